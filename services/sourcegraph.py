"""Source-graph exploration for analysts (D9.7): an entry, its sources and its dependents.

Only what the caller may see is shown; hidden neighbours appear at most as a count, never
with ids, rules or shapes. Saved per-Item rules are never returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from neo4j import AsyncManagedTransaction

from graph import sourcegraph as sourcegraph_q
from graph.access import MAX_SOURCE_DEPTH
from graph.driver import read
from graph.memory import EntryMap
from services.crypto import Cipher
from services.domain import Principal
from services.errors import BadInput, NotFound
from services.memory import Entry, decrypt_entry, open_read
from services.runtime import Runtime
from services.validation import check_id

_SHOWN = ["active", "invalidated"]
Direction = Literal["sources", "dependents"]


@dataclass(frozen=True, slots=True)
class Neighbour:
    entry: Entry
    distance: int


@dataclass(frozen=True, slots=True)
class ItemSource:
    chat: str
    item: str
    distance: int


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    entries: tuple[Neighbour, ...]
    items: tuple[ItemSource, ...]
    hidden: int


async def entry(rt: Runtime, principal: Principal, bot_id: str, entry_id: str) -> Entry:
    """One entry the caller may see (history included), else NOT_FOUND."""
    check_id(bot_id, "botId")
    check_id(entry_id, "id")

    async def work(tx: AsyncManagedTransaction) -> tuple[list[EntryMap], Cipher]:
        _, reader, cipher = await open_read(rt, tx, principal, bot_id)
        return await sourcegraph_q.entries_by_id(
            tx, bot_id=bot_id, ids=[entry_id], statuses=_SHOWN, **reader.params
        ), cipher

    found, cipher = await read(rt.driver, work)
    if not found:
        raise NotFound("entry not found")
    return decrypt_entry(cipher, found[0])


async def neighbourhood(
    rt: Runtime, principal: Principal, bot_id: str, entry_id: str, direction: Direction, depth: int
) -> Neighbourhood:
    """Sources or dependents within ``depth`` hops; entries the caller may not see are only counted."""
    check_id(bot_id, "botId")
    check_id(entry_id, "id")
    if not 1 <= depth <= MAX_SOURCE_DEPTH:
        raise BadInput(f"depth is between 1 and {MAX_SOURCE_DEPTH}", field="depth")

    async def work(
        tx: AsyncManagedTransaction,
    ) -> tuple[list[sourcegraph_q.NeighbourRow], dict[str, EntryMap], Cipher]:
        _, reader, cipher = await open_read(rt, tx, principal, bot_id)
        if not await sourcegraph_q.entries_by_id(
            tx, bot_id=bot_id, ids=[entry_id], statuses=_SHOWN, **reader.params
        ):
            raise NotFound("entry not found")
        near = [
            n
            for n in await sourcegraph_q.neighbours(tx, bot_id=bot_id, id=entry_id, direction=direction)
            if n["depth"] <= depth
        ]
        ids = [n["id"] for n in near if n["kind"] == "entry"]
        shown = await sourcegraph_q.entries_by_id(
            tx, bot_id=bot_id, ids=ids, statuses=_SHOWN, **reader.params
        )
        return near, {row["id"]: row for row in shown}, cipher

    near, shown, cipher = await read(rt.driver, work)
    entries = tuple(
        Neighbour(decrypt_entry(cipher, shown[n["id"]]), n["depth"])
        for n in near
        if n["kind"] == "entry" and n["id"] in shown
    )
    items = tuple(
        ItemSource(n["chat"], n["id"], n["depth"])
        for n in near
        if n["kind"] == "item" and n["chat"] is not None  # an Item always has its Chat
    )
    hidden = sum(1 for n in near if n["kind"] == "entry" and n["id"] not in shown)
    return Neighbourhood(entries, items, hidden)
