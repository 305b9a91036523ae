"""Idempotency keys: a create sent again with the caller's same key gets what the first one
created, read again as it stands now, never a second Turn, message or entry.

A key is its caller's (a person's, an organization's platform, the operator's): the same key of
another caller is another key. A request with a key first looks for it (:func:`earlier`): what
an earlier request with it created is read again, before anything else is done. Else the key is
claimed in the transaction that creates (:func:`claim`): a second request racing with it waits
on the record's uniqueness until the first commits, then raises :class:`Replay` — its own
transaction rolls back having created nothing — and is answered as the first. A key sent with
another request (another operation, or other arguments) is BAD_INPUT, whatever the first one
did. :func:`once` is that protocol around a create and the read of what was created. A record
holds a keyed digest of the request, never its words (E1), and is kept
``idempotency_key_seconds`` (a day): after that the key is new again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Final, TypeVar

from neo4j import AsyncManagedTransaction
from neo4j.exceptions import DriverError, Neo4jError

from graph import idempotency as idempotency_q
from graph.driver import autocommit, write
from graph.idempotency import HoldRow
from services.crypto import Kind
from services.domain import Principal
from services.errors import BadInput, Conflict
from services.ids import new_id
from services.runtime import Runtime, now_ms

#: A key: 1 to 255 visible ASCII characters (a UUID, or any token the client makes).
KEY: Final = re.compile(r"[\x21-\x7e]{1,255}")
#: What the REST routes read the key from.
HEADER: Final = "Idempotency-Key"
#: How long a hold lasts past its last renewal (:func:`in_flight`), and how often it is renewed:
#: a renewal may wait a while for Neo4j and still come before the lease ends.
LEASE_MS: Final = 20_000
RENEW_SECONDS: Final = 5.0

log = logging.getLogger("botmemory.idempotency")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Key:
    """A caller's key for one request."""

    #: The record's id: a digest of whose key it is and the key.
    id: str
    operation: str
    #: The request's arguments with whose key it is (the record's id), as its digest is made of
    #: them (held in memory only): two callers' same request have different digests, so someone
    #: reading the store cannot test another's private Remember for words they guess by sending
    #: them with a key of their own.
    request: str
    #: The arguments alone: what the digest of an older record (no ``scoped``) is made of.
    unscoped: str
    #: This request's own id: the record it claimed is its own while it holds it.
    claim_id: str
    #: Whether the claim also holds the key while the request answers past its transaction
    #: (:func:`in_flight`).
    held: bool = False


def key_of(principal: Principal, key: str | None, operation: str, request: Sequence[object]) -> Key | None:
    """The caller's ``key`` for ``operation`` with its arguments ``request`` (None: sent without
    one)."""
    if key is None:
        return None
    if not KEY.fullmatch(key):
        raise BadInput("an idempotency key is 1 to 255 visible ASCII characters", field="idempotencyKey")
    if principal.kind == "person":
        scope = f"person:{principal.person_id}"
    elif principal.kind == "platform":
        scope = f"org:{principal.organization_id}"
    else:
        scope = "admin"
    record = hashlib.sha256(f"{scope}\x00{key}".encode()).hexdigest()
    unscoped = json.dumps([operation, *request], separators=(",", ":"))
    scoped = json.dumps([record, operation, *request], separators=(",", ":"))
    return Key(record, operation, scoped, unscoped, new_id("claim"))


@dataclass(frozen=True, slots=True)
class Created:
    """What the first request with a key created: a Turn, a Chat or an entry (``resource_id``), the
    Item it answers with (``item_id``), the memory version it made (``version``)."""

    resource_id: str
    item_id: str | None = None
    version: int | None = None

    @classmethod
    def of(cls, found: idempotency_q.ClaimMap) -> Created:
        return cls(found["resourceId"], found["itemId"], found["version"])


class Replay(Exception):
    """Raised in a transaction whose key an earlier request claimed meanwhile (it rolls back)."""

    def __init__(self, created: Created) -> None:
        super().__init__("the idempotency key was claimed")
        self.created = created


def _same(rt: Runtime, key: Key, found: idempotency_q.ClaimMap) -> Created:
    """What ``found`` created, when it is this request's record; BAD_INPUT when it is another's.
    A request whose digest is gone (its Chat's history deleted) or was made under a master key
    no longer known is taken to be this one: the key names it."""
    if found["operation"] == key.operation:
        if found["request"] is None:
            return Created.of(found)
        request = key.request if found.get("scoped") else key.unscoped
        digest = rt.keyring.digest(Kind.REQUEST_DIGEST, request, found["master"])
        if digest is None or digest == found["request"]:
            return Created.of(found)
    raise BadInput("this idempotency key was sent with another request", field="idempotencyKey")


async def earlier(rt: Runtime, key: Key | None) -> Created | None:
    """What an earlier request with ``key`` created (None: none did, or it is past its time)."""
    if key is None:
        return None
    found = await autocommit(rt.driver, lambda s: idempotency_q.find(s, id=key.id, now=now_ms()))
    return None if found is None else _same(rt, key, found)


