"""A Bot's memory: the lock (C1, D9.8), the version and change log (C2), and Entry reads.

Reads run in one transaction whose first statement takes the shared lock on the Memory node;
changes start by writing the Memory node (the exclusive lock), so a read never mixes old access
rules with new content, across API processes too. Content is returned as ciphertext and
decrypted by the caller after commit.
"""

from __future__ import annotations

from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import (
    HELD_KEYS,
    READER_MAP,
    VISIBLE,
    ReaderMap,
    readers_now,
)
from graph.driver import Ciphertext, QueryTarget, single
from graph.topics import topic_key

#: The sources of an entry ``e`` as ids (``sources``), for the API's view of it.
_ENTRY_SOURCES: Final[LiteralString] = """
OPTIONAL MATCH (e)-[:SOURCE]->(src)
WITH e, collect(CASE WHEN src IS NULL THEN null WHEN src:Item THEN {chat: src.chatId, item: src.id}
                     ELSE {entry: src.id} END) AS sources
"""


class ItemSourceMap(TypedDict):
    chat: str
    item: str


class EntrySourceMap(TypedDict):
    entry: str


#: One of ``sources``: an Item of a Chat, or an entry.
SourceMap = ItemSourceMap | EntrySourceMap

#: The sources of ``e`` as a subquery binding ``sources`` (for a statement that goes on with ``e``).
SOURCES_OF_E: Final[LiteralString] = "CALL (e) {" + _ENTRY_SOURCES + "  RETURN sources\n}\n"

#: The API's view of an entry ``e``: fields, sources as ids, content as ciphertext.
ENTRY_MAP: Final[LiteralString] = (
    "e {.id, .layer, .tags, .status, .confidence, .createdAt, .updatedAt, .invalidatedAt,\n"
    """     saidAt: coalesce(e.saidAt, e.createdAt), changedVersion: coalesce(e.changedVersion, 0),
     .content, .contentLength, .orderKey, .memoryRank, sources: sources}"""
)


class EntryMap(TypedDict):
    """ENTRY_MAP. Properties stored as null (``confidence`` but on observations,
    ``invalidatedAt`` until invalidated) come back as None."""

    id: str
    layer: str
    tags: list[str]
    status: str
    confidence: float | None
    createdAt: int
    updatedAt: int
    invalidatedAt: int | None
    #: When its newest source was said (D9.31; an entry written before entries were dated: when
    #: it was created).
    saidAt: int
    #: The memory version of the last change that named it (0: no logged change names it).
    changedVersion: int
    content: Ciphertext
    contentLength: int
    orderKey: int
    memoryRank: int
    sources: list[SourceMap]


class EntryRow(TypedDict):
    entry: EntryMap


class EntriesRow(TypedDict):
    entries: list[EntryMap]


#: ``e`` as one ``entry`` row.
ENTRY_ROW: Final[LiteralString] = _ENTRY_SOURCES + "RETURN " + ENTRY_MAP + " AS entry\n"

#: The rows of ``e`` collected as one ``entries`` list (the end of a subquery).
ENTRY_LIST: Final[LiteralString] = _ENTRY_SOURCES + "RETURN collect(" + ENTRY_MAP + ") AS entries\n"

#: Above every ``memoryRank`` (pinned entries rank from 2**50); bounds index range seeks.
TOP_RANK: Final = 2**62

#: The shared lock as the head of a read's first query (``READ_LOCK + "WITH m" + …``): it is
#: taken on the Memory node's one row before the rest of the statement runs (the read part is
#: planned on top of it), so a read needs no round trip of its own for the lock. No Memory
#: node → no rows.
READ_LOCK: Final[LiteralString] = """
MATCH (held:Memory {id: $botId})
CALL apoc.lock.read.nodes([held])
WITH held
MATCH (m:Memory) WHERE elementId(m) = elementId(held)
"""
_LOCKED: Final[LiteralString] = READ_LOCK + "WITH m\n"

SHARED_LOCK: Final[LiteralString] = READ_LOCK + "RETURN m.version AS version\n"


class VersionRow(TypedDict):
    """SHARED_LOCK, BUMP_VERSION, ``identity.LOCK_CHANNEL``."""

    version: int


#: The first statement of every change takes the Memory node's exclusive lock explicitly.
#: Starting with ``SET m.version = m.version + 1`` instead deadlocks under load (measured: two
#: writers and four readers): the write is preceded by a shared lock that is then upgraded,
#: and D9.8 forbids upgrades.
BUMP_VERSION: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.nodes([m])
WITH m
SET m.version = m.version + 1
RETURN m.version AS version
"""

#: The first statement of a person's read (C1, D9.8): the shared lock of the Bot's memory,
#: then, under it and in the same round trip, that person as a reader (see READER). A Bot their
#: organization neither owns nor is linked to is never locked (no row, as an unknown Bot):
#: locked, its refusal waited behind that organization's writers and took a second statement,
#: which told it from an unknown Bot (D9.4).
_LOCK_AND_READER_ROW: Final[LiteralString] = (
    """
