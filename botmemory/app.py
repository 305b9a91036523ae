"""The Starlette application: GraphQL at /graphql (GraphiQL for browsers), REST at /v1 (described
at /openapi.json and /docs), the pages (/explore, /static), /healthz and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import traceback
from collections import Counter
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Final, TypedDict, cast

from cross_web import HTTPException as CrossWebHTTPException
from graphql import GraphQLError, OperationDefinitionNode, OperationType, get_operation_ast, parse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from strawberry.asgi import ASGIWebSocketAdapter, GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_transport_ws.types import ConnectionInitMessage
from strawberry.types import ExecutionResult
from strawberry.types.unset import UNSET, UnsetType

from botmemory import openapi, pages, rest
from botmemory.rest_input import KeyTwice, once
from botmemory.rest_models import ErrorBody, respond
from learning.gateway import Gateway
from resolvers.schema import build_schema
from schema.context import Context
from schema.errors import code_of, with_code, without_values
from schema.fanout import encode_next
from services import auth, memorybot, metrics
from services.bootstrap import open_runtime
from services.changefeed import ChangeHub
from services.embedding import Embedder
from services.errors import RETRY_AFTER_SECONDS, BadInput, ServiceError, unavailable
from services.logs import configure_logging
from services.runtime import Runtime
from services.settings import Settings, load_settings
from services.turnfeed import TurnHub

log = logging.getLogger("botmemory.api")


class State(TypedDict):
    runtime: Runtime
    gateway: Gateway
    embedder: Embedder | None
    hub: ChangeHub
    turn_hub: TurnHub


#: The close reason of a ``connection_init`` refused for want of a token (4403): the payload
#: shapes we accept.
WS_AUTH_REASON = (
    'unauthenticated: connection_init payload is {"Authorization": "Bearer <token>"} or {"token": "<token>"}'
)
#: The close reason of a ``connection_init`` whose bearer token the API does not accept (4403),
#: in REST's words: the shape was right.
WS_TOKEN_REASON: Final = "unauthenticated: invalid, expired or revoked token"
#: The close reason of a socket past its token's sockets in this process (4429), with the limit.
TOO_MANY_SOCKETS: Final = "too many sockets: you hold as many open on this API process as you may"
#: The close code and reason of a ``connection_init`` whose token could not be looked up because
#: Neo4j or Redis is out of reach (1013: try again later), as REST's 503 says it.
WS_UNAVAILABLE: Final = (1013, "unavailable: the service cannot check tokens now; connect again in a moment")
#: The most bytes a close frame's reason may hold (RFC 6455: 125 bytes of payload, 2 of them the
#: code).
MAX_CLOSE_REASON: Final = 123


def fit_close_reason(reason: str) -> str:
    """``reason`` cut to what a close frame holds (UTF-8, on a character boundary, ``…`` where
    cut). Strawberry closes with text that quotes the client: an unknown message type, a syntax
    error's token; a longer one raised out of the close (a traceback in the log, the client left
    with 1006 and no reason)."""
    data = reason.encode()
    if len(data) <= MAX_CLOSE_REASON:
        return reason
    return data[: MAX_CLOSE_REASON - len("…".encode())].decode(errors="ignore") + "…"


class WebSocketAdapter(ASGIWebSocketAdapter):
    """Strawberry's socket, whose close reasons always fit a close frame (:func:`fit_close_reason`)."""

    async def close(self, code: int, reason: str) -> None:
        await super().close(code, fit_close_reason(reason))


#: The longest operation id a socket may use (graphql-transport-ws leaves it to the server).
MAX_OPERATION_ID: Final = 200


