"""Starting is boring: several processes migrating the same database at once all succeed and
agree on the schema version (the API and the worker start together on a fresh data directory)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

import pytest
from neo4j import AsyncDriver

from graph import migrations
from graph.migrations import _WRITE_VERSION, LATEST, current_version, migrate  # pyright: ignore[reportPrivateUsage]
from services.ids import new_id
from services.runtime import Runtime
from services.settings import Settings
from tools.processes import WorkerProcess

DROPS = (
    "DROP INDEX entry_bot_id IF EXISTS",
    "DROP INDEX entry_vec_seq IF EXISTS",
    "DROP INDEX enrichment_bot IF EXISTS",
    "DROP INDEX confession_bot IF EXISTS",
)


async def test_concurrent_starters_all_migrate_to_the_latest_version(runtime: Runtime) -> None:
    driver = runtime.driver
    bot = "bot_" + secrets.token_hex(16)
    for _ in range(3):
        # Entries no topic link was made for (a store of version 14): the starters race to link
        # them (migration 15), and each topic is linked once (CREATE made one link per starter).
        await driver.execute_query(
            "UNWIND range(1, 300) AS n CREATE (:Entry {id: $bot + '-' + n, botId: $bot, tags: ['alpha', 'beta', 'chat:x']})",
            bot=bot,
        )
        # As if nothing had been applied: every schema statement runs again in every starter, and
        # a few indexes really are missing, so the starters race to create them.
        for drop in DROPS:
            await driver.execute_query(drop)
        await driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 0")
        versions = await asyncio.gather(*(migrate(driver) for _ in range(4)))
        assert versions == [LATEST] * 4
        assert await current_version(driver) == LATEST
        links, _, _ = await driver.execute_query(
            "MATCH (e:Entry {botId: $bot}) RETURN e.id AS id, COUNT { (e)-[:HAS_TOPIC]->() } AS n", bot=bot
        )
        assert len(links) == 300 and {r["n"] for r in links} == {2}
        await driver.execute_query(
            "MATCH (e:Entry {botId: $bot}) DETACH DELETE e WITH count(*) AS _ "
            "MATCH (t:Topic {botId: $bot}) DETACH DELETE t",
            bot=bot,
        )


def _log_of(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


async def _logged(path: Path, text: bytes, worker: WorkerProcess) -> None:
    """Until ``text`` is in the worker's log (or it exited: then it must be there)."""
    for _ in range(600):
        if text in _log_of(path):
            return
        if worker.proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    assert text in _log_of(path), _log_of(path)[-2000:].decode(errors="replace")


async def test_the_worker_waits_for_the_schema_the_api_applies(
    runtime: Runtime, settings: Settings, service_env: dict[str, str]
) -> None:
    """One process migrates: the worker starts only once the schema has this code's version, and
    refuses one that newer code wrote, in a sentence."""
    driver = runtime.driver
    older = settings.data_dir / "logs" / f"pytest-worker-schema-{secrets.token_hex(3)}.log"
    await driver.execute_query(_SET_VERSION, version=LATEST - 1)
    worker = WorkerProcess(older, service_env)
    try:
        await _logged(older, f"waiting for schema version {LATEST}".encode(), worker)
        assert not worker.ready()
        assert await migrate(driver) == LATEST  # what the API does at start
        await asyncio.to_thread(worker.wait_ready, 60)
    finally:
        worker.stop()
        await driver.execute_query(_SET_VERSION, version=LATEST)

    newer = older.with_name(older.stem + "-newer.log")
    await driver.execute_query(_SET_VERSION, version=LATEST + 1)
    try:
        worker = WorkerProcess(newer, service_env)
        try:
            await _logged(newer, f"newer than this code's {LATEST}: upgrade this process".encode(), worker)
            assert await asyncio.to_thread(worker.proc.wait, 60) != 0
        finally:
            worker.stop()
    finally:
        await driver.execute_query(_SET_VERSION, version=LATEST)


_SET_VERSION = "MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = $version"


async def test_a_version_older_than_the_recorded_one_is_never_written(runtime: Runtime) -> None:
    """Of processes migrating together, a slow one that finished an older step after a faster one
    recorded the latest wrote the older version over it: the next start ran the later steps'
    data changes again."""
    assert await migrate(runtime.driver) == LATEST
    await runtime.driver.execute_query(_WRITE_VERSION, version=LATEST - 2)
    assert await current_version(runtime.driver) == LATEST


