"""Reading a Bot's memory: list, change log, context, hasEntries, validateReferences.

Every read is one transaction that takes the shared Memory lock first (C1, D9.8), applies the
one visibility check of :mod:`graph.access` inside its queries (V10), and decrypts after commit
only the entries it returns (E2).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import access, identity
from graph import memory as memory_q
from graph.driver import autocommit, read, single
from services.auth import require_person
from services.crypto import Cipher
from services.domain import Principal
from services.errors import BadInput, Forbidden, NotFound
from services.runtime import Runtime
from services.validation import check_id

ENTRY_KIND = "entry"
#: Candidates per key of a page of context, and of the first page of its one statement until
#: this process has seen the Bot's lines (see _first_page).
_CONTEXT_PAGE = 64
#: Candidates per key of the second page in context's one statement, read when all of the first
#: fit: up to three pages' worth of entries in one round trip; more are paged in one explicit
#: transaction. Measured with 96 entries returned (1k pool): 9.5 ms, against 10.5 ms paging in an
#: explicit transaction; a second page of three pages' worth cost more than it saved (10.8 vs 10.1).
_CONTEXT_MORE = 2 * _CONTEXT_PAGE
#: The first page holds what is expected to fit with this much to spare; at least _MIN_PAGE.
_PAGE_MARGIN = 1.25
_MIN_PAGE = 8
#: The most entries one page of GET memory holds (``limit``).
MAX_PAGE = 1000
TOPIC = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_TAG = re.compile(r"^(?:[a-z]+:)*[A-Za-z0-9_\-]+$")
_MAX_FILTER_TAGS = 20


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads: people (all must pass, D9.15) in one organization."""

    org: str
    readers: tuple[dict[str, Any], ...]

    @property
    def params(self) -> dict[str, Any]:
        return {"org": self.org, "readers": list(self.readers)}


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    layer: str
    content: str
    tags: tuple[str, ...]
    sources: tuple[dict[str, str], ...]
    status: str
    confidence: float | None
    created_at: int
    updated_at: int
    invalidated_at: int | None

    def json(self) -> dict[str, Any]:
        """The seed's entry shape (D9.19)."""
        body: dict[str, Any] = {
            "id": self.id,
            "layer": self.layer,
            "content": self.content,
            "tags": list(self.tags),
            "sources": [dict(s) for s in self.sources],
            "status": self.status,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
        if self.confidence is not None:
            body["confidence"] = self.confidence
        if self.invalidated_at is not None:
            body["invalidatedAt"] = self.invalidated_at
        return body


@dataclass(frozen=True, slots=True)
class Change:
    version: int
    at: int
    actor: str
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Context:
    text: str
    ids: tuple[str, ...]
    contents: tuple[str, ...] = ()  # the entries' texts, in the order of ``ids``


def decrypt_entry(cipher: Cipher, row: dict[str, Any]) -> Entry:
    return Entry(
        id=row["id"],
        layer=row["layer"],
        content=cipher.decrypt(ENTRY_KIND, row["id"], bytes(row["content"])),
        tags=tuple(row["tags"]),
        sources=tuple(row["sources"]),
        status=row["status"],
        confidence=row.get("confidence"),
        created_at=row["createdAt"],
        updated_at=row["updatedAt"],
        invalidated_at=row.get("invalidatedAt"),
    )


def check_filter_tags(tags: list[str]) -> list[str]:
    if len(tags) > _MAX_FILTER_TAGS:
        raise BadInput(f"at most {_MAX_FILTER_TAGS} tags", field="tags")
    for tag in tags:
        if not _TAG.match(tag) or len(tag) > 200:
            raise BadInput("tags must be topics or OpenBot tags like chat:<id>", field="tags")
    return tags


async def person_reader(
    tx: AsyncManagedTransaction, *, bot_id: str, person_id: str, org: str
) -> dict[str, Any] | None:
    record = await single(tx, access.READER, botId=bot_id, personId=person_id, org=org)
    return None if record is None else record["reader"]


async def user_reader(tx: AsyncManagedTransaction, *, bot_id: str, person_id: str, org: str) -> Reader:
    """That person as the reader of a change they make: they must use the Bot (a grant, D9.1),
    else the same NotFound as an unknown Bot."""
    reader = await person_reader(tx, bot_id=bot_id, person_id=person_id, org=org)
    if reader is None or not reader["usesBot"]:
        raise NotFound("bot not found")
    return Reader(org, (reader,))


async def _cipher_of(rt: Runtime, tx: AsyncManagedTransaction, bot_id: str) -> Cipher:
    cached = rt.keyring.cached(bot_id)
    if cached is not None:
        return cached
    key = await identity.bot_key(tx, id=bot_id)
    if key is None:
        raise NotFound("bot not found")
    return rt.cipher(bot_id, key["master"], key["wrapped"])


async def open_read(
    rt: Runtime, tx: AsyncManagedTransaction, principal: Principal, bot_id: str
) -> tuple[int, Reader, Cipher]:
    """Shared lock first (C1), then the caller as a reader; needs read on the Bot (a grant)."""
    person_id = require_person(principal)
    assert principal.organization_id is not None
    locked = await single(
        tx, memory_q.LOCK_AND_READER, botId=bot_id, personId=person_id, org=principal.organization_id
    )
    return await _as_reader(rt, tx, principal, bot_id, locked)


async def _as_reader(
    rt: Runtime, tx: AsyncManagedTransaction, principal: Principal, bot_id: str, locked: dict[str, Any] | None
) -> tuple[int, Reader, Cipher]:
    """The caller as a reader from the first statement's ``{version, reader}``, or the error:
    404 when the Bot is not theirs to know of, 403 when they know it but may not read it."""
    assert principal.organization_id is not None
    if locked is None or locked["reader"] is None:
        raise NotFound("bot not found")
    version, reader = int(locked["version"]), locked["reader"]
    if not reader["usesBot"]:
        bot = await identity.get_bot(tx, id=bot_id)
        org = principal.organization_id
        if bot is None or (bot["organizationId"] != org and org not in bot["linkedOrganizationIds"]):
            raise NotFound("bot not found")
        raise Forbidden("you need read on this Bot")
    return version, Reader(principal.organization_id, (reader,)), await _cipher_of(rt, tx, bot_id)


async def require_reader(rt: Runtime, principal: Principal, bot_id: str) -> None:
    """Raise unless the caller may read this Bot's memory (a person with a grant, D9.5)."""
    check_id(bot_id, "botId")

    async def work(tx: AsyncManagedTransaction) -> None:
        await open_read(rt, tx, principal, bot_id)

    await read(rt.driver, work)


async def list_entries(
    rt: Runtime, principal: Principal, bot_id: str, tags: list[str]
) -> tuple[list[Entry], int]:
    """GET memory: the entries for the caller in their organization, history included, never retracted."""
    found, version, cipher = await _listing(rt, principal, bot_id, tags, None)
    return [decrypt_entry(cipher, row) for row in found], version


async def list_page(
    rt: Runtime, principal: Principal, bot_id: str, tags: list[str], limit: int, after: str | None
) -> tuple[list[Entry], int, str | None]:
    """One page of ``list_entries``: at most ``limit`` entries after the cursor ``after`` (None:
    from the start), and the cursor of the next page (None after a short, last page). Each page
    is read under its own shared lock, so ``version`` may differ between pages."""
    if not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"limit is between 1 and {MAX_PAGE}", field="limit")
    found, version, cipher = await _listing(rt, principal, bot_id, tags, (limit, _parse_cursor(after)))
    entries = [decrypt_entry(cipher, row) for row in found]
    last = found[-1] if len(found) == limit else None
    return entries, version, None if last is None else _cursor(last["memoryRank"], last["id"])


