"""The source graph around one entry for analysts (D9.7): its sources and dependents to a depth."""

from __future__ import annotations

from typing import Any, Final, Literal, LiteralString, NotRequired, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import VISIBLE, ReaderMap, readers_now
from graph.driver import rows
from graph.entries import IdRow
from graph.memory import ENTRY_ROW, EntryMap, EntryRow

#: Entries and Items around one entry within ``$depth`` hops (at most 8, the source-chain bound,
#: D9.2), each once at its nearest distance (D9.7 filters them after): a breadth-first walk that
#: visits each node once. (Every path up to 8 hops was enumerated, then the nearest kept: paths
#: multiply where observations share sources, and ``depth: 1`` cost as much as 8.)
SOURCES_OF: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
CALL apoc.path.expandConfig(e, {relationshipFilter: 'SOURCE>', minLevel: 1, maxLevel: $depth,
                                uniqueness: 'NODE_GLOBAL', bfs: true}) YIELD path
WITH last(nodes(path)) AS n, length(path) AS depth
RETURN CASE WHEN n:Item THEN 'item' ELSE 'entry' END AS kind, n.id AS id, n.chatId AS chat, depth,
       n.status AS status
"""


DEPENDENTS_OF: Final[LiteralString] = """
MATCH (e:Entry {id: $id, botId: $botId})
CALL apoc.path.expandConfig(e, {relationshipFilter: '<SOURCE', minLevel: 1, maxLevel: $depth,
                                uniqueness: 'NODE_GLOBAL', bfs: true}) YIELD path
WITH last(nodes(path)) AS d, length(path) AS depth
WHERE d:Entry AND d.botId = $botId
RETURN 'entry' AS kind, d.id AS id, null AS chat, depth, d.status AS status
"""


class NeighbourRow(TypedDict):
    """SOURCES_OF, DEPENDENTS_OF: ``chat`` is an Item's Chat (None for an entry), ``status`` an
    entry's (None for an Item)."""

    kind: str
    id: str
    chat: str | None
    depth: int
    status: str | None


#: The entries of ``$ids`` in ``$statuses`` that the reader may see, as ``e``.
_VISIBLE_OF_IDS: Final[LiteralString] = (
    readers_now()
    + """UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId}) USING INDEX e:Entry(id)
WHERE e.status IN $statuses AND """
    + VISIBLE
)

#: Visible entries by id with everything the API returns (content as ciphertext).
ENTRIES_BY_ID: Final[LiteralString] = _VISIBLE_OF_IDS + ENTRY_ROW + "ORDER BY e.memoryRank DESC, e.id\n"

#: Which of ``$ids`` the reader may see, by id alone (what a hidden count needs of entries past
#: the depth asked).
VISIBLE_IDS: Final[LiteralString] = _VISIBLE_OF_IDS + "\nRETURN e.id AS id\n"


async def neighbours(
    tx: AsyncManagedTransaction, *, bot_id: str, id: str, direction: str, depth: int
) -> list[NeighbourRow]:
    """Sources (``direction='sources'``) or dependents of an entry within ``depth`` hops, with
    their distance."""
    query = SOURCES_OF if direction == "sources" else DEPENDENTS_OF
    return await rows(tx, query, NeighbourRow, botId=bot_id, id=id, depth=depth)


async def entries_by_id(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    ids: list[str],
    statuses: list[str],
) -> list[EntryMap]:
    result = await rows(
        tx, ENTRIES_BY_ID, EntryRow, botId=bot_id, org=org, readers=readers, ids=ids, statuses=statuses
    )
    return [r["entry"] for r in result]


async def visible_ids(
    tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str], statuses: list[str], **reader: Any
) -> set[str]:
    """Which of ``ids`` the reader (``Reader.params``: ``org``, ``readers``) may see."""
    result = await rows(tx, VISIBLE_IDS, IdRow, botId=bot_id, ids=ids, statuses=statuses, **reader)
    return {r["id"] for r in result}


