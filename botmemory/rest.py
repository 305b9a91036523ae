"""REST adapters under ``/v1`` (DESIGN §5): thin wrappers over the same services as GraphQL."""

from __future__ import annotations

from typing import Any, cast

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services import (
    chatmemory,
    chats,
    commands,
    conversation,
    enrichments,
    learninglog,
    memory,
    memorybot,
    search,
)
from services.auth import authenticate
from services.domain import Item, Principal
from services.errors import BadInput
from services.runtime import Runtime


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


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadInput("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    return cast(dict[str, Any], body)


def string_field(body: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string", field=name)
    return value


def string_list(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in cast(list[Any], value)):
        raise BadInput(f"{name} must be a list of strings", field=name)
    return cast(list[str], value)


async def get_memory(request: Request) -> JSONResponse:
    """``GET /v1/bots/{botId}/memory?tags=a,b`` — entries for you, in your organization (seed).
    With ``limit`` (1–1000) and ``after``: one page in memory order and ``next``, the cursor of
    the page after it (null after the last)."""
    params = request.query_params
    raw = params.get("tags")
    tags = [t.strip() for t in raw.split(",") if t.strip()] if raw else []
    rt, principal, bot_id = runtime_of(request), await principal_of(request), request.path_params["bot_id"]
    if "limit" not in params and "after" not in params:
        found, version = await memory.list_entries(rt, principal, bot_id, tags)
        return JSONResponse({"entries": [e.json() for e in found], "version": version})
    limit = whole_number(params, "limit")
    limit = memory.MAX_PAGE if limit is None else limit
    page, version, next_page = await memory.list_page(rt, principal, bot_id, tags, limit, params.get("after"))
    return JSONResponse({"entries": [e.json() for e in page], "version": version, "next": next_page})


async def search_memory(request: Request) -> JSONResponse:
    """``GET /v1/bots/{botId}/memory/search?q=…&limit=…`` — the visible active entries most
    relevant to ``q``, best first, each with its score (design §10)."""
    principal = await principal_of(request)
    hits = await search.person_search(
        runtime_of(request),
        request.state.embedder,
        principal,
        request.path_params["bot_id"],
        request.query_params.get("q", ""),
        int_param(request, "limit", 10),
    )
    return JSONResponse({"results": [{"score": h.score, "entry": h.entry.json()} for h in hits]})


async def chat_memory_context(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/memory/context?limit=&q=`` — server callers (D9.26): the visible
    memory of the chat's readers as text, chosen by relevance to ``q`` when given, and the ids."""
    found = await chatmemory.context(
        runtime_of(request),
        request.state.embedder,
        await principal_of(request),
        request.path_params["chat_id"],
        int_param(request, "limit", 4000),
        request.query_params.get("q"),
    )
    return JSONResponse({"text": found.text, "ids": list(found.ids)})


async def chat_memory_has_entries(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/memory/has-entries`` — server callers (D9.26)."""
    found = await chatmemory.has_entries(
        runtime_of(request), await principal_of(request), request.path_params["chat_id"]
    )
    return JSONResponse({"hasEntries": found})


async def chat_memory_validate(request: Request) -> JSONResponse:
    """``POST /v1/chats/{chatId}/memory/validate-references`` ``{"ids": [...]}`` — server callers
    (D9.26): whether an answer that used these entries may still be shown (N4)."""
    principal = await principal_of(request)
    ids = string_list(await json_body(request), "ids")
    valid = await chatmemory.validate_references(
        runtime_of(request), principal, request.path_params["chat_id"], ids
    )
    return JSONResponse({"valid": valid})


async def chat_memory_search(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/memory/search?q=&limit=`` — server callers (D9.26): search for
    every reader of an answer in the chat."""
    hits = await chatmemory.chat_search(
        runtime_of(request),
        request.state.embedder,
        await principal_of(request),
        request.path_params["chat_id"],
        request.query_params.get("q", ""),
        int_param(request, "limit", 10),
    )
    return JSONResponse({"results": [{"score": h.score, "entry": h.entry.json()} for h in hits]})


async def post_memory(request: Request) -> JSONResponse:
    """``POST /v1/bots/{botId}/memory`` with a ``Remember`` or ``Forget`` command (D9.19)."""
    principal = await principal_of(request)
    body = await json_body(request)
    command = body.get("command")
    if not isinstance(command, dict):
        raise BadInput('expected {"command": {"_tag": ...}}', field="command")
    command = cast(dict[str, Any], command)
    bot_id = request.path_params["bot_id"]
    rt = runtime_of(request)
    match command.get("_tag"):
        case "Remember":
            content = string_field(command, "content")
            assert content is not None
            entry, version = await commands.remember(
                rt, principal, bot_id, content, string_list(command, "tags"), request.state.embedder
            )
            return JSONResponse({"entry": entry.json(), "version": version}, status_code=201)
        case "Forget":
            entry_id = string_field(command, "id")
            assert entry_id is not None
            return JSONResponse({"version": await commands.forget(rt, principal, bot_id, entry_id)})
        case _:
            raise BadInput("command._tag is Remember or Forget", field="command._tag")


async def get_log(request: Request) -> JSONResponse:
    """``GET /v1/bots/{botId}/memory/log`` — changes of entries you may see (D9.19), newest
    first; ``?limit=`` (1–1000, default 1000) and ``?before=<version>`` page back through it,
    ``next`` is the ``before`` of the next page (null after the last)."""
    params = request.query_params
    limit = whole_number(params, "limit")
    changes, version, next_page = await memory.change_log(
        runtime_of(request),
        await principal_of(request),
        request.path_params["bot_id"],
        memory.MAX_PAGE if limit is None else limit,
        whole_number(params, "before"),
    )
    rows = [
        {"version": c.version, "at": c.at, "actor": c.actor, "ids": list(c.ids), "removed": list(c.removed)}
        for c in changes
    ]
    return JSONResponse({"changes": rows, "version": version, "next": next_page})


def whole_number(params: QueryParams, name: str) -> int | None:
    """A query parameter that must be a whole number when given."""
    raw = params.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise BadInput(f"{name} must be a whole number", field=name)
    return int(raw)


async def post_purge(request: Request) -> JSONResponse:
    """``POST /v1/bots/{botId}/memory/purge`` with ``{"tag": "chat:…"}`` → ``{"removed": n}``."""
    principal = await principal_of(request)
    tag = string_field(await json_body(request), "tag")
    assert tag is not None
    removed = await commands.purge(runtime_of(request), principal, request.path_params["bot_id"], tag)
    return JSONResponse({"removed": removed})


async def get_memory_bot(request: Request) -> JSONResponse:
    """``GET /v1/bots/{botId}/memory/bot`` — the memory Bot's settings (C3, D9.13)."""
    principal = await principal_of(request)
    found = await memorybot.get_settings(runtime_of(request), principal, request.path_params["bot_id"])
    return JSONResponse(found.json())


async def patch_memory_bot(request: Request) -> JSONResponse:
    """``PATCH /v1/bots/{botId}/memory/bot`` with ``expected`` (409 when the settings moved)."""
    principal = await principal_of(request)
    patch = memorybot.SettingsPatch.of_body(await json_body(request))
    updated = await memorybot.update_settings(
        runtime_of(request), principal, request.path_params["bot_id"], patch
    )
    return JSONResponse(updated.json())


async def get_confessions(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/confessions`` — the Chat owner's view (D9.6)."""
    principal = await principal_of(request)
    found = await memorybot.confessions(
        runtime_of(request),
        principal,
        request.path_params["chat_id"],
        limit=int_param(request, "limit", 50),
        skip=int_param(request, "skip", 0),
    )
    return JSONResponse({"confessions": [c.json() for c in found]})


async def get_context(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/context`` — the context pack for the chat's audience (D9.17)."""
    principal = await principal_of(request)
    pack = await conversation.context_pack(
        runtime_of(request), principal, request.path_params["chat_id"], request.state.embedder
    )
    return JSONResponse(pack.json(item_json))


async def get_enrichments(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/enrichments`` — the Chat owner's view, re-validated (D9.6)."""
    principal = await principal_of(request)
    found = await enrichments.enrichments(
        runtime_of(request),
        principal,
        request.path_params["chat_id"],
        limit=int_param(request, "limit", 50),
        skip=int_param(request, "skip", 0),
    )
    return JSONResponse({"enrichments": [e.json() for e in found]})


async def get_learning(request: Request) -> JSONResponse:
    """``GET /v1/chats/{chatId}/learning`` — the Chat owner's learning executions (D9.21)."""
    principal = await principal_of(request)
    found = await learninglog.executions(
        runtime_of(request),
        principal,
        request.path_params["chat_id"],
        limit=int_param(request, "limit", 50),
        skip=int_param(request, "skip", 0),
    )
    return JSONResponse({"executions": [x.json() for x in found]})


routes = [
    Route("/chats/{chat_id}/messages", chat_messages, methods=["GET"]),
    Route("/bots/{bot_id}/memory", get_memory, methods=["GET"]),
    Route("/bots/{bot_id}/memory", post_memory, methods=["POST"]),
    Route("/bots/{bot_id}/memory/search", search_memory, methods=["GET"]),
    Route("/bots/{bot_id}/memory/log", get_log, methods=["GET"]),
    Route("/bots/{bot_id}/memory/purge", post_purge, methods=["POST"]),
    Route("/bots/{bot_id}/memory/bot", get_memory_bot, methods=["GET"]),
    Route("/bots/{bot_id}/memory/bot", patch_memory_bot, methods=["PATCH"]),
    Route("/chats/{chat_id}/confessions", get_confessions, methods=["GET"]),
    Route("/chats/{chat_id}/enrichments", get_enrichments, methods=["GET"]),
    Route("/chats/{chat_id}/learning", get_learning, methods=["GET"]),
    Route("/chats/{chat_id}/context", get_context, methods=["GET"]),
    Route("/chats/{chat_id}/memory/context", chat_memory_context, methods=["GET"]),
    Route("/chats/{chat_id}/memory/has-entries", chat_memory_has_entries, methods=["GET"]),
    Route("/chats/{chat_id}/memory/validate-references", chat_memory_validate, methods=["POST"]),
    Route("/chats/{chat_id}/memory/search", chat_memory_search, methods=["GET"]),
]
