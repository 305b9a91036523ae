"""The arq worker process: ``python -m learning.worker``.

Jobs take ids only (E4) and never raise; the graph is the log of record (D9.9). Each worker
also runs the sweeper, which re-queues executions whose lease expired or whose enqueue was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, ClassVar

from arq import cron, func
from arq.worker import Worker, get_kwargs
from neo4j.exceptions import DriverError, Neo4jError
from prometheus_client import start_http_server
from redis.exceptions import AuthenticationError, RedisError

from learning import backfill, summary
from learning.executions import ExecutionRunner
from learning.gateway import Gateway
from learning.sweeper import sweeper
from services import jobs, metrics
from services.bootstrap import open_runtime, redis_of
from services.embedding import EmbedderUnavailable
from services.logs import configure_logging, log_tasks
from services.runtime import Runtime, now_ms
from services.settings import Settings, load_settings
from services.tasks import cancel_and_wait

log = logging.getLogger("botmemory.worker")

HEARTBEAT_KEY = "botmemory:worker:heartbeat"
#: The pause before a worker that lost Redis starts itself again.
REDIS_RETRY_SECONDS = 1.0
#: How often the worker's event loop records that it runs (``metrics.WORKER_PULSE``); a loop that
#: stalls (a blocking call, a stopped process) stops beating and the health check fails.
PULSE_SECONDS = 10.0
#: How long one backfill job works before it queues the next part (well within the job timeout).
BACKFILL_SECONDS = 60.0


async def startup(ctx: dict[str, Any]) -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    ctx["pulse"] = asyncio.create_task(pulse())  # beating while it waits for the schema, too
    stack = contextlib.AsyncExitStack()
    ctx["stack"] = stack
    # The API applies the migrations; the worker waits for their version (one migrating process).
    runtime = await stack.enter_async_context(open_runtime(settings, schema="wait"))
    gateway = await stack.enter_async_context(Gateway(settings))
    await gateway.warm_up()
    ctx["runtime"], ctx["gateway"] = runtime, gateway
    ctx["runner"] = ExecutionRunner(
        runtime, gateway, f"{socket.gethostname()}:{os.getpid()}", ctx.setdefault("stopping", asyncio.Event())
    )
    ctx["sweeper"] = asyncio.create_task(sweeper(runtime))
    # `kill -USR1 <pid>` logs where each of its tasks waits (a worker that seems stuck).
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, log_tasks, log)
    await heartbeat(ctx)
    log.info("worker ready")


async def shutdown(ctx: dict[str, Any]) -> None:
    for name in ("sweeper", "pulse"):
        task = ctx.get(name)
        if task is not None:
            await cancel_and_wait(task)
    stack: contextlib.AsyncExitStack | None = ctx.get("stack")
    if stack is not None:
        await stack.aclose()


async def heartbeat(ctx: dict[str, Any]) -> None:
    """Record that a worker is alive (read by operators)."""
    runtime: Runtime = ctx["runtime"]
    await runtime.redis.set(HEARTBEAT_KEY, str(now_ms()), ex=120)


async def pulse() -> None:
    """Beat every ``PULSE_SECONDS`` while the event loop runs (this process's own liveness: the
    Redis heartbeat above is one key for every worker, and a job, so it waits for a free slot)."""
    while True:
        metrics.WORKER_PULSE.set(time.time())
        await asyncio.sleep(PULSE_SECONDS)


async def run_execution(ctx: dict[str, Any], execution_id: str, epoch: int) -> None:
    """``exec:<id>:<epoch>``: run one epoch of a learning execution; never raises (D9.9)."""
    runner: ExecutionRunner = ctx["runner"]
    try:
        outcome = await runner.run(execution_id, epoch)
    except asyncio.CancelledError:  # arq's job timeout or a shutdown; the sweeper queues it again
        metrics.EXECUTIONS.labels(outcome="cancelled").inc()
        raise
    except (Neo4jError, DriverError, RedisError) as exc:  # Neo4j or Redis gone past the retries,
        # mid-claim, mid-step or mid-finish: the lease runs out and the sweeper queues it again (it
        # reached arq as a failed job before)
        outcome = "error:" + type(exc).__name__
    except Exception as exc:  # a fault of ours: said with its stack, never raised into arq
        # Type and stack only, as the API logs its internal errors: a message may quote content.
        stack = "".join(traceback.format_tb(exc.__traceback__))
        log.warning("execution %s epoch %s raised %s\n%s", execution_id, epoch, type(exc).__name__, stack)
        outcome = "error:" + type(exc).__name__
    metrics.EXECUTIONS.labels(outcome=outcome.split(":")[0]).inc()
    log.info("execution %s epoch %s: %s", execution_id, epoch, outcome)


async def backfill_bot(ctx: dict[str, Any], bot_id: str, part: int) -> None:
    """``backfill:<botId>:<part>``: keywords and vectors of the Bot's entries that lack them, for
    a bounded time; queues the next part while work is left (design §10), not when the embedder
    failed (the next sweep tries again). Never raises."""
    runtime: Runtime = ctx["runtime"]
    gateway: Gateway = ctx["gateway"]
    try:
        done = await backfill.run(runtime, bot_id, gateway.embedder, seconds=BACKFILL_SECONDS)
    except EmbedderUnavailable as exc:  # the next sweep tries again (not a part at once: a
        # provider that is down would be called over and over)
        log.warning("backfill of %s paused: embedding failed (%s)", bot_id, exc.code)
        return
    except Exception as exc:  # recorded as a code; the next sweep queues it again
        log.warning("backfill of %s failed: %s", bot_id, type(exc).__name__)
        # Its lane goes on: a Bot that fails every time (an entry that cannot be read) came
        # first in every sweep's order and, with one lane, kept the others waiting for good.
        await _hand_on_lane(runtime, gateway, bot_id)
        return
    if not done:
        await jobs.enqueue_backfill(runtime, bot_id, part=part + 1)
    log.info("backfill of %s part %s: %s", bot_id, part, "done" if done else "continues")
    if done:
        await _hand_on_lane(runtime, gateway, bot_id)


async def _hand_on_lane(runtime: Runtime, gateway: Gateway, bot_id: str) -> None:
    """The lane of ``bot_id``'s backfill, which ends, goes to the next Bot due after it in id
    order (the sweep starts from the first): the lanes go through the due Bots once a sweep, so a
    Bot that fails every time is tried once a sweep. Handed to the first due again, two such
    Bots handed the lane to each other without end, and the queue filled with their jobs."""
    with contextlib.suppress(Exception):  # the next sweep starts it otherwise
        due = await backfill.bots_to_backfill(runtime, gateway.embedder)
        await jobs.start_backfills(runtime, [b for b in due if b > bot_id], finishing=bot_id)


async def backfill_keywords(ctx: dict[str, Any], part: int) -> None:
    """``keywords:<part>``: the keywords of every Bot due for them, one Bot after another, for a
    bounded time; queues the next part while Bots are left (one pass at a time, so the queue
    never fills with them). Keywords need no model and take a moment a Bot, so every Bot is
    keyword-searchable soon after an upgrade: in the lanes alone, a Bot's keywords waited behind
    the vectors of every Bot before it (hours for most, after a store's first upgrade, their
    ``search`` empty meanwhile). A Bot that fails is passed by (the next sweep tries again).
    Never raises."""
    runtime: Runtime = ctx["runtime"]
    began = time.monotonic()
    try:
        due = await backfill.bots_to_backfill(runtime, None, gauge=False)
    except Exception as exc:  # the next sweep tries again
        log.warning("keyword pass failed: %s", type(exc).__name__)
        return
    for n, bot_id in enumerate(due):
        left = BACKFILL_SECONDS - (time.monotonic() - began)
        try:
            if left <= 0 or not await backfill.run(runtime, bot_id, None, seconds=left):
                log.info("keyword pass part %s: %s of %s Bots, continues", part, n, len(due))
                await jobs.start_keyword_pass(runtime, part=part + 1)
                return
        except Exception as exc:
            log.warning("keywords of %s failed: %s", bot_id, type(exc).__name__)
    log.info("keyword pass part %s: done (%s Bots)", part, len(due))


async def backfill_sweep(ctx: dict[str, Any]) -> None:
    """Start the keyword pass when a Bot is due for keywords, and backfills of the Bots whose
    entries lack keywords or a vector of this embedder, a few at a time (the ``backfill_lanes``
    setting: each finished Bot hands its lane to the next)."""
    runtime: Runtime = ctx["runtime"]
    gateway: Gateway = ctx["gateway"]
    if not runtime.settings.backfill:
        return
    try:
        if gateway.embedder is not None and await backfill.bots_to_backfill(runtime, None, gauge=False):
            await jobs.start_keyword_pass(runtime)
        await jobs.start_backfills(runtime, await backfill.bots_to_backfill(runtime, gateway.embedder))
    except Exception as exc:  # the next sweep retries
        log.warning("backfill sweep failed: %s", type(exc).__name__)


async def summary_sweep(ctx: dict[str, Any]) -> None:
    """Queue the summaries that are due (``jobs.enqueue_due_summaries``); never raises."""
    try:
        await jobs.enqueue_due_summaries(ctx["runtime"])
    except Exception as exc:  # the next sweep retries
        log.warning("summary sweep failed: %s", type(exc).__name__)


async def summarize_chat(ctx: dict[str, Any], chat_id: str) -> None:
    """``summary:<chatId>``: compress a Chat's history past the threshold (D9.17); never raises.
    One call covers at most 500 Items: while the history is still due after one, the job makes
    the next, as long as it may begin one (within its first step deadline, as a learning job:
    arq's timeout never cuts a call). It stopped after one: a history that had grown past a call
    while this job ran (its enqueue refused, the job id taken) or came in by the thousand stayed
    behind until the Chat's next Turn, and a quiet Chat's context pack kept a hole between its
    summary and its last messages."""
    runtime: Runtime = ctx["runtime"]
    began = time.monotonic()
    while True:
        try:
            outcome = await summary.summarize(runtime, ctx["gateway"], chat_id)
        except Exception as exc:  # recorded as a code; the next completed Turn asks again
            outcome = "failed:" + type(exc).__name__
        log.info("summary of %s: %s", chat_id, outcome)
        stopping: asyncio.Event = ctx["stopping"]
        if (
            outcome != "saved"
            or stopping.is_set()
            or time.monotonic() - began > runtime.settings.step_deadline_seconds
        ):
            return


class WorkerSettings:
    functions: ClassVar[list[Any]] = [
        heartbeat,
        func(run_execution, name=jobs.RUN_EXECUTION),
        func(summarize_chat, name=jobs.SUMMARIZE_CHAT),
        func(backfill_bot, name=jobs.BACKFILL_BOT),
        func(backfill_keywords, name=jobs.BACKFILL_KEYWORDS),
    ]
    cron_jobs: ClassVar[list[Any]] = [
        cron(heartbeat, second={0, 30}, run_at_startup=False),
        cron(backfill_sweep, minute={0, 10, 20, 30, 40, 50}, second=0, run_at_startup=True),
        cron(summary_sweep, minute={5, 15, 25, 35, 45, 55}, second=0, run_at_startup=True),
    ]
    on_startup = startup
    on_shutdown = shutdown
    poll_delay = 0.05
    keep_result = 0
    max_jobs = 10
    handle_signals = True
    job_serializer = staticmethod(jobs.serialize)
    job_deserializer = staticmethod(jobs.deserialize)


def serve_metrics(settings: Settings) -> None:
    """This process's Prometheus metrics at ``http://<host>:<port>/metrics`` (a daemon thread;
    port 0: none). A port in use ends the worker with one line, like the API's port."""
    if settings.worker_metrics_port == 0:
        return
    try:
        start_http_server(settings.worker_metrics_port, addr=settings.worker_metrics_host)
    except OSError as exc:
        where = f"{settings.worker_metrics_host}:{settings.worker_metrics_port}"
        log.error("worker metrics cannot listen on %s (%s); set BOTMEMORY_WORKER_METRICS_PORT", where, exc)
        raise SystemExit(2) from None
    log.info(
        "worker metrics on http://%s:%s/metrics", settings.worker_metrics_host, settings.worker_metrics_port
    )


