"""REST adapters under ``/v1`` (DESIGN §5): thin wrappers over the same services as GraphQL. Each
handler reads its input with botmemory.rest_input and answers a botmemory.rest_models body; the
route table :data:`operations` also makes the OpenAPI document (botmemory.openapi)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from botmemory.openapi import COMMON_ERRORS, Operation, operation_routes
from botmemory.rest_input import (
    ContextQuery,
    Forget,
    LogQuery,
    MemoryCommand,
    MemoryQuery,
    MessageBody,
    MetaBody,
    NoQuery,
    PageQuery,
    PurgeBody,
    References,
    SearchQuery,
    read_body,
    read_query,
)
from botmemory.rest_models import (
    ChangeLog,
    ChatMetaList,
    ChatMetaOut,
    Confessions,
    ContextPackOut,
    Enrichments,
    EntryList,
    Executions,
    Forgotten,
    HasEntries,
    MemoryContext,
    MessagesPage,
    Purged,
    Remembered,
    SavedMessage,
    SearchResults,
    SettingsOut,
    Validity,
    respond,
)
from learning import messages
from services import (
    chatmemory,
    chats,
    commands,
    conversation,
    enrichments,
    idempotency,
    learninglog,
    memory,
    memorybot,
    search,
)
from services.auth import authenticate
from services.domain import Principal
from services.errors import BadInput
from services.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    return request.state.runtime


async def principal_of(request: Request) -> Principal:
    return await authenticate(runtime_of(request), request.headers.get("authorization"))


async def chat_messages(request: Request) -> Response:
    """The chat's Items in order (D9.19), ``limit`` from ``skip``."""
    principal = await principal_of(request)
    page = read_query(request, PageQuery)
    found = await chats.messages(
        runtime_of(request), principal, request.path_params["chat_id"], limit=page.limit, skip=page.skip
    )
    return respond(MessagesPage.model_validate({"messages": found.items, "total": found.total}))


async def post_message(request: Request) -> Response:
    """Save a message in the chat (seed 004's ``POST /conversations/messages``, over Turns): a user
    message starts a Turn and is rewritten for you with what helps from memory (as ``startTurn``);
    an assistant message is the Bot's reply in the Turn it answers and completes it (what the Bot
    confided on it is learned then, L2); a notice starts a Turn of its own."""
    arrived = time.monotonic()
    principal = await principal_of(request)
    body = await read_body(request, MessageBody)
    chat_id = request.path_params["chat_id"]
    if body.conversation_id not in (None, chat_id):
        raise BadInput("conversation_id names another chat than the path", field="conversation_id")
    key = idempotency.key_of(
        principal,
        request.headers.get(idempotency.HEADER),
        f"saveMessage:{body.role}",
        [chat_id, body.model_dump(mode="json")],
    )
    saved = await messages.save_message(
        runtime_of(request),
        request.state.gateway,
        principal,
        chat_id,
        body.message,
        role=body.role,
        actor_id=body.actor_id,
        turn_id=body.turn_id,
        complete=body.complete,
        said_at=body.said_at,
        time_zone=body.time_zone,
        arrived=arrived,
        key=key,
    )
    turn: dict[str, object] = {"id": saved.turn_id, "status": saved.turn_status}
    if saved.enriched_input is not None:
        turn["enrichedInput"] = saved.enriched_input
    return respond(SavedMessage.model_validate({"message": saved.item, "turn": turn}), 201)


async def get_memory(request: Request) -> Response:
    """The entries for you, in your organization (seed), with all of ``tags``.
    With ``limit`` (1–1000) or ``after``: one page in memory order and ``next``, the cursor of the
    page after it (null after the last)."""
    rt, principal, bot_id = runtime_of(request), await principal_of(request), request.path_params["bot_id"]
    query = read_query(request, MemoryQuery)
    if not query.paged:
        found, version = await memory.list_entries(rt, principal, bot_id, query.tag_list)
        return respond(EntryList.model_validate({"entries": found, "version": version}))
    limit = memory.MAX_PAGE if query.limit is None else query.limit
    page, version, next_page = await memory.list_page(
        rt, principal, bot_id, query.tag_list, limit, query.after
    )
    return respond(EntryList.model_validate({"entries": page, "version": version, "next": next_page}))


