"""The MCP server (``python -m botmemory.mcp``) through the SDK's own clients, over stdio and
streamable HTTP, against the real API: it reads only as the token's person (V7, V10) and forgets
through the API's checked path (V11)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from botmemory.mcp_api import REMEMBER, SEARCH, ApiError
from botmemory.mcp_api import Api as McpApi
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, make_world
from tests.conftest import ROOT, ApiProcess
from tests.learning_helpers import holding_lock
from tests.memory_helpers import fact, said, visible
from tests.waiting import until
from tools.processes import free_port

TOOLS = {"remember", "forget", "search", "context", "why"}


def _env(api_url: str | None, **extra: str) -> dict[str, str]:
    """The server's environment; without ``api_url``, no ``BOTMEMORY_API_URL``."""
    named = {"BOTMEMORY_API_URL": api_url} if api_url is not None else {}
    return {**named, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def mcp_log(settings: Settings) -> Path:
    path = settings.data_dir / "logs" / "pytest-mcp.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@asynccontextmanager
async def stdio(api_url: str | None, log: Path, **env: str) -> AsyncGenerator[Client]:
    """A client of ``python -m botmemory.mcp`` spawned over stdio with this environment."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "botmemory.mcp"], env=_env(api_url, **env), cwd=ROOT
    )
    with log.open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


@pytest.fixture(scope="module")
def mcp_http(api_process: ApiProcess, mcp_log: Path) -> Iterator[str]:
    """``python -m botmemory.mcp --http`` on a free port; its MCP endpoint's URL once it answers."""
    with http_server(api_process.url, mcp_log) as url:
        yield url


@contextmanager
def http_server(api_url: str, mcp_log: Path) -> Generator[str]:
    """``python -m botmemory.mcp --http`` for the API at ``api_url`` on a free port; its MCP
    endpoint's URL once it answers."""
    port = free_port()
    with mcp_log.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "botmemory.mcp", "--http", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, **_env(api_url)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:  # poll until it answers (a refusal without a token is an answer)
            assert proc.poll() is None, f"the MCP server exited early; see {mcp_log}"
            assert time.monotonic() < deadline, f"the MCP server did not start; see {mcp_log}"
            try:
                httpx.post(url, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@asynccontextmanager
async def http(url: str, token: str | None) -> AsyncGenerator[Client]:
    """A client of the HTTP server sending ``token`` as its bearer on every request."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as transport_http,
        Client(streamable_http_client(url, http_client=transport_http)) as client,
    ):
        yield client


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured result of a successful tool call."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


async def error(client: Client, tool: str, **arguments: Any) -> str:
    """The message of a failed tool call, ``CODE: message``, after the SDK's prefix."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, text(result)
    prefix = f"Error executing tool {tool}: "
    assert text(result).startswith(prefix), text(result)
    return text(result).removeprefix(prefix)


def hit_ids(found: dict[str, Any]) -> list[str]:
    return [h["entry"]["id"] for h in found["hits"]]


async def test_stdio_tools_read_and_forget_as_the_token_person(
    api: Api, api_process: ApiProcess, mcp_log: Path
) -> None:
    w = await make_world(api, ("ann", "bob"))
    outsider = await make_world(api, ("eve",))
    fact = "Ann's locker code is 4711 and it sticks in winter"
    async with stdio(
        api_process.url, mcp_log, BOTMEMORY_TOKEN=w.tokens["ann"], BOTMEMORY_BOT_ID=w.bot
    ) as ann:
        assert {t.name for t in (await ann.list_tools()).tools} == TOOLS
        remembered = await call(ann, "remember", content=fact, tags=["work"])
        entry = remembered["entry"]
        assert (entry["content"], entry["layer"]) == (fact, "pinned") and "work" in entry["tags"]
        assert hit_ids(await call(ann, "search", query="locker code")) == [entry["id"]]
        context = await call(ann, "context", input="what is my locker code?", limit=200)
        assert context == {"text": f"- {fact}", "ids": [entry["id"]]}
        # A budget too small for the line leaves it out rather than cutting it (N3).
        assert await call(ann, "context", input="locker code", limit=len(fact)) == {"text": "", "ids": []}

        # V7: the same Bot through another person's MCP server shows nothing of Ann's pinned entry.
        async with stdio(api_process.url, mcp_log, BOTMEMORY_TOKEN=w.tokens["bob"]) as bob:
            assert hit_ids(await call(bob, "search", query="locker code", bot_id=w.bot)) == []
            message = await error(bob, "forget", entry_id=entry["id"], bot_id=w.bot)
            assert message.startswith("CONFLICT: ")
        # An outsider of another organization finds nothing and learns nothing of it.
        async with stdio(api_process.url, mcp_log, BOTMEMORY_TOKEN=outsider.tokens["eve"]) as eve:
            result = await eve.call_tool("search", {"query": "locker code", "bot_id": w.bot})
            assert fact not in text(result) and entry["id"] not in text(result)
            assert result.is_error or hit_ids(result.structured_content or {}) == []

        assert (await call(ann, "forget", entry_id=entry["id"]))["id"] == entry["id"]
        assert hit_ids(await call(ann, "search", query="locker code")) == []
        assert (await call(ann, "context", input="locker code"))["ids"] == []


async def test_stdio_errors_carry_the_api_code(api: Api, api_process: ApiProcess, mcp_log: Path) -> None:
    w = await make_world(api, ("ann",))
    async with stdio(api_process.url, mcp_log, BOTMEMORY_TOKEN=w.tokens["ann"]) as ann:
        assert (await error(ann, "search", query="anything")).startswith("BAD_INPUT: give bot_id")
        colon = await error(ann, "remember", content="x", tags=["for:bot"], bot_id=w.bot)
        assert colon.startswith("BAD_INPUT: ")
        assert (await error(ann, "search", query=" ", bot_id=w.bot)).startswith("BAD_INPUT: ")
        assert (await error(ann, "context", input="x", limit=0, bot_id=w.bot)).startswith("BAD_INPUT: ")
        # The API's bound on a context (it had none here).
        assert (await error(ann, "context", input="x", limit=100_001, bot_id=w.bot)).startswith(
            "BAD_INPUT: limit is between 1 and 100000"
        )
        # Arguments of the wrong type are refused alike (the SDK's words named no code), and an
        # empty bot_id is no bot_id (it fell back to BOTMEMORY_BOT_ID).
        assert (await error(ann, "search", query="x", limit="ten", bot_id=w.bot)).startswith(
            "BAD_INPUT: limit "
        )
        assert (await error(ann, "search", query=5, bot_id=w.bot)).startswith("BAD_INPUT: query ")
        # A limit is an integer, as the API's Int: not a boolean or a float (pydantic's lax mode took
        # true for 1 and 2.0 for 2).
        for odd in (True, 2.0):
            assert (await error(ann, "search", query="x", limit=odd, bot_id=w.bot)).startswith(
                "BAD_INPUT: limit "
            )
            assert (await error(ann, "context", input="x", limit=odd, bot_id=w.bot)).startswith(
                "BAD_INPUT: limit "
            )
        assert (await error(ann, "forget", entry_id=["a"], bot_id=w.bot)).startswith("BAD_INPUT: entry_id ")
        assert (await error(ann, "search", query="x", bot_id=" ")).startswith("BAD_INPUT: bot_id is empty")
        # The API's words about its own arguments name the tool's (they said id, botId and query).
        assert await error(ann, "forget", entry_id="not an id", bot_id=w.bot) == (
            "BAD_INPUT: entry_id is not a valid id"
        )
        assert (
            await error(ann, "why", entry_id="not an id", bot_id=w.bot)
            == "BAD_INPUT: entry_id is not a valid id"
        )
        assert (
            await error(ann, "search", query="x", bot_id="not a bot") == "BAD_INPUT: bot_id is not a valid id"
        )
        assert await error(ann, "context", input=" ", bot_id=w.bot) == "BAD_INPUT: input is empty"
        # A long input is ranked for its beginning, as the API's context(query) ranks a Turn's input
        # (it was refused as a search query).
        long = await call(ann, "context", input="where do I park? " * 200, bot_id=w.bot)
        assert long["ids"] == [] and long["text"] == ""
        # An argument the tool does not take (tags misspelt): refused, not dropped with the entry kept.
        assert (await error(ann, "remember", content="x", tag=["work"], bot_id=w.bot)).startswith(
            "BAD_INPUT: tag is not an argument"
        )
    bad = "bm_" + "0" * 40
    async with stdio(api_process.url, mcp_log, BOTMEMORY_TOKEN=bad, BOTMEMORY_BOT_ID=w.bot) as nobody:
        message = await error(nobody, "search", query="anything")
        assert message.startswith("UNAUTHENTICATED: ") and bad not in message
    # The API is not there: a clear tool error, not a traceback, and not the URL's password.
    gone = f"http://proxy:hunter2@127.0.0.1:{free_port()}"
    async with stdio(gone, mcp_log, BOTMEMORY_TOKEN=w.tokens["ann"], BOTMEMORY_BOT_ID=w.bot) as ann:
        message = await error(ann, "search", query="anything")
        assert message.startswith("UNAVAILABLE: ") and "Traceback" not in message
        assert "hunter2" not in message and "127.0.0.1" in message
    # An API reached through a URL that carries a password: the MCP SDK set the root logger to INFO,
    # and the HTTP client logged each request's URL, password and all, to the MCP log.
    own_log = mcp_log.with_name("pytest-mcp-carried.log")
    await asyncio.to_thread(own_log.unlink, missing_ok=True)
    carried = api_process.url.replace("http://", "http://proxy:hunter2@")
    async with stdio(carried, own_log, BOTMEMORY_TOKEN=w.tokens["ann"], BOTMEMORY_BOT_ID=w.bot) as ann:
        await ann.call_tool("search", {"query": "anything"})  # whatever the API answers: it was asked
    logged = await asyncio.to_thread(own_log.read_bytes)
    assert b"hunter2" not in logged, logged[-500:]


@pytest.mark.parametrize(
    ("token", "told"),
    [
        ("", ""),
        # A character no header carries: the HTTP client failed inside at the first tool call.
        ("bm_t\u00f6ken", ": it holds characters no token has"),
    ],
)
def test_stdio_without_a_usable_token_stops_with_one_line(
    api_process: ApiProcess, token: str, told: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "botmemory.mcp"],
        cwd=ROOT,
        env={**os.environ, **_env(api_process.url), "BOTMEMORY_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "botmemory.mcp: set BOTMEMORY_TOKEN to the person's API token (or use --http)" + told
    ]


async def test_http_passes_each_requests_token_through(api: Api, mcp_http: str) -> None:
    w = await make_world(api, ("ann", "bob"))
    fact = "Ann parks on level minus three, bay 42"
    async with http(mcp_http, w.tokens["ann"]) as ann, http(mcp_http, w.tokens["bob"]) as bob:
        assert {t.name for t in (await ann.list_tools()).tools} == TOOLS
        entry = (await call(ann, "remember", content=fact, bot_id=w.bot))["entry"]
        assert hit_ids(await call(ann, "search", query="where do I park", bot_id=w.bot)) == [entry["id"]]
        assert fact in (await call(ann, "context", input="parking bay", bot_id=w.bot))["text"]
        # One server, two people: each request reads as its own bearer (V7).
        assert hit_ids(await call(bob, "search", query="where do I park", bot_id=w.bot)) == []
        await call(ann, "forget", entry_id=entry["id"], bot_id=w.bot)
        assert hit_ids(await call(ann, "search", query="where do I park", bot_id=w.bot)) == []
        # A tool of no such name: an error with a code, as the API's (the SDK's own had none).
        assert (await error(ann, "recall", query="x")) == (
            "NOT_FOUND: no such tool; the tools are context, forget, remember, search, why"
        )


async def test_stdio_reaches_the_api_its_settings_name(
    api: Api, api_process: ApiProcess, mcp_log: Path
) -> None:
    """Without ``BOTMEMORY_API_URL`` the server called http://127.0.0.1:8000 whatever
    ``BOTMEMORY_API_PORT`` said: with another port every tool call failed, and on a shared
    machine the person's token went to whatever listened on 8000. It calls the API the settings
    name now (the SDK starts it without this process's environment: only what is given here)."""
    w = await make_world(api, ("ann",))
    port = str(api_process.port)
    env = {"BOTMEMORY_API_PORT": port, "BOTMEMORY_TOKEN": w.tokens["ann"], "BOTMEMORY_BOT_ID": w.bot}
    async with stdio(None, mcp_log, **env) as ann:
        entry = (await call(ann, "remember", content="Ann's bike is the green one"))["entry"]
        assert hit_ids(await call(ann, "search", query="green bike")) == [entry["id"]]


def test_http_refuses_a_token_it_cannot_check_while_the_api_is_away(mcp_log: Path) -> None:
    """A token the API could not be asked about passed the edge (``Bearer garbage`` got an MCP
    session), though a token the API does not accept is refused. While the API cannot be reached
    the request is refused with 503 UNAVAILABLE and ``Retry-After`` (not 401: the token may be
    good, and a host renews a token on a 401), and the answer names no internal address: over
    HTTP the agents are remote."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    headers = {"Authorization": "Bearer garbage", "Accept": "application/json, text/event-stream"}
    with http_server(f"http://127.0.0.1:{free_port()}", mcp_log) as url:
        response = httpx.post(url, json=initialize, headers=headers, timeout=30)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"].isdigit() and "www-authenticate" not in response.headers
    assert response.json()["error"] == {
        "code": "UNAVAILABLE",
        "message": "the botmemory API cannot be reached to check the token; try again in a moment",
    }
    assert "127.0.0.1" not in response.text


async def test_why_lists_the_callers_steps_for_pinned_and_learned_entries(
    api: Api, runtime: Runtime, mcp_http: str
) -> None:
    w = await make_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    june_16 = 1_686_923_760_000  # when it was said (D9.31), shown with the entry
    source = await said(api, w.tokens["ann"], chat, "I take the 7:40 train every morning", said_at=june_16)
    learned = await fact(runtime, w.bot, "Ann commutes by the 7:40 train", source)
    ann_atom = f"person:{w.people['ann']}"
    async with http(mcp_http, w.tokens["ann"]) as ann, http(mcp_http, w.tokens["bob"]) as bob:
        pinned = (await call(ann, "remember", content="Call me Annie", bot_id=w.bot))["entry"]["id"]
        proof = await call(ann, "why", entry_id=pinned, bot_id=w.bot)
        assert proof["entry"]["id"] == pinned and "pinned" in proof["summary"]
        assert {(s["entry"], s["rule"], s["admittedBy"]) for s in proof["steps"]} >= {
            (pinned, "PERSON", ann_atom)
        }

        proof = await call(ann, "why", entry_id=learned, bot_id=w.bot)
        assert proof["entry"]["content"] == "Ann commutes by the 7:40 train"
        assert proof["entry"]["saidAt"] == june_16
        steps = {(s["entry"], s["chat"], s["item"], s["rule"], s["admittedBy"]) for s in proof["steps"]}
        assert (learned, *source, "PERSON", ann_atom) in steps
        assert (learned, *source, "ORGANIZATION", f"org:{w.org}") in steps
        # D9.7: an entry Bob may not see has no proof for him, only NOT_FOUND.
        assert (await error(bob, "why", entry_id=learned, bot_id=w.bot)).startswith("NOT_FOUND: ")


def test_http_refuses_a_request_without_a_token_the_api_accepts(mcp_http: str) -> None:
    """401 with ``WWW-Authenticate: Bearer`` before the MCP transport: without a bearer token, and
    with one the API does not accept (before, a well-formed unknown token was let through and
    every tool call failed inside a 200). A token it accepts passes (the tests above)."""
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = httpx.post(mcp_http, json=listing, timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    unknown = "bm_" + "1" * 40
    response = httpx.post(mcp_http, json=listing, headers={"Authorization": f"Bearer {unknown}"}, timeout=10)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "UNAUTHENTICATED" and unknown not in response.text
    # A token no header can carry on (a byte beyond ASCII): refused alike, not failed inside
    # when the server passed it to the API.
    latin = [(b"Authorization", "Bearer bm_t\u00f6ken".encode("latin-1"))]
    response = httpx.post(
        mcp_http, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=latin, timeout=10
    )
    assert response.status_code == 401 and response.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_a_change_the_api_did_not_answer_may_have_been_made(
    api: Api, api_process: ApiProcess, runtime: Runtime
) -> None:
    """The MCP server forwards a tool call to the API over HTTP. A ``remember`` that waited past
    its client's timeout (the memory held by a long commit) was said as "the API is not
    reachable", UNAVAILABLE: an agent sends that again. But the API went on and saved the entry,
    so a second one was pinned. A change that was sent and got no answer now says it may have
    been made, and to read first; the entry is there once the memory is free."""
    w = await make_world(api, ("ann",))
    lock = "MATCH (m:Memory {id: $b}) CALL apoc.lock.nodes([m]) RETURN 1"
    async with (
        holding_lock(runtime, lock, b=w.bot),
        httpx.AsyncClient(base_url=api_process.url, timeout=2) as http,
    ):
        with pytest.raises(ApiError) as refused:
            await McpApi(http).call(REMEMBER, {"b": w.bot, "c": "sent once", "t": []}, w.tokens["ann"])
    assert refused.value.code == "UNAVAILABLE", refused.value
    assert "may have been made; read before sending it again" in str(refused.value)

    async def made() -> bool:
        return [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == ["sent once"]

    await until(made, "the change the API was not heard answering was never made")


async def test_a_change_a_proxy_gave_up_on_may_have_been_made() -> None:
    """A proxy in front of the API answers 502 or 504 (no JSON) when the API did not answer it in
    time or broke off: the API may have gone on and made the change, so a mutation says to read
    before sending it again; a read is simply not answered. (A real HTTP server answering as such
    a proxy does.)"""

    async def gateway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"<html>504 Gateway Time-out</html>"
        writer.write(
            b"HTTP/1.1 504 Gateway Time-out\r\ncontent-type: text/html\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(gateway, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            with pytest.raises(ApiError) as change:
                await McpApi(http).call(REMEMBER, {"b": "bot_x", "c": "x", "t": []}, "bm_" + "3" * 40)
            with pytest.raises(ApiError) as query:
                await McpApi(http).call(SEARCH, {"b": "bot_x", "q": "x", "l": 1}, "bm_" + "3" * 40)
    finally:
        server.close()
        await server.wait_closed()
    assert change.value.code == "UNAVAILABLE"
    assert str(change.value).endswith("HTTP 504: the change may have been made; read before sending it again")
    assert query.value.code == "UNAVAILABLE" and "may have been made" not in str(query.value)


async def test_a_change_whose_answer_was_lost_is_sent_again_and_made_once(
    api: Api, api_process: ApiProcess
) -> None:
    """The MCP server sends its changes with an idempotency key of their own (D9.35) and sends one
    again with it while no answer says what became of it: here a proxy passes the first
    ``remember`` to the API, which makes it, and answers 504 as if it had timed out. The tool
    answers with that entry, made once (sent again without the key, a second one was pinned)."""
    w = await make_world(api, ("ann",))
    lost = 0

    async def losing_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal lost
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        headers = {k: v for k, v in fields.items() if k.lower() in ("authorization", "content-type")}
        body = await reader.readexactly(int(fields.get("content-length", fields.get("Content-Length", "0"))))
        async with httpx.AsyncClient(base_url=api_process.url) as upstream:
            answer = await upstream.post(lines[0].split(" ")[1], content=body, headers=headers)
        if lost == 0:
            lost += 1
            status, payload, kind = "504 Gateway Time-out", b"<html>504</html>", "text/html"
        else:
            status, payload, kind = f"{answer.status_code} OK", answer.content, "application/json"
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(losing_first, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            data = await McpApi(http).change(
                REMEMBER, {"b": w.bot, "c": "pinned once", "t": []}, w.tokens["ann"]
            )
    finally:
        server.close()
        await server.wait_closed()
    assert lost == 1
    entries = await visible(api, w.tokens["ann"], w.bot)
    assert [e["content"] for e in entries.values()] == ["pinned once"]
    assert data["remember"]["entry"]["id"] in entries


async def test_a_change_sent_unanswered_then_unreachable_still_says_it_may_have_been_made() -> None:
    """The first attempt reaches a server that never answers it (it may have made the change), the
    next find nothing listening: the last failure still says the change may have been made —
    said "not reachable", an agent sent it again with another key."""
    received, ended = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        await ended.wait()  # never answered: the client's timeout ends the attempt
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1) as http:
            attempt = asyncio.create_task(
                McpApi(http).change(REMEMBER, {"b": "bot_x", "c": "x", "t": []}, "bm_" + "3" * 40)
            )
            await received.wait()
            server.close()  # nothing listens for the attempts after the first
            with pytest.raises(ApiError) as failed:
                await attempt
    finally:
        ended.set()
        server.close()
        await server.wait_closed()
    assert failed.value.code == "UNAVAILABLE"
    assert "is not reachable" in failed.value.message
    assert str(failed.value).endswith("the change may have been made; read before sending it again")
