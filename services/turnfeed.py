"""Turn events for subscribers of a Chat (``turnEvents``): the built-in runner's reply as it streams.

Reply text streams only to subscribers on the API process that runs the Turn. Other processes
learn of saved Items and of the Turn's end through Redis pub/sub, which carries ids only (E4);
they read the Item themselves. Events never carry the enriched input (D9.16): the person's Item
is their own words. Subscribers are the Chat's people (D9.6) holding a live token, both checked
again on every saved Item.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import chats as chats_q
from graph.driver import read
from services import metrics, pubsub
from services.crypto import Kind
from services.runtime import Runtime, now_ms
from services.tasks import cancel_and_wait

log = logging.getLogger("services.turnfeed")

CHANNEL_PATTERN = "botmemory:turns:*"
#: Where a process says that who may follow Chats may have changed (a channel's members were set,
#: a token was revoked): every API process then checks its subscribers of every Chat again, so a
#: reply streaming meanwhile stops reaching a person removed from its channel at once, not at the
#: next saved Item.
ACCESS_CHANNEL = "botmemory:turns:access"
ACCESS_CHANGED = "ACCESS_CHANGED"


class _ItemOfChat(chats_q.ChatForRow):
    item: chats_q.ItemNode


@dataclass(frozen=True, slots=True)
class TurnEvent:
    turn_id: str
    kind: str  # REPLY_DELTA | ITEM_ADDED | TURN_COMPLETED
    text: str | None = None
    item_id: str | None = None
    item_kind: str | None = None


@dataclass(eq=False, slots=True)
class Subscriber:
    chat_id: str
    person_id: str
    token_id: str
    queue: asyncio.Queue[TurnEvent | None] = field(
        default_factory=lambda: asyncio.Queue[TurnEvent | None](1000)
    )
    #: Set when its queue overflowed: the stream ends (None) instead of skipping an event.
    too_slow: bool = False
    #: Set when its token was revoked or expired: the stream ends (None) as unauthenticated.
    token_gone: bool = False


class TurnHub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.origin = secrets.token_hex(8)
        self.subscribers: dict[str, set[Subscriber]] = {}
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(
            pubsub.listen(
                self.rt.redis,
                CHANNEL_PATTERN,
                self._remote,
                self.ready,
                self._resubscribed,
                silence=self.rt.settings.redis_timeout_seconds,
            ),
            name="turnfeed",
        )

    async def _resubscribed(self) -> None:
        """After every (re)subscription: what was announced while the connection was away is
        lost, a change of who may follow a Chat among it, so every stream here is checked again
        (a person removed meanwhile kept the reply's words streaming to them until the Chat's
        next saved Item)."""
        try:
            await self._recheck(*self.subscribers)
        except Exception as exc:  # the next saved Item of each Chat checks its streams again
            log.warning("the turn streams were not checked again after a reconnect (%s)", type(exc).__name__)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    @contextlib.asynccontextmanager
    async def subscribe(self, chat_id: str, person_id: str, token_id: str) -> AsyncGenerator[Subscriber]:
        sub = Subscriber(chat_id, person_id, token_id)
        self.subscribers.setdefault(chat_id, set()).add(sub)
        metrics.SUBSCRIPTIONS_OPENED.labels("turnEvents").inc()
        try:
            yield sub
        finally:
            subs = self.subscribers.get(chat_id, set())
            subs.discard(sub)
            if not subs:
                self.subscribers.pop(chat_id, None)

    async def publish(self, chat_id: str, event: TurnEvent) -> None:
        """Deliver here with content; tell other processes the ids (deltas stay local)."""
        if event.kind == "ITEM_ADDED":
            await self._recheck(chat_id)
        for sub in list(self.subscribers.get(chat_id, ())):
            pubsub.offer(sub, event)
        if event.kind != "REPLY_DELTA":
            message = {
                "origin": self.origin,
                "chatId": chat_id,
                "turnId": event.turn_id,
                "kind": event.kind,
                "itemId": event.item_id,
            }
            if self.rt.quiet.skips("turn_event"):
                return
            try:
                await self.rt.redis.publish(f"botmemory:turns:{chat_id}", json.dumps(message))
            except Exception as exc:  # live-only: the Turn's Items are in the chat for anyone who missed it
                self.rt.quiet.failed(exc)
                log.warning("a turn event was not announced to other API processes (%s)", type(exc).__name__)

    async def recheck(self, chat_id: str) -> None:
        """End the streams of ``chat_id`` whose person is no longer one of its people, or whose
        token is gone (a stream just registered: what changed before it was)."""
        await self._recheck(chat_id)

    async def _recheck(self, *chat_ids: str) -> None:
        """End the streams of people who are no longer people of their Chat, or whose token is
        gone: the Chats ``chat_ids`` (those followed here), in one statement."""
        # Who follows each Chat now: those who subscribe while the statement runs are not judged
        # by it (their tokens were not asked about; they were checked as they subscribed).
        followed = {c: list(subs) for c in chat_ids if (subs := self.subscribers.get(c))}
        if not followed:
            return
        tokens = {c: sorted({s.token_id for s in subs}) for c, subs in followed.items()}
        found = await read(self.rt.driver, lambda tx: chats_q.chats_people(tx, tokens=tokens, now=now_ms()))
        for chat_id, judged in followed.items():
            record = found.get(chat_id)
            people: set[str] = set() if record is None else set(record["people"])
            live: set[str] = set() if record is None else set(record["live"])
            current = self.subscribers.get(chat_id, set())
            for sub in judged:
                if sub.person_id not in people or sub.token_id not in live:
                    sub.token_gone = sub.token_id not in live
                    pubsub.offer(sub, None)
                    current.discard(sub)

    async def _remote(self, message: dict[str, Any]) -> None:
        """An event of another process: ids only; read the Item here. A change of who may follow
        Chats (from any process, this one included) checks every subscriber again."""
        if message.get("kind") == ACCESS_CHANGED:
            await self._recheck(*self.subscribers)
            return
        chat_id = str(message["chatId"])
        if message.get("origin") == self.origin or chat_id not in self.subscribers:
            return
        event = TurnEvent(str(message["turnId"]), str(message["kind"]), item_id=message.get("itemId"))
        if event.kind == "ITEM_ADDED" and event.item_id:
            item_id = str(event.item_id)

            async def work(tx: AsyncManagedTransaction) -> _ItemOfChat | None:
                row = await chats_q.chat_for(tx, chat_id=chat_id, person_id=None)
                item = await chats_q.item_by_uid(tx, uid=f"{chat_id}/{item_id}")
                return None if row is None or item is None else {**row, "item": item}

            found = await read(self.rt.driver, work)
            if found is None:
                return
            # Who may still follow the Chat is judged before its words are opened: a stream that
            # ends here (its person left the Chat, its token is gone) had them decrypted for
            # nobody (E2), as the local path checks before it delivers.
            await self._recheck(chat_id)
            if not self.subscribers.get(chat_id):
                return
            cipher = self.rt.cipher(found["chat"]["botId"], found["keyMaster"], found["keyWrapped"])
            item = found["item"]
            text = item.get("text")
            event = TurnEvent(
                event.turn_id,
                event.kind,
                None if text is None else cipher.decrypt(Kind.ITEM, item["uid"], text),
                item_id,
                item["kind"],
            )
        for sub in list(self.subscribers.get(chat_id, ())):
            pubsub.offer(sub, event)


async def announce_access_change(rt: Runtime) -> None:
    """Tell every API process that who may follow Chats may have changed (ACCESS_CHANNEL). Not
    announced (Redis down), the streams are still checked again at the next saved Item."""
    try:
        await rt.redis.publish(ACCESS_CHANNEL, json.dumps({"kind": ACCESS_CHANGED}))
    except Exception as exc:
        log.warning("a change of chat access was not announced to the API processes (%s)", type(exc).__name__)
