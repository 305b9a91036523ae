"""GraphQL types of the memory Bot: settings, confide answers and confessions."""

from __future__ import annotations

import strawberry

from schema.types import Long
from services import enrichments, learninglog, memorybot


@strawberry.type
class Budget:
    period: str = strawberry.field(description="day or month (UTC calendar periods)")
    limit_micros: Long


@strawberry.type
class Spent:
    micros: Long = strawberry.field(description="Confirmed cost in the current period, micro-USD.")
    unknown_calls: int = strawberry.field(description="Calls in the period without usage (not charged).")


@strawberry.type
class MemoryBot:
    version: int = strawberry.field(description="The settings' own version; send it as `expected`.")
    instructions: str | None
    concurrency: int | None
    budget: Budget | None
    spent: Spent | None

    @classmethod
    def of(cls, s: memorybot.MemoryBotSettings) -> MemoryBot:
        return cls(
            version=s.version,
            instructions=s.instructions,
            concurrency=s.concurrency,
            budget=None
            if s.budget is None
            else Budget(period=s.budget.period, limit_micros=Long(s.budget.limit_micros)),
            spent=None
            if s.spent_micros is None
            else Spent(micros=Long(s.spent_micros), unknown_calls=s.unknown_calls or 0),
        )


@strawberry.input
class BudgetInput:
    period: str
    limit_micros: Long


@strawberry.type
class ConfideAnswer:
    answer: str


@strawberry.type
class Confession:
    id: strawberry.ID
    turn_id: strawberry.ID
    text: str | None = strawberry.field(
        description="What the Bot confided; null once the chat's history was deleted."
    )
    answer: str | None = strawberry.field(
        description="Null while unanswered, or when an entry it drew on is no longer visible to you."
    )
    entry_ids: list[strawberry.ID]
    answered_by: str | None
    created_at: Long

    @classmethod
    def of(cls, c: memorybot.Confession) -> Confession:
        return cls(
            id=strawberry.ID(c.id),
            turn_id=strawberry.ID(c.turn_id),
            text=c.text,
            answer=c.answer,
            entry_ids=[strawberry.ID(i) for i in c.entry_ids],
            answered_by=c.answered_by,
            created_at=Long(c.created_at),
        )


@strawberry.type
class Enrichment:
    id: strawberry.ID
    turn_id: strawberry.ID
    text: str | None = strawberry.field(
        description="The rewritten input; null when an entry it used is no longer visible to you."
    )
    original: str | None = strawberry.field(description="The person's words (older records have none).")
    entry_ids: list[strawberry.ID]
    created_at: Long

    @classmethod
    def of(cls, e: enrichments.Enrichment) -> Enrichment:
        return cls(
            id=strawberry.ID(e.id),
            turn_id=strawberry.ID(e.turn_id),
            text=e.text,
            original=e.original,
            entry_ids=[strawberry.ID(i) for i in e.entry_ids],
            created_at=Long(e.created_at),
        )


@strawberry.type(description="Evidence a refused learning step never learned (D9.21).")
class SetAside:
    first: int = strawberry.field(description="The first Item's sequence number in the chat.")
    last: int = strawberry.field(description="The last Item's sequence number in the chat.")
    codes: list[str] = strawberry.field(
        description="Why each answer was refused: rule and field, never content."
    )


@strawberry.type(description="One learning execution of a chat (its Turn's evidence).")
class LearningExecution:
    id: strawberry.ID
    turn_id: strawberry.ID
    status: str
    learned: int
    error: str | None
    set_aside: list[SetAside]
    created_at: Long
    ended_at: Long | None

    @classmethod
    def of(cls, x: learninglog.Execution) -> LearningExecution:
        return cls(
            id=strawberry.ID(x.id),
            turn_id=strawberry.ID(x.turn_id),
            status=x.status,
            learned=x.learned,
            error=x.error,
            set_aside=[SetAside(first=a.first, last=a.last, codes=list(a.codes)) for a in x.set_aside],
            created_at=Long(x.created_at),
            ended_at=None if x.ended_at is None else Long(x.ended_at),
        )
