"""The API and the learning worker as child processes: how the tests and the benchmarks start
theirs (``python -m botmemory.serve`` and ``python -m learning.worker``), each with its log file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """This server as a child process on a free local port, healthy once constructed: how the
    tests and the benchmarks start their API processes. ``env`` is added to ours."""

    def __init__(
        self,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 60,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "botmemory.serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"API exited early; see {log_path}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"API did not become healthy; see {log_path}")

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/graphql"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class WorkerProcess:
    """This worker as a child process with its log file: how the tests and the learning benchmark
    start theirs. ``env`` is added to ours; tests may kill (-9) and restart it. Its metrics are
    served on a free local port (kept across restarts) unless ``env`` names one."""

    def __init__(self, log_path: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log_path, self.cwd = log_path, cwd
        self.env = {
            **os.environ,
            "BOTMEMORY_WORKER_METRICS_HOST": "127.0.0.1",
            "BOTMEMORY_WORKER_METRICS_PORT": str(free_port()),
            **(env or {}),
        }
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
    def metrics_url(self) -> str:
        """Its Prometheus ``/metrics``."""
        host, port = self.env["BOTMEMORY_WORKER_METRICS_HOST"], self.env["BOTMEMORY_WORKER_METRICS_PORT"]
        return f"http://{host}:{port}/metrics"

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