async def once(
    rt: Runtime,
    key: Key | None,
    create: Callable[[], Awaitable[T]],
    again: Callable[[Created], Awaitable[T]],
) -> T:
    """What ``create`` answers (its transaction claims ``key``: :func:`claim`), or, when an earlier
    request with ``key`` created — found before anything else is done, or claimed while
    ``create``'s transaction waited (:class:`Replay`, that transaction rolled back) — what
    ``again`` reads of it now."""
    if (created := await earlier(rt, key)) is not None:
        return await again(created)
    try:
        return await create()
    except Replay as replay:
        return await again(replay.created)


async def claim(
    tx: AsyncManagedTransaction,
    rt: Runtime,
    key: Key | None,
    *,
    resource_id: str,
    chat_id: str | None = None,
    version: int | None = None,
) -> None:
    """Claim ``key`` for what this request creates (``resource_id``, with the ``version`` when that is
    what it answers; the first Item it adds: :func:`claimed_item`), first thing under the lock
    that orders its writers, before any check a first request's commit would change. Returns when
    the key is new (or this very request claimed it, on a retry of its transaction); raises
    :class:`Replay` when another request with the same arguments claimed it, BAD_INPUT when one
    with others did. ``chat_id``: the Chat whose history deletion drops the request's digest
    (D9.23: its words' digest). Without a key, nothing."""
    if key is None:
        return
    now = now_ms()
    fields = {
        "id": key.id,
        "operation": key.operation,
        "request": rt.keyring.digest(Kind.REQUEST_DIGEST, key.request),
        "scoped": True,
        "master": rt.keyring.current_id,
        "resourceId": resource_id,
        "claimId": key.claim_id,
        "chatId": chat_id,
        "itemId": None,
        "version": version,
        "createdAt": now,
        "expiresAt": now + int(rt.settings.idempotency_key_seconds * 1000),
        "heldBy": key.claim_id if key.held else None,
        "heldUntil": now + LEASE_MS if key.held else None,
    }
    found = await idempotency_q.claim(tx, id=key.id, now=now, fields=fields)
    if found["claimId"] != key.claim_id:
        raise Replay(_same(rt, key, found))


async def claimed_item(tx: AsyncManagedTransaction, key: Key | None, item_id: str) -> None:
    """The first Item the request that claimed ``key`` adds (once its Items are numbered)."""
    if key is not None:
        await idempotency_q.set_item(tx, id=key.id, item_id=item_id)


@asynccontextmanager
async def in_flight(rt: Runtime, key: Key | None) -> AsyncGenerator[Key | None]:
    """``key`` held while an answer runs past its transaction (the built-in runner's reply): the
    key it yields makes the claim hold the record too (``heldBy``, ``heldUntil``), and a lease of
    :data:`LEASE_MS` is renewed every :data:`RENEW_SECONDS` until the answer ends, when it is let
    go. A request sent again meanwhile finds its Turn without a reply and takes the hold over
    (:func:`take_over`) only once its lease ended: CONFLICT while it runs; a process killed
    mid-answer frees it within the lease. The hold is the Neo4j record's, as the claim is, so a
    request with a key needs no more than one without (Redis down, it is answered all the same),
    and no second store can disagree about who holds it."""
    if key is None:
        yield None
        return
    held = replace(key, held=True)
    renewing = asyncio.create_task(_renew(rt, held), name="botmemory-idempotency-lease")
    try:
        yield held
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
        try:  # only its own hold; one it fails to let go runs out with its lease, the answer stands
            await _hold(rt, held, until=None)
        except (Neo4jError, DriverError, OSError) as exc:
            log.warning("an idempotency key's hold was left to run out (%s)", type(exc).__name__)


async def take_over(rt: Runtime, key: Key | None) -> None:
    """Hold ``key``, whose Turn a request that held it left without a reply, before asking again;
    CONFLICT while that request's lease runs (it may still be answering)."""
    if key is None:
        return
    found = await _hold(rt, key, until=now_ms() + LEASE_MS, take_over=True)
    if found is not None and not found["ours"]:
        left = max(1, math.ceil(((found["heldUntil"] or 0) - now_ms()) / 1000))
        raise Conflict(
            "a request with this idempotency key is being answered, or was cut off; "
            f"send it again in {left} s"
        )


async def _hold(rt: Runtime, key: Key, *, until: int | None, take_over: bool = False) -> HoldRow | None:
    return await write(
        rt.driver,
        lambda tx: idempotency_q.hold(
            tx, id=key.id, holder=key.claim_id, now=now_ms(), until=until, take_over=take_over
        ),
    )


async def _renew(rt: Runtime, key: Key) -> None:
    """Renew ``key``'s lease while its answer runs (nothing before its claim made the record)."""
    while True:
        await asyncio.sleep(RENEW_SECONDS)
        try:
            found = await _hold(rt, key, until=now_ms() + LEASE_MS)
        except (Neo4jError, DriverError, OSError) as exc:  # the next renewal tries again
            log.warning("an idempotency key's lease was not renewed (%s)", type(exc).__name__)
            continue
        if found is not None and not found["ours"]:
            log.warning("an idempotency key's lease ran out while its answer ran; another request holds it")
            return
