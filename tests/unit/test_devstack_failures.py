"""``make up`` says why a process failed in one sentence, with where its log is (issue 17)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.settings import Settings
from tools import devstack
from tools.processes import free_port
from tools.stores import Proc, failure, procs, running_pid, stop, why_it_failed

TRACEBACK = """\
12:00:01 INFO botmemory schema version 7
Traceback (most recent call last):
  File "/app/learning/worker.py", line 41, in startup
    runtime = await stack.enter_async_context(open_runtime(settings, schema="wait"))
  File "/app/services/bootstrap.py", line 52, in wait_for_schema
    raise SchemaTooNew(version)
services.bootstrap.SchemaTooNew: the database schema is version 9, newer than this code's 8: upgrade this process
"""


def test_the_exception_a_process_died_of_is_the_sentence(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(TRACEBACK)
    assert (
        why_it_failed(log)
        == "the database schema is version 9, newer than this code's 8: upgrade this process"
    )
    message = str(failure("worker", "exited", log))
    assert message == (
        "worker exited: the database schema is version 9, newer than this code's 8: upgrade this process"
        f" (log: {log})"
    )
    assert "Traceback" not in message and "\n" not in message


def test_without_an_exception_the_last_line_and_without_a_log_nothing(tmp_path: Path) -> None:
    log = tmp_path / "neo4j.log"
    log.write_text("starting\nERROR Address already in use: 127.0.0.1:7687\n\n")
    assert why_it_failed(log) == "ERROR Address already in use: 127.0.0.1:7687"
    assert why_it_failed(tmp_path / "missing.log") == ""
    assert str(failure("api", "not ready after 120s", tmp_path / "missing.log")) == (
        f"api not ready after 120s (log: {tmp_path / 'missing.log'})"
    )


def test_make_test_installs_the_suites_tools_that_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make test`` on a fresh machine: the page tests' chromium and the quickstart's curl and jq
    come with apt-get like redis-server (only .ci/run installed them; the README's second command
    failed those tests without them). Nothing is installed when all are there."""
    installed: list[list[str]] = []
    have = {"curl"}

    def apt_install(what: str, packages: list[str]) -> None:
        installed.append(packages)

    def which(exe: str) -> str | None:
        return f"/usr/bin/{exe}" if exe in have else None

    monkeypatch.setattr(devstack, "apt_install", apt_install)
    monkeypatch.setattr(devstack.shutil, "which", which)
    assert devstack.main(["test-tools"]) == 0
    assert installed == [["chromium", "jq"]]
    have |= {"chromium", "jq"}
    installed.clear()
    assert devstack.main(["test-tools"]) == 0
    assert installed == []


