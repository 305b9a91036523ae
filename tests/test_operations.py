"""Operations (issue 18 item 8): the worker's own /metrics, every request counted with its code
and timed by surface, one-line CLI errors, and a platform token told what it may read (D9.26)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.chats import PLATFORM_READS
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, make_world
from tests.conftest import ROOT, ApiProcess, WorkerProcess
from tests.learning_helpers import (
    complete,
    confide,
    fact_call,
    first_item,
    learn,
    memory_world,
    wait_executions,
)
from tests.model_server import ModelServer
from tests.waiting import until
from tools.processes import free_port

Sample = tuple[str, tuple[tuple[str, str], ...]]


async def scrape(url: str) -> dict[Sample, float]:
    """Every sample of a Prometheus text page, by name and labels."""
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def until_moved(
    url: str, name: str, floor: float, within: float = 60, **labels: str
) -> dict[Sample, float]:
    """The samples once ``name{labels}`` is above ``floor`` (a counter moved by another process)."""

    async def moved() -> dict[Sample, float] | None:
        samples = await scrape(url)
        return samples if value(samples, name, **labels) > floor else None

    return await until(moved, f"{name}{labels} stayed at {floor} on {url}", within=within)


# --- 1. The worker's metrics ---------------------------------------------------------------------


async def test_the_worker_serves_the_metrics_of_its_learning(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    """One learning execution whose first answer is refused (asked again) and whose second is
    learned: the worker's own /metrics counts the execution, both model calls of the task
    ``learn``, their confirmed cost (20 micro-USD each at the test price) and the refusal."""
    url = learning_worker.metrics_url
    before = await scrape(url)
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "Please run the tests before saying done.")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script(
        "learn",
        learn(fact_call("Run the tests before reporting done.", "i-9")),  # unknown_item: asked again
        learn(fact_call("Run the tests before reporting done.", item)),
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 1)
    # The worker counts an execution once its end is recorded in the graph: wait for the counter.
    done = value(before, "botmemory_learning_executions_total", outcome="done")
    after = await until_moved(url, "botmemory_learning_executions_total", done, outcome="done")

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("botmemory_learning_executions_total", outcome="done") >= 1
    assert moved("botmemory_model_calls_total", task="learn", status="ok") >= 2
    assert moved("botmemory_model_cost_micros_total", task="learn") >= 40
    assert moved("botmemory_learning_refusals_total", code="unknown_item", then="reasked") >= 1
    assert moved("botmemory_model_call_seconds_count", task="learn") >= 2
    # The confide answer was the API's call: it is on the API's /metrics, not the worker's.
    assert moved("botmemory_model_calls_total", task="confide", status="ok") == 0


def _compose_worker_health_check() -> list[str]:
    """The worker's healthcheck command, as docker-compose.yml writes it."""
    compose = (ROOT / "docker-compose.yml").read_text()
    worker = compose[compose.index("\n  worker:\n") :]
    line = next(line for line in worker.splitlines() if line.strip().startswith("test: ["))
    return json.loads(line.split("test:", 1)[1])


async def test_the_compose_health_check_of_the_worker_fails_while_it_is_stalled(
    learning_worker: WorkerProcess,
) -> None:
    """docker-compose.yml had no health check for the worker: a worker whose process stopped
    answering looked as healthy as a working one. The check as compose writes it (its port made
    this worker's) passes while the worker's loop beats, fails while the process is stopped, and
    passes again once it runs."""
    kind, python, *args = _compose_worker_health_check()
    assert (kind, python) == ("CMD", "python")
    port = learning_worker.env["BOTMEMORY_WORKER_METRICS_PORT"]  # its port, as compose passes it

    def check() -> int:
        env = {"PATH": os.environ["PATH"], "BOTMEMORY_WORKER_METRICS_PORT": port}
        return subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, timeout=60, check=False
        ).returncode

    assert check() == 0
    os.kill(learning_worker.proc.pid, signal.SIGSTOP)
    try:
        assert check() != 0
    finally:
        os.kill(learning_worker.proc.pid, signal.SIGCONT)
    assert check() == 0


