"""Turns and their Items: a Turn opened with the input (its actor saved, V3), Items appended to an
open Turn, numbered within the Chat and encrypted (E1), and the Turn completed, which lets its
learning run (L2). Who may write: :func:`services.chats.require_writer`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from neo4j import AsyncManagedTransaction, AsyncSession

from graph import chats as chats_q
from graph import learning
from graph.driver import autocommit, read, write
from services import idempotency
from services.chats import chat_cipher, item_of, require_writer
from services.crypto import Kind
from services.domain import Item, ItemKind, Principal, Turn
from services.errors import BadInput, Conflict, Forbidden
from services.idempotency import Key
from services.ids import new_id
from services.jobs import enqueue_executions, enqueue_summary_if_due
from services.runtime import Runtime, now_ms
from services.validation import check_id, check_said_at, check_text, check_time_zone

MAX_ITEMS_PER_CALL = 100


@dataclass(frozen=True, slots=True)
class NewItem:
    kind: ItemKind
    text: str
    app: str | None = None
    #: When it was said (epoch ms), for history imported; None: now.
    said_at: int | None = None
    #: The IANA time zone a person's message was said in (D9.32); None: the one its Turn's start
    #: was given, else its speaker's.
    time_zone: str | None = None


async def start_turn(
    rt: Runtime,
    principal: Principal,
    chat_id: str,
    text: str,
    *,
    actor_id: str | None,
    notice: bool,
    said_at: int | None = None,
    time_zone: str | None = None,
    allowed: Callable[[], None] | None = None,
    complete: bool = False,
    key: Key | None = None,
) -> Turn:
    """Open a Turn whose first Item is the input; the Turn's actor is saved (V3). ``complete``:
    the Turn is completed in the same transaction (words no reply answers). ``key``: the caller's
    idempotency key: sent again with the same request, the Turn it started is read again
    (``replayed``), as it stands now, and none is started.

    The actor is the person of a person token, or for a platform token a named person of
    the Chat (never anyone else), or a notice. ``said_at``: when the input was said (history
    imported; D9.31), else now; ``time_zone``: where (D9.32), else the actor's own zone.
    ``allowed`` is called once the caller and the actor may write the Chat, before the Turn is
    written (again when the write is retried).
    """
    check_id(chat_id, "chatId")
    text = check_text(text, "input", limit=rt.settings.max_text_chars)
    turn_id, now = new_id("turn"), now_ms()
    check_said_at(said_at, "saidAt", now=now)
    check_time_zone(time_zone, "timeZone")
    if notice and time_zone is not None:
        raise BadInput("only a person's words are said in a time zone, not a notice", field="timeZone")
    if principal.kind == "person":
        if notice or actor_id not in (None, principal.person_id):
            raise Forbidden("a person starts Turns only as themselves")
        actor_id = principal.person_id
    elif principal.kind == "platform":
        if notice == (actor_id is not None):
            raise BadInput("name exactly one of actorId or notice", field="actorId")
        if actor_id is not None:
            check_id(actor_id, "actorId")
    else:
        raise Forbidden("Turns are started by people or platforms")
    actor = actor_id
    kind = ItemKind.NOTICE if actor is None else ItemKind.PERSON_MESSAGE

    async def work(tx: AsyncManagedTransaction) -> tuple[chats_q.TurnNode, int, str | None, int]:
        row = await chats_q.chat_for(tx, chat_id=chat_id, person_id=principal.person_id)
        require_writer(principal, row, "chat")
        assert row is not None
        # A person's own Turn: require_writer found them one of the Chat's people (``isPerson``).
        if (
            actor is not None
            and actor != principal.person_id
            and not await chats_q.is_person_of_chat(tx, chat_id=chat_id, person_id=actor)
        ):
            raise Forbidden("the actor is not a person of this chat")
        await idempotency.claim(tx, rt, key, resource_id=turn_id, chat_id=chat_id)
        if allowed is not None:
            allowed()
        turn_seq, item_seq = await chats_q.allocate_turn(tx, chat_id=chat_id)
        turn, unsummarized, zone = await chats_q.create_turn(
            tx,
            id=turn_id,
            chat_id=chat_id,
            seq=turn_seq,
            actor_kind="notice" if actor is None else "person",
            actor_id=actor,
            items=[_new_row(rt, row, item_seq, kind, text, None, actor, said_at, time_zone)],
            now=now,
            time_zone=time_zone,
        )
        if complete:
            turn, _ = await _complete(tx, turn_id, now)  # nothing confided on it yet: none queued
        return turn, unsummarized, zone, item_seq

    async def create() -> Turn:
        turn, unsummarized, zone, item_seq = await write(rt.driver, work)
        # A history past the threshold is summarized whether or not its Turns were completed: a
        # platform that never completes them (each counts as completed once idle, for learning)
        # left it growing with no summary, and a context pack with a hole before its last messages.
        await enqueue_summary_if_due(rt, chat_id, unsummarized)
        created = turn["createdAt"]
        item = Item(
            f"i-{item_seq}",
            chat_id,
            turn["id"],
            item_seq,
            kind,
            text,
            None,
            actor,
            created,
            created if said_at is None else said_at,
            zone,
        )
        return replace(Turn.of(turn, input=text, enriched_input=text), input_time_zone=zone, input_item=item)

    async def again(created: idempotency.Created) -> Turn:
        return await replayed_turn(rt, principal, created.resource_id)

    return await idempotency.once(rt, key, create, again)


async def replayed_turn(rt: Runtime, principal: Principal, turn_id: str) -> Turn:
    """The Turn a start sent with an idempotency key began, read again with its input as it stands
    now (no words once the Chat's history was deleted, D9.23), for a caller who may still write
    its Chat."""

    async def work(tx: AsyncManagedTransaction) -> tuple[chats_q.TurnForRow | None, chats_q.ItemNode | None]:
        row = await chats_q.turn_for(tx, turn_id=turn_id, person_id=principal.person_id)
        if row is None:
            return None, None
        return row, await chats_q.first_item_of_turn(tx, chat_id=row["chat"]["id"], turn_id=turn_id)

    row, first = await read(rt.driver, work)
    require_writer(principal, row, "chat")
    assert row is not None
    assert first is not None  # a Turn is created with its first Item
    item = item_of(first, chat_cipher(rt, row))
    turn = Turn.of(row["turn"], input=item.text, enriched_input=item.text)
    return replace(turn, input_time_zone=item.time_zone, input_item=item, replayed=True)


def _new_row(
    rt: Runtime,
    row: chats_q.ChatForRow,
    seq: int,
    kind: ItemKind,
    text: str | None,
    app: str | None,
    speaker: str | None,
    said_at: int | None,
    time_zone: str | None = None,
) -> dict[str, Any]:
    """An Item's row (``text`` None: saved without words, as a deleted history leaves it)."""
    chat_id = row["chat"]["id"]
    uid = f"{chat_id}/i-{seq}"
    return {
        "uid": uid,
        "id": f"i-{seq}",
        "seq": seq,
        "kind": kind.value,
        "text": None if text is None else chat_cipher(rt, row).encrypt(Kind.ITEM, uid, text),
        "textLength": 0 if text is None else len(text),
        "app": app,
        "speakerId": speaker,
        "saidAt": said_at,
        "timeZone": time_zone,
    }


def _speaker(kind: ItemKind, turn: chats_q.TurnNode, chat: chats_q.ChatNode, app: str | None) -> str | None:
    if kind is ItemKind.PERSON_MESSAGE:
        if turn["actorKind"] != "person":
            raise BadInput("a notice Turn has no person to speak", field="items.kind")
        return turn.get("actorId")
    if kind in (ItemKind.BOT_MESSAGE, ItemKind.TOOL_CALL):
        return chat["botId"]
    if kind is ItemKind.TOOL_RESULT:
        return f"app:{app}"
    return None


def require_own_turn(principal: Principal, row: chats_q.TurnForRow | None, does: str) -> None:
    """The caller may write in the Turn's Chat (``require_writer``) and, a person, only in their
    own Turn: its person messages are its actor's words (V3) and nobody starts a Turn as someone
    else; in a group chat, Bob completing or confiding on Ann's Turn cut the Bot's reply to her
    short (CONFLICT) and started learning on her half-said words. The platform acts on any."""
    require_writer(principal, row, "turn")
    assert row is not None
    if principal.kind == "person" and row["turn"].get("actorId") != principal.person_id:
        raise Forbidden(f"a person {does} only their own Turns")


async def require_own_turn_first(rt: Runtime, principal: Principal, turn_id: str, does: str) -> None:
    """:func:`require_own_turn`, read on its own before a change locks the Turn (which checks it
    again under the lock): another's Turn is never locked. Locked first, a refusal waited behind
    whatever held the Turn (a completion, learning being recorded), which told a busy Turn from an
    unknown id, and held the Turn's own writers meanwhile (D9.4)."""
    row = await autocommit(
        rt.driver, lambda s: chats_q.turn_for(s, turn_id=turn_id, person_id=principal.person_id)
    )
    require_own_turn(principal, row, does)


async def add_items(
    rt: Runtime,
    principal: Principal,
    turn_id: str,
    items: list[NewItem],
    *,
    made_in_epoch: int | None = None,
    complete: bool = False,
    key: Key | None = None,
) -> list[Item]:
    """Append Items to an open Turn, numbered within the Chat and encrypted (E1). ``made_in_epoch``:
    the Chat's history epoch the Items' words were made from (the built-in runner's reply, made
    of the history it read): when the history was deleted since, they are saved without their
    words (D9.23: work that began before a deletion saves none of them). ``complete``: the Turn
    is completed in the same transaction (:func:`complete_turn`), so the Items are its last.
    ``key``: the caller's idempotency key: sent again with the same request, the Items it added
    are read again, as they stand now, and none is added."""
    check_id(turn_id, "turnId")
    if not items or len(items) > MAX_ITEMS_PER_CALL:
        raise BadInput(f"send between 1 and {MAX_ITEMS_PER_CALL} items", field="items")
    now = now_ms()
    for n, item in enumerate(items):
        check_text(item.text, f"items[{n}].text", limit=rt.settings.max_text_chars)
        check_said_at(item.said_at, f"items[{n}].saidAt", now=now)
        check_time_zone(item.time_zone, f"items[{n}].timeZone")
        if item.time_zone is not None and item.kind is not ItemKind.PERSON_MESSAGE:
            raise BadInput("only a person's message is said in a time zone", field=f"items[{n}].timeZone")
        if (item.kind is ItemKind.TOOL_RESULT) != (item.app is not None):
            raise BadInput("an App tool result, and only it, names its App", field=f"items[{n}].app")
        if item.app is not None:
            check_id(item.app, f"items[{n}].app")

    async def work(
        tx: AsyncManagedTransaction,
    ) -> tuple[list[chats_q.ItemNode], bool, list[learning.Queued]]:
        # Locked: a completeTurn committing meanwhile is seen (its status), never appended to.
        row = await chats_q.turn_for_update(tx, turn_id=turn_id, person_id=principal.person_id)
        require_own_turn(principal, row, "adds Items to")
        assert row is not None
        # Before its status: a first request's commit completes it.
        await idempotency.claim(tx, rt, key, resource_id=turn_id, chat_id=row["chat"]["id"])
        if row["turn"]["status"] != "open":
            raise Conflict("the Turn is already completed")
        actor = row["turn"].get("actorId")
        if (
            actor is not None
            and any(i.kind is ItemKind.PERSON_MESSAGE for i in items)
            and not await chats_q.is_person_of_chat(tx, chat_id=row["chat"]["id"], person_id=actor)
        ):
            # Their words only while they are a person of the Chat (D9.34: removed, or out of its
            # channel): a platform never puts words in the mouth of someone who left.
            raise Forbidden("the Turn's person is no longer a person of this chat")
        first, epoch = await chats_q.allocate_items(tx, chat_id=row["chat"]["id"], count=len(items))
        await idempotency.claimed_item(tx, key, f"i-{first}")
        words = made_in_epoch is None or made_in_epoch == epoch
        new_rows = [
            _new_row(
                rt,
                row,
                first + n,
                i.kind,
                i.text if words else None,
                i.app,
                _speaker(i.kind, row["turn"], row["chat"], i.app),
                i.said_at,
                i.time_zone,
            )
            for n, i in enumerate(items)
        ]
        created = await chats_q.create_items(tx, turn_id=turn_id, items=new_rows, now=now)
        queued: list[learning.Queued] = []
        if complete:
            _, queued = await _complete(tx, turn_id, now)
        return created, words, queued

    async def create() -> list[Item]:
        await require_own_turn_first(rt, principal, turn_id, "adds Items to")
        created, words, queued = await write(rt.driver, work)
        if complete:
            await _completed(rt, created[0]["chatId"], queued)
        return [
            Item(
                c["id"],
                c["chatId"],
                c["turnId"],
                c["seq"],
                ItemKind(c["kind"]),
                i.text if words else None,
                c.get("app"),
                c.get("speakerId"),
                now,
                c.get("saidAt", now),
                c.get("timeZone"),
            )
            for c, i in zip(created, items, strict=True)
        ]

    async def again(created: idempotency.Created) -> list[Item]:
        return (await replayed_items(rt, principal, created, len(items)))[0]

    return await idempotency.once(rt, key, create, again)


async def replayed_items(
    rt: Runtime, principal: Principal, created: idempotency.Created, count: int
) -> tuple[list[Item], str]:
    """The ``count`` Items an addItems sent with an idempotency key added (from ``created.item_id``
    to the Turn ``created.resource_id``), read again as they stand now, for a caller who may still
    add to that Turn; and the Turn's status."""
    assert created.item_id is not None
    first = int(created.item_id.removeprefix("i-"))

    def items(tx: AsyncManagedTransaction, chat_id: str) -> Awaitable[list[chats_q.ItemNode]]:
        return chats_q.items_by_uid(tx, uids=[f"{chat_id}/i-{seq}" for seq in range(first, first + count)])

    found, row = await _turn_with(rt, principal, created.resource_id, items, "adds Items to")
    return found, row["turn"]["status"]


async def turn_items(rt: Runtime, principal: Principal, turn_id: str) -> list[Item]:
    """The Turn's Items as they stand now, for a caller who may add to it."""

    def items(tx: AsyncManagedTransaction, chat_id: str) -> Awaitable[list[chats_q.ItemNode]]:
        return chats_q.items_of_turn(tx, chat_id=chat_id, turn_id=turn_id)

    return (await _turn_with(rt, principal, turn_id, items, "reads the Items of"))[0]


async def _turn_with(
    rt: Runtime,
    principal: Principal,
    turn_id: str,
    items: Callable[[AsyncManagedTransaction, str], Awaitable[list[chats_q.ItemNode]]],
    doing: str,
) -> tuple[list[Item], chats_q.TurnForRow]:
    """Items of a Turn (what ``items`` reads of its Chat), decrypted, and the Turn, read together
    for a caller who may add to it (:func:`require_own_turn`, saying what they were ``doing``)."""

    async def work(tx: AsyncManagedTransaction) -> tuple[chats_q.TurnForRow | None, list[chats_q.ItemNode]]:
        row = await chats_q.turn_for(tx, turn_id=turn_id, person_id=principal.person_id)
        return (None, []) if row is None else (row, await items(tx, row["chat"]["id"]))

    row, found = await read(rt.driver, work)
    require_own_turn(principal, row, doing)
    assert row is not None
    cipher = chat_cipher(rt, row)
    return [item_of(i, cipher) for i in found], row


async def reply_turn(rt: Runtime, principal: Principal, chat_id: str, turn_id: str | None) -> str:
    """The Turn of ``chat_id`` a reply goes to (seed 004's save-a-message, D9.33): ``turn_id``, which
    must be a Turn of that Chat the caller may add to (:func:`require_own_turn`; a completed one
    is refused as :func:`add_items` refuses it), else the Chat's latest open Turn of a person —
    a person's own, for a person (CONFLICT when there is none)."""
    check_id(chat_id, "chatId")
    if turn_id is not None:
        check_id(turn_id, "turnId")

    async def find(s: AsyncSession) -> tuple[chats_q.TurnForRow | None, chats_q.TurnNode | None]:
        if turn_id is not None:
            return await chats_q.turn_for(s, turn_id=turn_id, person_id=principal.person_id), None
        row = await chats_q.chat_for(s, chat_id=chat_id, person_id=principal.person_id)
        require_writer(principal, row, "chat")
        return None, await chats_q.latest_open_turn(s, chat_id=chat_id, person_id=principal.person_id)

    named, latest = await autocommit(rt.driver, find)
    if turn_id is not None:
        if named is not None and named["chat"]["id"] != chat_id:
            named = None  # a Turn of another Chat is not found in this one
        require_own_turn(principal, named, "adds Items to")
        return turn_id
    if latest is None:
        raise Conflict("the chat has no open Turn to reply in: a person's message starts one")
    return latest["id"]


async def complete_turn(rt: Runtime, principal: Principal, turn_id: str) -> Turn:
    """Mark a Turn completed (idempotent); this is what lets its learning run (L2)."""
    check_id(turn_id, "turnId")
    now = now_ms()

    async def work(tx: AsyncManagedTransaction) -> tuple[chats_q.TurnNode, list[learning.Queued]]:
        row = await chats_q.turn_for(tx, turn_id=turn_id, person_id=principal.person_id)
        require_own_turn(principal, row, "completes")
        return await _complete(tx, turn_id, now)

    turn, queued = await write(rt.driver, work)
    await _completed(rt, turn["chatId"], queued)
    return Turn.of(turn)


async def _complete(
    tx: AsyncManagedTransaction, turn_id: str, now: int
) -> tuple[chats_q.TurnNode, list[learning.Queued]]:
    """The Turn completed (idempotent) and the executions waiting for it queued (L2), in ``tx``."""
    queued = await learning.queue_turn(tx, turn_id=turn_id, now=now)
    turn = await chats_q.complete_turn(tx, turn_id=turn_id, now=now)
    assert turn is not None  # the caller read it in this transaction
    return turn, queued


async def _completed(rt: Runtime, chat_id: str, queued: list[learning.Queued]) -> None:
    """After a completion commits: its executions sent to the workers, the Chat's summary if due."""
    await enqueue_executions(rt, queued)
    await enqueue_summary_if_due(rt, chat_id)