async def search_memory(request: Request) -> Response:
    """The visible active entries most relevant to ``q``, best first, each with its score (design §10)."""
    principal = await principal_of(request)
    query = read_query(request, SearchQuery)
    hits = await search.person_search(
        runtime_of(request),
        request.state.embedder,
        principal,
        request.path_params["bot_id"],
        query.q,
        query.limit,
    )
    return respond(SearchResults.model_validate({"results": hits}))


async def chat_memory_context(request: Request) -> Response:
    """Server callers (D9.26): the visible memory of the chat's readers as text and the ids.
    Chosen by relevance to ``q`` when given, else in memory order."""
    principal = await principal_of(request)
    query = read_query(request, ContextQuery)
    found = await chatmemory.context(
        runtime_of(request),
        request.state.embedder,
        principal,
        request.path_params["chat_id"],
        query.limit,
        query.q,
    )
    return respond(MemoryContext.model_validate(found))


async def chat_memory_has_entries(request: Request) -> Response:
    """Server callers (D9.26): whether any active entry is visible to the chat's readers."""
    principal = await principal_of(request)
    read_query(request, NoQuery)
    found = await chatmemory.has_entries(runtime_of(request), principal, request.path_params["chat_id"])
    return respond(HasEntries(has_entries=found))


async def chat_memory_validate(request: Request) -> Response:
    """Server callers (D9.26): whether an answer that used these entries may still be shown (N4)."""
    principal = await principal_of(request)
    body = await read_body(request, References)
    valid = await chatmemory.validate_references(
        runtime_of(request), principal, request.path_params["chat_id"], body.ids
    )
    return respond(Validity(valid=valid))


async def chat_memory_search(request: Request) -> Response:
    """Server callers (D9.26): search for every reader of an answer in the chat."""
    principal = await principal_of(request)
    query = read_query(request, SearchQuery)
    hits = await chatmemory.chat_search(
        runtime_of(request),
        request.state.embedder,
        principal,
        request.path_params["chat_id"],
        query.q,
        query.limit,
    )
    return respond(SearchResults.model_validate({"results": hits}))


async def post_memory(request: Request) -> Response:
    """A ``Remember`` (201) or ``Forget`` (200) command (D9.19).
    Forget takes back your part; an id that is not for you is a 409 (D9.4)."""
    principal = await principal_of(request)
    command = (await read_body(request, MemoryCommand)).command
    rt, bot_id = runtime_of(request), request.path_params["bot_id"]
    sent = request.headers.get(idempotency.HEADER)
    if isinstance(command, Forget):
        key = commands.forget_key(principal, sent, bot_id, command.id)
        return respond(Forgotten(version=await commands.forget(rt, principal, bot_id, command.id, key)))
    tags = list(command.tags)
    key = commands.remember_key(principal, sent, bot_id, command.content, tags)
    entry, version = await commands.remember(
        rt, principal, bot_id, command.content, tags, request.state.embedder, key
    )
    return respond(Remembered.model_validate({"entry": entry, "version": version}), status=201)


async def get_log(request: Request) -> Response:
    """Changes of entries you may see (D9.19), newest first.
    ``limit`` (1–1000, default 1000) and ``before`` page back through it; ``next`` is the
    ``before`` of the next page (null after the last)."""
    principal = await principal_of(request)
    query = read_query(request, LogQuery)
    changes, version, next_page = await memory.change_log(
        runtime_of(request),
        principal,
        request.path_params["bot_id"],
        memory.MAX_PAGE if query.limit is None else query.limit,
        query.before,
    )
    return respond(ChangeLog.model_validate({"changes": changes, "version": version, "next": next_page}))