#: Why the reader may see the entry ``$id`` (D9.28): if VISIBLE admits the one reader of
#: ``$readers``, one row per entry of the closure (``depth`` from the root, nearest first) with
#: ``steps``: each rule of that entry and of its Item edges mapped to the reader's own atom that
#: satisfies it. A rule the reader does not meet maps to nothing and is dropped (it cannot occur
#: while VISIBLE holds: ``why`` explains, it never decides), so no other reader's atom and no
#: hidden neighbour is ever named. No rows when the entry is not visible. Hop bound 8 (D9.2).
WHY_STEPS: Final[LiteralString] = (
    readers_now()
    + """MATCH (e:Entry {id: $id, botId: $botId})
WHERE e.status IN $statuses AND """
    + VISIBLE
    + """
WITH e, org, readers[0] AS rd
CALL (rd) {
  MATCH (c:Channel) WHERE c.id IN rd.channels
  RETURN apoc.map.fromPairs(collect([c.id, c.name])) AS names
}
CALL (e) {
  MATCH p = (e)-[:SOURCE*0..8]->(x:Entry)
  RETURN x, min(length(p)) AS depth
}
WITH x, depth, org, rd, names,
     [t IN x.tags WHERE t STARTS WITH 'for:' OR t STARTS WITH 'org:' | CASE
        WHEN t = 'for:person:' + rd.id THEN {rule: 'PERSON', atom: 'person:' + rd.id}
        WHEN t STARTS WITH 'for:channel:' AND substring(t, 12) IN rd.channels
          THEN {rule: 'CHANNEL', atom: 'channel:' + substring(t, 12),
                name: names[substring(t, 12)]}
        WHEN t = 'for:bot' AND rd.usesBot THEN {rule: 'BOT', atom: 'bot'}
        WHEN t = 'org:' + org THEN {rule: 'ORGANIZATION', atom: 'org:' + org}
      END] AS own,
     CASE WHEN size(coalesce(x.excluded, [])) > 0 AND NOT rd.id IN x.excluded
       THEN [{rule: 'NOT_EXCLUDED', atom: 'person:' + rd.id}] ELSE [] END AS kept,
     [(x)-[r:SOURCE]->(i:Item) | [CASE
        WHEN r.rule = 'person:' + rd.id THEN {rule: 'PERSON', atom: r.rule, chat: i.chatId, item: i.id}
        WHEN r.rule STARTS WITH 'channel:' AND substring(r.rule, 8) IN rd.channels
          THEN {rule: 'CHANNEL', atom: r.rule, chat: i.chatId, item: i.id,
                name: names[substring(r.rule, 8)]}
      END, CASE WHEN r.org = org
        THEN {rule: 'ORGANIZATION', atom: 'org:' + org, chat: i.chatId, item: i.id} END]] AS edges
RETURN x.id AS entry, x.layer AS layer, depth,
       [s IN own + kept + reduce(acc = [], pair IN edges | acc + pair) WHERE s IS NOT NULL] AS steps
ORDER BY depth, entry
"""
)


#: The rules WHY_STEPS names.
WhyRule = Literal["PERSON", "CHANNEL", "BOT", "ORGANIZATION", "NOT_EXCLUDED"]


class WhyStep(TypedDict):
    """One of WHY_STEPS's ``steps``: a rule and the reader's atom that meets it; ``chat`` and
    ``item`` for a source Item's rule, ``name`` for a channel's."""

    rule: WhyRule
    atom: str
    chat: NotRequired[str]
    item: NotRequired[str]
    name: NotRequired[str | None]


class WhyRow(TypedDict):
    entry: str
    layer: str
    depth: int
    steps: list[WhyStep]


async def why_steps(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    id: str,
    org: str,
    readers: list[ReaderMap],
    statuses: list[str],
) -> list[WhyRow]:
    """The closure of a visible entry with each rule mapped to the reader's atom (WHY_STEPS)."""
    return await rows(tx, WHY_STEPS, WhyRow, botId=bot_id, id=id, org=org, readers=readers, statuses=statuses)
