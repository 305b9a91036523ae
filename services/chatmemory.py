"""Memory for the readers of a Chat's answer, for server callers (D9.26, N5): a platform token of
the Chat's organization may ask for ``context(chatId, limit, query)`` (the visible text and the
ids of the entries used in it), ``hasEntries``, ``validateReferences`` and ``search`` — always
for every reader of an answer in that Chat (D9.15), never for the caller. A platform reads no
memory of its own (D9.5): it gets what the Chat's people may see, and nothing in a review chat
or with ``botMemory`` off (D9.16, L5).
"""

from __future__ import annotations

from typing import Final

from services import retrieval, search
from services.domain import Principal
from services.embedding import Embedder
from services.errors import BadInput, Forbidden, NotFound
from services.memory import Reader
from services.memorybot import route_and_reader
from services.runtime import Runtime
from services.validation import MAX_CONTEXT_CHARS, check_id

#: The most ids to validate (the largest context: ``services.validation.MAX_CONTEXT_CHARS``).
MAX_REFERENCES: Final = 1_000


async def audience(rt: Runtime, principal: Principal, chat_id: str) -> tuple[str, Reader | None]:
    """The Chat's Bot and every reader of an answer in it; no reader when the Chat gets no memory.
    Only a platform token of the Chat's organization may ask (others: 403; another's chat: 404)."""
    if principal.kind != "platform":
        raise Forbidden("server calls need a platform token of the chat's organization")
    check_id(chat_id, "chatId")

    assert principal.organization_id is not None
    chat, route, reader = await route_and_reader(rt, chat_id, principal.organization_id)
    if chat["review"] or not route.bot_memory:
        return route.bot_id, None
    return route.bot_id, reader


async def context(
    rt: Runtime, embedder: Embedder | None, principal: Principal, chat_id: str, limit: int, query: str | None
) -> retrieval.Context:
    """Visible text for the Chat's readers within ``limit`` characters, chosen by relevance to
    ``query`` when given (else in memory order), with the ids of the entries in it (N3, N5)."""
    if not 1 <= limit <= MAX_CONTEXT_CHARS:
        raise BadInput(f"limit is between 1 and {MAX_CONTEXT_CHARS}", field="limit")
    if query is not None and len(query) > search.MAX_QUERY_CHARS:
        raise BadInput(f"query is at most {search.MAX_QUERY_CHARS} characters", field="query")
    bot_id, reader = await audience(rt, principal, chat_id)
    if reader is None:
        return retrieval.Context("", ())
    return await search.context(rt, embedder, bot_id, reader, limit, query)


async def has_entries(rt: Runtime, principal: Principal, chat_id: str) -> bool:
    """Whether any active entry is visible to every reader of the Chat (N3)."""
    bot_id, reader = await audience(rt, principal, chat_id)
    return reader is not None and await retrieval.has_entries(rt, bot_id, reader)


async def validate_references(rt: Runtime, principal: Principal, chat_id: str, ids: list[str]) -> bool:
    """Whether a saved answer that used ``ids`` may still be shown to the Chat's readers (N4)."""
    if len(ids) > MAX_REFERENCES:
        raise BadInput(f"at most {MAX_REFERENCES} ids", field="ids")
    for entry_id in ids:
        check_id(entry_id, "ids")
    bot_id, reader = await audience(rt, principal, chat_id)
    if reader is None:
        return not ids
    return await retrieval.validate_references(rt, bot_id, reader, ids)


async def chat_search(
    rt: Runtime,
    embedder: Embedder | None,
    principal: Principal,
    chat_id: str,
    query: str,
    limit: int,
    *,
    bot_id: str | None = None,
) -> list[search.Hit]:
    """``search`` on behalf of the Chat's readers: what every one of them may see (``bot_id``,
    when given, must be the Chat's Bot)."""
    query, limit = search.check_query(query), search.check_limit(limit)
    chat_bot, reader = await audience(rt, principal, chat_id)
    if bot_id is not None and bot_id != chat_bot:
        raise NotFound("chat not found")
    bot_id = chat_bot
    if reader is None:
        return []
    return await search.search(rt, embedder, bot_id, reader, query, limit)