async def post_purge(request: Request) -> Response:
    """Remove every entry with a ``from:``, ``chat:``, ``org:`` or ``channel:`` tag (D9.20)."""
    principal = await principal_of(request)
    body = await read_body(request, PurgeBody)
    removed = await commands.purge(runtime_of(request), principal, request.path_params["bot_id"], body.tag)
    return respond(Purged(removed=removed))


async def get_memory_bot(request: Request) -> Response:
    """The memory Bot's settings and what its budget period has cost (C3, D9.13)."""
    principal = await principal_of(request)
    read_query(request, NoQuery)
    found = await memorybot.get_settings(runtime_of(request), principal, request.path_params["bot_id"])
    return respond(SettingsOut.of(found))


async def patch_memory_bot(request: Request) -> Response:
    """Change the memory Bot's settings (C3, D9.13); 409 when they moved since ``expected``.
    A field left out stays as it is; a null one removes the limit or the instructions."""
    principal = await principal_of(request)
    patch = await read_body(request, memorybot.SettingsPatch)
    updated = await memorybot.update_settings(
        runtime_of(request), principal, request.path_params["bot_id"], patch
    )
    return respond(SettingsOut.of(updated))


async def get_confessions(request: Request) -> Response:
    """The Chat owner's view of the confessions in the chat (D9.6)."""
    principal = await principal_of(request)
    page = read_query(request, PageQuery)
    found, total = await memorybot.confessions(
        runtime_of(request), principal, request.path_params["chat_id"], limit=page.limit, skip=page.skip
    )
    return respond(Confessions.model_validate({"confessions": found, "total": total}))


async def get_context(request: Request) -> Response:
    """The context pack for the chat's audience: summary, preferences, last messages, memory (D9.17)."""
    principal = await principal_of(request)
    read_query(request, NoQuery)
    pack = await conversation.context_pack(
        runtime_of(request), principal, request.path_params["chat_id"], request.state.embedder
    )
    return respond(ContextPackOut.model_validate(pack))


async def list_meta(request: Request) -> Response:
    """The conversation meta of your Chats (seed 004, D9.30), ``limit`` from ``skip``.
    Chats without any (no summary and no message yet) are left out; ``total`` counts the others."""
    principal = await principal_of(request)
    page = read_query(request, PageQuery)
    found, total = await conversation.chat_metas(
        runtime_of(request), principal, limit=page.limit, skip=page.skip
    )
    return respond(ChatMetaList.model_validate({"data": found, "total": total}))


async def get_meta(request: Request) -> Response:
    """A Chat's conversation meta (seed 004, D9.30), for its people; 404 when it has none yet."""
    principal = await principal_of(request)
    read_query(request, NoQuery)
    found = await conversation.chat_meta(runtime_of(request), principal, request.path_params["chat_id"])
    return respond(ChatMetaOut.model_validate(found))


async def post_meta(request: Request) -> Response:
    """Set the meta of a Chat that has none yet (seed 004, D9.30): its owner only; 409 when it has.
    The map becomes the Chat's summary: what ``contextPack``, the Bot and the next compression read."""
    return await _set_meta(request, create=True)


async def put_meta(request: Request) -> Response:
    """Replace a Chat's meta (seed 004, D9.30): its owner only; 404 when it has none yet. The map
    becomes the Chat's summary and covers every message so far."""
    return await _set_meta(request, create=False)


async def _set_meta(request: Request, *, create: bool) -> Response:
    principal = await principal_of(request)
    body = await read_body(request, MetaBody)
    found = await conversation.set_chat_meta(
        runtime_of(request),
        principal,
        request.path_params["chat_id"],
        body.summary,
        create=create,
        expected=body.expected,
    )
    return respond(ChatMetaOut.model_validate(found), 201 if create else 200)


async def get_enrichments(request: Request) -> Response:
    """The Chat owner's view of the rewritten inputs, re-validated (D9.6)."""
    principal = await principal_of(request)
    page = read_query(request, PageQuery)
    found, total = await enrichments.enrichments(
        runtime_of(request), principal, request.path_params["chat_id"], limit=page.limit, skip=page.skip
    )
    return respond(Enrichments.model_validate({"enrichments": found, "total": total}))


