"""Seed 004's save-a-message (``POST /v1/chats/{chatId}/messages``, D9.33) over Turns: a person's message
starts a Turn, its input rewritten for the caller as ``startTurn`` rewrites it (N1, D9.16); the
Bot's reply is added to the Turn it answers and completes it, which lets what the Bot confided on
the Turn be learned (L1, L2) and the Chat's summary be updated when due (DESIGN §6); a notice
starts a notice Turn (a platform's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from learning import enrichment
from learning.gateway import Gateway
from services import idempotency, turns
from services.domain import Item, ItemKind, Principal
from services.errors import BadInput
from services.idempotency import Key
from services.runtime import Runtime, now_ms
from services.validation import check_said_at, check_text

Role = Literal["user", "assistant", "notice"]


@dataclass(frozen=True, slots=True)
class Saved:
    """The message as saved, and its Turn once saved."""

    item: Item
    turn_id: str
    turn_status: str
    #: A person's message with what helps from memory, for the caller only (D9.16); None else.
    enriched_input: str | None


async def save_message(
    rt: Runtime,
    gateway: Gateway,
    principal: Principal,
    chat_id: str,
    text: str,
    *,
    role: Role,
    actor_id: str | None = None,
    turn_id: str | None = None,
    complete: bool | None = None,
    said_at: int | None = None,
    time_zone: str | None = None,
    arrived: float | None = None,
    key: Key | None = None,
) -> Saved:
    """Save ``text`` in the Chat as ``role`` says. ``actor_id``: whose message a platform saves
    (a person of the Chat). ``turn_id``: the Turn a reply answers (else the Chat's latest open
    Turn of a person, the caller's own for a person).
    ``complete``: whether the Turn is completed with it — by default a reply completes its Turn,
    a person's message leaves its own open for the reply. ``key``: the caller's idempotency key:
    sent again with the same request, the message it saved is read again (with its Turn as it
    stands now) and nothing is saved."""
    # What the message is, before where it would go (as startTurn checks its input first).
    check_text(text, "message", limit=rt.settings.max_text_chars)
    check_said_at(said_at, "saidAt", now=now_ms())
    if role == "assistant":
        if actor_id is not None:
            raise BadInput("the Bot's reply has no actor", field="actorId")
        if time_zone is not None:
            raise BadInput("only a person's message is said in a time zone", field="timeZone")
        complete = True if complete is None else complete
        # Before the Turn is sought: the one it answered is completed, and another may be open.
        if (created := await idempotency.earlier(rt, key)) is not None:
            [item], status = await turns.replayed_items(rt, principal, created, 1)
            return Saved(item, created.resource_id, status, None)
        target = await turns.reply_turn(rt, principal, chat_id, turn_id)
        new = turns.NewItem(ItemKind.BOT_MESSAGE, text, said_at=said_at)
        [item] = await turns.add_items(rt, principal, target, [new], complete=complete, key=key)
        return Saved(item, item.turn_id, "completed" if complete else "open", None)
    if turn_id is not None:
        raise BadInput("a person's message or a notice starts a Turn of its own", field="turnId")
    turn = await enrichment.start_turn(
        rt,
        gateway,
        principal,
        chat_id,
        text,
        actor_id=actor_id,
        notice=role == "notice",
        said_at=said_at,
        time_zone=time_zone,
        arrived=arrived,
        complete=bool(complete),
        key=key,
    )
    assert turn.input_item is not None
    return Saved(turn.input_item, turn.id, turn.status, turn.enriched_input if role == "user" else None)