async def test_a_starter_that_read_an_old_version_runs_no_step_applied_since(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that read an old version when it started ran every data step another starter had
    applied meanwhile: version 16's cleared the request hashes the new processes had written
    since (their interrupted learning steps then paid for their model calls again). The version
    is read again before each step."""
    assert await migrate(runtime.driver) == LATEST
    call = new_id("call")
    await runtime.driver.execute_query(
        "CREATE (:ModelCall {id: $id, botId: 'b', task: 'learn', requestHash: 'keyed', at: 1})", id=call
    )
    reads = 0

    async def stale_then_true(driver: AsyncDriver) -> int:
        nonlocal reads
        reads += 1
        return 15 if reads == 1 else await current_version(driver)  # as read before the others ran

    monkeypatch.setattr(migrations, "current_version", stale_then_true)
    try:
        assert await migrations.migrate(runtime.driver) == LATEST
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (c:ModelCall {id: $id}) RETURN c.requestHash AS h", id=call
        )
        assert [r["h"] for r in records] == ["keyed"]
    finally:
        await runtime.driver.execute_query("MATCH (c:ModelCall {id: $id}) DETACH DELETE c", id=call)


async def test_one_starter_migrates_while_another_holds_the_lease(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Two starters that read the same old version both ran its data step (16's cleared the
    request hashes the first one's processes had written since): a starter waits while another
    holds the migration lease, runs nothing meanwhile, and applies what is left once it is given
    back."""
    driver = runtime.driver
    assert await migrate(driver) == LATEST
    await driver.execute_query(
        "MERGE (l:MigrationLease {id: 'schema'}) SET l.holder = 'another', l.until = timestamp() + 600000"
    )
    await driver.execute_query(_SET_VERSION, version=LATEST - 1)
    caplog.set_level(logging.INFO, logger="graph.migrations")
    waiting = asyncio.create_task(migrate(driver))
    try:
        for _ in range(1200):
            if "waiting for another process to migrate the schema" in caplog.text:
                break
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the starter never waited for the lease")
        assert await current_version(driver) == LATEST - 1  # nothing applied under another's lease
        await driver.execute_query(
            "MATCH (l:MigrationLease {id: 'schema'}) SET l.holder = null, l.until = null"
        )
        assert await asyncio.wait_for(waiting, 60) == LATEST
    finally:
        waiting.cancel()
        await driver.execute_query(_SET_VERSION, version=LATEST)
    records, _, _ = await driver.execute_query("MATCH (l:MigrationLease) RETURN l.holder AS holder")
    assert [r["holder"] for r in records] == [None]  # given back


async def test_a_lease_whose_holder_died_is_taken_over(runtime: Runtime) -> None:
    """A starter killed while migrating leaves its lease behind: once it lapses (Neo4j's clock),
    the next starter takes it and migrates."""
    driver = runtime.driver
    await driver.execute_query(
        "MERGE (l:MigrationLease {id: 'schema'}) SET l.holder = 'killed', l.until = timestamp() - 1"
    )
    await driver.execute_query(_SET_VERSION, version=LATEST - 1)
    try:
        assert await asyncio.wait_for(migrate(driver), 60) == LATEST
    finally:
        await driver.execute_query(_SET_VERSION, version=LATEST)
    records, _, _ = await driver.execute_query("MATCH (l:MigrationLease) RETURN l.holder AS holder")
    assert [r["holder"] for r in records] == [None]  # taken over, then given back


async def test_a_starter_whose_lease_was_taken_over_stops_before_its_next_step(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starter that stalled past its lease (or could not renew it) went on migrating beside the
    one that took the lease over: its renewer now finds the lease taken and marks it lost, and the
    steps stop before the next one (LeaseLost: the process starts again)."""
    driver = runtime.driver
    monkeypatch.setattr(migrations, "_RENEW_SECONDS", 0.05)
    lease = migrations._Lease("stalled")  # pyright: ignore[reportPrivateUsage]
    assert await migrations._take_lease(driver, lease.holder)  # pyright: ignore[reportPrivateUsage]
    await driver.execute_query(
        "MATCH (l:MigrationLease {id: 'schema'}) SET l.holder = 'other', l.until = timestamp() + 600000"
    )
    try:
        renewing = migrations._renew_lease(driver, lease)  # pyright: ignore[reportPrivateUsage]
        await asyncio.wait_for(renewing, 60)
        assert lease.lost
        await driver.execute_query(_SET_VERSION, version=LATEST - 1)
        with pytest.raises(migrations.LeaseLost):
            await migrations._apply_steps(driver, lease)  # pyright: ignore[reportPrivateUsage]
        assert await current_version(driver) == LATEST - 1  # nothing applied
    finally:
        await driver.execute_query(_SET_VERSION, version=LATEST)
        await driver.execute_query(
            "MATCH (l:MigrationLease {id: 'schema'}) SET l.holder = null, l.until = null"
        )
