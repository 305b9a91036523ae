"""The reads that pick what the memory Bot is offered (N3, N4, D9.14): ``context`` pages in memory
order that stop at the first entry that does not fit, ``hasEntries`` and ``validateReferences``;
each seeks the ``entry_active`` index per audience key and applies the one visibility check."""

from __future__ import annotations

from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.access import HELD_KEYS, VISIBLE, IdsRow, ReaderMap, readers_now
from graph.driver import Ciphertext, QueryTarget, single
from graph.entries import IdRow
from graph.memory import READ_LOCK, TOP_RANK, reader_keys

#: The seek of ``context``'s candidates: the ``entry_active`` index (active entries only, in
#: memory order per audience key) gives rank, id and stored length without reading the node —
#: the planner uses a composite index only with a predicate on each of its properties.
ACTIVE_SEEK: Final[LiteralString] = (
    "e.botId = $botId AND e.activeKey = key AND e.contentLength IS NOT NULL AND e.id IS NOT NULL"
    " AND e.memoryRank < "
)

#: The shared lock (C1, D9.8) at the head of a statement that goes on with ``m``.
_LOCKED: Final[LiteralString] = READ_LOCK + "WITH m\n"


def _context_page(
    after: LiteralString,
    limit: LiteralString,
    size: LiteralString,
    count: LiteralString,
    carry: LiteralString = "",
) -> LiteralString:
    """One page of active candidates for ``context`` (N3) in memory order below ``after``: per
    key, an index-ordered seek with at most ``limit``; then the pages of all keys are merged. What
    fits is decided here from the stored lengths (``size`` characters and ``count`` entries used
    before, at most ``$max``; a line costs its length + 2 for "- ", + 1 for the newline before all
    but the first). Binds ``page`` (the candidates as {e, rank, id, length}) and ``fit`` ({size,
    n: how many fit, open: false once one did not}); needs ``readers`` and ``org``. ``limit`` is
    a parameter; ``carry`` (", a, b") names variables the expressions use, kept through the page.
    Of a candidate only its label is read from the node; of an entry that fits, its content.
    Called only at import, to build the named statements below (their text: graph/statements.cypher)."""
    line = "x.length + 2 + CASE WHEN " + count + " + fit.n > 0 THEN 1 ELSE 0 END"
    kept = carry[2:] + ", " if carry else ""
    return (
        "\nUNWIND "
        + HELD_KEYS
        + """ AS key
CALL (key, readers, org"""
        + carry
        + """) {
  MATCH (e:Entry)
  USING INDEX e:Entry(botId, activeKey, memoryRank, contentLength, id)
  WHERE """
        + ACTIVE_SEEK
        + after
        + " AND "
        + VISIBLE
        + """
  RETURN e, e.memoryRank AS rank, e.id AS id, e.contentLength AS length
  ORDER BY e.botId DESC, e.activeKey DESC, e.memoryRank DESC LIMIT """
        + limit
        + """
}
WITH e, rank, id, length"""
        + carry
        + " ORDER BY rank DESC, id LIMIT "
        + limit
        + """
WITH """
        + kept
        + """collect({e: e, rank: rank, id: id, length: length}) AS page
WITH page, reduce(fit = {size: """
        + size
        + """, n: 0, open: true}, x IN page |
  CASE WHEN fit.open AND fit.size + """
        + line
        + """ <= $max
       THEN {size: fit.size + """
        + line
        + """, n: fit.n + 1, open: true}
       ELSE {size: fit.size, n: fit.n, open: false} END) AS fit
"""
    )


#: The entries of a page that fit: id, rank and ciphertext.
_FITTING: Final[LiteralString] = (
    "[x IN page[0..fit.n] | {id: x.id, rank: x.rank, content: x.e.content,"
    " saidAt: coalesce(x.e.saidAt, x.e.createdAt)}]"
)


class FittingRow(TypedDict):
    """An entry that fits (_FITTING)."""

    id: str
    rank: int
    content: Ciphertext
    #: When its newest source was said (D9.31).
    saidAt: int


#: One page (see _context_page) below ``$after`` after ``$size`` characters and ``$count``
#: entries: the entries that fit come back with their ciphertext; ``open`` is false once one did
#: not fit, ``candidates`` tells a full page.
CONTEXT_PAGE: Final[LiteralString] = (
    readers_now()
    + _context_page("$after", "$limit", "$size", "$count")
    + "RETURN "
    + _FITTING
    + " AS page, size(page) AS candidates, fit.open AS open, fit.size AS size\n"
)


class ContextPageRow(TypedDict):
    page: list[FittingRow]
    candidates: int
    open: bool
    size: int


