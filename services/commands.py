"""What people do to memory: Remember, Forget (V11, D9.4), share (V6, D9.3), purge (D9.13, D9.20)
and deleting a Chat's history (V13). All changes go through :func:`apply_changes`, except purge
and history deletion, which remove data and keep their own log row.
"""

from __future__ import annotations

import re
from typing import Final

from neo4j import AsyncManagedTransaction

from graph import bots as bots_q
from graph import changelog, chats, conversation, entries
from graph import memory as memory_q
from graph import purge as purge_q
from graph.driver import read, write
from services import idempotency, sourcegraph
from services.auth import require_person
from services.changes import Applied, Forget, Remember, Share, check_topics
from services.domain import Principal
from services.embedding import Embedder
from services.errors import BadInput, Conflict, Forbidden, NotFound
from services.idempotency import Key
from services.ids import new_id
from services.memory import Entry, Reader, require_use, user_reader
from services.runtime import Runtime, now_ms
from services.validation import check_expected, check_id
from services.writepath import apply_changes, publish_change, require_visible

#: A purge's tag: from:, chat:, org: or channel: and an id (as the tags a filter takes, ``services.memory``).
PURGE_TAG: Final = re.compile(r"(?:from|chat|org|channel):[A-Za-z0-9_\-]{1,200}")


async def _uses_bot(rt: Runtime, principal: Principal, bot_id: str) -> None:
    """NOT_FOUND or FORBIDDEN unless the caller uses the Bot (``services.memory.require_use``),
    read before a change takes its lock (D9.4): a Bot of another organization was locked
    exclusively, its data key unwrapped and the change rolled back before its NOT_FOUND, which an
    unknown Bot answered after one read — the time told them apart, and each such request held
    the other organization's readers and writers."""
    person_id = require_person(principal)
    assert principal.organization_id is not None
    await require_use(rt, bot_id, person_id, principal.organization_id)


async def _reader(tx: AsyncManagedTransaction, principal: Principal, bot_id: str) -> Reader:
    person_id = require_person(principal)
    assert principal.organization_id is not None
    return await user_reader(tx, bot_id=bot_id, person_id=person_id, org=principal.organization_id)


def remember_key(
    principal: Principal, sent: str | None, bot_id: str, content: str, tags: list[str]
) -> Key | None:
    """A Remember's idempotency key (D9.35): the same request over REST and GraphQL."""
    return idempotency.key_of(principal, sent, "remember", [bot_id, content, tags])


def forget_key(principal: Principal, sent: str | None, bot_id: str, entry_id: str) -> Key | None:
    """A Forget's idempotency key (D9.35): the same request over REST and GraphQL."""
    return idempotency.key_of(principal, sent, "forget", [bot_id, entry_id])


async def remember(
    rt: Runtime,
    principal: Principal,
    bot_id: str,
    content: str,
    tags: list[str],
    embedder: Embedder | None = None,
    key: Key | None = None,
) -> tuple[Entry, int]:
    """A pinned entry only the caller sees (``for:person:<you>``), in their organization;
    searchable by its words, and by its meaning with ``embedder`` (design §10). ``key``: the
    caller's idempotency key: sent again with the same request, the entry it created is read
    again (while the caller sees it) with the version that created it, and none is created."""
    person_id = require_person(principal)
    check_id(bot_id, "botId")
    topics = check_topics(tuple(tags), "tags")
    org = principal.organization_id
    assert org is not None
    change = Remember(content=content, person_id=person_id, org=org, topics=topics)

    async def create() -> tuple[Entry, int]:
        # A read of the caller's use of the Bot before anything else (another organization's Bot
        # is never locked), then one statement: the lock, that use again, the entry, the version
        # and the log (with a key, a transaction that claims it too).
        applied = await apply_changes(
            rt,
            bot_id,
            [change],
            "person",
            person=(person_id, org),
            embedder=embedder,
            key=key,
            key_names=change.id,
        )
        tags_out = ("from:" + person_id, "for:person:" + person_id, "org:" + org, *topics)
        at = applied.at
        return Entry(
            change.id, "pinned", content, tags_out, (), "active", None, at, at, None, at, applied.version
        ), applied.version

    async def again(created: idempotency.Created) -> tuple[Entry, int]:
        """The entry created, as the caller sees it now, and the version that created it."""
        return await sourcegraph.entry(rt, principal, bot_id, created.resource_id), _version_of(created)

    return await idempotency.once(rt, key, create, again)


