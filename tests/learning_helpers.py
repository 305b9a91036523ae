"""Helpers for the memory-Bot tests: a world whose organization has a model, the platform's
calls (startTurn, addItems, confide, completeTurn) and waiting for learning to end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, LiteralString

from neo4j import AsyncManagedTransaction

from graph.driver import write
from graph.learning import ENDS
from services.ids import new_id
from services.runtime import Runtime
from tests.client import Api, World, bearer, make_world
from tests.conftest import TEST_MODEL
from tests.model_server import Reply, ToolCall
from tests.waiting import until


async def memory_world(
    api: Api,
    names: tuple[str, ...] = ("ann", "bob"),
    *,
    channel: tuple[str, ...] = (),
    model: str | None = TEST_MODEL,
) -> World:
    """A world whose organization uses ``model`` for its memory Bot (L5: no default)."""
    w = await make_world(api, names, channel=channel)
    await set_org(api, w.org, model=model)
    return w


async def set_org(api: Api, org: str, *, model: str | None = TEST_MODEL, bot_memory: bool = True) -> None:
    await api.admin(
        "mutation($o: ID!, $m: String, $b: Boolean) { updateOrganization(id: $o, botMemoryModel: $m, botMemory: $b) { id } }",
        {"o": org, "m": model, "b": bot_memory},
    )


async def add_items(
    api: Api, token: str, turn: str, *items: tuple[str, str] | tuple[str, str, str]
) -> list[str]:
    """Items as (kind, text) or (kind, text, app); returns their ids (i-N)."""
    data = await api.gql(
        "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }",
        {"t": turn, "i": [{"kind": i[0], "text": i[1], "app": i[2] if len(i) > 2 else None} for i in items]},
        token,
    )
    return [i["id"] for i in data["addItems"]]


async def confide(api: Api, token: str, turn: str, text: str = "I got the dates wrong.") -> str:
    data = await api.gql(
        "mutation($t: ID!, $x: String!) { confide(turnId: $t, text: $x) { answer } }",
        {"t": turn, "x": text},
        token,
    )
    return data["confide"]["answer"]


async def complete(api: Api, token: str, turn: str) -> None:
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn}, token)


async def first_item(api: Api, token: str, chat: str) -> str:
    data = await api.gql("query($c: ID!) { chat(id: $c) { messageCount } }", {"c": chat}, token)
    return f"i-{data['chat']['messageCount']}"


async def executions(rt: Runtime, turn: str) -> list[dict[str, Any]]:
    records, _, _ = await rt.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN x {.*} AS x ORDER BY x.createdAt", t=turn
    )
    return [dict(r["x"]) for r in records]


async def wait_executions(
    rt: Runtime, turn: str, statuses: tuple[str, ...] = ENDS, within: float = 20
) -> list[dict[str, Any]]:
    """Until every execution of the Turn is in one of ``statuses``."""
    found: list[dict[str, Any]] = []

    async def ended() -> list[dict[str, Any]]:
        nonlocal found
        found = await executions(rt, turn)
        return found if found and all(x["status"] in statuses for x in found) else []

    await until(
        ended,
        lambda: f"executions did not reach {statuses}: {[(x['status'], x.get('error')) for x in found]}",
        within=within,
    )
    # Read once more: Neo4j reads at read committed, and a read running while the end commits may
    # see some of that transaction's properties and not others (CI saw an execution `done` without
    # the `setAside` the same statement wrote). The commit is whole by the time its end was seen.
    return await executions(rt, turn)


async def position(rt: Runtime, bot: str, chat: str) -> int:
    records, _, _ = await rt.driver.execute_query(
        "OPTIONAL MATCH (p:ReadPosition {id: $id}) RETURN coalesce(p.seq, 0) AS seq", id=f"{bot}|{chat}"
    )
    return int(records[0]["seq"])


async def memory_bot_changes(rt: Runtime, bot: str) -> list[dict[str, Any]]:
    records, _, _ = await rt.driver.execute_query(
        "MATCH (c:Change {botId: $b, actor: 'memory_bot'}) RETURN c {.version, .entryIds} AS c ORDER BY c.version",
        b=bot,
    )
    return [dict(r["c"]) for r in records]


def learn(*calls: tuple[str, dict[str, Any] | str], **reply: Any) -> Reply:
    """A learning answer made of tool calls (name, arguments)."""
    return Reply(tool_calls=[ToolCall(name, args) for name, args in calls], **reply)


def fact_call(content: str, *items: str, topics: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    return ("add_fact", {"content": content, "source_item_ids": list(items), "topics": list(topics)})


async def until_logged(path: Path, text: str, within: float = 30, after: int = 0) -> None:
    """Until a process's log holds ``text`` past its first ``after`` bytes (the event that shows
    the work was considered)."""

    async def logged() -> bool:
        return text.encode() in (await asyncio.to_thread(path.read_bytes))[after:]

    await until(logged, f"{text!r} never logged in {path}", within=within)


@contextlib.asynccontextmanager
async def holding_lock(rt: Runtime, statement: LiteralString, **params: Any) -> AsyncGenerator[asyncio.Event]:
    """A transaction that ran ``statement`` (one that takes a lock) and holds what it took until
    the yielded event is set, or the block ends."""
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: AsyncManagedTransaction) -> None:
        await (await tx.run(statement, params)).consume()
        locked.set()
        await release.wait()

    held = asyncio.create_task(write(rt.driver, hold))
    try:
        await locked.wait()
        yield release
    finally:
        release.set()
        await held


async def until_a_transaction_waits_for_a_lock(
    rt: Runtime, within: float = 30, running: str = "", given: tuple[str, str] | None = None
) -> None:
    """Until Neo4j shows a transaction blocked on a lock (``running``: one whose statement holds
    that text, not another process's that happens to wait; ``given``: one whose statement has that
    parameter with that value, e.g. ``("botId", bot)``)."""
    name, value = given or ("", "")

    async def blocked() -> bool:
        records, _, _ = await rt.driver.execute_query(
            "SHOW TRANSACTIONS YIELD status, currentQuery, parameters "
            "WHERE status STARTS WITH 'Blocked' AND currentQuery CONTAINS $running "
            "AND ($name = '' OR parameters[$name] = $value) RETURN count(*) AS n",
            running=running,
            name=name,
            value=value,
        )
        return records[0]["n"] > 0

    await until(blocked, "no transaction ever waited for the lock", within=within)


#: An execution made in the graph alone (no Turn, no job): what the statements it tests read.
_BARE_EXECUTION = {"botId": "b", "chatId": "c", "turnId": "t", "turnSeq": 1, "epoch": 0, "attempts": 0}


@contextlib.asynccontextmanager
async def bare_executions(rt: Runtime, *rows: dict[str, Any]) -> AsyncGenerator[list[str]]:
    """Executions made in the graph alone, one per row (its properties over a queued one of Bot
    ``b``; an id made unless given), deleted afterwards; yields their ids."""
    made: list[dict[str, Any]] = [
        {**_BARE_EXECUTION, "status": "queued", "id": new_id("exec"), **row} for row in rows
    ]
    await rt.driver.execute_query("UNWIND $rows AS r CREATE (x:LearningExecution) SET x = r", rows=made)
    try:
        yield [x["id"] for x in made]
    finally:
        await rt.driver.execute_query(
            "MATCH (x:LearningExecution) WHERE x.id IN $ids DETACH DELETE x", ids=[x["id"] for x in made]
        )


def letters(marks: str) -> list[str]:
    """One long message per mark, 19,999 characters each (a word repeated: ``"A A … A"``), all
    distinct: four of them pass a step's or a summary's 60,000 characters."""
    return [(mark + " ") * 9_999 + mark for mark in marks]


async def long_turn(api: Api, token: str, chat: str, letter: str) -> None:
    """A completed Turn of 10,502 characters: two of them pass the summary threshold (20,000)."""
    turn = await api.turn(token, chat, f"{letter} " + letter * 10_500)
    await complete(api, token, turn["id"])


async def wait_summary(api: Api, token: str, chat: str, within: float = 30) -> str:
    """The Chat's rolling summary as its context pack shows it, once the worker wrote one."""

    async def written() -> str | None:
        answer = await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(token))
        summary: str | None = answer.json()["summary"]
        return summary

    return await until(written, "the worker never wrote the chat's summary", within=within, every=0.1)


async def spend(rt: Runtime, bot: str) -> list[tuple[int, int, int]]:
    """The Bot's Spend counters (calls, micros, unknownCalls), one per period, sorted."""
    records, _, _ = await rt.driver.execute_query(
        "MATCH (s:Spend {botId: $b}) RETURN s.calls AS c, s.micros AS m, s.unknownCalls AS u", b=bot
    )
    return sorted((r["c"], r["m"], r["u"]) for r in records)
