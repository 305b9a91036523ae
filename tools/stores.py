"""The local Neo4j (the Java launcher in ``launcher/``) and Redis of a profile, and the detached
background processes of the local stack: pid files in ``<data_dir>/run/``, logs in
``<data_dir>/logs/``; a process is stopped only when its pid file names it and its command line
is the one we started."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from services.settings import Settings

REPO = Path(__file__).resolve().parent.parent


LAUNCHER = REPO / "launcher"


TARGET = LAUNCHER / "target"


MAIN_CLASS = "botmemory.Neo4jLauncher"


JVM_FLAGS = (
    # Neo4j 5 on Java 17: without java.nio the page cache falls back to a slower mode.
    *(
        f"--add-opens=java.base/{pkg}=ALL-UNNAMED"
        for pkg in ("java.lang", "java.nio", "java.io", "java.util", "java.util.concurrent", "sun.nio.ch")
    ),
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dlog4j2.disable.jmx=true",
    "-Dfile.encoding=UTF-8",
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:+ExitOnOutOfMemoryError",
)


NEO4J_TIMEOUT = 180.0


REDIS_TIMEOUT = 30.0


#: The offline model (``tools.model_stub``) listens beside the API: its port + 99 (8099), or this.
STUB_PORT_ENV = "BOTMEMORY_MODEL_STUB_PORT"


#: The model name the local stack and the demo give the offline model (it serves any name).
STUB_MODEL = "botmemory-stub"


def stub_port(s: Settings) -> int:
    """The offline model's port: ``BOTMEMORY_MODEL_STUB_PORT``, else the API's port + 99."""
    given = os.environ.get(STUB_PORT_ENV)
    if not given:
        return s.api_port + 99
    if not given.isdigit() or not 1 <= int(given) <= 65535:
        raise StackError(f"{STUB_PORT_ENV} is a port: a whole number from 1 to 65535")
    return int(given)


Popen = subprocess.Popen[bytes]


class StackError(RuntimeError):
    """A service could not be started or checked; the message says what to look at."""


@dataclass(frozen=True)
class Proc:
    """One background process of a profile: its pid file, log, command-line markers and the
    environment entries it was started with (``child_env``: the profile's data dir), for a
    process whose command line is the same in every profile."""

    name: str
    pid_file: Path
    log_file: Path
    markers: tuple[str, ...]
    stop_timeout: float
    env_markers: tuple[str, ...] = ()


def data_dir(s: Settings) -> Path:
    """The profile's data directory as an absolute path."""
    return s.data_dir.resolve()


def procs(s: Settings) -> dict[str, Proc]:
    """The processes of this profile, in start order."""
    d = data_dir(s)

    def proc(
        name: str, markers: tuple[str, ...], stop_timeout: float = 20.0, env: tuple[str, ...] = ()
    ) -> Proc:
        return Proc(name, d / "run" / f"{name}.pid", d / "logs" / f"{name}.log", markers, stop_timeout, env)

    return {
        "neo4j": proc("neo4j", (MAIN_CLASS, f"--home {d / 'neo4j'} "), 90.0),
        # redis-server rewrites its title to "redis-server 127.0.0.1:PORT".
        "redis": proc("redis", ("redis-server", f"127.0.0.1:{s.redis_port} ")),
        "model": proc("model", ("-m tools.model_stub ", f"--port {stub_port(s)} ")),
        "api": proc("api", ("-m botmemory.serve ", f"--port {s.api_port} ")),
        # Every profile's worker reads ``-m learning.worker``: a stale pid file whose pid is now
        # another profile's worker (tests, bench, eval) is told apart by the data dir it was given.
        # Asked to stop, it lets its running steps end (``Settings.stop_seconds``).
        "worker": proc(
            "worker", ("-m learning.worker",), s.stop_seconds() + 5.0, env=(f"BOTMEMORY_DATA_DIR={d}",)
        ),
    }


def running_pid(p: Proc) -> int | None:
    """The pid from ``p``'s pid file if that process is alive and is the one we started."""
    try:
        pid = int(p.pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        environ = (
            Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
            if p.env_markers
            else []
        )
    except (OSError, ValueError):
        return None
    ours = all(m in cmdline + " " for m in p.markers) and all(e in environ for e in p.env_markers)
    return pid if ours else None


def spawn(p: Proc, cmd: Sequence[str], env: dict[str, str]) -> Popen:
    """Start ``cmd`` detached (own session, log file, no stdin) and write its pid file."""
    p.pid_file.parent.mkdir(parents=True, exist_ok=True)
    p.log_file.parent.mkdir(parents=True, exist_ok=True)
    with p.log_file.open("ab") as log:
        log.write(f"\n=== devstack: starting {p.name} at {time.strftime('%F %T')} ===\n".encode())
        log.flush()
        child = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    p.pid_file.write_text(f"{child.pid}\n")
    print(f"{p.name}: started (pid {child.pid}), log {p.log_file}")
    return child


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (empty if missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


#: The last line of a Python traceback: ``package.module.SomeError: what went wrong``.
_RAISED: Final = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception|Exit|TooNew|Unavailable)): (.+)$"
)


