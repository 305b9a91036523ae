"""The learning queue on arq (D9.9): jobs ``exec:<id>:<epoch>`` whose arguments are ids only (E4).

Jobs are serialised as JSON, not pickle: nothing read from Redis is ever executed as code.
Losing an enqueue is harmless: the execution is queued in Neo4j, and the sweeper enqueues
queued executions nobody took under a new epoch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Final, cast

from arq.constants import in_progress_key_prefix, job_key_prefix
from redis.exceptions import RedisError

from graph import conversation
from graph.driver import read, write
from graph.learning import Queued
from services.runtime import Runtime, now_ms

log = logging.getLogger("botmemory.queue")

RUN_EXECUTION = "run_execution"
SUMMARIZE_CHAT = "summarize_chat"
BACKFILL_BOT = "backfill_bot"
BACKFILL_KEYWORDS = "backfill_keywords"


def serialize(job: dict[str, Any]) -> bytes:
    return json.dumps(job).encode()


def deserialize(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)


def job_id(execution_id: str, epoch: int) -> str:
    return f"exec:{execution_id}:{epoch}"


async def enqueue_executions(rt: Runtime, queued: list[Queued], *, defer_seconds: float = 0.0) -> None:
    """Enqueue ``[{id, epoch}]``, to run ``defer_seconds`` from now (none: at once); a job id
    already in the queue is not added twice."""
    for execution in queued:
        if rt.quiet.skips("enqueue"):
            return  # the sweeper queues them
        try:
            await rt.redis.enqueue_job(
                RUN_EXECUTION,
                execution["id"],
                execution["epoch"],
                _job_id=job_id(execution["id"], execution["epoch"]),
                _defer_by=defer_seconds or None,
            )
        except RedisError as exc:
            rt.quiet.failed(exc)
            log.warning("enqueue of %s failed (%s); the sweeper retries", execution["id"], type(exc).__name__)


async def _in_flight(rt: Runtime, kind: str) -> list[str]:
    """The ids (after ``<kind>:``) of the jobs of ``kind`` queued or running (arq's job and
    in-progress keys)."""
    found: list[str] = []
    for prefix in (job_key_prefix, in_progress_key_prefix):
        keys = cast(AsyncIterator[bytes], rt.redis.scan_iter(match=f"{prefix}{kind}:*", count=1000))  # pyright: ignore[reportUnknownMemberType]
        async for key in keys:
            found.append(key.decode().removeprefix(prefix).removeprefix(f"{kind}:"))
    return found


async def backfills_in_flight(rt: Runtime) -> set[str]:
    """The Bots with a backfill part queued or running."""
    return {rest.split(":")[0] for rest in await _in_flight(rt, "backfill")}


async def start_keyword_pass(rt: Runtime, *, part: int = 0) -> bool:
    """Queue ``keywords:<part>``, the keyword pass over every Bot due for keywords (design §10),
    unless part 0 finds one in flight (a pass queues its own next part). True when queued."""
    try:
        if part == 0 and await _in_flight(rt, "keywords"):
            return False
        await rt.redis.enqueue_job(BACKFILL_KEYWORDS, part, _job_id=f"keywords:{part}")
    except RedisError as exc:
        log.warning("enqueue of the keyword pass failed (%s); the next sweep retries", type(exc).__name__)
        return False
    return True


async def start_backfills(rt: Runtime, due: list[str], *, finishing: str | None = None) -> int:
    """Queue the backfill of the first Bots of ``due`` not already in flight, while fewer than
    ``backfill_lanes`` are (``finishing``: a Bot whose last part is ending, whose lane this frees).
    A Bot keeps its lane from part to part; the next sweep starts lanes that failed. Returns how
    many were queued."""
    try:
        busy = await backfills_in_flight(rt)
    except RedisError as exc:
        log.warning("backfills in flight unknown (%s); the next sweep retries", type(exc).__name__)
        return 0
    busy.discard(finishing or "")
    started = 0
    for bot_id in due:
        if len(busy) >= rt.settings.backfill_lanes:
            break
        if bot_id in busy or bot_id == finishing:
            continue
        await enqueue_backfill(rt, bot_id)
        busy.add(bot_id)
        started += 1
    return started


async def enqueue_backfill(rt: Runtime, bot_id: str, *, part: int = 0) -> None:
    """Queue ``backfill:<botId>:<part>``: keywords and vectors for a Bot's entries that lack them
    (design §10). A run does a bounded part and queues the next one while work is left."""
    try:
        await rt.redis.enqueue_job(BACKFILL_BOT, bot_id, part, _job_id=f"backfill:{bot_id}:{part}")
    except RedisError as exc:
        log.warning("enqueue of a backfill failed (%s); the next sweep retries", type(exc).__name__)


#: How many Chats a sweep queues for a summary due, the most behind first (each may wait for its
#: Bot's slot in a worker's job: a thousand filled every job slot), and how long before it queues
#: one Chat again.
SUMMARY_SWEEP_LIMIT: Final = 50
SUMMARY_SWEEP_AGAIN_MS: Final = 3_600_000


async def enqueue_due_summaries(rt: Runtime, now: int | None = None) -> int:
    """Queue ``summary:<chatId>`` for the Chats whose summary is due (the worker's sweep, D9.17):
    a queueing lost after completeTurn's commit waited for the Chat's next completed Turn, and a
    quiet Chat kept its gap between summary and messages. arq keeps one job per id: a summary
    queued already is not doubled. Returns how many were due. (``now``: when the sweep runs, as
    far as it knows.)"""
    now = now_ms() if now is None else now
    due = await write(
        rt.driver,
        lambda tx: conversation.summaries_due(
            tx,
            threshold=rt.settings.summary_threshold_chars,
            limit=SUMMARY_SWEEP_LIMIT,
            sweptBefore=now - SUMMARY_SWEEP_AGAIN_MS,
            now=now,
        ),
    )
    queued = 0
    for chat_id in due:
        try:
            await rt.redis.enqueue_job(SUMMARIZE_CHAT, chat_id, _job_id=f"summary:{chat_id}")
        except RedisError as exc:
            log.warning("enqueue of a summary failed (%s); the next sweep retries", type(exc).__name__)
            break
        queued += 1
    if queued < len(due):  # those not queued are due to the next sweep (marked, they waited an hour)
        await write(rt.driver, lambda tx: conversation.unmark_swept(tx, chat_ids=due[queued:], at=now))
    return len(due)


async def enqueue_summary_if_due(rt: Runtime, chat_id: str, chars: int | None = None) -> bool:
    """Queue ``summary:<chatId>`` when the Chat's history passed the summary threshold (D9.17);
    ``chars``: what its summary would hold, when the caller read it already."""
    if chars is None:
        _, chars = await read(rt.driver, lambda tx: conversation.unsummarized(tx, chat_id=chat_id))
    if chars <= rt.settings.summary_threshold_chars:
        return False
    if rt.quiet.skips("enqueue"):
        return True  # as a failed enqueue: the next Turn retries
    try:
        await rt.redis.enqueue_job(SUMMARIZE_CHAT, chat_id, _job_id=f"summary:{chat_id}")
    except RedisError as exc:
        rt.quiet.failed(exc)
        log.warning("enqueue of a summary failed (%s); the next Turn retries", type(exc).__name__)
    return True