def _well_formed(message: object) -> bool:
    """A graphql-transport-ws message of the shape its type needs: an object with a string
    ``type``; ``subscribe`` with a string ``id`` and a ``payload`` object whose ``query`` is text
    (``operationName`` text when given; its ``variables`` and ``extensions`` are the operation's
    to refuse, :func:`_payload_refusal`); ``complete`` with a string ``id`` of at most
    MAX_OPERATION_ID characters. Strawberry read the fields as they came:
    ``[]``, ``"payload": "x"`` or ``"id": [1]`` raised a TypeError out of the socket — a traceback
    in the log and a 1011 close for any client, before its token was looked at; an id of a
    megabyte was repeated in every message of its operation (each change event, for each of its
    subscriptions)."""
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        return False
    fields = cast(dict[str, object], message)
    if fields["type"] in ("subscribe", "complete"):
        id = fields.get("id")
        if not isinstance(id, str) or len(id) > MAX_OPERATION_ID:
            return False
    if fields["type"] == "subscribe":
        payload = fields.get("payload")
        if not isinstance(payload, dict):
            return False
        request = cast(dict[str, object], payload)
        return isinstance(request.get("query"), str) and isinstance(request.get("operationName") or "", str)
    return True


def _payload_refusal(payload: dict[str, object]) -> str | None:
    """Why a ``subscribe`` payload's ``variables`` or ``extensions`` cannot be read: either is an
    object or null, as over HTTP, in the words Strawberry's HTTP view says it: a falsy other
    (``""``, ``0``, ``false``) is no object either, and would run as no variables."""
    for name in ("variables", "extensions"):
        if not isinstance(payload.get(name), dict | None):
            return f"The GraphQL operation's `{name}` must be an object or null, if provided."
    return None


class TransportWSHandler(BaseGraphQLTransportWSHandler[Context, None]):
    #: The caller whose socket this is, once counted among its sockets (``GraphQLApp.sockets``).
    _counted: str | None = None

    async def handle(self) -> None:
        try:
            await super().handle()
        finally:
            if self._counted is not None:
                sockets = cast(GraphQLApp, self.view).sockets
                sockets[self._counted] -= 1
                if not sockets[self._counted]:
                    del sockets[self._counted]

    async def handle_message(self, message: Any) -> None:
        if not _well_formed(message):
            await self.handle_invalid_message("Failed to parse message")  # 4400, as for a missing field
            return
        # (An id already running is Strawberry's to refuse: it closes the socket, 4409.)
        if (
            message["type"] == "subscribe"
            and self.connection_acknowledged
            and message["id"] not in self.operations
        ):
            payload = message["payload"]
            tokens = self.context.runtime.settings.max_query_tokens
            refusal = _payload_refusal(payload) or _socket_refusal(
                payload["query"], payload.get("operationName"), tokens
            )
            limit = self.context.runtime.settings.max_socket_operations
            if refusal is None and len(self.operations) >= limit:
                refusal = f"at most {limit} operations run at once on one socket: complete one first"
            if refusal is not None:
                error = GraphQLError(refusal, extensions={"code": "BAD_INPUT"})
                await self.send_message({"id": message["id"], "type": "error", "payload": [error.formatted]})
                return
        await super().handle_message(message)

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        """Refuse a missing or malformed credential with a reason that states the expected payload,
        and a bearer token the API does not accept as such; ``on_ws_connect`` then finds the
        caller already authenticated (the context keeps the outcome)."""
        payload = message.get("payload", {})
        if isinstance(payload, dict) and not self.connection_init_received and not self.connection_timed_out:
            # It came in time: the wait for it ends now, not after the token is looked up.
            if self.connection_init_timeout_task:
                self.connection_init_timeout_task.cancel()
            self.context.connection_params = payload
            try:
                await self.context.authenticate_connection()
                principal = await self.context.principal()
            except BadInput as exc:  # two credentials: which one would count? (HTTP: 400)
                await self._refuse_init(4400, exc.message)
                return
            except ServiceError:
                token = auth.bearer_token(self.context.authorization)
                await self._refuse_init(4403, WS_AUTH_REASON if token is None else WS_TOKEN_REASON)
                return
            except Exception as exc:
                # Neo4j or Redis out of reach: said as such, not raised out of the application (a
                # traceback naming the database's host, the client left with 1006 and no reason).
                if unavailable(exc) is None:
                    raise
                log.warning("unavailable on connection_init: %s", type(exc).__name__)
                await self._refuse_init(*WS_UNAVAILABLE)
                return
            # A person's sockets are counted together whatever token opened them (a person issues
            # any number of tokens); a platform token's are its own; the operator's token has no id.
            caller = principal.person_id or principal.token_id or principal.kind
            sockets, limit = (
                cast(GraphQLApp, self.view).sockets,
                self.context.runtime.settings.max_sockets_per_person,
            )
            if sockets[caller] >= limit:
                await self._refuse_init(4429, f"{TOO_MANY_SOCKETS} ({limit})")
                return
            sockets[caller] += 1
            self._counted = caller
        await super().handle_connection_init(message)

    async def _refuse_init(self, code: int, reason: str) -> None:
        """Close the socket in answer to its ``connection_init`` (its wait for one ends)."""
        if self.connection_init_timeout_task:
            self.connection_init_timeout_task.cancel()
        await self.websocket.close(code=code, reason=reason)


