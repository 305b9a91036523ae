"""REST adapters under ``/v1`` (DESIGN §5): thin wrappers over the same services as GraphQL."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from botmemory import chats
from botmemory.auth import authenticate
from botmemory.domain import Item, Principal
from botmemory.errors import BadInput
from botmemory.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    return request.state.runtime


async def principal_of(request: Request) -> Principal:
    return await authenticate(runtime_of(request), request.headers.get("authorization"))


def int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadInput(f"{name} must be an integer", field=name) from None


def item_json(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "turnId": item.turn_id,
        "kind": item.kind.value,
        "text": item.text,
        "app": item.app,
        "speakerId": item.speaker_id,
        "createdAt": item.created_at,
    }


async def chat_messages(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/messages?limit&skip`` — the chat's Items in order (D9.19)."""
    principal = await principal_of(request)
    page = await chats.messages(
        runtime_of(request),
        principal,
        request.path_params["chat_id"],
        limit=int_param(request, "limit", 50),
        skip=int_param(request, "skip", 0),
    )
    return JSONResponse({"messages": [item_json(i) for i in page.items], "total": page.total})


routes = [
    Route("/chats/{chat_id}/messages", chat_messages, methods=["GET"]),
]
