"""Operator changes outside the write path's checks of callers and the model: loading legacy
entries (V9) and recomputing every label of a Bot. Each is one change of the Bot's memory, with
its own version and log row (actor ``promotion`` or ``system``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from neo4j import AsyncManagedTransaction

from graph import changelog, entries
from graph import memory as memory_q
from graph.driver import write
from services.changes import Applied, check_content
from services.crypto import Kind
from services.errors import NotFound
from services.ids import new_id
from services.memory import cipher_of
from services.runtime import Runtime, now_ms
from services.writepath import ORDER_SLOTS, publish_change


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """An entry from an older version without access proof (V9)."""

    content: str
    tags: tuple[str, ...]
    layer: str = "fact"
    id: str = field(default_factory=lambda: new_id("mem"))


async def import_legacy(rt: Runtime, bot_id: str, legacy: list[LegacyEntry]) -> Applied:
    """Load legacy entries: kept hidden, out of learning, never widened (V9); logged as ``promotion``.

    They keep their tags but get no SOURCE edges; a declared source count they cannot meet
    (and the legacy flag) makes the visibility check fail closed for them and anything above.
    """
    cipher = await cipher_of(rt, bot_id)
    change_id, now = new_id("chg"), now_ms()
    for entry in legacy:
        check_content(entry.content)

    async def work(tx: AsyncManagedTransaction) -> Applied:
        version = await memory_q.bump_version(tx, bot_id=bot_id)
        if version is None:
            raise NotFound("bot not found")
        rows = [
            {
                "id": entry.id,
                "layer": entry.layer if entry.layer in ("fact", "observation", "pinned") else "fact",
                "content": cipher.encrypt(Kind.ENTRY, entry.id, entry.content),
                "contentLength": len(entry.content),
                "tags": list(entry.tags),
                "orderKey": version * ORDER_SLOTS + position,
            }
            for position, entry in enumerate(legacy, 1)
        ]
        await entries.create_legacy(tx, bot_id=bot_id, rows=rows, now=now)
        ids = [entry.id for entry in legacy]
        payload = cipher.encrypt(Kind.CHANGE, change_id, json.dumps({"kind": "import", "count": len(legacy)}))
        _, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor="promotion",
            entry_ids=ids,
            payload=payload,
        )
        return Applied(version, tuple(ids), now, tuple(removed))

    applied = await write(rt.driver, work)
    # Announced like every change (ids only, E4): each process's view of the memory version moves
    # on, though nobody may see these entries (V9).
    await publish_change(rt, bot_id, applied)
    return applied


async def relabel_all(rt: Runtime, bot_id: str) -> int:
    """Recompute every label of a Bot from the path query (after manual surgery on the graph), as
    a change of actor ``system``: its log row names what the new labels hide from someone (D9.24)."""
    change_id, now = new_id("chg"), now_ms()

    async def work(tx: AsyncManagedTransaction) -> tuple[int, Applied]:
        version = await memory_q.bump_version(tx, bot_id=bot_id)
        if version is None:
            raise NotFound("bot not found")
        ids = await entries.all_ids(tx, bot_id=bot_id)
        _, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor="system",
            entry_ids=[],
            payload=None,
            relabel=ids,
        )
        return len(ids), Applied(version, (), now, tuple(removed))

    count, applied = await write(rt.driver, work)
    await publish_change(rt, bot_id, applied)
    return count