class _Worker(Worker):
    """arq's worker, asked to stop (SIGTERM, SIGINT): it takes no more jobs, its jobs begin no
    more steps and it waits up to ``Settings.stop_seconds`` for the running ones (their model calls saved
    and charged) before it cancels what is left."""

    def handle_sig_wait_for_completion(self, signum: signal.Signals) -> None:
        stopping = self.ctx.get("stopping")
        if isinstance(stopping, asyncio.Event):
            stopping.set()
        log.info("asked to stop: the running jobs end their steps")
        super().handle_sig_wait_for_completion(signum)


def main() -> None:
    """Run one worker (settings are read here, not at import). A lost Redis connection ends
    arq's run with an error; the process then starts itself afresh (same pid, nothing left of the
    old run) once a second until Redis answers — what the queue held is re-queued by the sweeper.
    A Redis that refuses its credentials ends it (it started itself again once a second for ever)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    serve_metrics(settings)
    try:
        _Worker(
            **get_kwargs(WorkerSettings),  # type: ignore[arg-type]
            # Its queue is polled with the same deadlines as every other Redis command: a Redis that
            # accepts connections and never answers held the poll for ever, so the restart below
            # never came.
            redis_pool=redis_of(settings),
            job_timeout=int(settings.job_seconds()),
            job_completion_wait=int(settings.stop_seconds()) + 1,
        ).run()
    except AuthenticationError:  # no restart mends a password: one line, and an exit
        log.error("Redis refused the worker's credentials: check BOTMEMORY_REDIS_URL")
        raise SystemExit(2) from None
    except (RedisError, OSError) as exc:
        log.warning("worker lost Redis (%s); starting again", type(exc).__name__)
        time.sleep(REDIS_RETRY_SECONDS)
        os.execv(sys.executable, [sys.executable, "-m", "learning.worker"])  # noqa: S606 (this very program)


if __name__ == "__main__":
    main()
