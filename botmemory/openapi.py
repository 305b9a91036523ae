"""The REST route table and the OpenAPI 3.1 document made from it: each :class:`Operation` is one
Starlette route and one operation of the document, with its body, query and response models
(JSON Schema from pydantic). Served at ``/openapi.json``; ``/docs`` renders it with Swagger UI
from the app's own static files (no external URL)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, Literal, cast

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from botmemory.pages import render
from botmemory.rest_models import ErrorBody
from services.idempotency import HEADER, KEY

Handler = Callable[[Request], Awaitable[Response]]

#: The errors every operation may answer (DESIGN §5); an operation adds its own (409).
COMMON_ERRORS: Final = (400, 401, 403, 404, 422, 503)

_ERRORS: Final = {
    400: "BAD_INPUT: a header that counts once (Authorization, Idempotency-Key) sent twice",
    401: "UNAUTHENTICATED: no valid bearer token",
    403: "FORBIDDEN: the token may not do this",
    404: "NOT_FOUND: no such bot or chat for you",
    409: "CONFLICT: the state moved or the id is not yours",
    415: "BAD_INPUT: a body said to be other than JSON (Content-Type)",
    422: "BAD_INPUT: a refused value, named in the message",
    503: "UNAVAILABLE: Neo4j or Redis did not answer; send it again after Retry-After seconds",
}

_PARAM: Final = re.compile(r"{(\w+)}")


@dataclass(frozen=True, slots=True)
class Operation:
    """One REST operation: ``method`` and ``path`` (a Starlette template under the prefix),
    its handler (whose docstring gives the summary and description) and its models."""

    method: Literal["GET", "POST", "PUT", "PATCH"]
    path: str
    handler: Handler
    responses: Mapping[int, type[BaseModel]]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = COMMON_ERRORS
    #: Takes an ``Idempotency-Key`` header (``services.idempotency``).
    idempotent: bool = False


def operation_routes(operations: Sequence[Operation]) -> list[Route]:
    """One route per path, taking the method of each operation on it (a GET's HEAD too), so a
    method the path does not take is 405 with ``Allow`` naming all of them (a route per
    operation names only its own: ``DELETE …/memory`` would say ``GET, HEAD``, not ``POST``)."""
    by_path: dict[str, dict[str, Handler]] = {}
    for op in operations:
        by_path.setdefault(op.path, {})[op.method] = op.handler
    return [Route(path, _by_method(handlers), methods=list(handlers)) for path, handlers in by_path.items()]


def _by_method(handlers: Mapping[str, Handler]) -> Handler:
    """The handler of a request's method (HEAD: GET's, answered without its body)."""

    async def handle(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return handle


def _errors(op: Operation) -> tuple[int, ...]:
    """The error statuses ``op`` may answer: a body's, 415 too."""
    return (*op.errors, 415) if op.body is not None else op.errors


def document(operations: Sequence[Operation], prefix: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` mounted at ``prefix``."""
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ErrorBody, "serialization"): None}
    for op in operations:
        for model in op.responses.values():
            wanted[model, "serialization"] = None
        if op.body is not None:
            wanted[op.body, "validation"] = None
    refs, defs = models_json_schema(list(wanted), ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(prefix + op.path, {})[op.method.lower()] = _operation(
            op, lambda m, mode: refs[m, mode]
        )
    return _markdown(
        {
            "openapi": "3.1.0",
            "info": {"title": "botmemory REST", "version": "1"},
            "paths": paths,
            "components": {
                "schemas": defs.get("$defs", {}),
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
            "security": [{"bearer": []}],
        }
    )


def _markdown(node: Any) -> Any:
    """``node`` with its descriptions' code (the models' docstrings, reStructuredText's ````x````)
    in Markdown's ```x```."""
    if isinstance(node, dict):
        return {
            k: v.replace("``", "`") if k == "description" and isinstance(v, str) else _markdown(v)
            for k, v in cast(dict[str, Any], node).items()
        }
    if isinstance(node, list):
        return [_markdown(v) for v in cast(list[Any], node)]
    return node


