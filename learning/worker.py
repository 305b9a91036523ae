"""The arq worker process: ``arq learning.worker.WorkerSettings``.

Jobs take ids only (E4) and never raise; the graph is the log of record (D9.9).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from arq import cron
from arq.connections import RedisSettings
from arq.worker import run_worker

from botmemory.bootstrap import open_runtime
from botmemory.logs import configure_logging
from botmemory.runtime import Runtime, now_ms
from botmemory.settings import load_settings

log = logging.getLogger("botmemory.worker")

HEARTBEAT_KEY = "botmemory:worker:heartbeat"


async def startup(ctx: dict[str, Any]) -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    manager = open_runtime(settings)
    ctx["runtime_manager"] = manager
    ctx["runtime"] = await manager.__aenter__()
    await heartbeat(ctx)
    log.info("worker ready")


async def shutdown(ctx: dict[str, Any]) -> None:
    manager = ctx.get("runtime_manager")
    if manager is not None:
        await manager.__aexit__(None, None, None)


async def heartbeat(ctx: dict[str, Any]) -> None:
    """Record that a worker is alive (read by operators and ``/healthz`` of the worker)."""
    runtime: Runtime = ctx["runtime"]
    await runtime.redis.set(HEARTBEAT_KEY, str(now_ms()), ex=120)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [heartbeat]
    cron_jobs: ClassVar[list[Any]] = [cron(heartbeat, second={0, 30}, run_at_startup=False)]
    on_startup = startup
    on_shutdown = shutdown
    poll_delay = 0.05
    keep_result = 0
    max_jobs = 10
    handle_signals = True


def main() -> None:
    """Run one worker: ``python -m learning.worker`` (settings are read here, not at import)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    run_worker(WorkerSettings, redis_settings=RedisSettings.from_dsn(settings.redis_url))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
