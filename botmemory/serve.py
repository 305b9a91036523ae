"""The API server: ``python -m botmemory.serve [--host H] [--port P]`` runs uvicorn on the
settings' host and port (``BOTMEMORY_API_HOST``/``_PORT``) unless given.

Every place that starts the API (``make up``, the tests, the benchmark, the container) goes
through here, so they all run the same server options. WebSocket per-message deflate is off:
change events are small JSON documents written to many subscriptions, and compressing every
copy separately per connection cost more CPU than the rest of the fan-out together (measured
with ``make bench``; see bench/README.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import uvicorn

from services.settings import load_settings


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_settings()
    parser = argparse.ArgumentParser(prog="python -m botmemory.serve", description="Run the API server.")
    parser.add_argument("--host", default=settings.api_host)
    parser.add_argument("--port", type=int, default=settings.api_port)
    args = parser.parse_args(argv)
    uvicorn.run(
        "botmemory.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        ws_per_message_deflate=False,
    )


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


if __name__ == "__main__":
    main()
