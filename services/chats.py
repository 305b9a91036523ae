"""Chats and their Items: creating a Chat, who may write to it and who may read it (D9.6), and the
encryption of its Items (E1). Turns and the Items they add: :mod:`services.turns`."""

from __future__ import annotations

from neo4j import AsyncManagedTransaction

from graph import bots as bots_q
from graph import chats as chats_q
from graph import identity
from graph.chats import ChatForRow
from graph.driver import QueryTarget, autocommit, write
from services import idempotency
from services.crypto import Cipher, Kind
from services.domain import Chat, Item, ItemKind, Page, Principal
from services.errors import BadInput, Forbidden, NotFound, ServiceError
from services.idempotency import Key
from services.ids import new_id
from services.runtime import Runtime, now_ms
from services.validation import check_id, check_page


def chat_cipher(rt: Runtime, row: chats_q.ChatKeyRow) -> Cipher:
    """The Cipher of the Chat's Bot (its Items are encrypted with it, E1)."""
    return rt.cipher(row["chat"]["botId"], row["keyMaster"], row["keyWrapped"])


def item_of(row: chats_q.ItemNode, cipher: Cipher) -> Item:
    text = row.get("text")
    return Item(
        id=row["id"],
        chat_id=row["chatId"],
        turn_id=row["turnId"],
        seq=row["seq"],
        kind=ItemKind(row["kind"]),
        text=None if text is None else cipher.decrypt(Kind.ITEM, row["uid"], text),
        app=row.get("app"),
        speaker_id=row.get("speakerId"),
        created_at=row["createdAt"],
        said_at=row.get("saidAt", row["createdAt"]),
        time_zone=row.get("timeZone"),
    )


def require_writer(principal: Principal, row: chats_q.ChatForRow | None, what: str) -> None:
    """People of the Chat, and platform tokens of its organization, may write to it."""
    if row is None:
        raise NotFound(f"{what} not found")
    if principal.kind == "platform" and principal.organization_id == row["chat"]["organizationId"]:
        return
    if principal.kind == "person" and row["isPerson"]:
        return
    raise NotFound(f"{what} not found")


async def create_chat(
    rt: Runtime,
    principal: Principal,
    bot_id: str,
    *,
    channel_id: str | None,
    review: bool,
    owner_id: str | None,
    key: Key | None = None,
) -> Chat:
    """A private chat (no channel), a group chat (with a channel) or a review chat, owned by a person.

    A platform token names the owner (a person of its organization); a person owns their own chats.
    The owner must use the Bot: it is owned by or linked into their organization and they hold a grant.
    ``key``: the caller's idempotency key: sent again with the same request, the Chat it created
    is read again and none is created.
    """
    check_id(bot_id, "botId")
    if principal.kind == "person":
        assert principal.person_id is not None
        if owner_id not in (None, principal.person_id):
            raise Forbidden("a person creates chats only for themselves")
        owner_id = principal.person_id
    elif principal.kind == "platform":
        if owner_id is None:
            raise BadInput("a platform token must name the chat's owner", field="ownerId")
        check_id(owner_id, "ownerId")
    else:
        raise Forbidden("chats are created by people or platforms")
    owner = owner_id
    chat_id = new_id("chat")

    async def work(tx: AsyncManagedTransaction) -> chats_q.ChatNode | None:
        person = await identity.get_person(tx, id=owner)
        if person is None or (
            principal.kind == "platform" and person["organizationId"] != principal.organization_id
        ):
            raise NotFound("person not found")
        org_id = await bots_q.bot_org_for_person(tx, bot_id=bot_id, person_id=owner)
        if org_id is None:
            raise NotFound("bot not found")
        if await bots_q.grant_of(tx, bot_id=bot_id, person_id=owner) is None:
            raise Forbidden("the owner has no grant on this Bot")
        if channel_id is not None:
            channel = await identity.get_channel(tx, id=check_id(channel_id, "channelId"))
            if channel is None or channel["organizationId"] != org_id:
                raise NotFound("channel not found")
            if owner not in channel["memberIds"]:
                raise Forbidden("the owner of a group chat must be a member of its channel")
        await idempotency.claim(tx, rt, key, resource_id=chat_id)
        return await chats_q.create_chat(
            tx,
            id=chat_id,
            bot_id=bot_id,
            owner_id=owner,
            organization_id=org_id,
            channel_id=channel_id,
            review=review,
            now=now_ms(),
        )

    async def create() -> Chat:
        row = await write(rt.driver, work)
        assert row is not None
        return Chat.of(row)

    async def again(created: idempotency.Created) -> Chat:
        """The Chat created, as it stands now."""
        row = await autocommit(
            rt.driver,
            lambda s: chats_q.chat_for(s, chat_id=created.resource_id, person_id=principal.person_id),
        )
        require_writer(principal, row, "chat")
        assert row is not None
        return Chat.of(row["chat"])

    return await idempotency.once(rt, key, create, again)