#: What a request that sends a subscription over plain HTTP is told.
SUBSCRIPTION_OVER_HTTP: Final = (
    "subscriptions are served over WebSocket at /graphql (graphql-transport-ws; "
    'connection_init payload {"Authorization": "Bearer <token>"})'
)
#: An operation's keyword: a document of several named operations holds two or more.
_OPERATION_WORD: Final = re.compile(r"\b(?:query|mutation|subscription)\b")


def _refusal(request_data: GraphQLRequestData, max_tokens: int) -> str | None:
    """Why an HTTP request's document cannot run as sent: it holds several operations and names
    none (the GraphQL spec requires ``operationName`` then; Strawberry ran the first, and a first
    subscription failed inside as INTERNAL), or the operation it selects is a subscription. Parsed
    only when either may be so, and within the token limit (unbounded, a body of ~900 KB of
    tokens held the event loop ~3.7 s before anything checked the caller)."""
    query = request_data.query
    if not query or ("subscription" not in query and len(_OPERATION_WORD.findall(query)) < 2):
        return None
    try:
        document = parse(query, max_tokens=max_tokens)
    except GraphQLError:
        return None  # the execution reports the syntax error, or the limit
    operations = sum(isinstance(d, OperationDefinitionNode) for d in document.definitions)
    if operations > 1 and request_data.operation_name is None:
        return f"the document holds {operations} operations: operationName says which to run"
    operation = get_operation_ast(document, request_data.operation_name)
    if operation is not None and operation.operation is OperationType.SUBSCRIPTION:
        return SUBSCRIPTION_OVER_HTTP
    return None


def _socket_refusal(query: str, operation_name: str | None, max_tokens: int) -> str | None:
    """Why an operation sent on a socket cannot run as sent: no query, no operation in it, or not
    one operation that its ``operationName`` (or, without one, the document's only operation)
    selects. Strawberry ran a document's first operation when several were sent without a name (a
    mutation nobody chose to run), and answered the others INTERNAL, as HTTP's checks do not run
    here. A document that does not parse is left to the execution, which reports where."""
    if not query.strip():
        return "the query is empty"
    try:
        document = parse(query, max_tokens=max_tokens)
    except GraphQLError:
        return None
    operations = sum(isinstance(d, OperationDefinitionNode) for d in document.definitions)
    if operations == 0:
        return "the document holds no operation"
    if operations > 1 and operation_name is None:
        return f"the document holds {operations} operations: operationName says which to run"
    if get_operation_ast(document, operation_name) is None:
        return "operationName names no operation of the document"
    return None