# --- 2. Requests ---------------------------------------------------------------------------------


async def test_the_apis_metrics_are_for_operators_only(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """The API's /metrics counts what searches met — the candidates the access check refused
    too — so anyone reading it could ask whether another organization's memory holds a word
    (search it, watch the refusals move). It answered anyone; now, without a metrics token, only
    a client on this host that no proxy forwarded, and with one, only a request bearing it."""
    assert (await api.http.get("/metrics")).status_code == 200  # this host, directly
    for proxied in ({"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"}):
        response = await api.http.get("/metrics", headers=proxied)
        assert response.status_code == 403 and response.json()["error"]["code"] == "FORBIDDEN", proxied
        assert "BOTMEMORY_METRICS_TOKEN" in response.json()["error"]["message"]
    guarded = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-metrics.log",
        {**service_env, "BOTMEMORY_METRICS_TOKEN": "metrics-secret-7"},
    )
    try:
        async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as http:
            for given in (
                {},
                {"Authorization": "Bearer metrics-secret-8"},
                {"Authorization": "metrics-secret-7"},
            ):
                response = await http.get("/metrics", headers=given)
                assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHENTICATED"
                assert "metrics-secret" not in response.text
            response = await http.get("/metrics", headers={"Authorization": "Bearer metrics-secret-7"})
            assert response.status_code == 200 and "botmemory_requests_total" in response.text
    finally:
        guarded.stop()


async def test_every_request_is_counted_with_its_code_and_timed_by_surface(api: Api) -> None:
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    metrics_url = str(api.http.base_url).rstrip("/") + "/metrics"
    before = await scrape(metrics_url)
    assert (await api.http.get(f"/v1/bots/{w.bot}/memory", headers=headers)).status_code == 200
    missing = await api.http.get(f"/v1/chats/chat_{'0' * 32}/messages", headers=headers)
    assert missing.status_code == 404
    assert (await api.http.get("/v1/no-such-route", headers=headers)).status_code == 404
    assert (await api.gql("{ me { id } }", token=w.tokens["ann"]))["me"]["id"] == w.people["ann"]
    assert await api.codes("{ nope }", token=w.tokens["ann"]) == ["BAD_INPUT"]
    after = await scrape(metrics_url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("botmemory_requests_total", surface="rest", code="OK") == 1
    assert moved("botmemory_requests_total", surface="rest", code="NOT_FOUND") == 2
    assert moved("botmemory_request_seconds_count", surface="rest") == 3
    assert moved("botmemory_requests_total", surface="graphql", code="OK") == 1
    assert moved("botmemory_requests_total", surface="graphql", code="BAD_INPUT") == 1
    assert moved("botmemory_request_seconds_count", surface="graphql") == 2
    # Labels name surfaces and codes, never a path or an id.
    assert not any(w.bot in str(labels) for _, labels in after)


# --- 3. One-line CLI errors ----------------------------------------------------------------------


async def test_a_client_that_leaves_mid_body_is_no_internal_error(api: Api, settings: Settings) -> None:
    """A client may close its connection before its body is sent (Starlette's ClientDisconnect
    as the handler reads the body): nothing failed on the server's side, so it is no ERROR line
    with a traceback and no ``code="INTERNAL"`` count, but ``code="DISCONNECTED"``, on REST and
    GraphQL alike."""
    w = await make_world(api, ("ann",))
    metrics_url = str(api.http.base_url).rstrip("/") + "/metrics"
    log = settings.data_dir / "logs" / "pytest-api.log"
    host, port = str(api.http.base_url).removeprefix("http://").rstrip("/").split(":")
    for surface, path in (("rest", f"/v1/bots/{w.bot}/memory"), ("graphql", "/graphql")):
        before, written = await scrape(metrics_url), log.stat().st_size
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {w.tokens['ann']}\r\n"
            'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"query": '.encode()
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        seconds = value(before, "botmemory_request_seconds_count", surface=surface)
        after = await until_moved(metrics_url, "botmemory_request_seconds_count", seconds, surface=surface)
        counted = [
            value(after, "botmemory_requests_total", surface=surface, code=code)
            - value(before, "botmemory_requests_total", surface=surface, code=code)
            for code in ("INTERNAL", "DISCONNECTED")
        ]
        assert counted == [0, 1], surface
        with log.open("rb") as lines:
            lines.seek(written)
            said = lines.read()
        assert b"ERROR" not in said and b"Traceback" not in said, said


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "botmemory.cli", *args],
        cwd=ROOT,
        env={**os.environ, "BOTMEMORY_EMBEDDER": "none", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_cli_failure_is_one_line_on_stderr() -> None:
    unknown = cli("reindex", "bot_" + "0" * 32)
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        1,
        "",
        "botmemory: NOT_FOUND: bot not found\n",
    )

    closed = f"bolt://127.0.0.1:{free_port()}"
    down = cli("reindex", "bot_" + "0" * 32, BOTMEMORY_NEO4J_URI=closed)
    assert down.returncode == 1 and down.stdout == ""
    assert down.stderr.startswith("botmemory: UNAVAILABLE: Neo4j (BOTMEMORY_NEO4J_URI): ")
    assert down.stderr.count("\n") == 1 and "Traceback" not in down.stderr

    usage = cli("reindex")
    assert usage.returncode == 2
    assert (
        usage.stderr
        == "botmemory: BAD_INPUT: the following arguments are required: bot_id (see botmemory --help)\n"
    )

    debug = cli("reindex", "bot_" + "0" * 32, BOTMEMORY_DEBUG="1")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "NotFound: bot not found" in debug.stderr


