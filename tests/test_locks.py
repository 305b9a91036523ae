"""A statement that takes a node's lock and then decides on that node's properties reads them as
they are under the lock (C1, C2, C3, C4). Neo4j's Cypher may read a property of a matched node
before a later ``apoc.lock`` call in the same statement; every such statement therefore binds the
node again after the lock (``elementId``). Found by the soak: two changes with one version.

Each test runs many concurrent transactions against one node and checks that exactly what a
serial order allows happened."""

from __future__ import annotations

import asyncio

from graph import learning as learning_q
from graph import memorybot as memorybot_q
from graph.driver import write
from services.changes import Remember
from services.ids import new_id
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, make_world

RACERS = 24


async def test_concurrent_changes_of_one_bot_get_distinct_versions_and_log_rows(
    api: Api, runtime: Runtime
) -> None:
    """C2: every change bumps the version — new entries only (one statement) and others alike."""
    w = await make_world(api, ("ann",))
    ann = w.people["ann"]

    async def remember(n: int) -> int:
        change = Remember(content=f"note {n}", person_id=ann, org=w.org)
        return (await apply_changes(runtime, w.bot, [change], "person")).version

    versions = await asyncio.gather(*(remember(n) for n in range(RACERS)))
    assert sorted(versions) == list(range(min(versions), min(versions) + RACERS))
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change {botId: $b}) RETURN c.version AS v ORDER BY v", b=w.bot
    )
    logged = [r["v"] for r in records]
    assert len(logged) == len(set(logged)) and set(versions) <= set(logged)


async def test_one_of_many_concurrent_claims_of_an_execution_wins(runtime: Runtime) -> None:
    """C4: a queued execution of one epoch is claimed by exactly one worker."""
    x = new_id("exec")
    await runtime.driver.execute_query(
        "CREATE (:LearningExecution {id: $id, botId: 'b', chatId: 'c', turnId: 't', turnSeq: 1, "
        "epoch: 0, attempts: 0, status: 'queued'})",
        id=x,
    )

    async def claim(n: int) -> learning_q.ClaimMap | None:
        return await write(
            runtime.driver,
            lambda tx: learning_q.claim(tx, id=x, epoch=0, worker=f"w{n}", now=1, lease_ms=1000),
        )

    claims = await asyncio.gather(*(claim(n) for n in range(RACERS)))
    assert sum(c is not None for c in claims) == 1
    await runtime.driver.execute_query("MATCH (x:LearningExecution {id: $id}) DETACH DELETE x", id=x)


async def test_one_of_many_concurrent_settings_changes_with_one_expected_version_wins(
    api: Api, runtime: Runtime
) -> None:
    """C3: a compare-and-set on the settings' version lets one writer through."""
    w = await make_world(api, ("ann",))

    async def change(n: int) -> bool:
        done = await write(
            runtime.driver,
            lambda tx: memorybot_q.update_settings(
                tx, bot_id=w.bot, expected=0, values={"concurrency": n + 1}
            ),
        )
        assert done is not None
        return done[0]

    assert sum(await asyncio.gather(*(change(n) for n in range(RACERS)))) == 1