def _cursor(rank: int, entry_id: str) -> str:
    """An opaque position in memory order: after the entry ``entry_id`` of rank ``rank``."""
    return base64.urlsafe_b64encode(f"{rank}:{entry_id}".encode()).decode().rstrip("=")


def _parse_cursor(after: str | None) -> tuple[int, str] | None:
    if after is None:
        return None
    try:
        if len(after) > 200:
            raise ValueError(after)
        rank, _, entry_id = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)).decode().partition(":")
        check_id(entry_id, "after")
        if not 0 <= int(rank) < memory_q.TOP_RANK:
            raise ValueError(rank)
        return int(rank), entry_id
    except (ValueError, BadInput):
        raise BadInput("after is not a cursor of this listing", field="after") from None


async def _listing(
    rt: Runtime,
    principal: Principal,
    bot_id: str,
    tags: list[str],
    page: tuple[int, tuple[int, str] | None] | None,
) -> tuple[list[dict[str, Any]], int, Cipher]:
    """The rows (ciphertext) of GET memory or of one page of it, the version and the cipher."""
    check_id(bot_id, "botId")
    tags = check_filter_tags(tags)

    person_id, org = require_person(principal), principal.organization_id
    assert org is not None

    async def work(tx: AsyncManagedTransaction) -> tuple[int, list[dict[str, Any]], Cipher]:
        # One statement: the shared lock, the caller as a reader, and what they see (C1).
        locked = await memory_q.lock_reader_and_list(
            tx,
            bot_id=bot_id,
            person_id=person_id,
            org=org,
            statuses=["active", "invalidated"],
            tags=tags,
            page=page,
        )
        version, _, cipher = await _as_reader(rt, tx, principal, bot_id, locked)
        assert locked is not None
        return version, list(locked["entries"]), cipher

    version, found, cipher = await read(rt.driver, work)
    return found, version, cipher


