"""What the memory Bot is offered (N3, N4, D9.14): ``context`` in memory order, stopping at the
first entry that does not fit and decrypting only what is returned (E2); ``hasEntries``; and
``validateReferences``. Every read takes the shared Memory lock first (C1, D9.8) and applies the
one visibility check of :mod:`graph.access` inside its statement (V10)."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from dataclasses import dataclass

from neo4j import AsyncManagedTransaction

from graph import context as context_q
from graph import memory as memory_q
from graph.driver import autocommit, read
from graph.memory import reader_keys
from services.crypto import Cipher, Kind
from services.memory import Reader, cipher_of
from services.runtime import Runtime

#: Candidates per key of a page of context, and of the first page of its one statement until
#: this process has seen the Bot's lines (see _first_page).
_CONTEXT_PAGE = 64


def reader_scope(bot_id: str, reader: Reader) -> str:
    """What a process keeps per reader of a Bot (a query's vector, the mean length of the lines
    ``context`` gave them) is kept under this: the Bot and the reader's keys. Kept per Bot, one
    reader's questions and lines showed in another's times and results."""
    return bot_id + "\n" + "\n".join(reader_keys(list(reader.readers)))


#: Candidates per key of the second page in context's one statement, read when all of the first
#: fit: up to three pages' worth of entries in one round trip; more are paged in one explicit
#: transaction (bench/README.md has the measurements behind this size).
_CONTEXT_MORE = 2 * _CONTEXT_PAGE


#: The first page holds what is expected to fit with this much to spare; at least _MIN_PAGE.
_PAGE_MARGIN = 1.25


_MIN_PAGE = 8


@dataclass(frozen=True, slots=True)
class Context:
    text: str
    ids: tuple[str, ...]
    contents: tuple[str, ...] = ()  # the entries' texts, in the order of ``ids``
    said_at: tuple[int, ...] = ()  # when each was said (D9.31), in the order of ``ids``


async def context(rt: Runtime, bot_id: str, reader: Reader, limit: int) -> Context:
    """Visible active text in memory order, stopping at the first entry that does not fit (N3).

    Lengths are stored, so nothing is decrypted to decide what fits; only returned entries are.
    One statement (LOCKED_CONTEXT) reads up to two pages and usually decides: it takes the shared
    lock first (C1) and runs as an auto-commit transaction, one round trip. When that was not
    enough, the whole read runs again in one explicit transaction, page by page (D9.8).
    """

    def page(
        tx: AsyncManagedTransaction, after: int, size: int, count: int
    ) -> Awaitable[context_q.ContextPageRow]:
        return context_q.context_page(
            tx,
            bot_id=bot_id,
            after=after,
            limit=_CONTEXT_PAGE,
            size=size,
            count=count,
            max_size=limit,
            locked=after == memory_q.TOP_RANK,  # the shared lock heads the first statement (C1)
            **reader.params,
        )

    def last(found: context_q.ContextPageRow) -> bool:
        return not found["open"] or found["candidates"] < _CONTEXT_PAGE

    async def work(tx: AsyncManagedTransaction) -> tuple[list[context_q.FittingRow], Cipher]:
        used: list[context_q.FittingRow] = []
        size, after = 0, memory_q.TOP_RANK
        while True:
            found = await page(tx, after, size, len(used))
            used += found["page"]
            size = int(found["size"])
            if last(found):
                return used, await cipher_of(rt, bot_id, tx)
            after = used[-1]["rank"]

    scope = reader_scope(bot_id, reader)
    first_page = _first_page(rt.line_lengths.mean(scope), limit)
    first = await autocommit(
        rt.driver,
        lambda session: context_q.context(
            session, limit=first_page, more=_CONTEXT_MORE, max_size=limit, bot_id=bot_id, **reader.params
        ),
    )
    cipher = rt.keyring.cached(bot_id)
    if cipher is not None and first["complete"]:
        used = list(first["page"])
    else:
        used, cipher = await read(rt.driver, work)
    contents = cipher.decrypt_all(Kind.ENTRY, [(row["id"], row["content"]) for row in used])
    text = "\n".join("- " + c for c in contents)
    rt.line_lengths.observe(scope, len(text) + 1, len(contents))
    return Context(
        text, tuple(row["id"] for row in used), tuple(contents), tuple(row["saidAt"] for row in used)
    )


def _first_page(mean_line: float | None, limit: int) -> int:
    """Candidates per key of the first page of context's statement: every candidate costs the
    server a visibility check, so the page holds the lines expected to fit in ``limit`` (by the
    mean length of this Bot's lines so far) with a margin, rather than a fixed number. A page that
    all fits is followed by a second one in the same statement, so a short guess costs time only."""
    if mean_line is None:
        return _CONTEXT_PAGE
    return max(_MIN_PAGE, min(_CONTEXT_MORE, math.ceil(limit / mean_line * _PAGE_MARGIN)))


async def has_entries(rt: Runtime, bot_id: str, reader: Reader) -> bool:
    """True when any active entry is visible to every reader, even if none would fit (N3).
    One statement that takes the shared lock first (C1): an auto-commit transaction."""
    return await autocommit(
        rt.driver,
        lambda session: context_q.has_visible(session, bot_id=bot_id, locked=True, **reader.params),
    )


async def validate_references(rt: Runtime, bot_id: str, reader: Reader, ids: list[str]) -> bool:
    """A saved answer stays valid while every entry it used is still visible and active (N4); no
    decryption. One statement that takes the shared lock first (C1): an auto-commit transaction."""
    if not ids:
        return True
    visible = await autocommit(
        rt.driver,
        lambda session: context_q.visible_ids(
            session, bot_id=bot_id, ids=ids, active_only=True, locked=True, **reader.params
        ),
    )
    return set(ids) <= visible
