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
from typing import Any, TypedDict

from neo4j import AsyncManagedTransaction

from graph import chats as chats_q
from graph.driver import read, single
from services import metrics, pubsub
from services.crypto import Kind
from services.runtime import Runtime, now_ms

log = logging.getLogger("services.turnfeed")

CHANNEL_PATTERN = "botmemory:turns:*"

#: The Chat's people now (D9.6: a private chat's owner, a group chat's current channel members),
#: and which of the subscribers' tokens (``$tokens``) are still live (not revoked, not expired).
CHAT_PEOPLE = """
MATCH (ch:Chat {id: $chatId})
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
OPTIONAL MATCH (p:Person)-[:MEMBER]->(c)
WITH ch, c, collect(p.id) AS members
OPTIONAL MATCH (t:Token)
WHERE t.id IN $tokens AND t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
RETURN CASE WHEN c IS NULL THEN [ch.ownerId] ELSE members END AS people, collect(t.id) AS live
"""


class _ChatPeople(TypedDict):
    people: list[str]
    live: list[str]


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
            pubsub.listen(self.rt.redis, CHANNEL_PATTERN, self._remote, self.ready), name="turnfeed"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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
            try:
                await self.rt.redis.publish(f"botmemory:turns:{chat_id}", json.dumps(message))
            except Exception as exc:  # live-only: the Turn's Items are in the chat for anyone who missed it
                log.warning("a turn event was not announced to other API processes (%s)", type(exc).__name__)

    async def _recheck(self, chat_id: str) -> None:
        """End the streams of people who are no longer people of the Chat, or whose token is gone."""
        subs = self.subscribers.get(chat_id)
        if not subs:
            return
        tokens = sorted({s.token_id for s in subs})
        record = await read(
            self.rt.driver,
            lambda tx: single(tx, CHAT_PEOPLE, _ChatPeople, chatId=chat_id, tokens=tokens, now=now_ms()),
        )
        people: set[str] = set() if record is None else set(record["people"])
        live: set[str] = set() if record is None else set(record["live"])
        for sub in list(subs):
            if sub.person_id not in people or sub.token_id not in live:
                sub.token_gone = sub.token_id not in live
                pubsub.offer(sub, None)
                subs.discard(sub)

    async def _remote(self, message: dict[str, Any]) -> None:
        """An event of another process: ids only; read the Item here."""
        chat_id = str(message["chatId"])
        if message.get("origin") == self.origin or chat_id not in self.subscribers:
            return
        event = TurnEvent(str(message["turnId"]), str(message["kind"]), item_id=message.get("itemId"))
        if event.kind == "ITEM_ADDED" and event.item_id:
            item_id = str(event.item_id)

            async def work(tx: AsyncManagedTransaction) -> _ItemOfChat | None:
                row = await chats_q.chat_for(tx, chat_id=chat_id, person_id=None)
                item = await single(
                    tx,
                    "MATCH (i:Item {uid: $uid}) RETURN i {.*} AS item",
                    chats_q.ItemRow,
                    uid=f"{chat_id}/{item_id}",
                )
                return None if row is None or item is None else {**row, "item": item["item"]}

            found = await read(self.rt.driver, work)
            if found is None:
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
            await self._recheck(chat_id)
        for sub in list(self.subscribers.get(chat_id, ())):
            pubsub.offer(sub, event)
