"""GraphQL object types, built from the services' domain values."""

from __future__ import annotations

from typing import Annotated, NewType

import strawberry

from schema.context import Info
from services import conversation, domain

Long = NewType("Long", int)

#: The argument every create that a client may send again takes (``services.idempotency``).
IdempotencyKey = Annotated[
    str | None,
    strawberry.argument(
        description="Your key for this request (1 to 255 visible ASCII characters, such as a UUID): "
        "sent again with the same key and arguments within the server's key lifetime (a day by "
        "default), the mutation answers with what "
        "the first one created, as it stands now, and creates nothing; with other arguments it is "
        "BAD_INPUT."
    ),
]


def _parse_long(value: object) -> int:
    """A whole number within 64 bits, as REST takes it: ``int()`` took 1.9 as 1, ``true`` as 1
    and ``" 12 "`` as 12 where REST refuses them (a refusal here is BAD_INPUT)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError("Long is a whole number within 64 bits")
    return value


LONG_SCALAR = strawberry.scalar(
    name="Long",
    serialize=int,
    parse_value=_parse_long,
    description="A 64-bit integer (times are epoch milliseconds).",
)

# The domain enums are the GraphQL enums (registered once, here).
Access = domain.Access
ItemKind = domain.ItemKind
strawberry.enum(Access, name="Access")
strawberry.enum(ItemKind, name="ItemKind")


@strawberry.type
class Organization:
    id: strawberry.ID
    name: str
    bot_memory: bool
    bot_memory_model: str | None
    created_at: Long

    @classmethod
    def of(cls, o: domain.Organization) -> Organization:
        return cls(
            id=strawberry.ID(o.id),
            name=o.name,
            bot_memory=o.bot_memory,
            bot_memory_model=o.bot_memory_model,
            created_at=Long(o.created_at),
        )


@strawberry.type
class Person:
    id: strawberry.ID
    name: str
    organization_id: strawberry.ID
    time_zone: str | None = strawberry.field(
        description="The IANA time zone this person's words are said in (D9.32: what 'yesterday' and "
        "the days they name mean); null: UTC."
    )
    removed_at: Long | None = strawberry.field(
        default=None,
        description="When the admin removed this person from their organization (removePerson); null: a member.",
    )

    @classmethod
    def of(cls, p: domain.Person) -> Person:
        return cls(
            id=strawberry.ID(p.id),
            name=p.name,
            organization_id=strawberry.ID(p.organization_id),
            time_zone=p.time_zone,
            removed_at=None if p.removed_at is None else Long(p.removed_at),
        )


@strawberry.type
class CreatePersonPayload:
    person: Person
    token: str = strawberry.field(description="The person's first API token; shown only this once.")
    token_id: strawberry.ID = strawberry.field(
        description="The id of that token, for revokeToken (by the admin, or the person): without it "
        "a person's first token, the root of every token they issue, could never be revoked."
    )


@strawberry.type
class IssuedToken:
    id: strawberry.ID
    token: str = strawberry.field(description="The secret token; shown only this once.")


@strawberry.type
class TokenRef:
    id: strawberry.ID


@strawberry.type
class Channel:
    id: strawberry.ID
    name: str
    organization_id: strawberry.ID
    member_ids: list[strawberry.ID]
    version: int = strawberry.field(
        description="How many times its members were set: setChannelMembers' `expected`."
    )

    @classmethod
    def of(cls, c: domain.Channel) -> Channel:
        return cls(
            id=strawberry.ID(c.id),
            name=c.name,
            organization_id=strawberry.ID(c.organization_id),
            member_ids=[strawberry.ID(m) for m in c.member_ids],
            version=c.version,
        )


@strawberry.type
class Bot:
    id: strawberry.ID
    name: str
    organization_id: strawberry.ID
    model: str | None
    linked_organization_ids: list[strawberry.ID]

    @classmethod
    def of(cls, b: domain.Bot) -> Bot:
        return cls(
            id=strawberry.ID(b.id),
            name=b.name,
            organization_id=strawberry.ID(b.organization_id),
            model=b.model,
            linked_organization_ids=[strawberry.ID(o) for o in b.linked_organization_ids],
        )


@strawberry.type
class Item:
    id: strawberry.ID = strawberry.field(description="Numbered within its chat: i-1, i-2, …")
    chat_id: strawberry.ID
    turn_id: strawberry.ID
    sequence: int
    kind: ItemKind
    text: str | None = strawberry.field(description="Null once the chat's history is deleted.")
    app: str | None
    speaker_id: str | None
    created_at: Long = strawberry.field(description="When OpenBot saved it.")
    said_at: Long = strawberry.field(
        description="When it was said: the time the platform gave (history imported), else createdAt."
    )
    time_zone: str | None = strawberry.field(
        description="The IANA time zone a person's message was said in (D9.32): the one given for it "
        "or for its Turn's start, else its speaker's when it was saved; null: UTC."
    )

    @classmethod
    def of(cls, i: domain.Item) -> Item:
        return cls(
            id=strawberry.ID(i.id),
            chat_id=strawberry.ID(i.chat_id),
            turn_id=strawberry.ID(i.turn_id),
            sequence=i.seq,
            kind=i.kind,
            text=i.text,
            app=i.app,
            speaker_id=i.speaker_id,
            created_at=Long(i.created_at),
            said_at=Long(i.said_at),
            time_zone=i.time_zone,
        )


@strawberry.type
class Turn:
    id: strawberry.ID
    chat_id: strawberry.ID
    sequence: int
    status: str
    actor_kind: str
    actor_id: strawberry.ID | None
    input: str | None
    enriched_input: str | None = strawberry.field(
        description="The input the Bot should see; only ever returned to the startTurn caller."
    )
    reply: str | None = strawberry.field(description="The built-in runner's reply (sendMessage).")
    created_at: Long
    completed_at: Long | None
    time_zone: str | None = strawberry.field(
        description="The IANA time zone its start was given (D9.32): its actor's messages given none "
        "are said there; null: none given."
    )

    @classmethod
    def of(cls, t: domain.Turn) -> Turn:
        return cls(
            id=strawberry.ID(t.id),
            chat_id=strawberry.ID(t.chat_id),
            sequence=t.seq,
            status=t.status,
            actor_kind=t.actor_kind,
            actor_id=None if t.actor_id is None else strawberry.ID(t.actor_id),
            input=t.input,
            enriched_input=t.enriched_input,
            reply=t.reply,
            created_at=Long(t.created_at),
            completed_at=None if t.completed_at is None else Long(t.completed_at),
            time_zone=t.time_zone,
        )


@strawberry.type
class Chat:
    id: strawberry.ID
    bot_id: strawberry.ID
    organization_id: strawberry.ID
    owner_id: strawberry.ID
    channel_id: strawberry.ID | None
    review: bool
    created_at: Long

    @strawberry.field(description="The chat's Items in order; readable by its people only (D9.6).")
    async def messages(self, info: Info, limit: int = 50, skip: int = 0) -> list[Item]:
        page = await info.context.loaders.messages(limit, skip).load(str(self.id))
        return [Item.of(i) for i in page.items]

    @strawberry.field(description="How many Items the chat has.")
    async def message_count(self, info: Info) -> int:
        return await info.context.loaders.message_count.load(str(self.id))

    @classmethod
    def of(cls, c: domain.Chat) -> Chat:
        return cls(
            id=strawberry.ID(c.id),
            bot_id=strawberry.ID(c.bot_id),
            organization_id=strawberry.ID(c.organization_id),
            owner_id=strawberry.ID(c.owner_id),
            channel_id=None if c.channel_id is None else strawberry.ID(c.channel_id),
            review=c.review,
            created_at=Long(c.created_at),
        )


@strawberry.input
class ItemInput:
    kind: ItemKind
    text: str
    app: str | None = None
    said_at: Long | None = strawberry.field(
        default=None,
        description="When it was said, in epoch milliseconds, for history imported (not in the "
        "future); null: now. Memory learned from it is dated by it.",
    )
    time_zone: str | None = strawberry.field(
        default=None,
        description="The IANA time zone a person's message was said in, such as Europe/Berlin (D9.32); "
        "null: the one its Turn's start was given, else its speaker's.",
    )


@strawberry.type
class TurnEvent:
    turn_id: strawberry.ID
    kind: str = strawberry.field(description="REPLY_DELTA, ITEM_ADDED or TURN_COMPLETED")
    text: str | None = strawberry.field(
        description="Reply text (REPLY_DELTA) or the Item's text (ITEM_ADDED)."
    )
    item_id: strawberry.ID | None
    item_kind: str | None


@strawberry.type
class Preference:
    id: strawberry.ID
    content: str


@strawberry.type
class MemoryContext:
    text: str
    ids: list[strawberry.ID]


@strawberry.type(description="One key of a chat's conversation meta and its text (seed 004, D9.30).")
class MetaEntry:
    key: str
    text: str


@strawberry.input(description="One key of a chat's conversation meta and its text (seed 004, D9.30).")
class MetaEntryInput:
    key: str = strawberry.field(description="1–200 characters; not a message id such as i-3.")
    text: str


@strawberry.type(
    description="Seed 004's conversation meta of a chat (D9.30): its summary — the worker's text "
    "under the key `summary`, or what its owner set — then `i-N` → the text of the latest messages "
    "after it (under ~20,000 characters the summary is these messages alone)."
)
class ChatMeta:
    chat_id: strawberry.ID
    summary: list[MetaEntry]
    version: int = strawberry.field(
        description="Its version (0 before the first summary): send it as `expected` to `setChatMeta`; "
        "a replacement, the worker's compression or a history deletion moves it, never back."
    )

    @classmethod
    def of(cls, meta: conversation.ChatMeta) -> ChatMeta:
        return cls(
            chat_id=strawberry.ID(meta.chat_id),
            summary=[MetaEntry(key=key, text=text) for key, text in meta.summary.items()],
            version=meta.version,
        )


@strawberry.type(description="The conversation meta of the chats you may read that have one, newest first.")
class ChatMetaPage:
    data: list[ChatMeta]
    total: int


@strawberry.type
class ContextPack:
    chat_id: strawberry.ID
    summary: str | None = strawberry.field(description="The rolling summary of the chat's history.")
    preferences: list[Preference] = strawberry.field(
        description="Entries with the topic `preferences` that every reader of the chat may see."
    )
    last_messages: list[Item]
    memory: MemoryContext = strawberry.field(
        description="Memory every reader of the chat may see, in memory order (no rewritten inputs)."
    )
    meta: list[MetaEntry] = strawberry.field(
        description="Seed 004's conversation meta (D9.30): the summary, then `i-N` → the messages "
        "after it, so none between the summary and the last messages is left out."
    )
