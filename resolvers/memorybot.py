"""The memory Bot's queries and mutations: settings (C3, D9.13), confide (L1) and confessions (D9.6)."""

from __future__ import annotations

from typing import Any

import strawberry

from learning.confide import confide
from schema.context import Info
from schema.memorybot import BudgetInput, Confession, ConfideAnswer, Enrichment, LearningExecution, MemoryBot
from schema.types import IdempotencyKey
from services import enrichments, idempotency, learninglog, memorybot


@strawberry.type
class MemoryBotQuery:
    @strawberry.field(description="The memory Bot's settings; needs write on a Bot that is not linked.")
    async def memory_bot(self, info: Info, bot_id: strawberry.ID) -> MemoryBot:
        principal = await info.context.principal()
        return MemoryBot.of(await memorybot.get_settings(info.context.runtime, principal, str(bot_id)))

    @strawberry.field(description="What the Bot confided in a chat, with the answers; the owner only.")
    async def confessions(
        self, info: Info, chat_id: strawberry.ID, limit: int = 50, skip: int = 0
    ) -> list[Confession]:
        principal = await info.context.principal()
        found, _ = await memorybot.confessions(
            info.context.runtime, principal, str(chat_id), limit=limit, skip=skip
        )
        return [Confession.of(c) for c in found]

    @strawberry.field(description="How the memory Bot rewrote the inputs of a chat; the owner only.")
    async def enrichments(
        self, info: Info, chat_id: strawberry.ID, limit: int = 50, skip: int = 0
    ) -> list[Enrichment]:
        principal = await info.context.principal()
        found, _ = await enrichments.enrichments(
            info.context.runtime, principal, str(chat_id), limit=limit, skip=skip
        )
        return [Enrichment.of(e) for e in found]

    @strawberry.field(
        description="How the memory Bot learned from a chat, newest first: each execution's status, "
        "entries learned, error code and the evidence it set aside with the refusal codes; the owner only."
    )
    async def learning(
        self, info: Info, chat_id: strawberry.ID, limit: int = 50, skip: int = 0
    ) -> list[LearningExecution]:
        principal = await info.context.principal()
        found, _ = await learninglog.executions(
            info.context.runtime, principal, str(chat_id), limit=limit, skip=skip
        )
        return [LearningExecution.of(x) for x in found]


@strawberry.type
class MemoryBotMutation:
    @strawberry.mutation(
        description="Change the memory Bot's settings; `expected` is the settings version you read "
        "(CONFLICT when it moved). Omitted fields stay; null removes a limit."
    )
    async def update_memory_bot(
        self,
        info: Info,
        bot_id: strawberry.ID,
        expected: int,
        instructions: str | None = strawberry.UNSET,
        concurrency: int | None = strawberry.UNSET,
        budget: BudgetInput | None = strawberry.UNSET,
    ) -> MemoryBot:
        principal = await info.context.principal()  # the caller first: no token, no word on the input
        changes: dict[str, Any] = {}  # only the arguments given: absent = unchanged
        if instructions is not strawberry.UNSET:
            changes["instructions"] = instructions
        if concurrency is not strawberry.UNSET:
            changes["concurrency"] = concurrency
        if budget is not strawberry.UNSET:
            # As the REST body has it: the PATCH model refuses a bad value in the same words.
            changes["budget"] = (
                None if budget is None else {"period": budget.period, "limitMicros": int(budget.limit_micros)}
            )
        patch = memorybot.SettingsPatch.checked(expected=expected, **changes)
        return MemoryBot.of(
            await memorybot.update_settings(info.context.runtime, principal, str(bot_id), patch)
        )

    @strawberry.mutation(description="Tell how the work goes; the answer comes at once.")
    async def confide(
        self, info: Info, turn_id: strawberry.ID, text: str, idempotency_key: IdempotencyKey = None
    ) -> ConfideAnswer:
        principal = await info.context.principal()
        key = idempotency.key_of(principal, idempotency_key, "confide", [turn_id, text])
        answer = await confide(info.context.runtime, info.context.gateway, principal, str(turn_id), text, key)
        return ConfideAnswer(answer=answer)