# --- 4. A platform token on the people's chat views --------------------------------------------

CHAT = "query($c: ID!) { chat(id: $c) { id messages { id } } }"


async def test_a_platform_token_is_told_how_it_reads_a_chat_of_its_organization(api: Api) -> None:
    """D9.26: a platform token reads a Chat's memory through the server-caller routes; asking for
    its messages is FORBIDDEN with what it may call (REST and GraphQL), while a Chat of another
    organization, or none, stays NOT_FOUND (null in GraphQL): no existence oracle."""
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    platform, foreign = await api.platform_token(w.org), await api.platform_token(other.org)

    async def get(token: str, path: str) -> tuple[int, dict[str, Any]]:
        response = await api.http.get(path, headers={"Authorization": f"Bearer {token}"})
        return response.status_code, response.json()

    assert await get(platform, f"/v1/chats/{chat}/messages") == (
        403,
        {"error": {"code": "FORBIDDEN", "message": PLATFORM_READS}},
    )
    assert "/memory/context" in PLATFORM_READS and "person token" in PLATFORM_READS
    not_found = (404, {"error": {"code": "NOT_FOUND", "message": "chat not found"}})
    assert await get(foreign, f"/v1/chats/{chat}/messages") == not_found
    assert await get(platform, f"/v1/chats/chat_{'0' * 32}/messages") == not_found
    # What the message points at works for this token.
    assert await get(platform, f"/v1/chats/{chat}/memory/has-entries") == (200, {"hasEntries": False})

    body = await api.raw(CHAT, {"c": chat}, platform)
    assert body["data"] == {"chat": None}
    assert [(e["extensions"]["code"], e["message"]) for e in body["errors"]] == [
        ("FORBIDDEN", PLATFORM_READS)
    ]
    assert await api.raw(CHAT, {"c": chat}, foreign) == {"data": {"chat": None}}
    # A Chat the platform created itself (returned to it as a Chat): its messages are refused the same way.
    created = await api.raw(
        "mutation($b: ID!, $o: ID!) { createChat(botId: $b, ownerId: $o) { id messages { id } } }",
        {"b": w.bot, "o": w.people["ann"]},
        platform,
    )
    assert [e["extensions"]["code"] for e in created["errors"]] == ["FORBIDDEN"]
    # The chat's person still reads it.
    assert (await get(w.tokens["ann"], f"/v1/chats/{chat}/messages"))[0] == 200
