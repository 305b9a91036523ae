"""Domain values handed from the services to the GraphQL and REST adapters."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, Literal, TypeVar

from graph.bots import BotMap
from graph.chats import ChatNode, TurnNode
from graph.identity import ChannelMap, OrganizationNode, PersonMap

T = TypeVar("T")


class Access(Enum):
    READ = "READ"
    WRITE = "WRITE"
    NONE = "NONE"


class ItemKind(Enum):
    PERSON_MESSAGE = "PERSON_MESSAGE"
    BOT_MESSAGE = "BOT_MESSAGE"
    TOOL_CALL = "TOOL_CALL"
    TOOL_RESULT = "TOOL_RESULT"
    NOTICE = "NOTICE"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request: the operator (admin token), a person, or an organization's platform."""

    kind: Literal["admin", "person", "platform"]
    token_id: str | None = None
    person_id: str | None = None
    organization_id: str | None = None
    #: When the token expires (epoch ms; None: never): an open stream ends then.
    expires_at: int | None = None


@dataclass(frozen=True, slots=True)
class Organization:
    id: str
    name: str
    bot_memory: bool
    bot_memory_model: str | None
    created_at: int

    @classmethod
    def of(cls, row: OrganizationNode) -> Organization:
        return cls(
            row["id"], row["name"], bool(row["botMemory"]), row.get("botMemoryModel"), row["createdAt"]
        )


@dataclass(frozen=True, slots=True)
class Person:
    id: str
    name: str
    organization_id: str
    created_at: int
    #: The IANA time zone their words are said in (D9.32); None: UTC.
    time_zone: str | None = None
    #: When they were removed from their organization (None: a member).
    removed_at: int | None = None

    @classmethod
    def of(cls, row: PersonMap) -> Person:
        return cls(
            row["id"],
            row["name"],
            row["organizationId"],
            row["createdAt"],
            row.get("timeZone"),
            row.get("removedAt"),
        )


@dataclass(frozen=True, slots=True)
class Channel:
    id: str
    name: str
    organization_id: str
    member_ids: tuple[str, ...]
    created_at: int
    #: How many times its members were set: ``set_channel_members``' ``expected``.
    version: int = 0

    @classmethod
    def of(cls, row: ChannelMap) -> Channel:
        return cls(
            row["id"],
            row["name"],
            row["organizationId"],
            tuple(row["memberIds"]),
            row["createdAt"],
            row.get("version", 0),
        )


@dataclass(frozen=True, slots=True)
class Bot:
    id: str
    name: str
    organization_id: str
    model: str | None
    linked_organization_ids: tuple[str, ...]
    created_at: int

    @classmethod
    def of(cls, row: BotMap) -> Bot:
        return cls(
            row["id"],
            row["name"],
            row["organizationId"],
            row.get("model"),
            tuple(row.get("linkedOrganizationIds") or ()),
            row["createdAt"],
        )

    def seen_from(self, org: str | None) -> Bot:
        """The Bot as an organization sees it (None: the admin, who sees everything): its owner sees
        every organization it is linked into; a linked organization, only itself among them (which
        others share a Bot is the owner's business, not theirs)."""
        if org is None or org == self.organization_id:
            return self
        return replace(
            self, linked_organization_ids=tuple(o for o in self.linked_organization_ids if o == org)
        )


@dataclass(frozen=True, slots=True)
class Chat:
    id: str
    bot_id: str
    organization_id: str
    owner_id: str
    channel_id: str | None
    review: bool
    created_at: int

    @classmethod
    def of(cls, row: ChatNode) -> Chat:
        return cls(
            row["id"],
            row["botId"],
            row["organizationId"],
            row["ownerId"],
            row.get("channelId"),
            bool(row["review"]),
            row["createdAt"],
        )


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    chat_id: str
    turn_id: str
    seq: int
    kind: ItemKind
    text: str | None
    app: str | None
    speaker_id: str | None
    created_at: int
    #: When it was said: the time the platform gave (history imported), else ``created_at``.
    said_at: int
    #: The IANA time zone a person's message was said in (D9.32): the one given for it or for its
    #: Turn's start, else its speaker's; None: UTC.
    time_zone: str | None = None


@dataclass(frozen=True, slots=True)
class Turn:
    id: str
    chat_id: str
    seq: int
    status: str
    actor_kind: str
    actor_id: str | None
    created_at: int
    completed_at: int | None
    input: str | None = None
    enriched_input: str | None = None
    reply: str | None = None
    #: The Chat's history epoch when the Turn began (D9.23): work on its words saves none of them
    #: once the history was deleted after that.
    history_epoch: int = 0
    #: The entries ``enriched_input`` may draw on: every entry its rewrite was sent, not only those
    #: the model said it used (its text may draw on any). What a model request that carries it
    #: embeds (D9.20: a purge of any of them strips that request, one the model drew on unsaid too).
    drawn_entry_ids: tuple[str, ...] = ()
    #: The time zone ``input`` was said in (D9.32; None: UTC), as the Turn's start saved it.
    input_time_zone: str | None = None
    #: The time zone its start was given (D9.32): its actor's messages without one are said there.
    time_zone: str | None = None
    #: The Item its start saved the input as (set by the start only).
    input_item: Item | None = None
    #: Read again for a start sent again with its idempotency key, not started by it.
    replayed: bool = False

    @classmethod
    def of(cls, row: TurnNode, *, input: str | None = None, enriched_input: str | None = None) -> Turn:
        return cls(
            row["id"],
            row["chatId"],
            row["seq"],
            row["status"],
            row["actorKind"],
            row.get("actorId"),
            row["createdAt"],
            row.get("completedAt"),
            input,
            enriched_input,
            history_epoch=row.get("historyEpoch", 0),
            time_zone=row.get("timeZone"),
        )


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    total: int
