"""Root subscriptions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TypeVar
from weakref import WeakKeyDictionary

import strawberry

from schema.context import Info
from schema.memory import MemoryChangeEvent
from schema.types import TurnEvent
from services import chats, memory
from services.changefeed import CaughtUp, ChangeEvent
from services.domain import Principal
from services.errors import BadInput, Forbidden, NotFound, TooSlow, Unauthenticated
from services.runtime import now_ms
from services.validation import check_id

T = TypeVar("T")

#: One GraphQL view per change event, for every local subscriber it goes to (schema.fanout).
_VIEWS: WeakKeyDictionary[ChangeEvent, MemoryChangeEvent] = WeakKeyDictionary()


async def _next(queue: asyncio.Queue[T], principal: Principal) -> T:
    """The stream's next event, while the caller's token lives: at its expiry the stream ends
    UNAUTHENTICATED, as at a revocation (a quiet stream stayed open past it, holding one of the
    connection's operations, until something happened to check it again)."""
    if principal.expires_at is None:
        return await queue.get()
    try:
        async with asyncio.timeout(max(principal.expires_at - now_ms(), 0) / 1000):
            return await queue.get()
    except TimeoutError:
        raise Unauthenticated("invalid, expired or revoked token") from None


def _view_of(event: ChangeEvent) -> MemoryChangeEvent:
    view = _VIEWS.get(event)
    if view is None:
        view = _VIEWS[event] = MemoryChangeEvent.of(event)
    return view


@strawberry.type
class Subscription:
    @strawberry.subscription(
        description="Changes to entries you may see at delivery time (V10), and the ids of entries a "
        "change hid from you (D9.24). With after (the last version you saw), the changes since then "
        "come first, from the log, then the live ones: a reconnecting client misses nothing."
    )
    async def memory_changes(
        self, info: Info, bot_id: strawberry.ID, after: int | None = None
    ) -> AsyncGenerator[MemoryChangeEvent]:
        principal = await info.context.principal()
        await memory.require_reader(info.context.runtime, principal, str(bot_id))
        hub = info.context.hub
        person, org, token = principal.person_id, principal.organization_id, principal.token_id
        if hub is None or person is None or org is None or token is None:
            raise Unauthenticated("subscriptions need a person's token")
        if after is not None and not 0 <= after < 2**53:
            raise BadInput("after is a version of the memory", field="after")
        async with hub.subscribe(str(bot_id), person, org, token) as sub:
            floor = -1  # live events at or below it came in the replay
            if after is not None:
                async for replayed in hub.replay(sub, after):
                    if isinstance(replayed, CaughtUp):
                        floor = replayed.version
                        break
                    if replayed is None:
                        raise Unauthenticated("the token or the read grant is gone")
                    yield MemoryChangeEvent.of(replayed)
            while True:
                event = await _next(sub.queue, principal)
                if event is None and sub.too_slow:
                    raise TooSlow("this subscription fell more than 100 events behind; subscribe again")
                if event is None:
                    raise Unauthenticated("the token or the read grant is gone")
                if event.version > floor:
                    yield _view_of(event)

    @strawberry.subscription(
        description="Events of the chat's Turns run by the built-in runner: the reply as it streams, "
        "saved Items, the end of the Turn. For the chat's people; never the rewritten input."
    )
    async def turn_events(self, info: Info, chat_id: strawberry.ID) -> AsyncGenerator[TurnEvent]:
        principal = await info.context.principal()
        hub = info.context.turn_hub
        if hub is None or principal.person_id is None or principal.token_id is None:
            raise Unauthenticated("subscriptions need a person's token")
        # Checked before the registration too: registered, a stranger's stream made the process
        # read and decrypt the Chat's Items that other processes announced while its check ran
        # (D9.4). Checked again once registered: a removal (or a revoked token) whose re-check of
        # the Chat's followers ran between the first check and the registration ended no stream,
        # and the reply deltas, which are not checked one by one, reached the removed person.
        check_id(str(chat_id), "chatId")
        if await chats.get_chat(info.context.runtime, principal, str(chat_id)) is None:
            raise NotFound("chat not found")
        async with hub.subscribe(str(chat_id), principal.person_id, principal.token_id) as sub:
            chat = await chats.get_chat(info.context.runtime, principal, str(chat_id))
            if chat is None:
                raise NotFound("chat not found")
            await hub.recheck(chat.id)  # the token, now that the stream is registered
            while True:
                event = await _next(sub.queue, principal)
                if event is None and sub.too_slow:
                    raise TooSlow("this subscription fell more than 1,000 events behind; subscribe again")
                if event is None and sub.token_gone:
                    raise Unauthenticated("invalid, expired or revoked token")
                if event is None:
                    raise Forbidden("you are no longer one of the chat's people")
                yield TurnEvent(
                    turn_id=strawberry.ID(event.turn_id),
                    kind=event.kind,
                    text=event.text,
                    item_id=None if event.item_id is None else strawberry.ID(event.item_id),
                    item_kind=event.item_kind,
                )
