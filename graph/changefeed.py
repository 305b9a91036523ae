"""The batched visibility check of change events for the subscribers of one API process, and
the change log they catch up from (D9.24)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import READER_MAP, REMOVED_FOR, VISIBLE, ReaderMap, RemovedEntry, readers_now
from graph.driver import QueryTarget, rows, single
from graph.memory import ENTRY_LIST, READ_LOCK, TOP_RANK, EntryMap

#: For each local subscriber (``$subs``: ``{key, person, org, token}``) the ids among the changed
#: entries (``$ids``) it may see now: current membership, a live token, read on the Bot (V10);
#: and what the changes of ``$versions`` hid from it (D9.24, REMOVED_FOR: ``{version, id}``);
#: subscribers that lost access are absent. Then the entries anyone may see, read once for all
#: (content as ciphertext). One statement per event per API process, under the shared lock
#: taken first in the same statement (the first of the read, C1).
LOCKED_DELIVERY: Final[LiteralString] = (
    READ_LOCK
    + """
WITH m
MATCH (b:Bot {id: $botId})
UNWIND $subs AS sub
MATCH (t:Token {id: sub.token})-[:FOR]->(p:Person {id: sub.person})-[:MEMBER_OF]->(o:Organization {id: sub.org})
WHERE t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH sub, o, b, p, collect(c.id) AS channels
WITH sub, o.id AS org, ["""
    + READER_MAP
    + """] AS readers
WHERE readers[0].usesBot
CALL (org, readers) {
  UNWIND $ids AS entryId
  MATCH (e:Entry {id: entryId}) USING INDEX e:Entry(id)
  WHERE e.botId = $botId AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
  RETURN collect(e.id) AS visible
}
"""
    + REMOVED_FOR
    + """
WITH collect({key: sub.key, visible: visible, removed: removed}) AS found
CALL (found) {
  UNWIND found AS f
  UNWIND f.visible AS entryId
  WITH DISTINCT entryId
  MATCH (e:Entry {id: entryId}) USING INDEX e:Entry(id)
  WHERE e.botId = $botId
"""
    + ENTRY_LIST
    + """}
RETURN found, entries
"""
)


class Delivery(TypedDict):
    """One of LOCKED_DELIVERY's ``found``: a subscriber that may still read."""

    key: str
    visible: list[str]
    removed: list[RemovedEntry]


class DeliveryRow(TypedDict):
    found: list[Delivery]
    entries: list[EntryMap]


#: The memory version and the first ``$limit`` change-log rows with entries (changed or hidden)
#: after version ``$after``, oldest first, under the shared lock taken first (C1): every change up
#: to ``memoryVersion`` is in the log. The replay of ``memoryChanges(after:)`` and a hub's
#: catch-up after a missed event (D9.24); a seek of the ``change_bot_version`` index in its order.
LOCKED_LOG_AFTER: Final[LiteralString] = (
    READ_LOCK
    + """
WITH m
CALL () {
  MATCH (c:Change {botId: $botId})
  WHERE c.version > $after AND (size(c.entryIds) > 0 OR size(coalesce(c.removedIds, [])) > 0)
  WITH c ORDER BY c.botId, c.version LIMIT $limit
  RETURN collect({version: c.version, ids: c.entryIds, removed: coalesce(c.removedIds, [])}) AS rows
}
RETURN m.version AS memoryVersion, rows
"""
)


class ChangedIds(TypedDict):
    """A change as a delivery checks it: its version and the entries it changed."""

    version: int
    ids: list[str]


class LoggedChange(ChangedIds):
    """One of LOCKED_LOG_AFTER's ``rows``: a ChangedIds with what the change hid (D9.24)."""

    removed: list[str]


class LogAfterRow(TypedDict):
    memoryVersion: int
    rows: list[LoggedChange]


#: The current memory version of each of the Bots ``$botIds`` (a hub's catch-up after its Redis
#: connection came back); no lock: a version is one property, and the catch-up locks.
VERSIONS: Final[LiteralString] = """
UNWIND $botIds AS botId
MATCH (m:Memory {id: botId})
RETURN m.id AS botId, m.version AS version
"""


