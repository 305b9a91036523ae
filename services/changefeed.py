"""Memory change events for subscribers of one API process (``memoryChanges``, V10, E4).

Writers publish ``{botId, version, ids}`` on Redis after commit (ids only). Each API process
listens once; per event it runs one batched visibility check for all its local subscribers of
that Bot (current membership, live token), decrypts the union of what anyone may see once,
and hands each subscriber the same immutable entry objects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import changefeed, identity
from graph.driver import autocommit, read
from services import pubsub
from services.memory import Entry, decrypt_entry
from services.runtime import Runtime, now_ms

CHANNEL_PATTERN = "botmemory:changes:*"


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class ChangeEvent:
    """One event for every local subscriber with the same visible entries (compared by identity:
    the transport keys its once-per-event work on it, see ``schema.fanout``)."""

    version: int
    entries: tuple[Entry, ...]


@dataclass(eq=False, slots=True)
class Subscriber:
    key: str
    bot_id: str
    person_id: str
    org: str
    token_id: str
    #: Who reads: one visibility check per distinct identity, however many streams it holds.
    identity: str = field(init=False)
    #: Set when its queue overflowed: the stream ends (None) instead of skipping an event.
    too_slow: bool = False
    queue: asyncio.Queue[ChangeEvent | None] = field(
        default_factory=lambda: asyncio.Queue[ChangeEvent | None](100)
    )

    def __post_init__(self) -> None:
        self.identity = f"{self.person_id}|{self.org}|{self.token_id}"


class ChangeHub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.subscribers: dict[str, dict[str, Subscriber]] = {}
        self._task: asyncio.Task[None] | None = None
        self._counter = 0
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(
            pubsub.listen(self.rt.redis, CHANNEL_PATTERN, self.deliver, self.ready), name="changefeed"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.asynccontextmanager
    async def subscribe(
        self, bot_id: str, person_id: str, org: str, token_id: str
    ) -> AsyncGenerator[Subscriber]:
        self._counter += 1
        sub = Subscriber(f"s{self._counter}", bot_id, person_id, org, token_id)
        self.subscribers.setdefault(bot_id, {})[sub.key] = sub
        try:
            yield sub
        finally:
            subs = self.subscribers.get(bot_id, {})
            subs.pop(sub.key, None)
            if not subs:
                self.subscribers.pop(bot_id, None)

    async def deliver(self, event: dict[str, Any]) -> None:
        """One batched check per event for every local subscriber of the Bot."""
        bot_id, ids, version = str(event["botId"]), [str(i) for i in event["ids"]], int(event["version"])
        local = list(self.subscribers.get(bot_id, {}).values())
        if not local:
            return
        # One check per distinct (person, organization, token), however many streams they hold.
        identities = {s.identity: s for s in local}
        subs = [
            {"key": k, "person": s.person_id, "org": s.org, "token": s.token_id}
            for k, s in identities.items()
        ]
        now = now_ms()

        cipher = self.rt.keyring.cached(bot_id)

        async def work(tx: AsyncManagedTransaction) -> tuple[dict[str, list[str]], list[dict[str, Any]], Any]:
            found, changed = await changefeed.deliveries(tx, bot_id=bot_id, ids=ids, subs=subs, now=now)
            return found, changed, await identity.bot_key(tx, id=bot_id)

        if cipher is not None:  # one statement, the shared lock at its head (C1): auto-commit
            found, changed = await autocommit(
                self.rt.driver,
                lambda session: changefeed.deliveries(session, bot_id=bot_id, ids=ids, subs=subs, now=now),
            )
        else:  # the Bot's key too: both in one explicit transaction
            found, changed, key = await read(self.rt.driver, work)
            if key is None:
                return
            cipher = self.rt.cipher(bot_id, key["master"], key["wrapped"])
        decrypted = {row["id"]: decrypt_entry(cipher, row) for row in changed}  # once per event
        # Per identity: the event (one per distinct visible set), or None = end the subscription
        # (token revoked or read on the Bot lost); absent = nothing to send.
        outcome: dict[str, ChangeEvent | None] = {}
        events: dict[tuple[str, ...], ChangeEvent] = {}
        for ident in identities:
            seen = found.get(ident)
            if seen is None:
                outcome[ident] = None
                continue
            visible = tuple(sorted(i for i in seen if i in decrypted))
            if visible:
                if visible not in events:
                    events[visible] = ChangeEvent(version, tuple(decrypted[i] for i in visible))
                outcome[ident] = events[visible]
        for sub in local:
            if sub.identity in outcome:
                pubsub.offer(sub, outcome[sub.identity])