def test_a_workers_pid_file_names_only_the_worker_of_its_own_profile(tmp_path: Path) -> None:
    """Every profile's worker runs ``python -m learning.worker``: a stale pid file whose pid is now
    another profile's worker (tests, bench, eval) was taken for this profile's — ``make down``
    stopped it, ``make up`` started none. The data dir it was started with tells them apart."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m learning.worker"],
        env={**os.environ, "BOTMEMORY_DATA_DIR": str(theirs.resolve())},
    )
    try:
        for data in (ours, theirs):
            p = procs(Settings(env="local", data_dir=data))["worker"]
            p.pid_file.parent.mkdir(parents=True)
            p.pid_file.write_text(f"{worker.pid}\n")
        assert running_pid(procs(Settings(env="local", data_dir=theirs))["worker"]) == worker.pid
        assert running_pid(procs(Settings(env="local", data_dir=ours))["worker"]) is None
    finally:
        worker.kill()
        worker.wait()


def test_a_bad_setting_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``BOTMEMORY_API_PORT=abc make up`` printed the settings' traceback: the settings were read
    before the command's own error handling."""
    monkeypatch.setenv("BOTMEMORY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BOTMEMORY_API_PORT", "abc")
    assert devstack.main(["status"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("devstack: invalid settings: api_port") and err.count("\n") == 1, err


def test_down_leaves_a_process_started_with_other_settings_and_its_pid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After ``BOTMEMORY_API_PORT=8001 make up``, a plain ``make down`` removed the API's pid file
    although the process lived on (its markers name the other port): it was forgotten for good.
    It is left running now, with its pid file, and the command says so."""
    (tmp_path / "run").mkdir()
    pid_file = tmp_path / "run" / "api.pid"
    api = Proc("api", pid_file, tmp_path / "api.log", ("-m botmemory.serve ", "--port 8000 "), 5.0, ())
    command = [sys.executable, "-c", "import time; time.sleep(60)", "-m botmemory.serve ", "--port 8001 "]
    # Another profile's process (its own data dir) that took a stale pid file's pid: the file goes.
    stranger = subprocess.Popen(command, env={**os.environ, "BOTMEMORY_DATA_DIR": str(tmp_path / "other")})
    # This profile's, started with another port: it stays, with its pid file.
    other = subprocess.Popen(command, env={**os.environ, "BOTMEMORY_DATA_DIR": str(tmp_path)})
    try:
        for process in (stranger, other):  # its command line shows a moment after it starts
            until_shown(process.pid, "-m botmemory.serve")
        pid_file.write_text(f"{stranger.pid}\n")
        assert stop(api) is False and not pid_file.exists() and stranger.poll() is None
        pid_file.write_text(f"{other.pid}\n")
        assert stop(api) is False
        assert pid_file.exists() and other.poll() is None
        assert "started with other settings" in capsys.readouterr().out
        other.kill()
        other.wait()
        assert stop(api) is False and not pid_file.exists()  # gone: the stale file goes
    finally:
        for process in (stranger, other):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_down_tells_a_redis_of_this_profile_by_its_working_dir(tmp_path: Path) -> None:
    """redis-server overwrites its environment with its title: it is this profile's when it works
    in the profile's data dir (``--dir``), as devstack starts it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "redis").mkdir()
    pid_file = tmp_path / "run" / "redis.pid"
    redis = Proc("redis", pid_file, tmp_path / "redis.log", ("redis-server", "127.0.0.1:6379 "), 5.0, ())
    bare = {k: v for k, v in os.environ.items() if k != "BOTMEMORY_DATA_DIR"}
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "redis-server", "127.0.0.1:6380 "],
        cwd=tmp_path / "redis",
        env=bare,
    )
    try:
        until_shown(other.pid, "redis-server")
        pid_file.write_text(f"{other.pid}\n")
        assert stop(redis) is False and pid_file.exists() and other.poll() is None
    finally:
        other.kill()
        other.wait()


def until_shown(pid: int, text: str) -> None:
    """Until /proc shows ``text`` in the process's command line (empty right after it starts)."""
    deadline = time.monotonic() + 10
    while text not in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
        assert time.monotonic() < deadline, "the command line never showed"
        time.sleep(0.01)


def test_a_bad_stub_port_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``BOTMEMORY_MODEL_STUB_PORT`` was read with a bare ``int()``: a traceback."""
    monkeypatch.setenv("BOTMEMORY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BOTMEMORY_MODEL_STUB_PORT", "abc")
    assert devstack.main(["status"]) == 1
    err = capsys.readouterr().err
    assert err == "devstack: BOTMEMORY_MODEL_STUB_PORT is a port: a whole number from 1 to 65535\n"


def test_status_says_a_port_is_held_by_a_process_it_did_not_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another checkout's API on this profile's port was "not started by devstack, answering",
    which read as this stack's own. Status says whose it is not, and the setting that moves it."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        api = int(squatter.getsockname()[1])
        for name, value in {
            "BOTMEMORY_DATA_DIR": str(tmp_path),
            "BOTMEMORY_NEO4J_URI": f"bolt://127.0.0.1:{free_port()}",
            "BOTMEMORY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "BOTMEMORY_API_PORT": str(api),
            "BOTMEMORY_MODEL_STUB_PORT": str(free_port()),
            "BOTMEMORY_WORKER_METRICS_PORT": str(free_port()),
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        assert devstack.main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert lines == [
        "  neo4j   not running",
        "  redis   not running",
        "  model   not running",
        f"  api     not running; 127.0.0.1:{api} is in use by a process this devstack did not start "
        "(set BOTMEMORY_API_PORT)",
        "  worker  not running",
    ]
