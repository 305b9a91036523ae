"""An exception no handler answered (a REST route's, or one raised outside Strawberry) ends as a
500 in the API's error shape, logged by its type and where it was raised, never its message."""

from __future__ import annotations

import logging
from typing import cast

import httpx
import pytest
import strawberry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from botmemory.app import Unexpected
from resolvers.schema import Schema
from schema.errors import ErrorCodes

CANARY = "CANARY-7f3e-what-a-record-held"


async def fails(request: Request) -> Response:
    raise ValueError(f"cannot read {CANARY!r}")  # as a library's message quotes its input


async def test_an_unanswered_exception_is_a_500_logged_without_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Starlette's outermost handler answered it, then raised it again: the server logged the
    message (a record's content, a request's text) with the traceback."""
    app = Starlette(routes=[Route("/v1/x", fails)], middleware=[Middleware(Unexpected)])
    caplog.set_level(logging.DEBUG)
    transport = httpx.ASGITransport(app=app)  # raises what the app raises, as the server logs it
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get("/v1/x")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "INTERNAL"
    told = caplog.text + "".join(str(r.exc_info) for r in caplog.records)
    assert "ValueError" in told and "fails" in told  # its type and where it was raised
    assert CANARY not in told and CANARY not in response.text


@strawberry.type
class _Shown:
    @strawberry.field
    def text(self) -> str:
        return cast(str, {"content": CANARY})  # a resolver of ours handing a row where text belongs

    @strawberry.field
    def count(self) -> int:
        return cast(int, CANARY)

    @strawberry.field
    def needed(self) -> str:
        return cast(str, None)

    @strawberry.field
    def echo(self, n: int | None = 1) -> int:
        return cast(int, n)

    @strawberry.field
    def needs(self, n: int) -> int:
        return n


@strawberry.type
class _Root:
    @strawberry.field
    def shown(self) -> _Shown:
        return _Shown()


async def test_a_value_its_type_refuses_is_an_internal_error_never_quoted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """graphql-core refuses a value a field's type cannot hold with an error that quotes it
    ("String cannot represent value: {...}", up to 240 characters of a row) and is a GraphQLError
    itself: it was sent as BAD_INPUT, the value and all. It is ours, not the caller's: INTERNAL,
    masked; input errors stay BAD_INPUT with their message."""
    schema = Schema(query=_Root, extensions=[ErrorCodes])
    caplog.set_level(logging.DEBUG)
    for field in ("text", "count", "needed"):
        result = await schema.execute(f"{{ shown {{ {field} }} }}")
        assert result.errors is not None, field
        assert [(e.message, (e.extensions or {})["code"]) for e in result.errors] == [
            ("internal error", "INTERNAL")
        ]
        assert CANARY not in str(result.errors) and CANARY not in caplog.text, field
    refused = await schema.execute('{ shown { echo(n: "x") } }')
    assert refused.errors is not None and [(e.extensions or {})["code"] for e in refused.errors] == [
        "BAD_INPUT"
    ]
    bad_null = await schema.execute(
        "query($n: Int = 1) { shown { echo(n: $n) } }", variable_values={"n": "y"}
    )
    assert bad_null.errors is not None and [(e.extensions or {})["code"] for e in bad_null.errors] == [
        "BAD_INPUT"
    ]
    # Refused as the field runs (a null where its argument needs a value): the caller's doing.
    null = await schema.execute("query($n: Int = 1) { shown { needs(n: $n) } }", variable_values={"n": None})
    assert null.errors is not None and null.errors[0].path is not None
    assert [(e.extensions or {})["code"] for e in null.errors] == ["BAD_INPUT"]
    assert null.errors[0].message.startswith("Argument 'n' ")
