"""A Neo4j that accepts connections and never answers (its JVM paused, a host that stopped
responding) holds no request: a connection is given up after the silence Neo4j's keep-alive hint
allows (our launcher: NOOPs every second, 5 probes), and a new one after
``graph.driver.CONNECT_SECONDS``; requests are answered 503 UNAVAILABLE. And a process started
while Neo4j is down waits for it, saying so, and starts once it answers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

import httpx
import pytest
from neo4j import AsyncManagedTransaction
from neo4j.exceptions import IncompleteCommit, ServiceUnavailable

from graph.driver import autocommit, make_driver, single, write
from services.errors import unavailable
from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import ROOT, ApiProcess, WorkerProcess
from tests.proxies import CuttableProxy, SilentProxy, through_proxy
from tests.waiting import until
from tools.processes import free_port

REMEMBER: dict[str, Any] = {"command": {"_tag": "Remember", "content": "Call me Annie", "tags": []}}
MEMORY_QUERY = "query($b: ID!) { memory(botId: $b) { entries { id } } }"
#: How long a test waits for an answer from a process whose Neo4j is silent: far above what the
#: silences and the retries add up to, far below the driver's own 2 min read timeout.
ANSWER_WITHIN = 60


class One(TypedDict):
    n: int


async def test_a_silent_neo4j_is_unavailable_and_the_process_answers_once_it_is_heard_again(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """An API process whose Neo4j falls silent answers REST and GraphQL requests 503 UNAVAILABLE
    while the silence lasts (not after Neo4j's default 2 min of silence a connection, then the
    retries), and serves again once Neo4j is heard again."""
    proxy = SilentProxy(settings.neo4j_bolt_port)
    await proxy.start()
    env = through_proxy(proxy.port, service_env)
    log_path = settings.data_dir / "logs" / "pytest-api-neo4j-silent.log"
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    silent = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    offset = log_path.stat().st_size
    try:
        w = await make_world(api, ("ann",))
        ann = bearer(w.tokens["ann"])
        memory = f"/v1/bots/{w.bot}/memory"
        async with httpx.AsyncClient(base_url=silent.url, timeout=ANSWER_WITHIN) as http:
            assert (await http.get(memory, headers=ann)).status_code == 200
            proxy.fall_silent()
            for method, body in (("GET", None), ("POST", REMEMBER)):
                down = await http.request(method, memory, json=body, headers=ann)
                assert down.status_code == 503, down.text
                assert down.headers["retry-after"] == "1"
                assert down.json()["error"]["code"] == "UNAVAILABLE", down.text
            answer = await http.post(
                "/graphql", json={"query": MEMORY_QUERY, "variables": {"b": w.bot}}, headers=ann
            )
            [error] = answer.json()["errors"]
            assert error["extensions"] == {"code": "UNAVAILABLE"}, error
            proxy.hear_again()

            async def back() -> bool:
                return (await http.get(memory, headers=ann)).status_code == 200

            await until(back, "the process never answered again once Neo4j was heard", within=ANSWER_WITHIN)
        logged = log_path.read_bytes()[offset:]
        assert b"unavailable on GET" in logged and b"internal error" not in logged
    finally:
        proxy.hear_again()
        await asyncio.to_thread(silent.stop)
        await proxy.close()


async def test_a_commit_that_neo4j_never_answers_may_have_been_saved(settings: Settings) -> None:
    """A commit sent to a Neo4j that fell silent may have been made: it is said as such ("read
    before sending it again"), never as "try again"; a read that meets the silence is, after one
    attempt (the five attempts of a one-statement read are for a loss found at once: four more
    connections to a silent Neo4j each waited out its silence too)."""
    proxy = SilentProxy(settings.neo4j_bolt_port)
    await proxy.start()
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    driver = make_driver(f"bolt://127.0.0.1:{proxy.port}", settings.neo4j_user, password, retry_seconds=0.5)

    async def silenced_before_the_commit(tx: AsyncManagedTransaction) -> None:
        await single(tx, "RETURN 1 AS n", One)
        proxy.fall_silent()

    try:
        with pytest.raises(IncompleteCommit) as lost:
            await write(driver, silenced_before_the_commit)
        said = unavailable(lost.value)
        assert said is not None and "may have been saved" in said.message
        with pytest.raises(ServiceUnavailable) as gone:
            await autocommit(driver, lambda session: single(session, "RETURN 1 AS n", One))
        assert not isinstance(gone.value, IncompleteCommit)
        assert proxy.unheard == 1  # the read's one connection: the commit's was open before
        said = unavailable(gone.value)
        assert said is not None and "try again" in said.message
    finally:
        proxy.hear_again()
        await driver.close()
        await proxy.close()


async def test_an_api_started_while_neo4j_is_down_waits_and_serves_once_it_is_up(
    settings: Settings, service_env: dict[str, str]
) -> None:
    """An API process started while nothing listens at its Neo4j address says that it waits, again
    and again, and stays up past the driver's retries (rather than exit with "Application startup
    failed" and a traceback); once Neo4j listens it checks the keys, migrates and turns healthy."""
    proxy = CuttableProxy(settings.neo4j_bolt_port)
    await proxy.listen()
    await proxy.cut()  # its port, where nothing listens now
    env = through_proxy(proxy.port, service_env)
    log_path = settings.data_dir / "logs" / "pytest-api-neo4j-late.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    # The constructor returns once /healthz is green, raises if the process exits meanwhile.
    starting = asyncio.create_task(asyncio.to_thread(ApiProcess, settings, log_path, env))
    try:
        await _logged(log_path, offset, b"still waiting for Neo4j at 127.0.0.1:")  # past its retries
        assert not starting.done()
        await proxy.listen()
        await starting
    finally:
        # Failed before Neo4j listened, the constructor gives up on its own and stops the process.
        [late] = await asyncio.gather(starting, return_exceptions=True)
        if isinstance(late, ApiProcess):
            await asyncio.to_thread(late.stop)
        await proxy.cut()
    logged = log_path.read_bytes()[offset:]
    assert b"waiting for Neo4j at 127.0.0.1:" in logged and b"Traceback" not in logged
    assert b"Neo4j answers at" in logged and b"api ready" in logged


async def test_a_worker_started_while_neo4j_is_down_waits_and_starts_once_it_is_up(
    settings: Settings, service_env: dict[str, str]
) -> None:
    """The worker does the same (the same start, ``open_runtime``)."""
    proxy = CuttableProxy(settings.neo4j_bolt_port)
    await proxy.listen()
    await proxy.cut()
    env = through_proxy(proxy.port, service_env)
    log_path = settings.data_dir / "logs" / "pytest-worker-neo4j-late.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    worker = await asyncio.to_thread(WorkerProcess, log_path, env)
    try:
        await _logged(log_path, offset, b"still waiting for Neo4j at 127.0.0.1:")
        assert worker.proc.poll() is None
        await proxy.listen()
        await asyncio.to_thread(worker.wait_ready, 30)
        assert b"Traceback" not in log_path.read_bytes()[offset:]
    finally:
        await asyncio.to_thread(worker.stop)
        await proxy.cut()


async def test_an_api_waiting_for_neo4j_ends_when_asked_to_stop(
    settings: Settings, service_env: dict[str, str]
) -> None:
    """SIGTERM while it waits ends it at once: uvicorn's handler only notes a signal until the
    application has started, so the process would go on waiting until killed."""
    proxy = CuttableProxy(settings.neo4j_bolt_port)
    await proxy.listen()
    await proxy.cut()
    log_path = settings.data_dir / "logs" / "pytest-api-neo4j-stopped.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        api = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "botmemory.serve", "--host", "127.0.0.1", "--port", str(free_port())),
            cwd=ROOT,
            env={**os.environ, **through_proxy(proxy.port, service_env)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        await _logged(log_path, offset, b"waiting for Neo4j at 127.0.0.1:")
        api.terminate()
        assert await asyncio.wait_for(api.wait(), 30) == -signal.SIGTERM
    finally:
        if api.returncode is None:
            api.kill()
            await api.wait()


async def _logged(log_path: Path, offset: int, text: bytes) -> None:
    async def seen() -> bool:
        try:
            return text in (await asyncio.to_thread(log_path.read_bytes))[offset:]
        except FileNotFoundError:  # not yet made by the process's starter
            return False

    await until(seen, f"{text!r} never logged", within=30)
