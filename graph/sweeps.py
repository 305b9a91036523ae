"""The learning sweeps (D9.9): expired leases, stale queued executions, idle Turns and Bots whose
budget period renewed; and the owner's listing of a chat's executions (D9.21)."""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import rows, single
from graph.entries import count
from graph.learning import Queued, QueuedRow

#: How many times an execution's lease may run out with no step committed between (COMMIT_STEP
#: counts again from 0) before it ends ``failed`` with the error ``crashed``: a worker that dies on
#: it (killed for its memory, say) left it to a new epoch, the same work and the same death, for
#: ever, taking every job of that worker down with it each time; restarts of workers that make
#: progress between them never end it.
EXPIRIES_BEFORE_FAILING: Final = 5

#: Sweeper (D9.9): expired leases start a new epoch (the EXPIRIES_BEFORE_FAILING-th ends it
#: failed, ``crashed``); queued executions nobody took are enqueued again; waiting ones whose Turn
#: completed or went idle (D9.11) are queued. Each returns what to enqueue.
SWEEP_EXPIRED: Final[LiteralString] = """
MATCH (x:LearningExecution)
WHERE x.status = 'running' AND x.leaseUntil < timestamp()
WITH x AS held LIMIT $limit
CALL apoc.lock.nodes([held])
WITH held
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(held)
WITH x
WHERE x.status = 'running' AND x.leaseUntil < timestamp()
SET x.expiries = coalesce(x.expiries, 0) + 1, x.leaseUntil = null
WITH x, x.expiries >= $maxExpiries AS crashed
FOREACH (_ IN CASE WHEN crashed THEN [1] ELSE [] END |
  SET x.status = 'failed', x.error = 'crashed', x.endedAt = $now)
FOREACH (_ IN CASE WHEN crashed THEN [] ELSE [1] END |
  SET x.epoch = x.epoch + 1, x.status = 'queued', x.queuedAt = $now)
WITH x WHERE NOT crashed
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""


#: Queued executions nobody took for a while are enqueued again under the same epoch: arq keeps
#: one job per id, so a job still waiting in the queue is not doubled (no churn under backlog),
#: and a lost one (an API killed before it enqueued) comes back.
SWEEP_STALE_QUEUED: Final[LiteralString] = """
MATCH (x:LearningExecution)
WHERE x.status = 'queued' AND x.queuedAt < $before
WITH x AS held LIMIT $limit
CALL apoc.lock.nodes([held])
WITH held
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(held)
WITH x
WHERE x.status = 'queued' AND x.queuedAt < $before
SET x.queuedAt = $now
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""


SWEEP_IDLE_TURNS: Final[LiteralString] = """
MATCH (x:LearningExecution)
WHERE x.status = 'waiting'
MATCH (t:Turn {id: x.turnId})
WHERE t.status = 'completed' OR coalesce(t.lastActivityAt, t.createdAt) < $idleBefore
WITH x AS held LIMIT $limit
CALL apoc.lock.nodes([held])
WITH held
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(held)
WITH x
WHERE x.status = 'waiting'
SET x.status = 'queued', x.queuedAt = $now
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""


#: Up to ``$limit`` Bots with executions waiting for budget, drawn at random each sweep (the caller
#: checks each Bot's budget). The first ``$limit`` executions found were the same every sweep: a
#: Bot with that many waiting on a budget still spent hid every other Bot's, whose new period
#: was never released.
BUDGET_WAITING: Final[LiteralString] = """
MATCH (x:LearningExecution)
WHERE x.status = 'budget'
WITH DISTINCT x.botId AS botId
WITH botId ORDER BY rand() LIMIT $limit
RETURN collect(botId) AS bots
"""


class WaitingRow(TypedDict):
    bots: list[str]


#: Release executions waiting for budget (a new period, or a PATCH that raised the limit): the
#: $limit that waited longest; the sweep releases the rest in its next rounds, so that a month of
#: parked executions is never locked and queued in one transaction.
RELEASE_BUDGET: Final[LiteralString] = """
MATCH (x:LearningExecution)
WHERE x.status = 'budget' AND x.botId = $botId
WITH x ORDER BY x.queuedAt, x.id LIMIT $limit
WITH x AS held
CALL apoc.lock.nodes([held])
WITH held
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(held)
WITH x
WHERE x.status = 'budget'
SET x.epoch = x.epoch + 1, x.status = 'queued', x.queuedAt = $now
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""


async def sweep(tx: AsyncManagedTransaction, query: LiteralString, **params: Any) -> list[Queued]:
    """One of the sweeps (``query``: SWEEP_EXPIRED, SWEEP_STALE_QUEUED, SWEEP_IDLE_TURNS)."""
    record = await single(tx, query, QueuedRow, **params)
    return [] if record is None else record["queued"]


async def budget_waiting(tx: AsyncManagedTransaction, *, limit: int) -> list[str]:
    """The Bots (BUDGET_WAITING)."""
    record = await single(tx, BUDGET_WAITING, WaitingRow, limit=limit)
    return [] if record is None else record["bots"]


async def release_budget(tx: AsyncManagedTransaction, *, bot_id: str, now: int, limit: int) -> list[Queued]:
    record = await single(tx, RELEASE_BUDGET, QueuedRow, botId=bot_id, now=now, limit=limit)
    return [] if record is None else record["queued"]


#: The learning executions of a Chat for its owner, newest first: status, entries learned, the
#: error code, and the evidence set aside with its refusal codes (D9.21) — codes, never content.
LIST_EXECUTIONS: Final[LiteralString] = """
MATCH (x:LearningExecution) USING INDEX x:LearningExecution(chatId, createdAt, id)
WHERE x.chatId = $chatId AND x.createdAt >= 0 AND x.id >= ''
RETURN x {.id, .turnId, .status, .error, .learned, .producedIds, .setAside, .createdAt, .endedAt} AS execution
ORDER BY x.chatId DESC, x.createdAt DESC, x.id DESC SKIP $skip LIMIT $limit
"""


class ExecutionMap(TypedDict):
    """LIST_EXECUTIONS's ``execution``: ``setAside`` None until evidence was set aside;
    ``producedIds`` the entries it added (None: one that kept its count only)."""

    id: str
    turnId: str
    status: str
    error: str | None
    learned: int
    producedIds: list[str] | None
    setAside: list[str] | None
    createdAt: int
    endedAt: int | None


class ExecutionRow(TypedDict):
    execution: ExecutionMap


#: How many learning executions a Chat has (LIST_EXECUTIONS' pages, counted on the same index).
COUNT_EXECUTIONS: Final[LiteralString] = """
MATCH (x:LearningExecution) USING INDEX x:LearningExecution(chatId, createdAt, id)
WHERE x.chatId = $chatId AND x.createdAt >= 0 AND x.id >= ''
RETURN count(x) AS n
"""


async def list_executions(
    tx: AsyncManagedTransaction, *, chat_id: str, skip: int, limit: int
) -> tuple[list[ExecutionMap], int]:
    """One page of the Chat's learning executions and how many it has."""
    found = await rows(tx, LIST_EXECUTIONS, ExecutionRow, chatId=chat_id, skip=skip, limit=limit)
    return [r["execution"] for r in found], await count(tx, COUNT_EXECUTIONS, chatId=chat_id)
