"""How often the whole stack starts from nothing: ``make up``'s command (``python -m
tools.devstack up``) on a fresh data directory, N times, each on its own ports, then ``down``.

A start counts when the command exits 0 with the API answering ``/healthz`` and the worker
ready; a failure is reported with the one sentence the command printed. Issue 17 asks for 20/20.

    python -m bench.fresh_start [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def start_once(base_port: int, root: Path) -> tuple[bool, float, str]:
    """One fresh start and stop; (succeeded, seconds to ready, what it printed on failure)."""
    env = {
        **os.environ,
        "BOTMEMORY_ENV": "local",
        "BOTMEMORY_DATA_DIR": str(root),
        "BOTMEMORY_NEO4J_BOLT_PORT": str(base_port),
        "BOTMEMORY_NEO4J_URI": f"bolt://127.0.0.1:{base_port}",
        "BOTMEMORY_REDIS_PORT": str(base_port + 1),
        "BOTMEMORY_REDIS_URL": f"redis://127.0.0.1:{base_port + 1}/0",
        "BOTMEMORY_API_PORT": str(base_port + 2),
        # Its own, too: the local stack's worker (``make up``) holds the default 9464.
        "BOTMEMORY_WORKER_METRICS_PORT": str(base_port + 3),
    }
    python = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable
    started = time.perf_counter()
    try:
        up = subprocess.run(
            [python, "-m", "tools.devstack", "up"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        seconds = time.perf_counter() - started
        worker_log = root / "logs" / "worker.log"
        ready = (
            up.returncode == 0
            and worker_log.exists()
            and "worker ready" in _wait_for(worker_log, "worker ready")
        )
        return ready, seconds, "" if ready else (up.stderr.strip() or up.stdout.strip())[-500:]
    finally:
        subprocess.run(
            [python, "-m", "tools.devstack", "down"], cwd=REPO, env=env, capture_output=True, timeout=120
        )


def _wait_for(path: Path, text: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    content = ""
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            break
        time.sleep(0.2)
    return content


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.fresh_start", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--runs", type=int, default=20)
    p.add_argument(
        "--port",
        type=int,
        default=21687,
        help="first of three ports (bolt, redis, api), below the ephemeral range",
    )
    args = p.parse_args(argv)
    ok, times = 0, list[float]()
    for run in range(1, args.runs + 1):
        root = Path(tempfile.mkdtemp(prefix="botmemory-fresh-"))
        try:
            good, seconds, said = start_once(args.port, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ok += good
        times.append(seconds)
        print(
            f"run {run}: {'ok' if good else 'FAILED'} in {seconds:.1f} s{'' if good else ' — ' + said}",
            flush=True,
        )
    times.sort()
    print(f"{ok}/{args.runs} fresh starts succeeded; median {times[len(times) // 2]:.1f} s to ready")
    return 0 if ok == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
