"""Session fixtures: the real Neo4j and Redis started by ``make test``, plus a real API process.

Nothing here mocks a database. A missing service is a failure with a clear message, never a skip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from botmemory.bootstrap import open_runtime
from botmemory.runtime import Runtime
from botmemory.settings import Settings, load_settings
from tests.client import Api

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = load_settings()
    if s.env != "test":
        pytest.exit("run the tests with `make test` (BOTMEMORY_ENV=test and the test ports)", returncode=2)
    return s


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    try:
        async with open_runtime(settings) as rt:
            await rt.driver.verify_connectivity()
            await rt.redis.ping()  # type: ignore[misc]
            yield rt
    except OSError as exc:  # pragma: no cover - reported, never skipped
        pytest.fail(f"Neo4j/Redis of the test stack are not reachable ({exc}); run `make test`")


class ApiProcess:
    """A real uvicorn process of the API, its base URL and its log file."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "BOTMEMORY_API_PORT": str(self.port)}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "botmemory.app:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API exited early; see {log_path}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"API did not become healthy; see {log_path}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@pytest.fixture(scope="session")
def api_process(settings: Settings) -> Iterator[ApiProcess]:
    process = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api.log")
    yield process
    process.stop()


class WorkerProcess:
    """A real arq worker process and its log file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "learning.worker"], cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@pytest.fixture(scope="session")
def worker_process(settings: Settings) -> Iterator[WorkerProcess]:
    process = WorkerProcess(settings.data_dir / "logs" / "pytest-worker.log")
    yield process
    process.stop()


@pytest.fixture(scope="session")
async def api(api_process: ApiProcess, settings: Settings) -> AsyncIterator[Api]:
    assert settings.admin_token is not None
    async with httpx.AsyncClient(base_url=api_process.url, timeout=30) as http:
        yield Api(http, settings.admin_token.get_secret_value())
