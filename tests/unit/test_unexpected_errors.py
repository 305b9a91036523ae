"""An exception no handler answered (a REST route's, or one raised outside Strawberry) ends as a
500 in the API's error shape, logged by its type and where it was raised, never its message."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from botmemory.app import Unexpected

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
