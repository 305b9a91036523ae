"""Root queries."""

from __future__ import annotations

import strawberry

from resolvers.memory import MemoryQuery
from resolvers.memorybot import MemoryBotQuery
from schema.context import Info
from schema.types import (
    Bot,
    Channel,
    Chat,
    ChatMeta,
    ChatMetaPage,
    ContextPack,
    Item,
    MemoryContext,
    MetaEntry,
    Organization,
    Person,
    Preference,
)
from services import conversation, provisioning


@strawberry.type
class Query(MemoryQuery, MemoryBotQuery):
    @strawberry.field(description="The person of the token.")
    async def me(self, info: Info) -> Person:
        return Person.of(await provisioning.me(info.context.runtime, await info.context.principal()))

    @strawberry.field(
        description="A chat, or null when it is unknown or the caller is not one of its people "
        "(a platform token of its organization gets FORBIDDEN: it reads memory, not messages, D9.26)."
    )
    async def chat(self, info: Info, id: strawberry.ID) -> Chat | None:
        chat = await info.context.loaders.chat.load(str(id))
        return None if chat is None else Chat.of(chat)

    @strawberry.field(
        description="Summary, the first 20 preferences in memory order, the last 10 messages and "
        "memory, built for the chat's audience (every reader of an answer in it); for the chat's people."
    )
    async def context_pack(self, info: Info, chat_id: strawberry.ID) -> ContextPack:
        pack = await conversation.context_pack(
            info.context.runtime, await info.context.principal(), str(chat_id), info.context.embedder
        )
        return ContextPack(
            chat_id=strawberry.ID(pack.chat_id),
            summary=pack.summary,
            preferences=[Preference(id=strawberry.ID(e.id), content=e.content) for e in pack.preferences],
            last_messages=[Item.of(i) for i in pack.last_messages],
            memory=MemoryContext(text=pack.memory.text, ids=[strawberry.ID(i) for i in pack.memory.ids]),
            meta=[MetaEntry(key=key, text=text) for key, text in pack.meta.items()],
        )

    @strawberry.field(
        description="A chat's conversation meta (seed 004, D9.30), for its people; NOT_FOUND while it "
        "has none (no summary and no message yet)."
    )
    async def chat_meta(self, info: Info, chat_id: strawberry.ID) -> ChatMeta:
        found = await conversation.chat_meta(
            info.context.runtime, await info.context.principal(), str(chat_id)
        )
        return ChatMeta.of(found)

    @strawberry.field(
        description="The conversation meta of your chats that have one, newest chat first (seed 004, "
        "D9.30): `limit` from `skip`, and how many there are."
    )
    async def chat_metas(self, info: Info, limit: int = 50, skip: int = 0) -> ChatMetaPage:
        found, total = await conversation.chat_metas(
            info.context.runtime, await info.context.principal(), limit=limit, skip=skip
        )
        return ChatMetaPage(data=[ChatMeta.of(m) for m in found], total=total)

    @strawberry.field
    async def organization(self, info: Info, id: strawberry.ID) -> Organization:
        principal = await info.context.principal()
        return Organization.of(await provisioning.get_organization(info.context.runtime, principal, str(id)))

    @strawberry.field
    async def bot(self, info: Info, id: strawberry.ID) -> Bot:
        return Bot.of(await info.context.loaders.bot.load(str(id)))

    @strawberry.field(
        description="The Bots you can use: a person's granted Bots in their organization (owned or"
        " linked), a platform token's organization's Bots; by name."
    )
    async def bots(self, info: Info) -> list[Bot]:
        principal = await info.context.principal()
        return [Bot.of(b) for b in await provisioning.usable_bots(info.context.runtime, principal)]

    @strawberry.field
    async def channel(self, info: Info, id: strawberry.ID) -> Channel:
        principal = await info.context.principal()
        return Channel.of(await provisioning.get_channel(info.context.runtime, principal, str(id)))
