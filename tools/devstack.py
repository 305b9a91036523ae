"""Local stack manager: ``python -m tools.devstack services|up|down|status``.

Runs, for the profile of the current settings (``BOTMEMORY_*``), detached background processes:
Neo4j Community (the Java launcher in ``launcher/``), Redis, the API (uvicorn) and one arq worker (``python -m learning.worker``);
without ``OPENAI_BASE_URL`` also the offline model (``python -m tools.model_stub``), which the API
and the worker then use.
Pid files live in ``<data_dir>/run/``, logs in ``<data_dir>/logs/``. ``down`` stops only processes
that a pid file names and whose command line is the one we started. Secrets are never printed.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from typing import Final

from services.settings import ConfigurationError, Settings, load_settings
from tools.stores import (
    REPO,
    STUB_MODEL,
    STUB_PORT_ENV,
    Popen,
    StackError,
    apt_install,
    child_env,
    data_dir,
    ensure_neo4j,
    ensure_redis,
    failure,
    host_port,
    neo4j_ready,
    port_open,
    procs,
    redis_ping,
    running_pid,
    spawn,
    stop,
    stub_port,
    wait_until,
)

API_TIMEOUT = 120.0
MODEL_TIMEOUT = 60.0
STUB_LINE = "model: offline stub (learns plain 'I …' sentences) — set OPENAI_BASE_URL for a real model"


# --- the offline model ---------------------------------------------------------------------------


def model_env(s: Settings) -> dict[str, str]:
    """What the API and the worker need to use the offline model: nothing when ``OPENAI_BASE_URL``
    is set; else its URL, a placeholder key and a price of 0 for its calls (so a budget can be
    set), the price table's own entries kept."""
    if s.openai_base_url:
        return {}
    free = {"input": 0, "output": 0}
    prices = {"*": free, **{m: p.model_dump() for m, p in s.model_prices.items()}, STUB_MODEL: free}
    return {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{stub_port(s)}/v1",
        "OPENAI_API_KEY": "offline-stub",
        "BOTMEMORY_MODEL_PRICES": json.dumps(prices),
    }


def ensure_model(s: Settings) -> None:
    """Without ``OPENAI_BASE_URL``, start the offline model (unless running) and wait for its port."""
    if s.openai_base_url:
        return
    p, port = procs(s)["model"], stub_port(s)
    child: Popen | None = None
    if running_pid(p) is None:
        if port_open("127.0.0.1", port):
            raise StackError(
                f"127.0.0.1:{port} (the offline model's port) is already in use by another process; "
                "set BOTMEMORY_MODEL_STUB_PORT or OPENAI_BASE_URL"
            )
        child = spawn(p, [python_exe(), "-m", "tools.model_stub", "--port", str(port)], child_env(s))
    wait_until(p, lambda: port_open("127.0.0.1", port), MODEL_TIMEOUT, child)
    print(STUB_LINE)


# --- API and worker ------------------------------------------------------------------------------


def healthz(host: str, port: int) -> bool:
    """Whether ``GET /healthz`` answers 200."""
    conn = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def python_exe() -> str:
    """The project's venv interpreter, or the current one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def app_commands(s: Settings) -> dict[str, list[str]]:
    """How the API and the worker are started (their markers in ``procs`` must match these)."""
    py = python_exe()
    return {
        "api": [py, "-m", "botmemory.serve", "--host", s.api_host, "--port", str(s.api_port)],
        "worker": [py, "-m", "learning.worker"],
    }


def ensure_app(s: Settings) -> None:
    """Start the API and one worker (unless running) and wait for ``/healthz``."""
    ps, env, cmds = procs(s), {**child_env(s), **model_env(s)}, app_commands(s)
    api: Popen | None = None
    if running_pid(ps["api"]) is None:
        if port_open(s.api_host, s.api_port):
            raise StackError(f"{s.api_host}:{s.api_port} is already in use by another process")
        api = spawn(ps["api"], cmds["api"], env)
    if running_pid(ps["worker"]) is None:
        if s.worker_metrics_port and port_open(s.worker_metrics_host, s.worker_metrics_port):
            where = f"{s.worker_metrics_host}:{s.worker_metrics_port}"
            raise StackError(f"{where} (BOTMEMORY_WORKER_METRICS_PORT) is already in use by another process")
        spawn(ps["worker"], cmds["worker"], env)
    wait_until(ps["api"], lambda: healthz(s.api_host, s.api_port), API_TIMEOUT, api)
    worker = ps["worker"]
    if running_pid(worker) is None:
        raise failure("worker", "exited", worker.log_file)
    token = "BOTMEMORY_ADMIN_TOKEN" if "BOTMEMORY_ADMIN_TOKEN" in os.environ else data_dir(s) / "admin-token"
    print(f"api: ready. GraphiQL: http://{s.api_host}:{s.api_port}/graphql")
    if s.worker_metrics_port:
        print(f"worker metrics: http://{s.worker_metrics_host}:{s.worker_metrics_port}/metrics")
    print(f"admin token: in {token}")


# --- ports ---------------------------------------------------------------------------------------


#: The setting that moves each process's port.
PORT_SETTINGS: Final = {
    "neo4j": "BOTMEMORY_NEO4J_BOLT_PORT",
    "redis": "BOTMEMORY_REDIS_PORT",
    "model": STUB_PORT_ENV,
    "api": "BOTMEMORY_API_PORT",
    "worker": "BOTMEMORY_WORKER_METRICS_PORT",
}


def addresses(s: Settings) -> dict[str, tuple[str, int]]:
    """Where each process of the stack listens (the worker: its metrics; none when they are off,
    nor the offline model when ``OPENAI_BASE_URL`` is set)."""
    found = {
        "neo4j": host_port(s.neo4j_uri, 7687),
        "redis": host_port(s.redis_url, 6379),
        "model": ("127.0.0.1", stub_port(s)),
        "api": (s.api_host, s.api_port),
        "worker": (s.worker_metrics_host, s.worker_metrics_port),
    }
    if s.openai_base_url:
        del found["model"]
    if not s.worker_metrics_port:
        del found["worker"]
    return found


def taken(name: str, where: tuple[str, int]) -> str:
    """What an operator is told of a port that a process this devstack did not start holds."""
    return f"{where[0]}:{where[1]} is in use by a process this devstack did not start (set {PORT_SETTINGS[name]})"


def reusable(s: Settings, name: str) -> bool:
    """Whether what holds ``name``'s port is one ``up`` uses as it is: a Neo4j that takes the
    settings' login, a Redis that answers."""
    if name == "neo4j":
        return neo4j_ready(s, s.neo4j_password.get_secret_value() if s.neo4j_password else "")
    return name == "redis" and redis_ping(*host_port(s.redis_url, 6379))