#: The ``$ref`` of a model's schema in a mode.
Refs = Callable[[type[BaseModel], JsonSchemaMode], Any]


def _summary_and_description(doc: str) -> tuple[str, str]:
    """A handler's docstring as an operation's summary (its first sentence, plain text: OpenAPI
    renders no Markdown there) and description (the whole, Markdown; none when the sentence is
    all of it; it keeps the ids of the design it cites). The docstrings write code as
    reStructuredText does, ````x````; Markdown's is ```x```."""
    text = inspect.cleandoc(doc).replace("``", "`")
    whole = "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))
    sentence = _SENTENCE.match(whole)
    first = sentence.group(1) if sentence else whole.split("\n\n", 1)[0]
    summary = _CITED.sub("", first).replace("`", "")
    if len(summary) > SUMMARY_MAX and ": " in summary:  # a long sentence: what comes before its colon
        summary = summary.split(": ", 1)[0] + "."
    return summary, "" if whole == summary else whole


#: The longest summary kept whole (a list of operations shows each on one line).
SUMMARY_MAX: Final = 120


#: A first sentence: up to a full stop or question mark before a space or the end.
_SENTENCE: Final = re.compile(r"(.+?[.?])(?:\s|$)", re.S)
#: What a summary leaves to its description: the design's and the seed's ids it cites.
_CITED: Final = re.compile(r" \((?:seed|design|[VCELN]\d|D9\.)[^()]*\)")


def _operation(op: Operation, refs: Refs) -> dict[str, Any]:
    summary, description = _summary_and_description(op.handler.__doc__ or op.handler.__name__)
    found: dict[str, Any] = {
        "operationId": op.handler.__name__,
        "summary": summary,
        "tags": [op.path.split("/")[1]],
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(op.path)
        ]
        + _query_parameters(op.query)
        + ([_IDEMPOTENCY_KEY] if op.idempotent else []),
        "responses": {
            str(status): _response(HTTPStatus(status).phrase, refs(model, "serialization"))
            for status, model in op.responses.items()
        }
        | {
            str(status): _response(_ERRORS[status], refs(ErrorBody, "serialization"))
            for status in _errors(op)
        },
    }
    if description:
        found["description"] = description
    if op.body is not None:
        found["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs(op.body, "validation")}},
        }
    return found


_IDEMPOTENCY_KEY: Final = {
    "name": HEADER,
    "in": "header",
    "required": False,
    "description": "Your key for this request (1 to 255 visible ASCII characters, such as a UUID): sent "
    "again with the same key and body within the server's key lifetime (a day by default), the "
    "request answers with what the first one "
    "created, as it stands now, and creates nothing; with another body it is 422 BAD_INPUT.",
    "schema": {"type": "string", "pattern": f"^{KEY.pattern}$"},
}


def _response(description: str, schema: Any) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _query_parameters(model: type[BaseModel] | None) -> list[dict[str, Any]]:
    if model is None:
        return []
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    out: list[dict[str, Any]] = []
    for name, prop in schema["properties"].items():
        param: dict[str, Any] = {"name": name, "in": "query", "required": name in required}
        if "description" in prop:
            param["description"] = prop["description"]
        # A query parameter is left out rather than null: describe the value it has when given.
        given = [s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"]
        param["schema"] = {k: v for k, v in given[0].items() if k not in ("title", "description")}
        if prop.get("default") is not None:
            param["schema"]["default"] = prop["default"]
        out.append(param)
    return out


def routes(operations: Sequence[Operation], prefix: str) -> list[Route]:
    """``GET /openapi.json`` (built once, here) and ``GET /docs``."""
    spec = document(operations, prefix)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(spec)

    async def docs(request: Request) -> Response:
        # Swagger UI from the app's static files (``validatorUrl: null`` keeps it from calling
        # out), as the other pages: 503 naming `make assets` without them, the files' URLs
        # stamped (they are cached for a year).
        return render("docs.html")

    return [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
    ]
