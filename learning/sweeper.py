"""The sweeper every worker runs (D9.9, D9.11, D9.12): new epochs for expired leases, lost enqueues
queued again, idle Turns' executions queued, budget waits released when the budget is free, and
idempotency keys past their time dropped."""

from __future__ import annotations

import asyncio
import logging

from graph import idempotency as idempotency_q
from graph import learning as learning_q
from graph import memorybot
from graph import sweeps as sweeps_q
from graph.driver import read, write
from services.jobs import enqueue_executions
from services.memorybot import MemoryBotSettings, release_budget_waiting
from services.runtime import Runtime, now_ms

log = logging.getLogger("botmemory.learning")


async def sweep_once(rt: Runtime) -> int:
    """Start new epochs for expired leases and lost enqueues, queue idle Turns' executions, and
    release budget waits whose budget is free again (D9.9, D9.11, D9.12). Returns how many."""
    now = now_ms()
    settings = rt.settings
    limit = 200
    queued: list[learning_q.Queued] = []
    queued += await write(
        rt.driver,
        lambda tx: sweeps_q.sweep(
            tx, sweeps_q.SWEEP_EXPIRED, now=now, limit=limit, maxExpiries=sweeps_q.EXPIRIES_BEFORE_FAILING
        ),
    )
    before = now - int(settings.requeue_after_seconds * 1000)
    queued += await write(
        rt.driver,
        lambda tx: sweeps_q.sweep(tx, sweeps_q.SWEEP_STALE_QUEUED, before=before, now=now, limit=limit),
    )
    idle_before = now - int(settings.turn_idle_timeout_seconds * 1000)
    queued += await write(
        rt.driver,
        lambda tx: sweeps_q.sweep(
            tx, sweeps_q.SWEEP_IDLE_TURNS, idleBefore=idle_before, now=now, limit=limit
        ),
    )
    await enqueue_executions(rt, queued)
    # Idempotency keys past their time (services.idempotency): a batch a round.
    await write(rt.driver, lambda tx: idempotency_q.sweep_expired(tx, now=now, limit=limit))
    released = 0
    waiting = await read(rt.driver, lambda tx: sweeps_q.budget_waiting(tx, limit=limit))
    for bot_id in sorted(waiting):
        row = await read(rt.driver, lambda tx, b=bot_id: memorybot.settings(tx, bot_id=b))
        if row is not None:
            released += await release_budget_waiting(rt, bot_id, MemoryBotSettings.of(row))
    return len(queued) + released


async def sweeper(rt: Runtime) -> None:
    """The worker's sweeper loop; several workers may sweep at once (every transition is a CAS)."""
    while True:
        await asyncio.sleep(rt.settings.sweep_interval_seconds)
        try:
            await sweep_once(rt)
        except Exception as exc:  # keep sweeping; the next round retries
            log.warning("sweep failed: %s", type(exc).__name__)
