"""``make up`` (``python -m tools.devstack up``) checks every port the stack binds before it starts
anything: against the test stack's Neo4j and Redis, which it reuses as it would a local one."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from services.settings import Settings, load_settings
from tools import devstack
from tools.processes import free_port
from tools.stores import procs, stop


def listening(held: contextlib.ExitStack) -> int:
    """A port that a process this devstack did not start listens on, for the test's length."""
    squatter = held.enter_context(socket.socket())
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    return int(squatter.getsockname()[1])


@pytest.mark.parametrize("api_taken", [False, True])
def test_a_port_in_use_stops_up_before_anything_starts(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    api_taken: bool,
) -> None:
    """With the worker's metrics port taken, ``make up`` said so only after it had started the
    offline model and the API, and left them running. Now each port in use is named with the
    setting that moves it, and nothing is started."""
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    with contextlib.ExitStack() as held:
        metrics = listening(held)
        api = listening(held) if api_taken else free_port()
        for name, value in {
            "BOTMEMORY_DATA_DIR": str(tmp_path / "data"),
            "BOTMEMORY_NEO4J_URI": settings.neo4j_uri,  # the test stack's: reused, not started
            "BOTMEMORY_NEO4J_PASSWORD": password,
            "BOTMEMORY_REDIS_URL": settings.redis_url,
            "BOTMEMORY_API_PORT": str(api),
            "BOTMEMORY_MODEL_STUB_PORT": str(free_port()),
            "BOTMEMORY_WORKER_METRICS_PORT": str(metrics),
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        try:
            status = devstack.main(["up"])
        finally:
            for p in procs(load_settings()).values():  # what a failed check left running, if any
                stop(p)
    said = capsys.readouterr()
    assert status == 1, said
    held_by = "is in use by a process this devstack did not start"
    taken = [f"127.0.0.1:{api} {held_by} (set BOTMEMORY_API_PORT)"] if api_taken else []
    taken.append(f"127.0.0.1:{metrics} {held_by} (set BOTMEMORY_WORKER_METRICS_PORT)")
    assert said.err == f"devstack: {'; '.join(taken)}; nothing was started\n"
    assert "started (pid" not in said.out and "stopping" not in said.out, said.out
    assert not list((tmp_path / "data" / "run").glob("*.pid"))