#: ``\ud800``–``\udfff`` escaped in JSON text: a surrogate, which is a character only in a pair.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(decoded: object) -> bool:
    """Whether a decoded JSON value holds a lone surrogate: no UTF-8 text has one, so nothing
    could encrypt, store or embed it (JSON's ``\ud800`` escape is the only way in)."""
    try:
        json.dumps(decoded, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


def _media_type_lowered(content_type: bytes) -> bytes:
    """A ``Content-Type`` value with its media type in lower case, its parameters as sent (a
    multipart boundary is case-sensitive). Media types are not (RFC 9110), and Strawberry matches
    ``application/json`` as written: ``Application/JSON``, which REST takes, would be
    "Unsupported content type"."""
    media_type, semicolon, parameters = content_type.partition(b";")
    return media_type.strip().lower() + semicolon + parameters


class GraphQLApp(GraphQL[Context, None]):
    graphql_transport_ws_handler_class = TransportWSHandler
    websocket_adapter_class = WebSocketAdapter

    def __init__(self, schema: Any, *, max_query_tokens: int, **options: Any) -> None:
        super().__init__(schema, **options)
        self.max_query_tokens = max_query_tokens
        #: Open sockets by caller (a person's id, a platform token's id, "admin") in this process.
        self.sockets: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Strawberry answers a request it cannot read (not JSON, no query, a wrong method) in
        plain text; ours get the REST error body with a code, as every other error does. HEAD is
        answered as GET is, its headers alone (RFC 9110): the route's 405 names it in ``Allow``,
        and Strawberry's own answer to it is a 405 without one."""
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        method = "GET" if scope["method"] == "HEAD" else scope["method"]
        headers = [(k, _media_type_lowered(v) if k == b"content-type" else v) for k, v in scope["headers"]]
        try:
            # The response goes out on the request's own scope: for HEAD, without its body.
            response = await self.run(Request({**scope, "method": method, "headers": headers}, receive))
        except CrossWebHTTPException as exc:
            code = STATUS_CODES.get(exc.status_code, "BAD_INPUT")
            metrics.REQUESTS.labels(surface="graphql", code=code).inc()
            reason = without_values(exc.reason)
            if isinstance(exc.__cause__, json.JSONDecodeError):  # what was wrong (it quotes no input)
                if method == "GET":  # Strawberry names the body, which a GET has not
                    reason = "Unable to parse the variables or extensions of the query string as JSON"
                reason = f"{reason}: {exc.__cause__.msg}"
            response = error_json(code, reason, exc.status_code)
        await response(scope, receive, send)

    def decode_json(self, data: str | bytes) -> object:
        """JSON as Strawberry decodes it (request bodies, socket messages), refusing what is not
        UTF-8 text and a lone surrogate as it refuses what is not JSON (Python's decoder takes
        ``"\ud800"``, and bytes that encode one; pydantic's, which reads REST bodies, refuses
        both), an object that names a key twice, JSON nested too deep and a number too long. A
        body that is not UTF-8 raised past Strawberry's check: 500 before."""
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")  # strict: an encoded surrogate (ED A0 80) is refused too
            except UnicodeDecodeError as exc:
                raise json.JSONDecodeError(
                    "the body is not UTF-8 text", data.decode(errors="replace"), exc.start
                ) from None
        else:
            text = data
        try:
            decoded: object = json.loads(text, object_pairs_hook=once)
        except KeyTwice as exc:
            # As REST bodies (read_body): a parser keeps the last value, and the first is lost.
            raise json.JSONDecodeError(str(exc), text, 0) from None
        except json.JSONDecodeError:
            raise
        except (ValueError, RecursionError):
            # Nested deeper than Python's parser goes, or an integer of over 4,300 digits: both
            # raised past Strawberry's check of JSON errors, 500 (a 1011 close on a socket).
            raise json.JSONDecodeError(
                "the JSON is nested too deep or holds too long a number", text, 0
            ) from None
        if _SURROGATE_ESCAPE.search(text) and _lone_surrogate(decoded):
            raise json.JSONDecodeError("a lone surrogate is not a character", text, 0)
        if isinstance(data, bytes) and not isinstance(decoded, dict | list):
            # A request body (query parameters' values come as text, and may be null): Strawberry
            # read a request's fields off it and failed, 500.
            raise json.JSONDecodeError("a GraphQL request is a JSON object", text, 0)
        return cast(object, decoded)

    async def get_context(self, request: HTTPConnection, response: Any) -> Context:
        return Context(
            runtime=request.state.runtime,
            gateway=request.state.gateway,
            embedder=request.state.embedder,
            authorization=request.headers.get("authorization"),
            hub=request.state.hub,
            turn_hub=request.state.turn_hub,
            cache_loaders=request.scope["type"] != "websocket",
        )

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """Authenticate subscriptions once, on ``connection_init``; a bad token closes with 4403."""
        try:
            await context.authenticate_connection()
        except ServiceError:
            raise ConnectionRejectionError({"code": "UNAUTHENTICATED"}) from None
        return UNSET

    async def render_graphql_ide(self, request: Request) -> Response:
        return pages.render("graphiql.html")

    def encode_json(self, data: object) -> str | bytes:
        """Subscription payloads shared by several subscribers are serialised once (schema.fanout)."""
        shared = encode_next(data)
        return super().encode_json(data) if shared is None else shared

    async def execute_single(
        self,
        request: Request,
        request_adapter: Any,  # strawberry's adapter (of its cross_web dependency), passed on
        sub_response: Response,
        context: Context,
        root_value: None,
        request_data: GraphQLRequestData,
    ) -> ExecutionResult:
        """A subscription sent as a plain HTTP request gets BAD_INPUT saying where subscriptions are
        served (Strawberry would run its resolver as a query and fail inside it), and so does a
        document of several operations that names none (:func:`_refusal`)."""
        refusal = _refusal(request_data, self.max_query_tokens)
        if refusal is not None:
            return ExecutionResult(
                data=None, errors=[GraphQLError(refusal, extensions={"code": "BAD_INPUT"})]
            )
        return await super().execute_single(
            request, request_adapter, sub_response, context, root_value, request_data
        )

    async def process_result(self, request: Request, result: ExecutionResult) -> GraphQLHTTPResponse:
        """Parse errors end before the operation's extensions; give them their code here (and
        count them, as ErrorCodes counts the others). An operation without errors counts as OK."""
        if result.errors:
            for e in result.errors:
                if not (e.extensions and "code" in e.extensions):
                    metrics.REQUESTS.labels(surface="graphql", code=code_of(e)).inc()
            result.errors = [with_code(e) for e in result.errors]
        else:
            metrics.REQUESTS.labels(surface="graphql", code="OK").inc()
        return await super().process_result(request, result)


def error_json(code: str, message: str, status: int) -> Response:
    """The REST error format of DESIGN §5."""
    return respond(ErrorBody.model_validate({"error": {"code": code, "message": message}}), status)


async def service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_json(exc.code, exc.message, exc.status)


#: The code of a REST error status (DESIGN §5); other 4xx are BAD_INPUT.
STATUS_CODES = {
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    # A body that comes too slowly: sent again, the request may be answered (a subscription that
    # falls behind its events ends with the same code).
    408: "TOO_SLOW",
    409: "CONFLICT",
    503: "UNAVAILABLE",
}


def code_of_status(status: int) -> str:
    """The code of a REST response's status: OK below 400, else as its error body says."""
    if status < 400:
        return "OK"
    return STATUS_CODES.get(status, "BAD_INPUT" if status < 500 else "INTERNAL")


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = STATUS_CODES.get(exc.status_code, "BAD_INPUT")
    response = error_json(code, str(exc.detail), exc.status_code)
    response.headers.update(exc.headers or {})  # a 405's Allow (RFC 9110)
    return response


async def internal_error(request: Request, exc: Exception) -> Response:
    return failure(exc, request.method, request.url.path)


def failure(exc: Exception, method: str, path: str, stack: bool = False) -> Response:
    """The answer to an error no handler expected, logged by type (a message may quote content):
    503 UNAVAILABLE with ``Retry-After`` when Neo4j or Redis did not answer — the request may be
    sent again — else 500 INTERNAL (with its stack when ``stack``)."""
    down = unavailable(exc)
    if down is not None:
        log.warning("unavailable on %s %s: %s", method, path, type(exc).__name__)
        response = error_json(down.code, down.message, down.status)
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    where = "\n" + "".join(traceback.format_tb(exc.__traceback__)) if stack else ""
    log.error("internal error on %s %s: %s%s", method, path, type(exc).__name__, where)
    return error_json("INTERNAL", "internal error", 500)


async def healthz(request: Request) -> JSONResponse:
    """Green only when Neo4j and Redis both answer."""
    runtime: Runtime = request.state.runtime
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(runtime.driver.verify_connectivity(), timeout=5)
        checks["neo4j"] = "ok"
    except Exception as exc:  # health reports the failure instead of raising
        checks["neo4j"] = f"error: {type(exc).__name__}"
    try:
        await asyncio.wait_for(runtime.redis.ping(), timeout=5)  # type: ignore[misc]
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    healthy = all(v == "ok" for v in checks.values())
    # Whether a model endpoint is set (never which one): the demo and operators read it.
    model = "configured" if runtime.settings.openai_base_url else "missing"
    body = {"status": "ok" if healthy else "unavailable", **checks, "model": model}
    if checks["neo4j"] == "ok":  # whether every budget can bind (D9.25); a warning, not an outage
        with contextlib.suppress(Exception):
            body["budget"] = await asyncio.wait_for(memorybot.budget_state(runtime), timeout=5)
    return JSONResponse(body, status_code=200 if healthy else 503)


async def metrics_endpoint(request: Request) -> Response:
    """Prometheus metrics, for operators only (services.auth.check_scraper)."""
    proxied = "x-forwarded-for" in request.headers or "forwarded" in request.headers
    client = request.client.host if request.client is not None else None
    runtime: Runtime = request.state.runtime
    auth.check_scraper(runtime.settings, request.headers.get("authorization"), client, proxied)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


class Unexpected:
    """An exception no handler answered ends as a 500 in the API's error shape, logged by its type
    and where it was raised — never its message, which may quote what a request or a record held
    (the rule the GraphQL errors keep, ``schema.errors``). Starlette's outermost handler answered
    such an exception, then raised it again for the server to log, message and all."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except ClientDisconnect:
            # The client closed its connection before its body was in: nothing failed here, and
            # nobody is left to read an answer.
            log.info("client gone before its body was read on %s %s", scope["method"], scope["path"])
        except Exception as exc:
            answer = failure(exc, scope["method"], scope["path"], stack=True)
            if not started:  # else the response was cut short; the server closes the connection
                await answer(scope, receive, send)


#: On every HTTP answer: no type sniffing (a JSON body read as HTML), no Referer to other sites,
#: never framed (``frame-ancestors`` says it too, to browsers that read CSP).
SAFE_HEADERS: Final = (
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
)


class _HttpOnly:
    """An ASGI middleware of HTTP requests (:meth:`http`); the others pass by."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class SafeHeaders(_HttpOnly):
    """SAFE_HEADERS on every HTTP answer, and ``Cache-Control: no-store`` on the API's (REST and
    GraphQL) unless it says otherwise: they carry decrypted memory and messages, which a browser
    (the docs page's "Try it out" on a shared machine) or a proxy kept on disk."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        private = path == "/graphql" or path.startswith("/v1/")

        async def headed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SAFE_HEADERS:
                    headers.setdefault(name, value)
                if private:
                    headers.setdefault("cache-control", "no-store")
            await send(message)

        await self.app(scope, receive, headed)


#: The count of a request whose client left before its body was in: no error, and never sent.
DISCONNECTED: Final = "DISCONNECTED"


class RequestMetrics(_HttpOnly):
    """``botmemory_request_seconds{surface}`` of every HTTP request, and for REST
    ``botmemory_requests_total{surface="rest",code}`` (OK or the error's code, from its status;
    GraphQL counts its operations in GraphQLApp and ErrorCodes). A request whose client left
    before its body was in counts as DISCONNECTED on either (GraphQL never got to run it).
    Surfaces, never paths."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        surface = "graphql" if path == "/graphql" else "rest" if path.startswith("/v1/") else "other"
        status = 500  # unless a response starts: an exception the outermost handler answers

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        began = time.perf_counter()
        gone = False
        try:
            await self.app(scope, receive, observed)
        except ClientDisconnect:
            gone = True
            raise
        except Exception as exc:  # answered outside, by ``failure``: 503 for an outage, else 500
            if unavailable(exc) is not None:
                status = 503
            raise
        finally:
            metrics.REQUEST_SECONDS.labels(surface=surface).observe(time.perf_counter() - began)
            if gone and surface != "other":
                metrics.REQUESTS.labels(surface=surface, code=DISCONNECTED).inc()
            elif surface == "rest":
                metrics.REQUESTS.labels(surface=surface, code=code_of_status(status)).inc()


#: A 408's headers: the connection closes, as the rest of the body may still come on it (RFC 9110).
TOO_SLOW_CLOSE: Final = {"Connection": "close"}

#: Headers a request sends once at most.
ONE_OF_EACH: Final = (b"authorization", b"idempotency-key")


class BodyLimit:
    """Rejects request bodies over the configured size before any handler reads them, and a
    request (or a WebSocket's upgrade) whose URL or headers are over theirs: the server reads a
    URL of any length, and GraphQL over GET decoded its variables, JSON of any size, before
    anything looked at the caller (414, 431; an upgrade is refused, 403); and one that sends a
    header twice that must come once (400: which one would count?). A body that has not arrived
    whole ``read_seconds`` after a handler starts reading it is answered 408 (the server waits for
    the bytes a ``Content-Length`` promises for as long as the connection stays open, and a
    handler with them)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        max_url_bytes: int,
        max_header_bytes: int,
        read_seconds: float,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_url_bytes = max_url_bytes
        self.max_header_bytes = max_header_bytes
        self.read_seconds = read_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        url = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
        headers = sum(len(k) + len(v) for k, v in scope["headers"])
        names = [name for name, _ in scope["headers"]]
        twice = next((name for name in ONE_OF_EACH if names.count(name) > 1), None)
        refusal = None
        if url > self.max_url_bytes:
            refusal = (414, f"request URL over {self.max_url_bytes} bytes")
        elif headers > self.max_header_bytes:
            refusal = (431, f"request headers over {self.max_header_bytes} bytes")
        elif twice is not None:  # which one counts is anyone's guess: the first was taken
            refusal = (400, f"send the {twice.decode()} header once")
        if refusal is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008, "reason": refusal[1]})
            else:
                await error_json("BAD_INPUT", refusal[1], refusal[0])(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        seen = 0
        deadline: float | None = None  # of the whole body, from the first read of it
        whole = False

        async def limited() -> Message:
            nonlocal seen, deadline, whole
            if whole:  # the body is in: a wait for the client's disconnect lasts as the answer does
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.read_seconds
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(
                    408, f"the request body did not arrive within {self.read_seconds:g} s", TOO_SLOW_CLOSE
                ) from None
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise HTTPException(413, f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_json("BAD_INPUT", f"request body over {self.max_bytes} bytes", 413)
        await response(scope, receive, send)


def create_app(settings: Settings | None = None) -> Starlette:
    """The ASGI app; ``uvicorn botmemory.app:create_app --factory``."""
    settings = settings or load_settings()
    configure_logging(settings.log_level)
    graphql = GraphQLApp(
        build_schema(settings),
        max_query_tokens=settings.max_query_tokens,
        subscription_protocols=[GRAPHQL_TRANSPORT_WS_PROTOCOL],
        # Ours (TransportWSHandler, BOTMEMORY_MAX_SOCKET_OPERATIONS, BAD_INPUT): Strawberry's own
        # refused the 101st operation without a code, and whatever the setting said.
        max_subscriptions_per_connection=None,
        connection_init_wait_timeout=timedelta(seconds=settings.socket_init_seconds),
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[State]:
        async with open_runtime(settings) as runtime, Gateway(settings) as gateway:
            hub = ChangeHub(runtime)
            turn_hub = TurnHub(runtime)
            await hub.start()
            await turn_hub.start()
            await gateway.warm_up()
            log.info("api ready")
            try:
                yield {
                    "runtime": runtime,
                    "gateway": gateway,
                    "embedder": gateway.embedder,
                    "hub": hub,
                    "turn_hub": turn_hub,
                }
            finally:
                await turn_hub.stop()
                await hub.stop()

    app = Starlette(
        routes=[
            Route("/graphql", graphql, methods=["GET", "POST"]),
            WebSocketRoute("/graphql", graphql),
            Route("/explore", pages.explore, methods=["GET"]),
            Mount("/static", app=pages.static_files(), name="static"),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            # No redirect of a path with a trailing slash: Starlette's is built from the Host
            # header, whatever it names.
            Mount("/v1", app=Router(rest.routes, redirect_slashes=False)),
            *openapi.routes(rest.operations, "/v1"),
        ],
        middleware=[
            Middleware(SafeHeaders),
            Middleware(Unexpected),
            Middleware(RequestMetrics),
            Middleware(
                BodyLimit,
                max_bytes=settings.max_body_bytes,
                max_url_bytes=settings.max_url_bytes,
                max_header_bytes=settings.max_header_bytes,
                read_seconds=settings.body_read_timeout_seconds,
            ),
        ],
        exception_handlers={
            ServiceError: service_error,
            HTTPException: http_error,
            Exception: internal_error,
        },
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # see /v1's
    return app