def _checked_ids(ids: list[str], field: str) -> tuple[list[str], dict[str, BadInput]]:
    """The distinct well-formed ids, in order, and the error of each malformed one."""
    valid: dict[str, None] = {}
    errors: dict[str, BadInput] = {}
    for chat_id in ids:
        try:
            valid[check_id(chat_id, field)] = None
        except BadInput as exc:
            errors[chat_id] = exc
    return list(valid), errors


def _readable(principal: Principal, row: chats_q.ChatForRow | None) -> bool:
    """Only the Chat's people read it (D9.6): its owner, or a current member of its channel."""
    return row is not None and principal.kind == "person" and bool(row["isPerson"])


#: What a platform token of the Chat's organization is told when it asks for the people's view.
PLATFORM_READS = (
    "platform tokens read a chat through /v1/chats/{id}/memory/context, …/has-entries, "
    "…/validate-references and …/search (GraphQL: context, hasEntries, validateReferences and "
    "search with chatId); messages need the person token of a chat member"
)


def _unreadable(principal: Principal, row: ChatForRow | None) -> ServiceError:
    """NOT_FOUND (no existence oracle), except for a platform token of the Chat's own organization:
    FORBIDDEN, saying what it may call instead (D9.26)."""
    of_its_org = row is not None and row["chat"]["organizationId"] == principal.organization_id
    if principal.kind == "platform" and of_its_org:
        return Forbidden(PLATFORM_READS)
    return NotFound("chat not found")


async def readable_chat(tx: QueryTarget, principal: Principal, chat_id: str) -> chats_q.ChatForRow:
    """In ``tx``: the Chat with its Bot's key when the caller is one of its people (D9.6); else
    NOT_FOUND (a platform token of its organization: FORBIDDEN, saying what it may call)."""
    check_id(chat_id, "chatId")
    row = await chats_q.chat_for(tx, chat_id=chat_id, person_id=principal.person_id)
    if row is None or not _readable(principal, row):
        raise _unreadable(principal, row)
    return row


async def _chats_for(rt: Runtime, principal: Principal, chat_ids: list[str]) -> dict[str, ChatForRow]:
    """``chats_for`` of the valid ids, one auto-commit statement (none for no id)."""
    if not chat_ids:
        return {}
    return await autocommit(
        rt.driver, lambda s: chats_q.chats_for(s, chat_ids=chat_ids, person_id=principal.person_id)
    )


async def get_chats(
    rt: Runtime, principal: Principal, chat_ids: list[str]
) -> list[Chat | ServiceError | None]:
    """:func:`get_chat` of each id, in one statement: the Chat, None, the id's BAD_INPUT, or for a
    platform token of the Chat's organization FORBIDDEN (what it may call instead)."""
    valid, errors = _checked_ids(chat_ids, "id")
    found = await _chats_for(rt, principal, valid)
    result: list[Chat | ServiceError | None] = []
    for chat_id in chat_ids:
        row = found.get(chat_id)
        if chat_id in errors:
            result.append(errors[chat_id])
        elif row is not None and _readable(principal, row):
            result.append(Chat.of(row["chat"]))
        else:
            refused = _unreadable(principal, row)
            result.append(refused if isinstance(refused, Forbidden) else None)
    return result