async def change_log(
    rt: Runtime, principal: Principal, bot_id: str, limit: int = MAX_PAGE, before: int | None = None
) -> tuple[list[Change], int, int | None]:
    """The change log restricted to entries the caller may see (V10); rows with none are left out.
    Newest first, ``limit`` rows of versions below ``before`` (None: the latest); also returns the
    ``before`` of the next page (None after the last), so a page may show fewer rows than ``limit``."""
    check_id(bot_id, "botId")
    if not 1 <= limit <= MAX_PAGE:
        raise BadInput(f"limit is between 1 and {MAX_PAGE}", field="limit")
    if before is not None and not 1 <= before < memory_q.TOP_RANK:
        raise BadInput("before is a version of the log", field="before")

    async def work(tx: AsyncManagedTransaction) -> tuple[int, list[Change], int | None]:
        version, reader, _ = await open_read(rt, tx, principal, bot_id)
        log = await memory_q.log_rows(tx, bot_id=bot_id, limit=limit, before=before)
        next_page = log[-1]["version"] if len(log) == limit else None
        all_ids = sorted({i for row in log for i in row["ids"]})
        seen = await memory_q.visible_ids(tx, bot_id=bot_id, ids=all_ids, active_only=False, **reader.params)
        changes = [
            Change(row["version"], row["at"], row["actor"], tuple(i for i in row["ids"] if i in seen))
            for row in log
        ]
        return version, [c for c in changes if c.ids], next_page

    version, changes, next_page = await read(rt.driver, work)
    return changes, version, next_page


async def context(rt: Runtime, bot_id: str, reader: Reader, limit: int) -> Context:
    """Visible active text in memory order, stopping at the first entry that does not fit (N3).

    Lengths are stored, so nothing is decrypted to decide what fits; only returned entries are.
    One statement (LOCKED_CONTEXT) reads up to two pages and usually decides: it takes the shared
    lock first (C1) and runs as an auto-commit transaction, one round trip. When that was not
    enough, the whole read runs again in one explicit transaction, page by page (D9.8).
    """

    def page(tx: AsyncManagedTransaction, after: int, size: int, count: int) -> Awaitable[dict[str, Any]]:
        return memory_q.context_page(
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

    def last(found: dict[str, Any]) -> bool:
        return not found["open"] or found["candidates"] < _CONTEXT_PAGE

    async def work(tx: AsyncManagedTransaction) -> tuple[list[dict[str, Any]], Cipher]:
        used: list[dict[str, Any]] = []
        size, after = 0, memory_q.TOP_RANK
        while True:
            found = await page(tx, after, size, len(used))
            used += found["page"]
            size = int(found["size"])
            if last(found):
                return used, await _cipher_of(rt, tx, bot_id)
            after = used[-1]["rank"]

    first_page = _first_page(rt.line_lengths.mean(bot_id), limit)
    first = await autocommit(
        rt.driver,
        lambda session: memory_q.context(
            session, limit=first_page, more=_CONTEXT_MORE, max_size=limit, bot_id=bot_id, **reader.params
        ),
        write=False,
    )
    cipher = rt.keyring.cached(bot_id)
    if cipher is not None and first["complete"]:
        used = list(first["page"])
    else:
        used, cipher = await read(rt.driver, work)
    contents = cipher.decrypt_all(ENTRY_KIND, [(row["id"], bytes(row["content"])) for row in used])
    text = "\n".join("- " + c for c in contents)
    rt.line_lengths.observe(bot_id, len(text) + 1, len(contents))
    return Context(text, tuple(row["id"] for row in used), tuple(contents))


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
        lambda session: memory_q.has_visible(session, bot_id=bot_id, locked=True, **reader.params),
        write=False,
    )


async def validate_references(rt: Runtime, bot_id: str, reader: Reader, ids: list[str]) -> bool:
    """A saved answer stays valid while every entry it used is still visible and active (N4); no
    decryption. One statement that takes the shared lock first (C1): an auto-commit transaction."""
    if not ids:
        return True
    visible = await autocommit(
        rt.driver,
        lambda session: memory_q.visible_ids(
            session, bot_id=bot_id, ids=ids, active_only=True, locked=True, **reader.params
        ),
        write=False,
    )
    return set(ids) <= visible


async def chat_reader(rt: Runtime, chat_id: str) -> Reader | None:
    """Every reader of an answer in a Chat (D9.15): the owner, or each current channel member."""

    async def work(tx: AsyncManagedTransaction) -> dict[str, Any] | None:
        return await single(tx, access.CHAT_READERS, chatId=chat_id)

    record = await read(rt.driver, work)
    if record is None:
        return None
    return Reader(record["org"], tuple(record["readers"]))


async def person_reader_of(rt: Runtime, bot_id: str, person_id: str, org: str) -> Reader | None:
    async def work(tx: AsyncManagedTransaction) -> dict[str, Any] | None:
        return await person_reader(tx, bot_id=bot_id, person_id=person_id, org=org)

    reader = await read(rt.driver, work)
    return None if reader is None else Reader(org, (reader,))