MATCH (held:Memory {id: $botId})
WHERE EXISTS { MATCH (:Bot {id: $botId})-[:OWNED_BY|LINKED]->(:Organization {id: $org}) }
CALL apoc.lock.read.nodes([held])
WITH held
MATCH (m:Memory) WHERE elementId(m) = elementId(held)
WITH m
"""
    + """OPTIONAL MATCH (p:Person {id: $personId})-[:MEMBER_OF]->(o:Organization {id: $org})
OPTIONAL MATCH (b:Bot {id: $botId})
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH m, p, o, b, collect(c.id) AS channels
"""
)
_READER_OF_ROW: Final[LiteralString] = (
    "m.version AS version, CASE WHEN p IS NULL THEN null ELSE " + READER_MAP + " END AS reader\n"
)
#: LOCK_AND_READER: the version, the person as a reader, and the time zone they set (D9.32).
LOCK_AND_READER: Final[LiteralString] = (
    _LOCK_AND_READER_ROW + "RETURN p.timeZone AS timeZone, " + _READER_OF_ROW
)


class LockAndReaderRow(TypedDict):
    """LOCK_AND_READER; ``reader`` is None when the person is not in the organization;
    ``timeZone``: theirs (D9.32; None: UTC)."""

    version: int
    reader: ReaderMap | None
    timeZone: str | None


#: LOCK_AND_READER as the head of a longer statement: binds ``version`` and ``reader``.
_LOCK_AND_READER_HEAD: Final[LiteralString] = _LOCK_AND_READER_ROW + "WITH " + _READER_OF_ROW


#: The rows of the entries ``e`` as one ``entries`` list in memory order.
_IN_ORDER: Final[LiteralString] = (
    _ENTRY_SOURCES
    + "WITH e, sources ORDER BY e.memoryRank DESC, e.id\nRETURN collect("
    + ENTRY_MAP
    + ") AS entries\n"
)

#: What a listed entry ``e`` must be: of ``$statuses``, with every tag of ``$tags``, visible.
_LISTED: Final[LiteralString] = "e.status IN $statuses AND all(t IN $tags WHERE t IN e.tags) AND " + VISIBLE

#: The most entries a topic may have for a tag filter on it to read them from its Topic rather
#: than walk the reader's entries (``$topicSeekMax`` of _candidates). Above it, a page of the walk
#: meets the topic often enough; below it, reading the topic's entries costs less than a walk that
#: misses it.
TOPIC_SEEK_MAX: Final = 2000

#: The topic of ``$tags`` (all-of) with the fewest entries under the reader's audience ``keys``,
#: as ``tps`` (its Topics of those keys, ``graph.topics``) and ``topicSize`` (their degrees, read
#: without reading the entries): 0 when no such entry has it (then nothing passes the filter), null
#: when ``$tags`` holds no topic (only OpenBot's tags). Entries under keys the reader does not hold
#: are never counted nor read (VISIBLE admits none of them), so neither the choice below nor its
#: time tells how many of another audience carry a topic: another person's private entries, a
#: channel's the reader is not in. (Those under a key the reader holds that another condition
#: hides — an observation that also needs a channel they are not in, another organization's of a
#: linked Bot, their own Forget exclusions — are read and refused, as by the walk and by search.)
_RAREST_TOPIC: Final[LiteralString] = (
    """
