"""Root mutations: provisioning (admin), tokens (D9.5) and the platform's chat operations."""

from __future__ import annotations

import time
from typing import Annotated

import strawberry

from learning import enrichment, runner
from resolvers.memory import MemoryMutation
from resolvers.memorybot import MemoryBotMutation
from schema.context import Info
from schema.types import (
    Access,
    Bot,
    Channel,
    Chat,
    ChatMeta,
    CreatePersonPayload,
    IdempotencyKey,
    IssuedToken,
    Item,
    ItemInput,
    Long,
    MetaEntryInput,
    Organization,
    Person,
    TokenRef,
    Turn,
)
from services import chats, conversation, idempotency, provisioning, turns
from services.errors import BadInput


@strawberry.type
class Mutation(MemoryMutation, MemoryBotMutation):
    @strawberry.mutation
    async def create_organization(
        self, info: Info, name: str, idempotency_key: IdempotencyKey = None
    ) -> Organization:
        principal = await info.context.principal()
        key = idempotency.key_of(principal, idempotency_key, "createOrganization", [name])
        return Organization.of(
            await provisioning.create_organization(info.context.runtime, principal, name, key)
        )

    @strawberry.mutation
    async def update_organization(
        self,
        info: Info,
        id: strawberry.ID,
        bot_memory: bool | None = strawberry.UNSET,
        bot_memory_model: str | None = strawberry.UNSET,
    ) -> Organization:
        org = await provisioning.update_organization(
            info.context.runtime,
            await info.context.principal(),
            str(id),
            bot_memory=None if bot_memory is strawberry.UNSET else bot_memory,
            set_model=bot_memory_model is not strawberry.UNSET,
            bot_memory_model=None if bot_memory_model is strawberry.UNSET else bot_memory_model,
        )
        return Organization.of(org)

    @strawberry.mutation(
        description="Set a chat's conversation meta (seed 004, D9.30): its owner only. `create`: only "
        "when it has none yet (else CONFLICT); otherwise only when it has (else NOT_FOUND). The entries "
        "become the chat's summary, which the context pack, the Bot and the next compression read. "
        "`expected`: the meta's `version` you read (CONFLICT when it moved since: another replacement, "
        "the worker's compression, a history deletion)."
    )
    async def set_chat_meta(
        self,
        info: Info,
        chat_id: strawberry.ID,
        summary: list[MetaEntryInput],
        create: bool = False,
        expected: int | None = None,
    ) -> ChatMeta:
        principal = await info.context.principal()  # the caller first: no token, no word on the input
        pairs = {entry.key: entry.text for entry in summary}
        if len(pairs) != len(summary):
            raise BadInput("summary names a key twice", field="summary")
        found = await conversation.set_chat_meta(
            info.context.runtime, principal, str(chat_id), pairs, create=create, expected=expected
        )
        return ChatMeta.of(found)

    @strawberry.mutation
    async def create_person(
        self, info: Info, organization_id: strawberry.ID, name: str, time_zone: str | None = None
    ) -> CreatePersonPayload:
        principal = await info.context.principal()
        person, token_id, token = await provisioning.create_person(
            info.context.runtime, principal, str(organization_id), name, time_zone
        )
        return CreatePersonPayload(person=Person.of(person), token=token, token_id=strawberry.ID(token_id))

    @strawberry.mutation(
        description="Set the IANA time zone your words are said in (such as Europe/Berlin; null: UTC, D9.32): "
        "your Items said from now on keep it, so 'yesterday' and the days you name are read as you live them."
    )
    async def set_time_zone(self, info: Info, time_zone: str | None = None) -> Person:
        principal = await info.context.principal()
        return Person.of(await provisioning.set_time_zone(info.context.runtime, principal, time_zone))

    @strawberry.mutation(description="A person issues another token for themselves (D9.5).")
    async def issue_token(self, info: Info, expires_in_seconds: int | None = None) -> IssuedToken:
        principal = await info.context.principal()
        token_id, token = await provisioning.issue_token(info.context.runtime, principal, expires_in_seconds)
        return IssuedToken(id=strawberry.ID(token_id), token=token)

    @strawberry.mutation(
        description="Remove a person from their organization (admin): out of every channel, no grant on "
        "any Bot, every token of theirs revoked, and never a member, a grantee or a chat's actor again. "
        "What they said and what was learned of it stay. Removed again: the person as they are."
    )
    async def remove_person(self, info: Info, person_id: strawberry.ID) -> Person:
        principal = await info.context.principal()
        return Person.of(await provisioning.remove_person(info.context.runtime, principal, str(person_id)))

    @strawberry.mutation(description="The admin revokes any token; a person revokes their own.")
    async def revoke_token(self, info: Info, token_id: strawberry.ID) -> TokenRef:
        principal = await info.context.principal()
        return TokenRef(
            id=strawberry.ID(await provisioning.revoke_token(info.context.runtime, principal, str(token_id)))
        )

    @strawberry.mutation(description="A platform token of one organization (admin).")
    async def create_platform_token(self, info: Info, organization_id: strawberry.ID) -> IssuedToken:
        principal = await info.context.principal()
        token_id, token = await provisioning.create_platform_token(
            info.context.runtime, principal, str(organization_id)
        )
        return IssuedToken(id=strawberry.ID(token_id), token=token)

    @strawberry.mutation
    async def create_channel(
        self,
        info: Info,
        organization_id: strawberry.ID,
        name: str,
        member_ids: list[strawberry.ID],
        idempotency_key: IdempotencyKey = None,
    ) -> Channel:
        principal = await info.context.principal()
        members = [str(m) for m in member_ids]
        key = idempotency.key_of(
            principal, idempotency_key, "createChannel", [organization_id, name, members]
        )
        channel = await provisioning.create_channel(
            info.context.runtime, principal, str(organization_id), name, members, key
        )
        return Channel.of(channel)

    @strawberry.mutation(
        description="Replace a channel's members (admin). `expected`: the channel's `version` you read "
        "(CONFLICT when its members were set since, nothing changed); without it the list replaces "
        "whatever is there."
    )
    async def set_channel_members(
        self,
        info: Info,
        channel_id: strawberry.ID,
        member_ids: list[strawberry.ID],
        expected: int | None = None,
    ) -> Channel:
        principal = await info.context.principal()
        channel = await provisioning.set_channel_members(
            info.context.runtime, principal, str(channel_id), [str(m) for m in member_ids], expected
        )
        return Channel.of(channel)

    @strawberry.mutation
    async def create_bot(
        self,
        info: Info,
        organization_id: strawberry.ID,
        name: str,
        model: str | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Bot:
        principal = await info.context.principal()
        key = idempotency.key_of(principal, idempotency_key, "createBot", [organization_id, name, model])
        return Bot.of(
            await provisioning.create_bot(
                info.context.runtime, principal, str(organization_id), name, model, key
            )
        )

    @strawberry.mutation
    async def grant_bot(
        self,
        info: Info,
        bot_id: strawberry.ID,
        person_id: strawberry.ID,
        access: Access,
    ) -> Bot:
        principal = await info.context.principal()
        bot = await provisioning.grant_bot(
            info.context.runtime, principal, str(bot_id), str(person_id), access
        )
        return Bot.of(bot)

    @strawberry.mutation
    async def link_bot(self, info: Info, bot_id: strawberry.ID, organization_id: strawberry.ID) -> Bot:
        principal = await info.context.principal()
        return Bot.of(
            await provisioning.link_bot(info.context.runtime, principal, str(bot_id), str(organization_id))
        )

    @strawberry.mutation(description="A private chat, a group chat (with a channel) or a review chat.")
    async def create_chat(
        self,
        info: Info,
        bot_id: strawberry.ID,
        channel_id: strawberry.ID | None = None,
        review: bool = False,
        owner_id: strawberry.ID | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Chat:
        principal = await info.context.principal()
        channel = None if channel_id is None else str(channel_id)
        owner = None if owner_id is None else str(owner_id)
        key = idempotency.key_of(principal, idempotency_key, "createChat", [bot_id, channel, review, owner])
        chat = await chats.create_chat(
            info.context.runtime,
            principal,
            str(bot_id),
            channel_id=channel,
            review=review,
            owner_id=owner,
            key=key,
        )
        return Chat.of(chat)

    @strawberry.mutation(
        description="Open a Turn; the input is saved as its first Item. `enrichedInput` is what "
        "the Bot should see (returned only here)."
    )
    async def start_turn(
        self,
        info: Info,
        chat_id: strawberry.ID,
        input: str,
        actor_id: strawberry.ID | None = None,
        notice: bool = False,
        said_at: Annotated[
            Long | None,
            strawberry.argument(
                description="When the input was said, in epoch milliseconds, for history imported "
                "(not in the future); null: now. Memory learned from it is dated by it."
            ),
        ] = None,
        time_zone: Annotated[
            str | None,
            strawberry.argument(
                description="The IANA time zone the input was said in, such as Europe/Berlin (D9.32): "
                "'yesterday' and the days it names are read there; null: the actor's own."
            ),
        ] = None,
        idempotency_key: IdempotencyKey = None,
    ) -> Turn:
        arrived = time.monotonic()
        principal = await info.context.principal()
        actor = None if actor_id is None else str(actor_id)
        said = None if said_at is None else int(said_at)
        key = idempotency.key_of(
            principal, idempotency_key, "startTurn", [chat_id, input, actor, notice, said, time_zone]
        )
        turn = await enrichment.start_turn(
            info.context.runtime,
            info.context.gateway,
            principal,
            str(chat_id),
            input,
            actor_id=actor,
            notice=notice,
            said_at=said,
            time_zone=time_zone,
            arrived=arrived,
            key=key,
        )
        return Turn.of(turn)

    @strawberry.mutation
    async def add_items(
        self,
        info: Info,
        turn_id: strawberry.ID,
        items: list[ItemInput],
        idempotency_key: IdempotencyKey = None,
    ) -> list[Item]:
        new = [
            turns.NewItem(
                kind=i.kind,
                text=i.text,
                app=i.app,
                said_at=None if i.said_at is None else int(i.said_at),
                time_zone=i.time_zone,
            )
            for i in items
        ]
        principal = await info.context.principal()
        request = [[i.kind.value, i.text, i.app, i.said_at, i.time_zone] for i in new]
        key = idempotency.key_of(principal, idempotency_key, "addItems", [turn_id, request])
        created = await turns.add_items(info.context.runtime, principal, str(turn_id), new, key=key)
        return [Item.of(i) for i in created]

    @strawberry.mutation
    async def complete_turn(self, info: Info, turn_id: strawberry.ID) -> Turn:
        turn = await turns.complete_turn(info.context.runtime, await info.context.principal(), str(turn_id))
        return Turn.of(turn)

    @strawberry.mutation(
        description="Run a whole Turn with the Bot's own chat model (the built-in runner); the reply "
        "also streams to turnEvents subscribers."
    )
    async def send_message(
        self, info: Info, chat_id: strawberry.ID, text: str, idempotency_key: IdempotencyKey = None
    ) -> Turn:
        principal = await info.context.principal()
        key = idempotency.key_of(principal, idempotency_key, "sendMessage", [chat_id, text])
        turn = await runner.send_message(
            info.context.runtime,
            info.context.gateway,
            info.context.turn_hub,
            principal,
            str(chat_id),
            text,
            key,
        )
        return Turn.of(turn)