async def get_learning(request: Request) -> Response:
    """The Chat owner's view of the memory Bot's learning executions (D9.21)."""
    principal = await principal_of(request)
    page = read_query(request, PageQuery)
    found, total = await learninglog.executions(
        runtime_of(request), principal, request.path_params["chat_id"], limit=page.limit, skip=page.skip
    )
    return respond(Executions.model_validate({"executions": found, "total": total}))


#: The REST surface: each a route under ``/v1`` and an operation of the OpenAPI document.
operations = (
    Operation("GET", "/chats/{chat_id}/messages", chat_messages, {200: MessagesPage}, query=PageQuery),
    Operation(
        "POST",
        "/chats/{chat_id}/messages",
        post_message,
        {201: SavedMessage},
        body=MessageBody,
        errors=(*COMMON_ERRORS, 409),  # a reply to a completed Turn, or in a chat with none
        idempotent=True,
    ),
    Operation("GET", "/bots/{bot_id}/memory", get_memory, {200: EntryList}, query=MemoryQuery),
    Operation(
        "POST",
        "/bots/{bot_id}/memory",
        post_memory,
        {201: Remembered, 200: Forgotten},
        body=MemoryCommand,
        errors=(*COMMON_ERRORS, 409),
        idempotent=True,
    ),
    Operation("GET", "/bots/{bot_id}/memory/search", search_memory, {200: SearchResults}, query=SearchQuery),
    Operation("GET", "/bots/{bot_id}/memory/log", get_log, {200: ChangeLog}, query=LogQuery),
    Operation("POST", "/bots/{bot_id}/memory/purge", post_purge, {200: Purged}, body=PurgeBody),
    Operation("GET", "/bots/{bot_id}/memory/bot", get_memory_bot, {200: SettingsOut}),
    Operation(
        "PATCH",
        "/bots/{bot_id}/memory/bot",
        patch_memory_bot,
        {200: SettingsOut},
        body=memorybot.SettingsPatch,
        errors=(*COMMON_ERRORS, 409),
    ),
    Operation("GET", "/chats/{chat_id}/confessions", get_confessions, {200: Confessions}, query=PageQuery),
    Operation("GET", "/chats/{chat_id}/enrichments", get_enrichments, {200: Enrichments}, query=PageQuery),
    Operation("GET", "/chats/{chat_id}/learning", get_learning, {200: Executions}, query=PageQuery),
    Operation("GET", "/chats/{chat_id}/context", get_context, {200: ContextPackOut}),
    Operation("GET", "/chats/meta", list_meta, {200: ChatMetaList}, query=PageQuery),
    Operation("GET", "/chats/{chat_id}/meta", get_meta, {200: ChatMetaOut}),
    Operation(
        "POST",
        "/chats/{chat_id}/meta",
        post_meta,
        {201: ChatMetaOut},
        body=MetaBody,
        errors=(*COMMON_ERRORS, 409),
    ),
    Operation(
        "PUT",
        "/chats/{chat_id}/meta",
        put_meta,
        {200: ChatMetaOut},
        body=MetaBody,
        errors=(*COMMON_ERRORS, 409),  # a stale ``expected`` (D9.30)
    ),
    Operation(
        "GET",
        "/chats/{chat_id}/memory/context",
        chat_memory_context,
        {200: MemoryContext},
        query=ContextQuery,
    ),
    Operation("GET", "/chats/{chat_id}/memory/has-entries", chat_memory_has_entries, {200: HasEntries}),
    Operation(
        "POST",
        "/chats/{chat_id}/memory/validate-references",
        chat_memory_validate,
        {200: Validity},
        body=References,
    ),
    Operation(
        "GET", "/chats/{chat_id}/memory/search", chat_memory_search, {200: SearchResults}, query=SearchQuery
    ),
)

routes = operation_routes(operations)