async def forget(
    rt: Runtime, principal: Principal, bot_id: str, entry_id: str, key: Key | None = None
) -> int:
    """Take back the caller's part (V11). Any entry id not for the caller is the same 409 (D9.4);
    an id no entry could have is BAD_INPUT, a Bot the caller does not use NOT_FOUND or FORBIDDEN
    (as GET memory, D9.4). ``key``: the caller's idempotency key: sent again with the same
    request, the version of the first one."""
    person_id = require_person(principal)
    check_id(bot_id, "botId")
    check_id(entry_id, "id")  # no entry has another shape: refusing it tells nothing (D9.4)

    async def precheck(tx: AsyncManagedTransaction) -> None:
        reader = await _reader(tx, principal, bot_id)
        await require_visible(tx, bot_id, reader, entry_id)

    # An unknown Bot, or one the caller does not use, is NOT_FOUND or FORBIDDEN as for Remember;
    # only the entry's own refusal is CONFLICT (it was all CONFLICT, "this entry is not for you").
    await _uses_bot(rt, principal, bot_id)

    async def create() -> int:
        change = Forget(entry_id, person_id)
        applied = await apply_changes(
            rt, bot_id, [change], "person", precheck=precheck, key=key, key_names=entry_id
        )
        return applied.version

    async def again(created: idempotency.Created) -> int:
        return _version_of(created)

    return await idempotency.once(rt, key, create, again)


def _version_of(created: idempotency.Created) -> int:
    assert created.version is not None  # a memory change's key holds the version it made
    return created.version


#: The most tags an audience holds (as many as the model's share may name) and the longest one.
MAX_AUDIENCE: Final = 100
MAX_AUDIENCE_TAG_CHARS: Final = 200


async def share(
    rt: Runtime,
    principal: Principal,
    bot_id: str,
    entry_id: str,
    audience: list[str],
    expected: int | None = None,
) -> Applied:
    """Share an entry more widely: the caller must see it and be one of the people behind it (V6).
    ``expected``: the entry's ``changed_version`` as the caller read it — CONFLICT when a change
    named it since (another share, a forget, its invalidation), so two people sharing it at once
    do not replace each other's audience unseen."""
    person_id = require_person(principal)
    check_id(bot_id, "botId")
    check_id(entry_id, "id")
    check_expected(expected)
    if not 1 <= len(audience) <= MAX_AUDIENCE:
        raise BadInput(f"an audience is 1 to {MAX_AUDIENCE} tags", field="audience")
    for n, tag in enumerate(audience):
        if len(tag) > MAX_AUDIENCE_TAG_CHARS:
            raise BadInput(
                f"an audience tag is at most {MAX_AUDIENCE_TAG_CHARS} characters", field=f"audience[{n}]"
            )

    async def precheck(tx: AsyncManagedTransaction) -> None:
        reader = await _reader(tx, principal, bot_id)
        await require_visible(tx, bot_id, reader, entry_id)
        row = await entries.entry_for_edit(tx, bot_id=bot_id, id=entry_id)
        assert row is not None
        if "from:" + person_id not in row["tags"] and row["author"] != person_id:
            raise Conflict("only the people behind an entry share it")
        if expected is not None and row["changedVersion"] != expected:
            raise Conflict(
                f"the entry changed since you read it (at version {row['changedVersion']}): read it again"
            )

    await _uses_bot(rt, principal, bot_id)
    return await apply_changes(rt, bot_id, [Share(entry_id, tuple(audience))], "person", precheck=precheck)