def why_it_failed(path: Path) -> str:
    """What a process's log says it failed of, in one line: the message of the exception it died
    of (not the traceback), else its last line; empty when the log says nothing."""
    lines = [line.strip() for line in tail(path, 200).splitlines() if line.strip()]
    for line in reversed(lines):
        found = _RAISED.match(line)
        if found:
            return found.group(2)
    return lines[-1][:300] if lines else ""


def failure(name: str, what: str, log_file: Path) -> StackError:
    """``<name> <what>: <why>; log: <file>`` — one sentence instead of a log tail."""
    why = why_it_failed(log_file)
    return StackError(f"{name} {what}{': ' + why if why else ''} (log: {log_file})")


def wait_until(p: Proc, ready: Callable[[], bool], timeout: float, child: Popen | None) -> None:
    """Poll ``ready`` until true; fail early with the log tail when the process dies."""
    deadline = time.monotonic() + timeout
    while not ready():
        died = child.poll() is not None if child is not None else running_pid(p) is None
        if died or time.monotonic() > deadline:
            raise failure(p.name, "exited" if died else f"not ready after {timeout:.0f}s", p.log_file)
        time.sleep(0.5)


def host_port(url: str, default_port: int) -> tuple[str, int]:
    """Host and port of a ``bolt://`` / ``redis://`` / ``http://`` URL."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def child_env(s: Settings) -> dict[str, str]:
    """Our environment (OPENAI_*, BOTMEMORY_*, ...) with an absolute data dir, for the children."""
    return {**os.environ, "BOTMEMORY_DATA_DIR": str(data_dir(s)), "PYTHONUNBUFFERED": "1"}


def launcher_fingerprint() -> tuple[str, str]:
    """Hashes of the launcher's pom and of its Java sources."""
    pom = hashlib.sha256((LAUNCHER / "pom.xml").read_bytes()).hexdigest()
    src = hashlib.sha256()
    for f in sorted((LAUNCHER / "src").rglob("*.java")):
        src.update(f.read_bytes())
    return pom, src.hexdigest()


