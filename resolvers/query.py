"""Root queries."""

from __future__ import annotations

import strawberry

from botmemory import chats, provisioning
from resolvers.memory import MemoryQuery
from resolvers.memorybot import MemoryBotQuery
from schema.context import Info
from schema.types import Bot, Channel, Chat, Organization, Person


@strawberry.type
class Query(MemoryQuery, MemoryBotQuery):
    @strawberry.field(description="The person of the token.")
    async def me(self, info: Info) -> Person:
        return Person.of(await provisioning.me(info.context.runtime, await info.context.principal()))

    @strawberry.field(
        description="A chat, or null when it is unknown or the caller is not one of its people."
    )
    async def chat(self, info: Info, id: strawberry.ID) -> Chat | None:
        chat = await chats.get_chat(info.context.runtime, await info.context.principal(), str(id))
        return None if chat is None else Chat.of(chat)

    @strawberry.field
    async def organization(self, info: Info, id: strawberry.ID) -> Organization:
        principal = await info.context.principal()
        return Organization.of(await provisioning.get_organization(info.context.runtime, principal, str(id)))

    @strawberry.field
    async def bot(self, info: Info, id: strawberry.ID) -> Bot:
        return Bot.of(
            await provisioning.get_bot(info.context.runtime, await info.context.principal(), str(id))
        )

    @strawberry.field
    async def channel(self, info: Info, id: strawberry.ID) -> Channel:
        principal = await info.context.principal()
        return Channel.of(await provisioning.get_channel(info.context.runtime, principal, str(id)))