def check_ports(s: Settings, names: Sequence[str]) -> None:
    """Before anything starts: every port the processes ``names`` bind is free, or held by what
    ``up`` reuses (this profile's processes, :func:`reusable`). A port held by anything else stops
    the command here, each named with the setting that moves it, before any process starts."""
    ps = procs(s)
    problems = [
        taken(name, where)
        for name, where in addresses(s).items()
        if name in names and running_pid(ps[name]) is None and port_open(*where) and not reusable(s, name)
    ]
    if problems:
        raise StackError("; ".join(problems) + "; nothing was started")


# --- commands ------------------------------------------------------------------------------------


@contextmanager
def profile_lock(s: Settings) -> Generator[None, None, None]:
    """Serialize devstack commands of one profile."""
    run = data_dir(s) / "run"
    run.mkdir(parents=True, exist_ok=True)
    with (run / "devstack.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def status(s: Settings) -> None:
    """Print which processes of this profile run and whether their ports answer."""
    checks = {
        "neo4j": lambda: port_open(*host_port(s.neo4j_uri, 7687)),
        "redis": lambda: redis_ping(*host_port(s.redis_url, 6379)),
        "model": lambda: port_open("127.0.0.1", stub_port(s)),
        "api": lambda: healthz(s.api_host, s.api_port),
        "worker": lambda: (
            s.worker_metrics_port > 0 and port_open(s.worker_metrics_host, s.worker_metrics_port)
        ),
    }
    listens = addresses(s)
    print(f"profile {s.env}, data dir {data_dir(s)}")
    for name, p in procs(s).items():
        pid = running_pid(p)
        if pid is not None:
            state = f"running (pid {pid}){', answering' if checks[name]() else ''}"
        elif name == "model" and s.openai_base_url:
            state = "OPENAI_BASE_URL is set (no offline model)"
        elif name in listens and port_open(*listens[name]):
            state = "not running; " + taken(name, listens[name])
        else:
            state = "not running"
        print(f"  {name:7} {state}")


#: What the test suite runs besides the stores (``make test``), by the Debian package that brings
#: it: the page tests' headless browser (any of the names ``tests/browser.py`` looks for) and the
#: README quickstart's tools (``tests/test_quickstart.py`` runs it as written).
TEST_TOOLS: Final = {
    "chromium": ("chromium", "chromium-browser", "google-chrome"),
    "curl": ("curl",),
    "jq": ("jq",),
}


def test_tools() -> None:
    """Install the test suite's tools that are missing (apt-get, as for ``redis-server``): on a
    fresh machine ``make test`` failed its page and quickstart tests without them."""
    missing = [package for package, names in TEST_TOOLS.items() if not any(map(shutil.which, names))]
    if missing:
        apt_install("test tools", missing)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``services``, ``up``, ``down``, ``status`` or ``test-tools``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in ("services", "up", "down", "status", "test-tools"):
        print("usage: python -m tools.devstack services|up|down|status|test-tools", file=sys.stderr)
        return 2
    if args[0] == "test-tools":
        try:
            test_tools()
        except subprocess.CalledProcessError as exc:
            print(f"devstack: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        s = load_settings()  # also generates the local secrets into the data dir on first start
    except (ConfigurationError, OSError) as exc:  # a bad setting, a data dir it cannot write
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    try:
        with profile_lock(s):
            if args[0] in ("services", "up"):
                check_ports(s, ("neo4j", "redis") if args[0] == "services" else tuple(PORT_SETTINGS))
                ensure_neo4j(s)
                ensure_redis(s)
            if args[0] == "up":
                ensure_model(s)
                ensure_app(s)
            elif args[0] == "down":
                stopped = [p.name for p in reversed(procs(s).values()) if stop(p)]
                print(
                    f"stopped {', '.join(stopped)} of profile {s.env}"
                    if stopped
                    else f"nothing of profile {s.env} was running"
                )
            elif args[0] == "status":
                status(s)
    except (StackError, subprocess.CalledProcessError) as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
