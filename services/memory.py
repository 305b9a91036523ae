"""Reading a Bot's memory: readers, the entry list in pages, the change log.

Every read is one transaction that takes the shared Memory lock first (C1, D9.8), applies the
one visibility check of :mod:`graph.access` inside its queries (V10), and decrypts after commit
only the entries it returns (E2).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import TypedDict

from neo4j import AsyncManagedTransaction

from graph import access
from graph import bots as bots_q
from graph import changefeed as changefeed_q
from graph import context as context_q
from graph import memory as memory_q
from graph.driver import QueryTarget, autocommit, read, single
from services.auth import require_person
from services.crypto import Cipher, Kind
from services.domain import Principal
from services.errors import BadInput, Forbidden, NotFound
from services.runtime import Runtime
from services.validation import check_id

#: The most entries one page of GET memory holds (``limit``).
MAX_PAGE = 1000
TOPIC = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_TAG = re.compile(r"^(?:[a-z]+:)*[A-Za-z0-9_\-]+$")
_MAX_FILTER_TAGS = 20


class ReaderParams(TypedDict):
    """The reader as the keyword arguments of the graph reads."""

    org: str
    readers: list[access.ReaderMap]


@dataclass(frozen=True, slots=True)
class Reader:
    """Who reads: people (all must pass, D9.15) in one organization."""

    org: str
    readers: tuple[access.ReaderMap, ...]
    #: The time zone of a person reading for themselves through ``open_read`` (D9.32: the dates
    #: their own search names are read there); None for UTC, for a Chat's audience, and for the
    #: readers made otherwise (``person_reader_of``, listings), which read no dates.
    time_zone: str | None = field(default=None, compare=False)

    @property
    def params(self) -> ReaderParams:
        return {"org": self.org, "readers": list(self.readers)}


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    layer: str
    content: str
    tags: tuple[str, ...]
    sources: tuple[memory_q.SourceMap, ...]
    status: str
    confidence: float | None
    created_at: int
    updated_at: int
    invalidated_at: int | None
    #: When its newest source was said (D9.31).
    said_at: int
    #: The memory version of the last change that named it (0: no logged change names it).
    changed_version: int = 0


@dataclass(frozen=True, slots=True)
class Change:
    version: int
    at: int
    actor: str
    #: Changed entries the reader may see now.
    ids: tuple[str, ...]
    #: Entries the change hid from the reader, who saw them before it (D9.24).
    removed: tuple[str, ...] = ()


def decrypt_entry(cipher: Cipher, row: memory_q.EntryMap) -> Entry:
    return Entry(
        id=row["id"],
        layer=row["layer"],
        content=cipher.decrypt(Kind.ENTRY, row["id"], row["content"]),
        tags=tuple(row["tags"]),
        sources=tuple(row["sources"]),
        status=row["status"],
        confidence=row.get("confidence"),
        created_at=row["createdAt"],
        updated_at=row["updatedAt"],
        invalidated_at=row.get("invalidatedAt"),
        said_at=row["saidAt"],
        changed_version=row["changedVersion"],
    )


def check_filter_tags(tags: list[str]) -> list[str]:
    if len(tags) > _MAX_FILTER_TAGS:
        raise BadInput(f"at most {_MAX_FILTER_TAGS} tags", field="tags")
    for tag in tags:
        if not _TAG.fullmatch(tag) or len(tag) > 200:
            raise BadInput("tags must be topics or OpenBot tags like chat:<id>", field="tags")
    return tags


async def _reader_row(tx: QueryTarget, *, bot_id: str, person_id: str, org: str) -> access.ReaderRow | None:
    return await single(tx, access.READER, access.ReaderRow, botId=bot_id, personId=person_id, org=org)


async def person_reader(tx: QueryTarget, *, bot_id: str, person_id: str, org: str) -> access.ReaderMap | None:
    record = await _reader_row(tx, bot_id=bot_id, person_id=person_id, org=org)
    return None if record is None else record["reader"]


def _unless_used(record: access.ReaderRow | None) -> access.ReaderMap:
    """The reader of READER's row when they use the Bot; else what every read and change of its
    memory alike tells them, decided from that one row (a second read told another
    organization's Bot from an unknown one by its time, D9.4): NOT_FOUND when the Bot is not
    theirs to know of (unknown, or neither owned by nor linked into their organization),
    FORBIDDEN when they know it and have no grant."""
    if record is None or not record["known"]:
        raise NotFound("bot not found")
    if not record["reader"]["usesBot"]:
        raise Forbidden("you need read on this Bot")
    return record["reader"]


async def user_reader(tx: AsyncManagedTransaction, *, bot_id: str, person_id: str, org: str) -> Reader:
    """That person as the reader of a change they make: they must use the Bot (a grant, D9.1),
    else the error of :func:`_unless_used`."""
    return Reader(org, (_unless_used(await _reader_row(tx, bot_id=bot_id, person_id=person_id, org=org)),))


async def cipher_of(rt: Runtime, bot_id: str, tx: QueryTarget | None = None) -> Cipher:
    """The Bot's data-key cipher (E1): the keyring's, once its data key was unwrapped in this
    process (data keys never change); else its wrapped key is read in ``tx`` or on its own."""
    cached = rt.keyring.cached(bot_id)
    if cached is not None:
        return cached
    if tx is not None:
        key = await bots_q.bot_key(tx, id=bot_id)
    else:
        key = await autocommit(rt.driver, lambda s: bots_q.bot_key(s, id=bot_id))
    if key is None:
        raise NotFound("bot not found")
    return rt.cipher(bot_id, key["master"], key["wrapped"])


async def open_read(
    rt: Runtime, tx: QueryTarget, principal: Principal, bot_id: str
) -> tuple[int, Reader, Cipher]:
    """Shared lock first (C1), then the caller as a reader; needs read on the Bot (a grant).
    In a session (an auto-commit transaction) the lock ends with the statement: for a caller
    whose next statement takes it again."""
    person_id = require_person(principal)
    assert principal.organization_id is not None
    locked = await single(
        tx,
        memory_q.LOCK_AND_READER,
        memory_q.LockAndReaderRow,
        botId=bot_id,
        personId=person_id,
        org=principal.organization_id,
    )
    zone = None if locked is None else locked["timeZone"]
    return await _as_reader(rt, tx, principal, bot_id, locked, zone)


async def _as_reader(
    rt: Runtime,
    tx: QueryTarget,
    principal: Principal,
    bot_id: str,
    locked: memory_q.LockAndReaderRow | memory_q.ReaderAndEntriesRow | None,
    zone: str | None = None,
) -> tuple[int, Reader, Cipher]:
    """The caller as a reader from the first statement's ``{version, reader}``, or the error:
    404 when the Bot is not theirs to know of (the statement has no row for a Bot neither owned
    by nor linked into their organization), 403 when they know it but may not read it."""
    assert principal.organization_id is not None
    if locked is None or locked["reader"] is None:
        raise NotFound("bot not found")
    version, reader = int(locked["version"]), locked["reader"]
    if not reader["usesBot"]:
        raise Forbidden("you need read on this Bot")
    return version, Reader(principal.organization_id, (reader,), zone), await cipher_of(rt, bot_id, tx)


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
) -> tuple[list[memory_q.EntryMap], int, Cipher]:
    """The rows (ciphertext) of GET memory or of one page of it, the version and the cipher."""
    check_id(bot_id, "botId")
    tags = check_filter_tags(tags)

    person_id, org = require_person(principal), principal.organization_id
    assert org is not None

    async def work(tx: QueryTarget) -> tuple[int, list[memory_q.EntryMap], Cipher]:
        # One statement: the shared lock, the caller as a reader, and what they see (C1); an
        # auto-commit transaction (only an error's cause or an uncached data key reads more).
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

    version, found, cipher = await autocommit(rt.driver, work)
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
        log = await changefeed_q.log_rows(tx, bot_id=bot_id, limit=limit, before=before)
        next_page = log[-1]["version"] if len(log) == limit else None
        return version, await readable_changes(tx, bot_id, reader, log), next_page

    version, changes, next_page = await read(rt.driver, work)
    return changes, version, next_page


async def readable_changes(
    tx: AsyncManagedTransaction, bot_id: str, reader: Reader, log: list[changefeed_q.LogRow]
) -> list[Change]:
    """Log rows as one reader may read them (V10, D9.24): the changed entries it may see now and
    the entries each change hid from it; rows with neither are left out. Under the shared lock."""
    all_ids = sorted({i for row in log for i in row["ids"]})
    seen = await context_q.visible_ids(tx, bot_id=bot_id, ids=all_ids, active_only=False, **reader.params)
    lost: dict[int, set[str]] = {}
    for r in await changefeed_q.removed_for(
        tx, bot_id=bot_id, versions=[row["version"] for row in log if row["removed"]], **reader.params
    ):
        lost.setdefault(r["version"], set()).add(r["id"])
    changes: list[Change] = []
    for row in log:
        gone = lost.get(row["version"], set())
        ids = tuple(i for i in row["ids"] if i in seen and i not in gone)
        removed = tuple(i for i in row["removed"] if i in gone)
        if ids or removed:
            changes.append(Change(row["version"], row["at"], row["actor"], ids, removed))
    return changes


async def chat_reader(rt: Runtime, chat_id: str) -> Reader | None:
    """The reader of an answer in a Chat (D9.15), to pass to the statements that check: the owner,
    or the group (``GROUP_SEEK``: its channel and seek keys only, never a proof — each statement
    builds the group and every current member of its channel as one reader under the lock);
    None when it has none."""

    async def work(session: QueryTarget) -> access.ChatReadersRow | None:
        return await single(session, access.CHAT_READERS, access.ChatReadersRow, chatId=chat_id)

    record = await autocommit(rt.driver, work)
    if record is None:
        return None
    return Reader(record["org"], tuple(record["readers"]))


async def person_reader_of(rt: Runtime, bot_id: str, person_id: str, org: str) -> Reader | None:
    async def work(session: QueryTarget) -> access.ReaderMap | None:
        return await person_reader(session, bot_id=bot_id, person_id=person_id, org=org)

    reader = await autocommit(rt.driver, work)
    return None if reader is None else Reader(org, (reader,))


async def require_use(rt: Runtime, bot_id: str, person_id: str, org: str) -> None:
    """The error of :func:`_unless_used` unless the person uses the Bot, read on its own before a
    change does anything slow or takes its lock (D9.4): the change reads it again under the lock
    (a grant may go)."""
    _unless_used(
        await autocommit(rt.driver, lambda s: _reader_row(s, bot_id=bot_id, person_id=person_id, org=org))
    )