async def require_owner_writer(tx: AsyncManagedTransaction, principal: Principal, bot_id: str) -> None:
    """Write on a Bot that is not linked: WRITE grant and membership of the owner organization (D9.13)."""
    person_id = require_person(principal)
    bot = await bots_q.get_bot(tx, id=bot_id)
    org = principal.organization_id
    if bot is None or (bot["organizationId"] != org and org not in bot["linkedOrganizationIds"]):
        raise NotFound("bot not found")
    if (
        bot["organizationId"] != org
        or await bots_q.grant_of(tx, bot_id=bot_id, person_id=person_id) != "WRITE"
    ):
        raise Forbidden("you need write on a Bot that is not linked")


async def purge(rt: Runtime, principal: Principal, bot_id: str, tag: str) -> int:
    """Remove every entry with an OpenBot tag ``from:``/``chat:``/``org:``/``channel:`` without reading it."""
    require_person(principal)  # before the Bot is looked at: a platform token learns nothing of it
    check_id(bot_id, "botId")
    if not isinstance(tag, str) or not PURGE_TAG.fullmatch(tag):  # pyright: ignore[reportUnnecessaryIsInstance]
        # A malformed tag matches nothing: refused, not counted as a purge of none (a version and a
        # change row for "from:" or "chat: x" before).
        raise BadInput("purge takes one from:, chat:, org: or channel: tag and an id", field="tag")
    change_id, now = new_id("chg"), now_ms()
    # Read before the lock too (D9.4, as ``_uses_bot``), and again under it.
    await read(rt.driver, lambda tx: require_owner_writer(tx, principal, bot_id))

    async def work(tx: AsyncManagedTransaction) -> tuple[int, Applied]:
        version = await memory_q.bump_version(tx, bot_id=bot_id)
        if version is None:
            raise NotFound("bot not found")
        await require_owner_writer(tx, principal, bot_id)
        purged = await purge_q.purge(tx, bot_id=bot_id, tag=tag)
        if not purged.ids:
            raise _NothingPurged  # rolled back: the version and the log stay as they were
        # The row names no changed entry; its removals are the purged entries and those resting
        # on them, each for the readers who saw it (D9.24).
        _, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor="person",
            entry_ids=[],
            payload=None,
            relabel=purged.above,
            gone=purged.gone,
        )
        return len(purged.ids), Applied(version, (), now, tuple(removed))

    try:
        count, applied = await write(rt.driver, work)
    except _NothingPurged:
        return 0
    await publish_change(rt, bot_id, applied)
    return count


class _NothingPurged(Exception):
    """No entry has the tag: nothing changed, so no version and no change row (one for every
    purge of nothing before)."""


async def delete_chat_history(rt: Runtime, principal: Principal, chat_id: str) -> int:
    """The Chat's owner removes its Items' content; ids and saved rules stay, and so does memory (V13)."""
    person_id = require_person(principal)
    check_id(chat_id, "chatId")

    async def work(tx: AsyncManagedTransaction) -> int:
        row = await chats.chat_for(tx, chat_id=chat_id, person_id=person_id)
        # The owner deletes the history even after leaving a group chat's channel (D9.23).
        owner = row is not None and row["chat"]["ownerId"] == person_id
        if row is None or not (row["isPerson"] or owner):
            raise NotFound("chat not found")
        if not owner:
            raise Forbidden("only the chat's owner deletes its history")
        # The Chat is locked first (DELETE_CHAT_HISTORY), then the summary, as a save locks them.
        items = await purge_q.delete_chat_history(tx, chat_id=chat_id)
        await conversation.delete_summary(tx, chat_id=chat_id)  # the summary is history too
        return items

    return await write(rt.driver, work)
