"""A statement that takes a node's lock and then decides on that node's properties reads them as
they are under the lock (C1, C2, C3, C4). Neo4j's Cypher may read a property of a matched node
before a later ``apoc.lock`` call in the same statement; every such statement therefore binds the
node again after the lock (``elementId``). Found by the soak: two changes with one version.

Each test runs many concurrent transactions against one node and checks that exactly what a
serial order allows happened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import conversation as conversation_q
from graph import learning as learning_q
from graph import memorybot as memorybot_q
from graph.driver import write
from services.changes import Remember
from services.ids import new_id
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, make_world
from tests.learning_helpers import bare_executions, until_a_transaction_waits_for_a_lock

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
    async with bare_executions(runtime, {}) as (x,):

        async def claim(n: int) -> learning_q.ClaimMap | None:
            return await write(
                runtime.driver,
                lambda tx: learning_q.claim(tx, id=x, epoch=0, worker=f"w{n}", now=1, lease_ms=1000),
            )

        claims = await asyncio.gather(*(claim(n) for n in range(RACERS)))
        assert sum(c is not None for c in claims) == 1


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


async def _behind_a_deletion(
    runtime: Runtime, chat: str, save: Callable[[AsyncManagedTransaction], Awaitable[Any]], running: str
) -> Any:
    """Run ``save`` (made with the Chat's history epoch 0) while a history deletion holds the Chat
    (its epoch moved, not yet committed), and commit the deletion once the save (its statement
    holds ``running``) waits for it."""
    async with runtime.driver.session() as session:
        deleting = await session.begin_transaction()
        try:
            await deleting.run(
                "MATCH (ch:Chat {id: $c}) CALL apoc.lock.nodes([ch]) "
                "SET ch.historyEpoch = coalesce(ch.historyEpoch, 0) + 1",
                c=chat,
            )
            saving = asyncio.create_task(write(runtime.driver, save))
            await until_a_transaction_waits_for_a_lock(runtime, running=running)
            await deleting.commit()
        finally:
            if deleting.closed() is False:
                await deleting.rollback()
        return await saving


async def test_a_save_behind_a_history_deletion_reads_the_epoch_the_deletion_left(
    api: Api, runtime: Runtime
) -> None:
    """D9.23 under C1: a save that began before a history deletion (a confide answer, a model
    call, a rewrite, a summary) and waits for the Chat's lock while the deletion runs must see the
    epoch the deletion committed, and keep none of the words. The statements read the epoch on
    the Chat as matched before the lock — the committed value, the old one — and saved them."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = (await api.turn(w.tokens["ann"], chat, "hello"))["id"]
    confession = new_id("conf")
    await runtime.driver.execute_query(
        "MATCH (t:Turn {id: $t}) CREATE (:Confession {id: $id, botId: $b, chatId: $c, turnId: $t, "
        "text: 'x', answer: null, usedEntryIds: [], createdAt: 0})-[:ABOUT]->(t)",
        t=turn,
        id=confession,
        b=w.bot,
        c=chat,
    )
    await _behind_a_deletion(
        runtime,
        chat,
        lambda tx: memorybot_q.answer_confession(
            tx,
            id=confession,
            answer="sealed answer",
            used_entry_ids=[],
            answered_by="model",
            now=1,
            history_epoch=0,
            bot_id=w.bot,
        ),
        "MATCH (f:Confession {id: $id})",
    )
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (f:Confession {id: $id}) RETURN f.answer AS answer", id=confession
    )
    assert [r["answer"] for r in records] == [None]
    saved = await _behind_a_deletion(
        runtime,
        chat,
        lambda tx: conversation_q.save_summary(
            tx,
            chatId=chat,
            botId=w.bot,
            historyEpoch=1,
            after=0,
            through=1,
            text="sealed summary",
            chars=14,
            now=1,
        ),
        "MERGE (s:ChatSummary {chatId: $chatId})",
    )
    assert saved is False
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (s:ChatSummary {chatId: $c}) RETURN s.text AS text", c=chat
    )
    assert [r["text"] for r in records] in ([], [None])


async def test_concurrent_model_calls_each_add_their_cost_to_the_spend(api: Api, runtime: Runtime) -> None:
    """L6: each saved model call adds its cost and its call to the Bot's Spend counters of the day
    and the month (MERGEd, locked, then incremented): none is lost, however many save at once."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    periods = ["day:2026-12-07", "month:2026-12"]

    async def save(n: int) -> None:
        fields: dict[str, Any] = {
            "id": new_id("call"), "botId": w.bot, "chatId": chat, "historyEpoch": 0, "org": w.org,
            "task": "learn", "model": "test-model", "executionId": None, "epoch": None, "step": None,
            "requestHash": None, "entryIds": [], "request": None, "result": None, "status": "ok",
            "attempts": 1, "attemptLog": ["ok:1ms"], "usageKnown": n % 2 == 0, "promptTokens": None,
            "completionTokens": None, "costMicros": 1 if n % 2 == 0 else None, "at": 1,
            "periods": periods, "charged": True, "calls": 2, "unknownCalls": 1 + (n % 2),
        }  # fmt: skip
        await write(runtime.driver, lambda tx: memorybot_q.save_model_call(tx, **fields))

    await asyncio.gather(*(save(n) for n in range(RACERS)))
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (s:Spend {botId: $b}) RETURN s.period AS p, s.micros AS m, s.calls AS c, s.unknownCalls AS u",
        b=w.bot,
    )
    counted = sorted((r["p"], r["m"], r["c"], r["u"]) for r in records)
    half = RACERS // 2
    assert counted == [(p, half, 2 * RACERS, RACERS + half) for p in periods]
