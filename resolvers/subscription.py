"""Root subscriptions."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import strawberry

from botmemory import memory
from botmemory.errors import Unauthenticated
from schema.context import Info
from schema.memory import MemoryChangeEvent, MemoryEntry


@strawberry.type
class Subscription:
    @strawberry.subscription(description="Changes to entries you may see at delivery time (V10).")
    async def memory_changes(self, info: Info, bot_id: strawberry.ID) -> AsyncGenerator[MemoryChangeEvent]:
        principal = await info.context.principal()
        await memory.require_reader(info.context.runtime, principal, str(bot_id))
        hub = info.context.hub
        person, org, token = principal.person_id, principal.organization_id, principal.token_id
        if hub is None or person is None or org is None or token is None:
            raise Unauthenticated("subscriptions need a person's token")
        async with hub.subscribe(str(bot_id), person, org, token) as sub:
            while True:
                event = await sub.queue.get()
                if event is None:
                    raise Unauthenticated("the token or the read grant is gone")
                yield MemoryChangeEvent(
                    version=event.version, entries=[MemoryEntry.of(e) for e in event.entries]
                )