async def get_chat(rt: Runtime, principal: Principal, chat_id: str) -> Chat | None:
    """The Chat if the caller is one of its people (D9.6), else None (no existence oracle); a
    platform token of the Chat's organization gets FORBIDDEN saying what it may call."""
    (chat,) = await get_chats(rt, principal, [chat_id])
    if isinstance(chat, ServiceError):
        raise chat
    return chat


async def message_pages(
    rt: Runtime, principal: Principal, chat_ids: list[str], *, limit: int, skip: int
) -> list[Page[Item] | ServiceError]:
    """:func:`messages` of each Chat, one page each, in one statement; a Chat the caller may not
    read gives NOT_FOUND (a platform token of its organization FORBIDDEN), a malformed id
    BAD_INPUT (per id); bad paging fails them all."""
    limit, skip = check_page(limit, skip, max_limit=rt.settings.max_page_size)
    valid, errors = _checked_ids(chat_ids, "chatId")
    found = (
        await autocommit(
            rt.driver,
            lambda s: chats_q.chat_pages(
                s, chat_ids=valid, person_id=principal.person_id, skip=skip, limit=limit
            ),
        )
        if valid
        else {}
    )
    result: list[Page[Item] | ServiceError] = []
    for chat_id in chat_ids:
        row = found.get(chat_id)
        if chat_id in errors:
            result.append(errors[chat_id])
        elif row is None or not _readable(principal, row):
            result.append(_unreadable(principal, row))
        else:
            cipher = chat_cipher(rt, row)
            items = tuple(item_of(i, cipher) for i in row["items"])
            result.append(Page(items, int(row["chat"]["nextItemSeq"])))
    return result


async def messages(rt: Runtime, principal: Principal, chat_id: str, *, limit: int, skip: int) -> Page[Item]:
    """The Chat's Items in order, one page; only its people may read them (D9.6)."""
    (page,) = await message_pages(rt, principal, [chat_id], limit=limit, skip=skip)
    if isinstance(page, ServiceError):
        raise page
    return page


async def last_messages(
    rt: Runtime, principal: Principal, chat_id: str, last: int
) -> tuple[Chat, Page[Item]]:
    """The Chat and its last ``last`` Items in order, in one statement, for one of its people
    (D9.6); NOT_FOUND otherwise (a platform token of its organization: FORBIDDEN, as
    :func:`get_chat`)."""
    check_id(chat_id, "chatId")
    row = await autocommit(
        rt.driver, lambda s: chats_q.chat_tail(s, chat_id=chat_id, person_id=principal.person_id, last=last)
    )
    if row is None or not _readable(principal, row):
        raise _unreadable(principal, row)
    cipher = chat_cipher(rt, row)
    items = tuple(item_of(i, cipher) for i in row["items"])
    return Chat.of(row["chat"]), Page(items, int(row["chat"]["nextItemSeq"]))


async def message_counts(rt: Runtime, principal: Principal, chat_ids: list[str]) -> list[int | ServiceError]:
    """How many Items each Chat has, in one statement; errors as :func:`messages`."""
    valid, errors = _checked_ids(chat_ids, "chatId")
    found = await _chats_for(rt, principal, valid)
    result: list[int | ServiceError] = []
    for chat_id in chat_ids:
        row = found.get(chat_id)
        if chat_id in errors:
            result.append(errors[chat_id])
        elif row is None or not _readable(principal, row):
            result.append(_unreadable(principal, row))
        else:
            result.append(int(row["chat"]["nextItemSeq"]))
    return result