CALL (keys) {
  WITH keys, [t IN $tags WHERE NOT t CONTAINS ':'] AS topics
  UNWIND CASE WHEN size(topics) = 0 THEN [null] ELSE topics END AS topic
  CALL (keys, topic) {
    UNWIND keys AS key
    MATCH (tp:Topic {key: """
    + topic_key("$botId", "key", "topic")
    + """})
    RETURN collect(tp) AS tps, sum(COUNT { (tp)<-[:HAS_TOPIC]-() }) AS degree
  }
  RETURN tps, CASE WHEN topic IS NULL THEN null ELSE degree END AS topicSize
  ORDER BY topicSize LIMIT 1
}
"""
)


def _candidates(walk: LiteralString, where: LiteralString) -> LiteralString:
    """Where a listing's entries ``e`` come from: the entries of the rarest topic of the filter
    under the reader's keys when it has at most ``$topicSeekMax`` there (each checked by
    ``where``), else ``walk``, the reader's
    own entries from the ``entry_audience`` index (one seek per audience key in ``keys``) — a
    walk that, for a rare topic, read every entry the reader may see (122 ms at 100k). The two
    find the same entries: VISIBLE admits only entries whose ``audienceKey`` the reader holds."""
    return (
        _RAREST_TOPIC
        + """CALL (readers, org, keys, tps, topicSize) {
  WITH readers, org, keys WHERE topicSize IS NULL OR topicSize > $topicSeekMax
"""
        + walk
        + """  RETURN e
UNION ALL
  WITH readers, org, tps WHERE topicSize <= $topicSeekMax
  UNWIND tps AS tp
  MATCH (tp)<-[:HAS_TOPIC]-(e:Entry)
  WHERE """
        + where
        + """
  RETURN e
}
"""
    )


#: The entries of a Bot a set of readers may see, in memory order (pinned first, then
#: ``orderKey`` descending, then ``id``). Candidates come from the ``entry_audience`` index,
#: one seek per audience key the reader holds (``$keys``: ``person:<id>``, each
#: ``channel:<id>``, ``bot``), or from a topic of the filter (_candidates), never from a filter
#: over the pool. ``$statuses`` picks active only or history too; ``$tags`` (all-of) narrows the
#: list. Returns ciphertext, as one list in one record (the driver decodes one list far faster
#: than many records).
_LIST_OF_KEYS: Final[LiteralString] = (
    _candidates(
        """  UNWIND keys AS key
  MATCH (e:Entry) USING INDEX e:Entry(botId, audienceKey, memoryRank)
  WHERE e.botId = $botId AND e.audienceKey = key AND e.memoryRank < $top AND """
        + _LISTED
        + "\n",
        "e.memoryRank < $top AND " + _LISTED,
    )
    + _IN_ORDER
)

#: Where a page's entry must be: after the one at ``$afterRank`` / ``$afterId`` in memory order.
#: (Ties on the rank are a CASE, not an OR: the planner splits an OR into two seeks whose union
#: loses the index order, and then sorts every visible entry — measured 1 s at 100k.)
_AFTER: Final[LiteralString] = (
    "e.memoryRank <= $afterRank AND CASE WHEN e.memoryRank = $afterRank THEN e.id > $afterId ELSE true END"
)


def _page_walk(label: LiteralString) -> LiteralString:
    """A page's walk of the ``label`` entries of the reader's keys: each key's seek stops at
    ``$limit`` visible entries in index order, so a page costs the same at any depth of the pool."""
    return (
        """  UNWIND keys AS key
  CALL (key, readers, org) {
    MATCH (e:"""
        + label
        + """) USING INDEX e:"""
        + label
        + """(botId, audienceKey, memoryRank)
    WHERE e.botId = $botId AND e.audienceKey = key AND """
        + _AFTER
        + " AND "
        + _LISTED
        + """
    RETURN e ORDER BY e.botId DESC, e.audienceKey DESC, e.memoryRank DESC, e.id LIMIT $limit
  }
