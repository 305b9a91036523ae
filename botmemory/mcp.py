"""The MCP server: ``python -m botmemory.mcp`` (stdio) or ``python -m botmemory.mcp --http``.

An edge process an agent's host starts: it gives the agent the tools ``remember``, ``forget``,
``search``, ``context`` and ``why`` for one person, by calling the running API over HTTP with
that person's token (``botmemory.mcp_api``), so every answer is access-checked there (V7).

Configuration: ``BOTMEMORY_API_URL`` (default: the API of ``BOTMEMORY_API_HOST`` and
``BOTMEMORY_API_PORT``, as the API itself reads them), ``BOTMEMORY_BOT_ID`` (the Bot when a tool
is given none) and, over stdio, ``BOTMEMORY_TOKEN`` (required). Over streamable HTTP each request
brings its own ``Authorization: Bearer`` token, which is passed through; the server keeps none
and refuses requests without one.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from pydantic import BaseModel, Field, StrictInt, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from botmemory.mcp_api import FORGET, REMEMBER, SEARCH, WHO, WHY, Api, ApiError
from services.logs import quiet_libraries
from services.settings import ConfigurationError, parse_settings
from services.validation import MAX_CONTEXT_CHARS, MAX_QUERY_CHARS, refusal

#: Hits a ``context`` call ranks before it fills the budget (the API's largest search).
_CONTEXT_CANDIDATES: Final = 100

Ctx = Context[Any, Any]


class Entry(BaseModel):
    id: str
    layer: str
    content: str
    tags: list[str]
    said_at: int = Field(alias="saidAt", description="When its newest source was said (epoch ms, D9.31).")


class Remembered(BaseModel):
    entry: Entry
    version: int


class Forgotten(BaseModel):
    id: str
    version: int


class Hit(BaseModel):
    score: float
    entry: Entry


class Found(BaseModel):
    hits: list[Hit]


class MemoryText(BaseModel):
    text: str
    ids: list[str]


class Step(BaseModel):
    entry: str
    chat: str | None
    item: str | None
    rule: str
    admitted_by: str = Field(alias="admittedBy")
    reason: str


class Proof(BaseModel):
    entry: Entry
    summary: str
    steps: list[Step]


@dataclass(frozen=True, slots=True)
class McpConfig:
    """Read once at start-up; ``token`` is None over HTTP (each request brings its own)."""

    api_url: str
    bot_id: str | None
    token: str | None


def bearer(headers: Mapping[str, str] | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if there is one."""
    value = (headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not usable(token.strip()):
        return None
    return token.strip()


def usable(token: str) -> bool:
    """Whether ``token`` can be sent in a header: printable ASCII, as every token of ours is (a
    character beyond it failed inside the HTTP client, an unexpected error, not UNAUTHENTICATED)."""
    return bool(token) and token.isascii() and token.isprintable()


def fit(hits: Sequence[Hit], limit: int) -> MemoryText:
    """The best hits as ``- content`` lines within ``limit`` characters, best first; a hit that
    does not fit is passed over for smaller ones below it."""
    lines: list[str] = []
    ids: list[str] = []
    size = 0
    for hit in hits:
        line = len(hit.entry.content) + 2 + (1 if lines else 0)
        if size + line <= limit:
            lines.append("- " + hit.entry.content)
            ids.append(hit.entry.id)
            size += line
    return MemoryText(text="\n".join(lines), ids=ids)


class _Server(MCPServer):
    """Arguments of the wrong shape are refused as the API refuses them: ``BAD_INPUT`` and the first
    refused argument (the SDK's own words named no code and carried pydantic's link). So is an
    argument the tool does not take: the SDK dropped it, so ``remember(tag=[…])`` (for ``tags``)
    kept an entry without its topics and said nothing. A ``limit`` is a JSON integer (``StrictInt``):
    pydantic's lax mode took ``true`` for 1 and ``2.0`` for 2, where the API's ``Int`` refuses both."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        tools = {t.name: t for t in await self.list_tools()}
        known = tools.get(name)
        if known is None:
            # The SDK's "Unknown tool: …" carried no code (and the whole name, however long).
            raise ToolError(
                f"Error executing tool {name[:100]}: NOT_FOUND: no such tool; the tools are "
                + ", ".join(sorted(tools))
            )
        unknown = sorted(set(arguments) - set(known.input_schema.get("properties", {})))
        if unknown:
            raise ToolError(f"Error executing tool {name}: BAD_INPUT: {unknown[0][:100]} is not an argument")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            refused = refusal(cause, skip=frozenset({"arguments"}))
            raise ToolError(f"Error executing tool {name}: BAD_INPUT: {refused.message}") from cause


#: The API's names of arguments that the tools name otherwise, for the API's messages.
_BOT: Final[Mapping[str, str]] = {"botId": "bot_id"}
_ENTRY: Final[Mapping[str, str]] = {"botId": "bot_id", "id": "entry_id"}
_INPUT: Final[Mapping[str, str]] = {"botId": "bot_id", "query": "input"}


M = TypeVar("M", bound=BaseModel)


def read(model: type[M], data: object) -> M:
    """The API's answer as ``model``. One of another shape (this server and the API of different
    versions) is UNAVAILABLE, said without the answer: pydantic's error quotes the values it
    refused (entries' contents), and the SDK logs an unexpected error with its causes."""
    try:
        return model.model_validate(data)
    except ValidationError:
        raise ApiError(
            "UNAVAILABLE",
            f"the botmemory API answered in a shape this server does not read ({model.__name__})",
        ) from None


def build_server(config: McpConfig, api: Api) -> MCPServer:
    """The MCP server with its five tools, calling ``api`` with the caller's token."""
    server: MCPServer = _Server("botmemory", instructions="Access-checked memory of one person.")
    # The SDK set the root logger to INFO: the HTTP client logged each call's URL to the API, a
    # password in BOTMEMORY_API_URL and all.
    quiet_libraries()

    def token(ctx: Ctx) -> str:
        found = config.token or bearer(ctx.headers)
        if found is None:
            raise ApiError("UNAUTHENTICATED", "send the person's token as 'Authorization: Bearer <token>'")
        return found

    def bot(bot_id: str | None) -> str:
        if bot_id is not None and not bot_id.strip():
            raise ApiError("BAD_INPUT", "bot_id is empty: give one, or leave it out for BOTMEMORY_BOT_ID")
        found = bot_id or config.bot_id
        if not found:
            raise ApiError("BAD_INPUT", "give bot_id, or start the server with BOTMEMORY_BOT_ID")
        return found

    @server.tool(description="Pin a fact the person states, as an entry only they see. Returns its id.")
    async def remember(
        content: str, ctx: Ctx, tags: list[str] | None = None, bot_id: str | None = None
    ) -> Remembered:
        data = await api.change(REMEMBER, {"b": bot(bot_id), "c": content, "t": tags}, token(ctx), _BOT)
        return read(Remembered, data["remember"])

    @server.tool(
        description="Remove an entry for you (by entry_id): it is gone for everyone when you are the only "
        "person behind it, else only for you (V11)."
    )
    async def forget(entry_id: str, ctx: Ctx, bot_id: str | None = None) -> Forgotten:
        data = await api.change(FORGET, {"b": bot(bot_id), "id": entry_id}, token(ctx), _ENTRY)
        return Forgotten(id=entry_id, version=data["forget"]["version"])

    async def ranked(
        query: str, limit: int, ctx: Ctx, bot_id: str | None, names: Mapping[str, str] = _BOT
    ) -> list[Hit]:
        data = await api.call(SEARCH, {"b": bot(bot_id), "q": query, "l": limit}, token(ctx), names)
        return [read(Hit, h) for h in data["search"]]

    @server.tool(
        description="The entries you may see that are most relevant to query (meaning and keywords), "
        "best first, with their ids and scores; limit is 1-100."
    )
    async def search(query: str, ctx: Ctx, limit: StrictInt = 10, bot_id: str | None = None) -> Found:
        return Found(hits=await ranked(query, limit, ctx, bot_id))

    @server.tool(
        description="The memory you may see about an input, as text lines of at most limit characters "
        "in all (most relevant first), with the ids of the entries used."
    )
    async def context(input: str, ctx: Ctx, limit: StrictInt = 4000, bot_id: str | None = None) -> MemoryText:
        if not 1 <= limit <= MAX_CONTEXT_CHARS:
            raise ApiError("BAD_INPUT", f"limit is between 1 and {MAX_CONTEXT_CHARS}")
        # Ranked for its first MAX_QUERY_CHARS, as the API's context(query) ranks for a Turn's input
        # (refused as a search query's length, under the API's name for it, before).
        return fit(
            await ranked(input.strip()[:MAX_QUERY_CHARS], _CONTEXT_CANDIDATES, ctx, bot_id, _INPUT), limit
        )

    @server.tool(
        description="Why you may see an entry (by entry_id): each access rule of it and of its sources, "
        "with your own membership that meets it (NOT_FOUND when you may not see it)."
    )
    async def why(entry_id: str, ctx: Ctx, bot_id: str | None = None) -> Proof:
        data = await api.call(WHY, {"b": bot(bot_id), "id": entry_id}, token(ctx), _ENTRY)
        found = data["entry"]
        return read(Proof, {"entry": found["entry"], **found["why"]})

    return server


#: How long a bearer token the API accepted is let through without asking again; each tool call
#: is checked by the API anyway, so a token revoked meanwhile reads nothing.
_ACCEPTED_SECONDS: Final = 30.0
#: Accepted tokens remembered (by digest), the least recently accepted dropped first.
_ACCEPTED_MAX: Final = 10_000


class RequireBearer:
    """Refuses an HTTP request without a bearer token, or with one the API does not accept, before
    the MCP transport sees it: 401 with ``WWW-Authenticate: Bearer``, as an MCP host expects of a
    token to renew (not a tool error inside a 200). A token the API accepted is remembered for a
    while by its digest. While the API cannot be asked, a token not remembered is refused with
    503 ``UNAVAILABLE`` and ``Retry-After``: nothing unchecked gets a session, and the host is not
    told to renew a token that may be good."""

    def __init__(self, app: ASGIApp, api: Api) -> None:
        self.app = app
        self.api = api
        self.accepted: OrderedDict[bytes, float] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            token = bearer(headers)
            if token is None:
                await _unauthenticated("send the person's token as 'Authorization: Bearer <token>'")(
                    scope, receive, send
                )
                return
            refused = await self._refusal(token)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _refusal(self, token: str) -> JSONResponse | None:
        """The answer refusing ``token``: 401 when the API does not accept it, 503 when the API
        cannot be asked (None: it accepts it, or refuses it only for this query, not as a token)."""
        digest = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        if self.accepted.get(digest, 0.0) > now:
            return None
        try:
            await self.api.call(WHO, {}, token)
        except ApiError as exc:
            if exc.code == "UNAUTHENTICATED":
                return _unauthenticated(exc.message)
            if exc.code == "UNAVAILABLE":
                return _unchecked()
            return None
        self.accepted[digest] = now + _ACCEPTED_SECONDS
        self.accepted.move_to_end(digest)
        while len(self.accepted) > _ACCEPTED_MAX:
            self.accepted.popitem(last=False)
        return None


def _unauthenticated(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": "UNAUTHENTICATED", "message": message}},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


#: Seconds a host is asked to wait before it sends a request refused while the API is away.
_RETRY_AFTER_SECONDS: Final = 5


def _unchecked() -> JSONResponse:
    # Without the API's address or its error: the agents are remote (``Api.named``).
    message = "the botmemory API cannot be reached to check the token; try again in a moment"
    return JSONResponse(
        {"error": {"code": "UNAVAILABLE", "message": message}},
        status_code=503,
        headers={"Retry-After": str(_RETRY_AFTER_SECONDS)},
    )


def configured_api_url() -> str:
    """``BOTMEMORY_API_URL``, else the API that ``BOTMEMORY_API_HOST`` and ``BOTMEMORY_API_PORT``
    configure, as the API reads them (an address binding every interface is reached on this
    host's loopback). Raises ConfigurationError for a setting of the wrong shape."""
    given = os.environ.get("BOTMEMORY_API_URL")
    if given:
        return given
    settings = parse_settings()
    host = settings.api_host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        return f"http://{host}:{settings.api_port}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    return f"http://{f'[{address}]' if address.version == 6 else address}:{settings.api_port}"


async def _with_api(config: McpConfig, run: Callable[[Api], Awaitable[None]]) -> None:
    async with httpx.AsyncClient(base_url=config.api_url, timeout=30) as http:
        await run(Api(http, named=config.token is not None))  # over HTTP the URL is not named


async def _stdio(config: McpConfig) -> None:
    async def run(api: Api) -> None:
        await build_server(config, api).run_stdio_async()

    await _with_api(config, run)


async def _http(config: McpConfig, host: str, port: int) -> None:
    async def run(api: Api) -> None:
        app = build_server(config, api).streamable_http_app(stateless_http=True, host=host)
        server = uvicorn.Server(
            uvicorn.Config(RequireBearer(app, api), host=host, port=port, log_level="info")
        )
        await server.serve()

    await _with_api(config, run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m botmemory.mcp", description="Serve botmemory's tools to an MCP host."
    )
    parser.add_argument("--http", action="store_true", help="streamable HTTP at /mcp instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    try:
        url = configured_api_url()
    except ConfigurationError as exc:
        print(f"botmemory.mcp: {exc} (or set BOTMEMORY_API_URL)", file=sys.stderr)
        return 2
    bot_id = os.environ.get("BOTMEMORY_BOT_ID") or None
    if args.http:
        anyio.run(_http, McpConfig(url, bot_id, None), args.host, args.port)
        return 0
    token = os.environ.get("BOTMEMORY_TOKEN", "").strip()
    if not usable(token):
        print(
            "botmemory.mcp: set BOTMEMORY_TOKEN to the person's API token (or use --http)"
            + (": it holds characters no token has" if token else ""),
            file=sys.stderr,
        )
        return 2
    anyio.run(_stdio, McpConfig(url, bot_id, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