#: ``context`` in one statement, as a read's only statement: the shared lock first (C1), a page
#: of ``$limit`` candidates per key and — only when every one of them fit — a second page of
#: ``$more`` below it, in the same statement. ``complete`` is false when even that was not
#: enough (the caller then pages in one explicit transaction, D9.8).
LOCKED_CONTEXT: Final[LiteralString] = (
    _LOCKED
    + readers_now()
    + "CALL (readers, org) {"
    + _context_page("$after", "$limit", "0", "0")
    + "RETURN "
    + _FITTING
    + """ AS first, fit.open AND size(page) = $limit AS full, fit.size AS firstSize
}
OPTIONAL CALL (readers, org, first, full, firstSize) {
  WITH readers, org, first, firstSize WHERE full"""
    + _context_page("last(first).rank", "$more", "firstSize", "size(first)", carry=", first, firstSize")
    + "RETURN "
    + _FITTING
    + """ AS rest, fit.open AND size(page) = $more AS more
}
RETURN first + coalesce(rest, []) AS page, NOT coalesce(more, false) AS complete
"""
)


class ContextRow(TypedDict):
    page: list[FittingRow]
    complete: bool


HAS_VISIBLE: Final[LiteralString] = (
    readers_now()
    + "UNWIND "
    + HELD_KEYS
    + """ AS key
CALL (key, readers, org) {
  MATCH (e:Entry)
  USING INDEX e:Entry(botId, activeKey, memoryRank, contentLength, id)
  WHERE """
    + ACTIVE_SEEK
    + "$top AND "
    + VISIBLE
    + """
  RETURN e.id AS id LIMIT 1
}
RETURN id LIMIT 1
"""
)


#: Which of ``$ids`` are visible (and active when ``$activeOnly``) — no content read (N4, E2).
VISIBLE_IDS: Final[LiteralString] = (
    readers_now()
    + """UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId}) USING INDEX e:Entry(id)
WHERE (NOT $activeOnly OR e.status = 'active') AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
RETURN collect(e.id) AS ids
"""
)


#: The same reads as the first statement of a read: the shared lock heads them (C1).
LOCKED_CONTEXT_PAGE: Final[LiteralString] = _LOCKED + CONTEXT_PAGE


LOCKED_HAS_VISIBLE: Final[LiteralString] = _LOCKED + HAS_VISIBLE


LOCKED_VISIBLE_IDS: Final[LiteralString] = _LOCKED + VISIBLE_IDS


async def context_page(
    tx: AsyncManagedTransaction,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    after: int,
    limit: int,
    size: int,
    count: int,
    max_size: int,
    locked: bool = False,
) -> ContextPageRow:
    """Of up to ``limit`` visible active candidates ranked below ``after``, the ones that fit
    (id, rank, content), whether all did (``open``), how many candidates there were, the new size.
    ``locked``: take the shared lock first, in the same statement (the first page of a read).

    One record holding a list: the driver decodes one list far faster than many records.
    """
    record = await single(
        tx,
        LOCKED_CONTEXT_PAGE if locked else CONTEXT_PAGE,
        ContextPageRow,
        botId=bot_id,
        org=org,
        readers=readers,
        keys=reader_keys(readers),
        after=after,
        limit=limit,
        size=size,
        count=count,
        max=max_size,
    )
    assert record is not None
    return record


async def context(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    limit: int,
    more: int,
    max_size: int,
) -> ContextRow:
    """LOCKED_CONTEXT: the entries that fit (id, rank, content) in a page of ``limit`` and, when
    all of them fit, a second of ``more``; ``complete`` is false when that was not enough."""
    record = await single(
        tx,
        LOCKED_CONTEXT,
        ContextRow,
        botId=bot_id,
        org=org,
        readers=readers,
        keys=reader_keys(readers),
        after=TOP_RANK,
        limit=limit,
        more=more,
        max=max_size,
    )
    assert record is not None
    return record


async def has_visible(
    tx: QueryTarget, *, bot_id: str, org: str, readers: list[ReaderMap], locked: bool = False
) -> bool:
    """Whether any active entry is visible to every reader; ``locked``: take the shared lock first."""
    record = await single(
        tx,
        LOCKED_HAS_VISIBLE if locked else HAS_VISIBLE,
        IdRow,
        botId=bot_id,
        org=org,
        readers=readers,
        keys=reader_keys(readers),
        top=TOP_RANK,
    )
    return record is not None


async def visible_ids(
    tx: QueryTarget,
    *,
    bot_id: str,
    org: str,
    readers: list[ReaderMap],
    ids: list[str],
    active_only: bool,
    locked: bool = False,
) -> set[str]:
    """Which of ``ids`` are visible; ``locked``: take the shared lock first, in the same statement."""
    record = await single(
        tx,
        LOCKED_VISIBLE_IDS if locked else VISIBLE_IDS,
        IdsRow,
        botId=bot_id,
        org=org,
        readers=readers,
        ids=ids,
        activeOnly=active_only,
    )
    return set() if record is None else set(record["ids"])
