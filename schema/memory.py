"""GraphQL types of a Bot's memory."""

from __future__ import annotations

import dataclasses
from enum import Enum

import strawberry
from graphql import ExecutionResult

from schema.fanout import OperationKey
from schema.types import Long
from services import memory, sourcegraph
from services.changefeed import ChangeEvent


@strawberry.type
class EntrySource:
    chat: strawberry.ID | None = None
    item: strawberry.ID | None = None
    entry: strawberry.ID | None = None


@strawberry.type(description="An entry found by search, with its relevance (higher is more relevant).")
class SearchHit:
    score: float = strawberry.field(
        description=(
            "Reciprocal-rank fusion of the entry's ranks by meaning and by keywords among the hits"
            " returned, plus a small pinned/recency prior: it counts no entry you cannot see."
        )
    )
    entry: MemoryEntry


@strawberry.type
class MemoryEntry:
    id: strawberry.ID
    layer: str
    content: str
    tags: list[str]
    sources: list[EntrySource]
    status: str
    confidence: float | None
    created_at: Long
    updated_at: Long
    invalidated_at: Long | None
    said_at: Long = strawberry.field(
        description="When its newest source was said (a pinned entry: when it was written)."
    )
    changed_version: Long = strawberry.field(
        description="The memory version of the last change that named this entry (0: no logged "
        "change names it); what shareEntry's expected compares."
    )

    @classmethod
    def of(cls, e: memory.Entry) -> MemoryEntry:
        return cls(
            id=strawberry.ID(e.id),
            layer=e.layer,
            content=e.content,
            tags=list(e.tags),
            sources=[
                EntrySource(
                    chat=_id(s.get("chat")),
                    item=_id(s.get("item")),
                    entry=_id(s.get("entry")),
                )
                for s in e.sources
            ],
            status=e.status,
            confidence=e.confidence,
            created_at=Long(e.created_at),
            updated_at=Long(e.updated_at),
            said_at=Long(e.said_at),
            changed_version=Long(e.changed_version),
            invalidated_at=None if e.invalidated_at is None else Long(e.invalidated_at),
        )


def _id(value: str | None) -> strawberry.ID | None:
    return None if value is None else strawberry.ID(value)


@strawberry.type
class MemoryPage:
    entries: list[MemoryEntry]
    version: int
    next: str | None = strawberry.field(
        default=None, description="With limit: the cursor of the next page (after), null after the last."
    )


@strawberry.type
class MemoryChange:
    version: int
    at: Long
    actor: str
    ids: list[strawberry.ID] = strawberry.field(description="Changed entries you may see now.")
    removed: list[strawberry.ID] = strawberry.field(
        description="Entries this change hid from you: you saw them before it (ids only)."
    )


@strawberry.type
class MemoryLog:
    changes: list[MemoryChange]
    version: int
    next: int | None = strawberry.field(
        default=None, description="The before of the next page (older changes), null after the last."
    )


@strawberry.type
class RememberPayload:
    entry: MemoryEntry
    version: int


@strawberry.type
class VersionPayload:
    version: int


@strawberry.type
class PurgePayload:
    removed: int


@strawberry.type
class HistoryDeleted:
    items: int = strawberry.field(description="Items whose content was removed; ids and rules stay (V13).")


@strawberry.type
class MemoryChangeEvent:
    version: int
    entries: list[MemoryEntry] = strawberry.field(description="Changed entries you may see now.")
    removed: list[strawberry.ID] = strawberry.field(
        description="Entries this change hid from you: you saw them before it (ids only, D9.24)."
    )
    #: Results per operation, shared by every subscriber this event goes to (schema.fanout).
    shared_results: strawberry.Private[dict[OperationKey, ExecutionResult]] = dataclasses.field(
        default_factory=dict[OperationKey, ExecutionResult]
    )

    @classmethod
    def of(cls, event: ChangeEvent) -> MemoryChangeEvent:
        return cls(
            version=event.version,
            entries=[MemoryEntry.of(e) for e in event.entries],
            removed=[strawberry.ID(i) for i in event.removed],
        )


@strawberry.type
class SourceNeighbour:
    entry: MemoryEntry
    distance: int


@strawberry.type
class SourceItem:
    chat: strawberry.ID
    item: strawberry.ID
    distance: int


@strawberry.type
class SourceNeighbourhood:
    entries: list[SourceNeighbour]
    items: list[SourceItem]
    hidden: int = strawberry.field(
        description="Entries you may not see, active or invalidated, within 8 hops in this direction "
        "whatever the depth asked: only their number (D9.7: no ids, rules or shape)."
    )


@strawberry.enum(description="The kind of rule an access step proves (D9.28).")
class AccessRule(Enum):
    PERSON = "PERSON"
    CHANNEL = "CHANNEL"
    BOT = "BOT"
    ORGANIZATION = "ORGANIZATION"
    NOT_EXCLUDED = "NOT_EXCLUDED"


@strawberry.type(description="One rule of the entry or of a source, and your own atom that meets it.")
class AccessStep:
    entry: strawberry.ID = strawberry.field(description="The entry of the closure this rule belongs to.")
    chat: strawberry.ID | None = strawberry.field(description="Set when the rule is a source Item's.")
    item: strawberry.ID | None
    rule: AccessRule
    admitted_by: str = strawberry.field(
        description='Your atom: "person:<your id>", "channel:<id>", "bot" or "org:<id>".'
    )
    reason: str

    @classmethod
    def of(cls, s: sourcegraph.AccessStep) -> AccessStep:
        return cls(
            entry=strawberry.ID(s.entry),
            chat=_id(s.chat),
            item=_id(s.item),
            rule=AccessRule(s.rule),
            admitted_by=s.admitted_by,
            reason=s.reason,
        )


@strawberry.type(description="Why you may see an entry: only your own atoms, never another reader's (D9.28).")
class AccessProof:
    summary: str
    steps: list[AccessStep]

    @classmethod
    def of(cls, proof: sourcegraph.AccessProof) -> AccessProof:
        return cls(summary=proof.summary, steps=[AccessStep.of(s) for s in proof.steps])