class BotVersionRow(TypedDict):
    botId: str
    version: int


@dataclass(frozen=True, slots=True)
class Found:
    """Per subscriber key: the ids it may see among the changed ones and ``(version, id)`` of what
    the changes hid from it; subscribers that lost access are absent. ``entries``: the rows of
    the visible ones (content as ciphertext)."""

    visible: dict[str, list[str]]
    removed: dict[str, list[tuple[int, str]]]
    entries: list[EntryMap]


async def deliveries(
    tx: QueryTarget,
    *,
    bot_id: str,
    ids: list[str],
    versions: list[int],
    subs: list[dict[str, str]],
    now: int,
) -> Found:
    """LOCKED_DELIVERY for the changed ``ids`` and the removals of the changes ``versions``."""
    row = await single(
        tx, LOCKED_DELIVERY, DeliveryRow, botId=bot_id, ids=ids, versions=versions, subs=subs, now=now
    )
    if row is None:
        return Found({}, {}, [])
    return Found(
        {f["key"]: f["visible"] for f in row["found"]},
        {f["key"]: [(r["version"], r["id"]) for r in f["removed"]] for f in row["found"]},
        row["entries"],
    )


async def log_after(
    tx: QueryTarget, *, bot_id: str, after: int, limit: int
) -> tuple[int, list[LoggedChange]] | None:
    """LOCKED_LOG_AFTER: the memory version and the rows ``{version, ids, removed}`` after
    ``after``, oldest first; None without the Bot's memory."""
    row = await single(tx, LOCKED_LOG_AFTER, LogAfterRow, botId=bot_id, after=after, limit=limit)
    if row is None:
        return None
    return row["memoryVersion"], row["rows"]


async def versions(tx: QueryTarget, *, bot_ids: list[str]) -> dict[str, int]:
    """VERSIONS: the current memory version of each Bot."""
    return {r["botId"]: r["version"] for r in await rows(tx, VERSIONS, BotVersionRow, botIds=bot_ids)}


#: The latest ``$limit`` change-log rows with entries (changed or removed, D9.24), of versions
#: below ``$before``, newest first (a seek of the ``change_bot_version`` index in its order).
LOG_ROWS: Final[LiteralString] = """
MATCH (c:Change {botId: $botId})
WHERE c.version < $before AND (size(c.entryIds) > 0 OR size(coalesce(c.removedIds, [])) > 0)
WITH c ORDER BY c.botId DESC, c.version DESC LIMIT $limit
RETURN c.version AS version, c.at AS at, c.actor AS actor, c.entryIds AS ids,
       coalesce(c.removedIds, []) AS removed
"""


class LogRow(TypedDict):
    version: int
    at: int
    actor: str
    ids: list[str]
    removed: list[str]


class RemovedRow(TypedDict):
    removed: list[RemovedEntry]


#: What the changes of ``$versions`` hid from the readers ``$readers`` in ``$org`` (D9.24).
REMOVED_FOR_READERS: Final[LiteralString] = readers_now() + REMOVED_FOR + "RETURN removed\n"


async def log_rows(
    tx: AsyncManagedTransaction, *, bot_id: str, limit: int, before: int | None = None
) -> list[LogRow]:
    return await rows(
        tx, LOG_ROWS, LogRow, botId=bot_id, limit=limit, before=TOP_RANK if before is None else before
    )


async def removed_for(
    tx: QueryTarget, *, bot_id: str, org: str, readers: list[ReaderMap], versions: list[int]
) -> list[RemovedEntry]:
    """REMOVED_FOR_READERS: ``{version, id}`` of what the changes of ``versions`` hid from the
    readers (D9.24)."""
    if not versions:
        return []
    record = await single(
        tx, REMOVED_FOR_READERS, RemovedRow, botId=bot_id, org=org, readers=readers, versions=versions
    )
    return [] if record is None else record["removed"]
