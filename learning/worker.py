"""The arq worker process: ``python -m learning.worker``.

Jobs take ids only (E4) and never raise; the graph is the log of record (D9.9). Each worker
also runs the sweeper, which re-queues executions whose lease expired or whose enqueue was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from arq import cron, func
from arq.connections import RedisSettings
from arq.worker import run_worker

from learning import summary
from learning.executions import ExecutionRunner, sweeper
from learning.gateway import Gateway
from services import jobs, metrics
from services.bootstrap import open_runtime
from services.logs import configure_logging
from services.runtime import Runtime, now_ms
from services.settings import load_settings

log = logging.getLogger("botmemory.worker")

HEARTBEAT_KEY = "botmemory:worker:heartbeat"


async def startup(ctx: dict[str, Any]) -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    stack = contextlib.AsyncExitStack()
    ctx["stack"] = stack
    runtime = await stack.enter_async_context(open_runtime(settings))
    gateway = await stack.enter_async_context(Gateway(settings))
    ctx["runtime"], ctx["gateway"] = runtime, gateway
    ctx["runner"] = ExecutionRunner(runtime, gateway, f"{socket.gethostname()}:{os.getpid()}")
    ctx["sweeper"] = asyncio.create_task(sweeper(runtime))
    await heartbeat(ctx)
    log.info("worker ready")


async def shutdown(ctx: dict[str, Any]) -> None:
    task = ctx.get("sweeper")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    stack: contextlib.AsyncExitStack | None = ctx.get("stack")
    if stack is not None:
        await stack.aclose()


async def heartbeat(ctx: dict[str, Any]) -> None:
    """Record that a worker is alive (read by operators)."""
    runtime: Runtime = ctx["runtime"]
    await runtime.redis.set(HEARTBEAT_KEY, str(now_ms()), ex=120)


async def run_execution(ctx: dict[str, Any], execution_id: str, epoch: int) -> None:
    """``exec:<id>:<epoch>``: run one epoch of a learning execution; never raises (D9.9)."""
    runner: ExecutionRunner = ctx["runner"]
    outcome = await runner.run(execution_id, epoch)
    metrics.EXECUTIONS.labels(outcome=outcome.split(":")[0]).inc()
    log.info("execution %s epoch %s: %s", execution_id, epoch, outcome)


async def summarize_chat(ctx: dict[str, Any], chat_id: str) -> None:
    """``summary:<chatId>``: compress a Chat's history past the threshold (D9.17); never raises."""
    try:
        outcome = await summary.summarize(ctx["runtime"], ctx["gateway"], chat_id)
    except Exception as exc:  # recorded as a code; the next completed Turn asks again
        outcome = "failed:" + type(exc).__name__
    log.info("summary of %s: %s", chat_id, outcome)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [
        heartbeat,
        func(run_execution, name=jobs.RUN_EXECUTION),
        func(summarize_chat, name=jobs.SUMMARIZE_CHAT),
    ]
    cron_jobs: ClassVar[list[Any]] = [cron(heartbeat, second={0, 30}, run_at_startup=False)]
    on_startup = startup
    on_shutdown = shutdown
    poll_delay = 0.05
    keep_result = 0
    max_jobs = 10
    handle_signals = True
    job_serializer = staticmethod(jobs.serialize)
    job_deserializer = staticmethod(jobs.deserialize)


def main() -> None:
    """Run one worker (settings are read here, not at import)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    run_worker(
        WorkerSettings,  # type: ignore[arg-type]
        redis_settings=RedisSettings.from_dsn(settings.redis_url),
        job_timeout=int(settings.step_deadline_seconds * 2 + 60),
    )


class WorkerProcess:
    """This worker as a child process with its log file: how the tests and the learning benchmark
    start theirs. ``env`` is added to ours; tests may kill (-9) and restart it."""

    def __init__(self, log_path: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log_path, self.cwd = log_path, cwd
        self.env = {**os.environ, **(env or {})}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._log.flush()
        self._spawned_at = self.log_path.stat().st_size
        return subprocess.Popen(
            [sys.executable, "-m", "learning.worker"],
            cwd=self.cwd,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def worker_id(self) -> str:
        """The id it writes on the executions it claims (``host:pid``)."""
        return f"{socket.gethostname()}:{self.proc.pid}"

    def ready(self) -> bool:
        """Whether it logged that it is ready since this object (re)started it; raises if it exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited early; see {self.log_path}")
        with self.log_path.open("rb") as fh:
            fh.seek(self._spawned_at)
            return b"worker ready" in fh.read()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"worker did not become ready; see {self.log_path}")

    def kill(self) -> None:
        """kill -9: no shutdown, no cleanup (fault injection)."""
        self.proc.kill()
        self.proc.wait(timeout=15)

    def restart(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc = self._spawn()

    def stop(self) -> None:
        """SIGTERM (arq shuts down gracefully), then SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


if __name__ == "__main__":
    main()