"""
    )


_FIRST_OF_PAGE: Final[LiteralString] = "WITH e ORDER BY e.memoryRank DESC, e.id LIMIT $limit\n"

#: One page of _LIST_OF_KEYS: the first ``$limit`` entries after the one at ``$afterRank`` /
#: ``$afterId`` in memory order (``$top`` / ``''`` for the first page).
_PAGE_OF_KEYS: Final[LiteralString] = (
    _candidates(_page_walk("Entry"), _AFTER + " AND " + _LISTED) + _FIRST_OF_PAGE + _IN_ORDER
)

#: The first ``$limit`` in memory order of a Bot's active preferences every reader may see (D9.17:
#: the entries with the topic ``preferences``, labelled ``:Preference`` while they have it,
#: ``graph.entries``), under the shared lock, in one statement: a page's walk over
#: ``entry_preference_audience`` (botId, audienceKey, memoryRank) — one seek per key the reader
#: holds, each stopping at ``$limit`` visible preferences — so neither the Bot's other entries nor
#: its older preferences are read (a tag filter read every visible entry).
LOCKED_PREFERENCES: Final[LiteralString] = (
    READ_LOCK
    + "WITH m\n"
    + readers_now("m, ")
    + "WITH m, readers, org, "
    + HELD_KEYS
    + " AS keys\nCALL (readers, org, keys) {\n"
    + _page_walk("Preference")
    + "  RETURN e\n}\n"
    + _FIRST_OF_PAGE
    + _IN_ORDER
)

#: GET memory in one statement: the shared lock and the caller as a reader (LOCK_AND_READER),
#: then — only when that person reads the Bot (``usesBot``) — _LIST_OF_KEYS for them, seeking
#: their own keys (see ``reader_keys``). ``entries`` is empty otherwise; the caller raises.
_LOCK_READER_AND: Final[LiteralString] = (
    _LOCK_AND_READER_HEAD
    + """CALL (reader) {
  WITH reader WHERE reader IS NOT NULL AND reader.usesBot
  WITH [reader] AS readers, $org AS org, reader.atoms AS keys"""
)
LOCK_READER_AND_LIST: Final[LiteralString] = (
    _LOCK_READER_AND + _LIST_OF_KEYS + "}\nRETURN version, reader, entries\n"
)

#: LOCK_READER_AND_LIST for one page (see _PAGE_OF_KEYS).
LOCK_READER_AND_PAGE: Final[LiteralString] = (
    _LOCK_READER_AND + _PAGE_OF_KEYS + "}\nRETURN version, reader, entries\n"
)


class ReaderAndEntriesRow(TypedDict):
    """LOCK_READER_AND_LIST, LOCK_READER_AND_PAGE: ``entries`` is empty unless ``reader`` uses the Bot."""

    version: int
    reader: ReaderMap | None
    entries: list[EntryMap]


async def shared_lock(tx: AsyncManagedTransaction, *, bot_id: str) -> int | None:
    """Take the shared lock of a Bot's memory (the first statement of every read); its version."""
    record = await single(tx, SHARED_LOCK, VersionRow, botId=bot_id)
    return None if record is None else int(record["version"])


async def bump_version(tx: AsyncManagedTransaction, *, bot_id: str) -> int | None:
    """Take the exclusive lock of a Bot's memory (the first statement of every change) and bump its version."""
    record = await single(tx, BUMP_VERSION, VersionRow, botId=bot_id)
    return None if record is None else int(record["version"])


def reader_keys(readers: list[ReaderMap]) -> list[str]:
    """Index keys to seek: those of the reader with the fewest (an entry must pass every reader)."""
    if not readers:
        return []
    return list(min((r["atoms"] for r in readers), key=len))


class PreferencesParams(TypedDict):
    """LOCKED_PREFERENCES' parameters."""

    botId: str
    org: str
    readers: list[ReaderMap]
    keys: list[str]
    statuses: list[str]
    tags: list[str]
    afterRank: int
    afterId: str
    limit: int


def preferences_params(*, bot_id: str, org: str, readers: list[ReaderMap], limit: int) -> PreferencesParams:
    """LOCKED_PREFERENCES' parameters: the first page of the active entries tagged ``preferences``."""
    return {
        "botId": bot_id,
        "org": org,
        "readers": readers,
        "keys": reader_keys(readers),
        "statuses": ["active"],
        "tags": ["preferences"],
        "afterRank": TOP_RANK,
        "afterId": "",
        "limit": limit,
    }


async def locked_preferences(
    tx: QueryTarget, *, bot_id: str, org: str, readers: list[ReaderMap], limit: int
) -> list[EntryMap]:
    """LOCKED_PREFERENCES: the first ``limit`` in memory order of the Bot's active preferences
    that every one of ``readers`` may see."""
    params = preferences_params(bot_id=bot_id, org=org, readers=readers, limit=limit)
    record = await single(tx, LOCKED_PREFERENCES, EntriesRow, **params)
    return [] if record is None else record["entries"]


async def lock_reader_and_list(
    tx: QueryTarget,
    *,
    bot_id: str,
    person_id: str,
    org: str,
    statuses: list[str],
    tags: list[str],
    page: tuple[int, tuple[int, str] | None] | None = None,
    topic_seek_max: int = TOPIC_SEEK_MAX,
) -> ReaderAndEntriesRow | None:
    """LOCK_READER_AND_LIST: ``{version, reader, entries}``, or None when the Bot has no memory.
    With ``page`` — ``(limit, after)``, ``after`` the (memoryRank, id) of the entry before the
    page or None for the first — one page of them (LOCK_READER_AND_PAGE). A filter on a topic
    with at most ``topic_seek_max`` entries reads them from the topic (-1: never; the tests
    compare the two ways)."""
    params = {
        "botId": bot_id,
        "personId": person_id,
        "org": org,
        "top": TOP_RANK,
        "topicSeekMax": topic_seek_max,
    }
    if page is None:
        return await single(
            tx, LOCK_READER_AND_LIST, ReaderAndEntriesRow, **params, statuses=statuses, tags=tags
        )
    limit, after = page
    after_rank, after_id = after or (TOP_RANK, "")
    return await single(
        tx,
        LOCK_READER_AND_PAGE,
        ReaderAndEntriesRow,
        **params,
        statuses=statuses,
        tags=tags,
        limit=limit,
        afterRank=after_rank,
        afterId=after_id,
    )
