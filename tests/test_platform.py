"""Health, metrics, migrations, GraphiQL, the schema snapshot and the auto-commit helper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from neo4j import WRITE_ACCESS, AsyncSession
from neo4j.exceptions import ClientError, IncompleteCommit, SessionExpired, TransientError

from graph.driver import AUTOCOMMIT_ATTEMPTS, autocommit, single
from graph.entries import CountRow
from graph.migrations import LATEST, current_version, migrate
from resolvers.schema import SNAPSHOT, build_schema
from services import memory, retrieval, search
from services.changes import Invalidate
from services.domain import Principal
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, make_world
from tests.memory_helpers import apply, command, fact, said


async def test_healthz_checks_neo4j_and_redis(api: Api) -> None:
    response = await api.http.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body.pop("budget") in ("none", "counted")
    assert body == {"status": "ok", "neo4j": "ok", "redis": "ok", "model": "configured"}


async def test_healthz_says_when_a_budget_cannot_bind(api: Api, runtime: Runtime) -> None:
    """D9.25: a budget is refused for a model without a price; when the price table loses a model
    after its budget was set, /healthz says `budget: unpriced` (and stays up: a warning)."""
    w = await make_world(api, ("ann",))
    await runtime.driver.execute_query(
        "MATCH (o:Organization {id: $o}), (m:Memory {id: $b}) "
        "SET o.botMemoryModel = 'a-model-nobody-priced', m.budgetLimitMicros = 1000, m.budgetPeriod = 'day'",
        o=w.org,
        b=w.bot,
    )
    try:
        response = await api.http.get("/healthz")
        assert response.status_code == 200 and response.json()["budget"] == "unpriced"
    finally:
        await runtime.driver.execute_query(
            "MATCH (m:Memory {id: $b}) REMOVE m.budgetLimitMicros, m.budgetPeriod", b=w.bot
        )
    assert (await api.http.get("/healthz")).json()["budget"] in ("none", "counted")


async def test_graphiql_loads(api: Api) -> None:
    page = await api.http.get("/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert "graphiql" in page.text.lower()


async def test_migrations_are_idempotent_and_recorded(runtime: Runtime) -> None:
    async def constraints() -> set[str]:
        records, _, _ = await runtime.driver.execute_query("SHOW CONSTRAINTS YIELD name RETURN name")
        return {r["name"] for r in records}

    first = await migrate(runtime.driver)
    names = await constraints()
    second = await migrate(runtime.driver)
    assert first == second == LATEST == await current_version(runtime.driver)
    assert await constraints() == names
    assert {"entry_id", "chat_id", "item_uid", "token_hash", "bot_id"} <= names


async def test_migration_6_relabels_entries_that_carry_the_older_labels(api: Api, runtime: Runtime) -> None:
    """Entries labelled before version 6 (``lblAtoms``, no ``lblRequires`` nor ``activeKey``)
    are invisible to the current check until the migration relabels them; after it, context
    finds the active one and not the invalidated one, and the old property is gone."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "facts")
    kept = await fact(runtime, w.bot, "kept", src)
    gone = await fact(runtime, w.bot, "gone", src)
    await apply(runtime, w.bot, Invalidate(gone))
    await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $botId}) SET e.lblAtoms = e.lblRequires REMOVE e.lblRequires, e.activeKey",
        botId=w.bot,
    )
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 5")
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    assert not await retrieval.has_entries(runtime, w.bot, reader)

    assert await migrate(runtime.driver) == LATEST
    assert (await retrieval.context(runtime, w.bot, reader, limit=100)).ids == (kept,)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $botId}) RETURN e.id AS id, e.lblAtoms AS old, e.activeKey AS key",
        botId=w.bot,
    )
    assert {r["id"]: (r["old"], r["key"]) for r in records} == {
        kept: (None, f"person:{w.people['ann']}"),
        gone: (None, None),
    }


def test_schema_snapshot_is_current(settings: Settings) -> None:
    """Regenerate with `python -m resolvers.snapshot` when the schema changes on purpose."""
    assert str(build_schema(settings)).strip() == SNAPSHOT.read_text().strip()


async def test_autocommit_retries_what_neo4j_rolled_back_as_transient_and_nothing_else(
    runtime: Runtime,
) -> None:
    """graph.driver.autocommit: a transient failure (Neo4j rolled the statement back) is run
    again on a new session, like a managed transaction; any other error is raised at once; a
    transient one that keeps coming is raised after the last attempt (the pauses add up to 1.5 s).
    A lost connection is retried for a read, raised at once for a statement that writes, as
    IncompleteCommit: it may have committed."""
    calls: list[str] = []

    async def flaky(session: AsyncSession) -> int:
        calls.append("flaky")
        if len(calls) < 3:
            raise TransientError("deadlock detected")  # what Neo4j reports for a rolled-back statement
        record = await single(session, "RETURN 41 + 1 AS n", CountRow)
        assert record is not None
        return int(record["n"])

    assert await autocommit(runtime.driver, flaky) == 42 and len(calls) == 3

    async def refused(session: AsyncSession) -> None:
        calls.append("refused")
        await single(session, "RETURN 1 / 0 AS n", CountRow)

    calls.clear()
    with pytest.raises(ClientError):
        await autocommit(runtime.driver, refused)
    assert calls == ["refused"]

    async def always(session: AsyncSession) -> None:
        calls.append("always")
        raise TransientError("lock timeout")

    calls.clear()
    with pytest.raises(TransientError):
        await autocommit(runtime.driver, always)
    assert len(calls) == AUTOCOMMIT_ATTEMPTS

    # A lost connection: a read is run again; a statement that writes is not (it may have committed).
    async def cut(session: AsyncSession) -> int:
        calls.append("cut")
        if len(calls) < 2:
            raise SessionExpired("the connection was closed")  # what the driver raises for a closed socket
        record = await single(session, "RETURN 7 AS n", CountRow)
        assert record is not None
        return int(record["n"])

    calls.clear()
    assert await autocommit(runtime.driver, cut) == 7 and calls == ["cut", "cut"]
    calls.clear()
    with pytest.raises(IncompleteCommit) as lost:  # said "may have been saved", never "try again"
        await autocommit(runtime.driver, cut, writes=True)
    assert calls == ["cut"] and isinstance(lost.value.__cause__, SessionExpired)


async def test_every_read_runs_on_the_leader_in_write_access_mode(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D9.27: every read takes the Bot's shared lock first (C1), and in a cluster a lock taken on
    a follower would not exclude the leader's writers — so reads ask for write access (the
    leader), in managed and auto-commit transactions alike. Recorded at the driver's session."""
    w = await make_world(api, ("ann",))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "Ann sails", "tags": []}
    )
    assert response.status_code == 201
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    modes: list[str] = []
    opened = cast(Callable[..., AsyncSession], runtime.driver.session)

    def session(**config: Any) -> AsyncSession:
        modes.append(str(config.get("default_access_mode", "unset")))
        return opened(**config)

    monkeypatch.setattr(runtime.driver, "session", session)
    principal = Principal("person", person_id=w.people["ann"], organization_id=w.org)
    listed, _ = await memory.list_entries(runtime, principal, w.bot, [])
    assert [e.content for e in listed] == ["Ann sails"]
    assert (await retrieval.context(runtime, w.bot, reader, 4000)).text == "- Ann sails"
    assert await retrieval.has_entries(runtime, w.bot, reader)
    assert [h.entry.content for h in await search.search(runtime, None, w.bot, reader, "sails", 5)] == [
        "Ann sails"
    ]
    assert len(modes) >= 4 and set(modes) == {WRITE_ACCESS}, modes