def ensure_launcher() -> None:
    """Build the launcher unless jars, classes and the build stamp match pom and sources.

    A changed pom (or missing jars) runs Maven, which needs the network once; a changed Java source
    alone is recompiled offline with javac.
    """
    TARGET.mkdir(exist_ok=True)
    stamp = TARGET / "devstack-build.stamp"
    with (TARGET / "devstack-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pom, src = launcher_fingerprint()
        old = stamp.read_text().split() if stamp.exists() else []
        jars = all(any((TARGET / d).glob(g)) for d, g in (("lib", "neo4j-kernel-*"), ("plugins", "apoc-*")))
        main_class = (TARGET / "classes" / "botmemory" / "Neo4jLauncher.class").exists()
        if old == [pom, src] and jars and main_class:
            return
        if old[:1] == [pom] and jars:
            print("neo4j: recompiling the launcher (javac)")
            sources = [str(f) for f in (LAUNCHER / "src").rglob("*.java")]
            cmd = ["javac", "--release", "17", "-d", str(TARGET / "classes"), "-cp", f"{TARGET / 'lib'}/*"]
            subprocess.run([*cmd, *sources], check=True)
        else:
            if shutil.which("mvn") is None:
                raise StackError("Maven (mvn) is needed once to fetch the Neo4j jars into launcher/target")
            print("neo4j: building the launcher with Maven (downloads the Neo4j jars once)")
            for d in ("lib", "plugins"):  # no stale jars of another version on the classpath
                shutil.rmtree(TARGET / d, ignore_errors=True)
            subprocess.run(["mvn", "-B", "-q", "-f", str(LAUNCHER / "pom.xml"), "compile"], check=True)
        stamp.write_text(f"{pom}\n{src}\n")


def neo4j_ready(s: Settings, password: str) -> bool:
    """Whether Bolt accepts the settings' credentials and the ``neo4j`` database answers."""
    from neo4j import GraphDatabase
    from neo4j.exceptions import DriverError, Neo4jError

    if not port_open(*host_port(s.neo4j_uri, 7687)):
        return False
    try:
        auth = (s.neo4j_user, password)
        with (
            GraphDatabase.driver(s.neo4j_uri, auth=auth, connection_timeout=3.0) as d,  # pyright: ignore[reportUnknownMemberType]
            d.session(database="neo4j") as session,  # pyright: ignore[reportUnknownMemberType]
        ):
            session.run("RETURN 1").consume()  # auto-commit: no driver-side retries
            return True
    except (DriverError, Neo4jError, OSError):
        return False


def password_file(s: Settings, password: str) -> Path:
    """A 0600 file holding the Neo4j password for the launcher (the settings' own file if it is one)."""
    own = data_dir(s) / "neo4j-password"
    if own.exists() and own.read_text().strip() == password:
        return own
    run = data_dir(s) / "run" / "neo4j-password"  # password came from BOTMEMORY_NEO4J_PASSWORD
    run.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(run, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    return run


def ensure_neo4j(s: Settings) -> None:
    """Reuse a reachable Neo4j or start the launcher, then wait for an authenticated Bolt session."""
    p = procs(s)["neo4j"]
    password = s.neo4j_password.get_secret_value() if s.neo4j_password else ""
    host, port = host_port(s.neo4j_uri, 7687)
    child: Popen | None = None
    log_start = p.log_file.stat().st_size if p.log_file.exists() else 0
    if (pid := running_pid(p)) is not None:
        print(f"neo4j: already running (pid {pid})")
    elif port_open(host, port):
        if not neo4j_ready(s, password):
            raise StackError(f"{host}:{port} is in use by a server that rejects the settings' Neo4j login")
        print(f"neo4j: reusing the server on {host}:{port} (not started by devstack)")
        return
    else:
        if len(password) < 8:  # the launcher failed on a shorter one with a Java stack trace
            raise StackError("BOTMEMORY_NEO4J_PASSWORD needs at least 8 characters (Neo4j's rule)")
        ensure_launcher()
        home = data_dir(s) / "neo4j"
        cmd = [
            shutil.which("java") or "java", *JVM_FLAGS, f"-Xms{s.neo4j_heap}", f"-Xmx{s.neo4j_heap}",
            "-cp", f"{TARGET / 'classes'}:{TARGET / 'lib'}/*", MAIN_CLASS,
            "--home", str(home), "--port", str(s.neo4j_bolt_port),
            "--password-file", str(password_file(s, password)),
            "--plugins", str(TARGET / "plugins"), "--pagecache", s.neo4j_pagecache,
        ]  # fmt: skip
        child = spawn(p, cmd, child_env(s))

    def ready() -> bool:
        # A launcher we just started is ready once it has set the password and printed NEO4J_READY.
        if child is not None:
            with p.log_file.open("rb") as log:
                log.seek(log_start)
                if b"NEO4J_READY" not in log.read():
                    return False
        return neo4j_ready(s, password)

    started = time.monotonic()
    wait_until(p, ready, NEO4J_TIMEOUT, child)
    print(f"neo4j: ready on {s.neo4j_uri} ({time.monotonic() - started:.1f}s)")


def redis_ping(host: str, port: int) -> bool:
    """Whether a Redis server answers PING on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def apt_install(what: str, packages: list[str]) -> None:
    """Install Debian ``packages`` with apt-get (sudo when not root), updating the index first
    when the install fails on a stale one."""
    print(f"{what}: not found, installing {' '.join(packages)} with apt-get")
    apt = ["apt-get"] if os.geteuid() == 0 else ["sudo", "apt-get"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run([*apt, "install", "-y", *packages], env=env, check=False).returncode != 0:
        subprocess.run([*apt, "update"], env=env, check=True)
        subprocess.run([*apt, "install", "-y", *packages], env=env, check=True)


def redis_server() -> str:
    """Path of ``redis-server``, installed with apt-get when missing."""
    if exe := shutil.which("redis-server"):
        return exe
    apt_install("redis", ["redis-server"])
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(exe).exists():
        raise StackError("redis-server is still missing after apt-get install")
    return exe


def ensure_redis(s: Settings) -> None:
    """Reuse a Redis that answers PING on the settings' URL, or start one without persistence."""
    p = procs(s)["redis"]
    host, port = host_port(s.redis_url, 6379)
    if redis_ping(host, port):
        print(f"redis: already answering on {host}:{port}")
        return
    child: Popen | None = None
    if running_pid(p) is None:
        redis_dir = data_dir(s) / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            redis_server(), "--port", str(s.redis_port), "--bind", "127.0.0.1", "--dir", str(redis_dir),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
        ]  # fmt: skip
        child = spawn(p, cmd, child_env(s))
    wait_until(p, lambda: redis_ping(host, port), REDIS_TIMEOUT, child)
    print(f"redis: ready on {host}:{port}")


def _other_settings_pid(p: Proc) -> int | None:
    """The pid in ``p``'s pid file when that process is alive, of ``p``'s kind (its first marker)
    and this profile's (started with its data dir, which the pid file lives in), but not the one
    these settings start: started with other ports, say. Another profile's process that took a
    stale pid file's pid (the tests', the bench's) is none."""
    data = p.pid_file.parent.parent
    try:
        pid = int(p.pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except (OSError, ValueError):
        return None
    # Started with this profile's data dir: in its environment, or (redis-server, which overwrites
    # its environment with its title) working in it (``--dir``).
    profile = f"BOTMEMORY_DATA_DIR={data}" in environ or cwd.is_relative_to(data)
    ours = p.markers[0] in cmdline + " " and profile
    return pid if ours and running_pid(p) is None else None


def stop(p: Proc) -> bool:
    """SIGTERM the process of ``p`` (SIGKILL after its timeout) and remove its pid file; whether
    it was running. A process of its kind started with other settings is left running, with its
    pid file and a warning (its pid file was removed, and the process forgotten)."""
    other = _other_settings_pid(p)
    if other is not None:
        print(
            f"{p.name}: pid {other} ({p.pid_file}) was started with other settings than these (another "
            "port?); left running: stop it with the settings it was started with, or kill it"
        )
        return False
    pid = running_pid(p)
    if pid is not None:
        print(f"{p.name}: stopping (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + p.stop_timeout
        while running_pid(p) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if running_pid(p) is not None:
            print(f"{p.name}: still running after {p.stop_timeout:.0f}s, sending SIGKILL")
            os.kill(pid, signal.SIGKILL)
    p.pid_file.unlink(missing_ok=True)
    return pid is not None
