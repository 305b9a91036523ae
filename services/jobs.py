"""The learning queue on arq (D9.9): jobs ``exec:<id>:<epoch>`` whose arguments are ids only (E4).

Jobs are serialised as JSON, not pickle: nothing read from Redis is ever executed as code.
Losing an enqueue is harmless: the execution is queued in Neo4j, and the sweeper enqueues
queued executions nobody took under a new epoch.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from redis.exceptions import RedisError

from graph import conversation
from graph.driver import read
from graph.learning import Queued
from services.runtime import Runtime

log = logging.getLogger("botmemory.queue")

RUN_EXECUTION = "run_execution"
SUMMARIZE_CHAT = "summarize_chat"
BACKFILL_BOT = "backfill_bot"


def serialize(job: dict[str, Any]) -> bytes:
    return json.dumps(job).encode()


def deserialize(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)


def job_id(execution_id: str, epoch: int) -> str:
    return f"exec:{execution_id}:{epoch}"


async def enqueue_executions(rt: Runtime, queued: list[Queued]) -> None:
    """Enqueue ``[{id, epoch}]``; a job id already in the queue is not added twice."""
    for execution in queued:
        try:
            await rt.redis.enqueue_job(
                RUN_EXECUTION,
                execution["id"],
                execution["epoch"],
                _job_id=job_id(execution["id"], execution["epoch"]),
            )
        except RedisError as exc:
            log.warning("enqueue of %s failed (%s); the sweeper retries", execution["id"], type(exc).__name__)


async def enqueue_backfill(rt: Runtime, bot_id: str, *, part: int = 0) -> None:
    """Queue ``backfill:<botId>:<part>``: keywords and vectors for a Bot's entries that lack them
    (design §10). A run does a bounded part and queues the next one while work is left."""
    try:
        await rt.redis.enqueue_job(BACKFILL_BOT, bot_id, part, _job_id=f"backfill:{bot_id}:{part}")
    except RedisError as exc:
        log.warning("enqueue of a backfill failed (%s); the next sweep retries", type(exc).__name__)


async def enqueue_summary_if_due(rt: Runtime, chat_id: str) -> bool:
    """Queue ``summary:<chatId>`` when the Chat's history passed the summary threshold (D9.17)."""
    _, chars = await read(rt.driver, lambda tx: conversation.unsummarized(tx, chat_id=chat_id))
    if chars <= rt.settings.summary_threshold_chars:
        return False
    try:
        await rt.redis.enqueue_job(SUMMARIZE_CHAT, chat_id, _job_id=f"summary:{chat_id}")
    except RedisError as exc:
        log.warning("enqueue of a summary failed (%s); the next Turn retries", type(exc).__name__)
    return True
