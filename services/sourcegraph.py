"""Source-graph exploration for analysts (D9.7): an entry, its sources and its dependents.

Only what the caller may see is shown; hidden neighbours appear at most as a count, never
with ids, rules or shapes. Saved per-Item rules are never returned, except as ``why`` shows
them to a reader they admit: only the reader's own atom that meets each rule (D9.28).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from neo4j import AsyncManagedTransaction

from graph import sourcegraph as sourcegraph_q
from graph.access import MAX_SOURCE_DEPTH
from graph.driver import read
from graph.memory import EntryMap
from graph.sourcegraph import WhyRow, WhyRule, WhyStep
from services.crypto import Cipher
from services.domain import Principal
from services.errors import BadInput, NotFound
from services.memory import Entry, decrypt_entry, open_read
from services.runtime import Runtime
from services.validation import check_id

_SHOWN = ["active", "invalidated"]
Direction = Literal["sources", "dependents"]
Rule = WhyRule


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


@dataclass(frozen=True, slots=True)
class AccessStep:
    """One rule of the closure and the caller's own atom that meets it (D9.28)."""

    entry: str
    rule: Rule
    admitted_by: str
    reason: str
    chat: str | None = None
    item: str | None = None


@dataclass(frozen=True, slots=True)
class AccessProof:
    summary: str
    steps: tuple[AccessStep, ...]


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
    """Sources or dependents within ``depth`` hops; entries the caller may not see are only
    counted, all those within MAX_SOURCE_DEPTH hops whatever the depth asked (counted by depth,
    they drew the hidden graph's shape, layer by layer: D9.7 gives no shape), and only while they
    are active or invalidated (a retracted entry is no one's neighbour)."""
    check_id(bot_id, "botId")
    check_id(entry_id, "id")
    if not 1 <= depth <= MAX_SOURCE_DEPTH:
        raise BadInput(f"depth is between 1 and {MAX_SOURCE_DEPTH}", field="depth")

    async def work(
        tx: AsyncManagedTransaction,
    ) -> tuple[list[sourcegraph_q.NeighbourRow], dict[str, EntryMap], set[str], Cipher]:
        _, reader, cipher = await open_read(rt, tx, principal, bot_id)
        if not await sourcegraph_q.entries_by_id(
            tx, bot_id=bot_id, ids=[entry_id], statuses=_SHOWN, **reader.params
        ):
            raise NotFound("entry not found")
        near = await sourcegraph_q.neighbours(
            tx, bot_id=bot_id, id=entry_id, direction=direction, depth=MAX_SOURCE_DEPTH
        )
        within = [n["id"] for n in near if n["kind"] == "entry" and n["depth"] <= depth]
        beyond = [
            n["id"] for n in near if n["kind"] == "entry" and n["depth"] > depth and n["status"] in _SHOWN
        ]
        shown = await sourcegraph_q.entries_by_id(
            tx, bot_id=bot_id, ids=within, statuses=_SHOWN, **reader.params
        )
        seen = set[str]()  # past the depth: only whether each may be seen (no row, no content)
        if beyond:
            seen = await sourcegraph_q.visible_ids(
                tx, bot_id=bot_id, ids=beyond, statuses=_SHOWN, **reader.params
            )
        return near, {row["id"]: row for row in shown}, seen, cipher

    near, shown, seen, cipher = await read(rt.driver, work)
    hidden = sum(
        1
        for n in near
        if n["kind"] == "entry" and n["status"] in _SHOWN and n["id"] not in shown and n["id"] not in seen
    )
    near = [n for n in near if n["depth"] <= depth]
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
    return Neighbourhood(entries, items, hidden)


async def why(rt: Runtime, principal: Principal, bot_id: str, entry_id: str) -> AccessProof:
    """Why the caller may see an entry (D9.28): every rule of its closure with the caller's own
    atom that meets it. VISIBLE decides (NOT_FOUND when it does not admit the caller)."""
    check_id(bot_id, "botId")
    check_id(entry_id, "id")

    async def work(tx: AsyncManagedTransaction) -> list[WhyRow]:
        _, reader, _ = await open_read(rt, tx, principal, bot_id)
        return await sourcegraph_q.why_steps(tx, bot_id=bot_id, id=entry_id, statuses=_SHOWN, **reader.params)

    closure = await read(rt.driver, work)
    if not closure:
        raise NotFound("entry not found")
    steps = tuple(
        AccessStep(
            entry=row["entry"],
            rule=s["rule"],
            admitted_by=s["atom"],
            reason=_reason(s),
            chat=s.get("chat"),
            item=s.get("item"),
        )
        for row in closure
        for s in row["steps"]
    )
    return AccessProof(_summary(closure), steps)


def _reason(step: WhyStep) -> str:
    item, chat = step.get("item"), step.get("chat")
    evidence = f" (the source message {item} in chat {chat})" if item else ""
    match step["rule"]:
        case "PERSON":
            return f"It is for you{evidence}."
        case "CHANNEL":
            label = step.get("name")
            name = f"{label!r} ({step['atom'][8:]})" if label else step["atom"][8:]
            return f"You are a member of channel {name}{evidence}."
        case "BOT":
            return "You use the Bot (grant)."
        case "ORGANIZATION":
            return f"You read in its organization {step['atom'][4:]}{evidence}."
        case _:
            return "You did not forget it."


def _summary(closure: list[WhyRow]) -> str:
    root, sources = closure[0], closure[1:]
    if root["layer"] == "pinned":
        return "You can see this entry because it is pinned and its own rules admit you."
    items = {(s.get("chat"), item) for row in closure for s in row["steps"] if (item := s.get("item"))}
    count = len(sources) + len(items)
    if count == 0:
        return "You can see this entry because its own audience admits you."
    if count == 1:
        return "You can see this entry because it and its one source admit you."
    return f"You can see this entry because it and every one of its {count} sources admit you."
