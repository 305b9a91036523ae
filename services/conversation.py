"""``contextPack`` (DESIGN §6, D9.17): summary, preferences, the last messages and the visible
memory ``context`` of a Chat, built for the Chat's audience — every reader of an answer in it —
never for the caller alone, and never holding a rewritten input. Preferences are memory entries
with the topic ``preferences``."""

from __future__ import annotations

from dataclasses import dataclass

from neo4j import AsyncManagedTransaction

from graph import conversation as conversation_q
from graph import memory as memory_q
from graph.driver import read
from graph.memorybot import RouteChat
from services import chats, memory, retrieval, search
from services.crypto import Kind
from services.domain import Item, ItemKind, Principal
from services.embedding import Embedder
from services.errors import NotFound
from services.memorybot import Route, load_route
from services.runtime import Runtime
from services.validation import check_id

PREFERENCES = "preferences"


LAST_MESSAGES = 10


@dataclass(frozen=True, slots=True)
class ContextPack:
    chat_id: str
    summary: str | None
    preferences: tuple[memory.Entry, ...]
    last_messages: tuple[Item, ...]
    memory: retrieval.Context


async def context_pack(
    rt: Runtime, principal: Principal, chat_id: str, embedder: Embedder | None = None
) -> ContextPack:
    """Summary, preferences, the last 10 messages and the visible memory ``context`` (D9.17),
    chosen by relevance to the latest person message (design §10)."""
    check_id(chat_id, "chatId")
    chat = await chats.get_chat(rt, principal, chat_id)
    if chat is None:
        raise NotFound("chat not found")
    total = (await chats.messages(rt, principal, chat_id, limit=1, skip=0)).total
    last = await chats.messages(
        rt, principal, chat_id, limit=LAST_MESSAGES, skip=max(total - LAST_MESSAGES, 0)
    )

    _, route, summary = await route_and_summary(rt, chat_id)
    preferences: tuple[memory.Entry, ...] = ()
    known = retrieval.Context("", ())
    reader = await memory.chat_reader(rt, chat_id)
    # Memory for the Chat's audience; none in review chats or with botMemory off (D9.16, L5).
    if reader is not None and route.bot_memory and not chat.review:
        preferences = tuple(await _preferences(rt, route, reader))
        said = [i.text for i in last.items if i.kind is ItemKind.PERSON_MESSAGE and i.text]
        known = await search.context(
            rt,
            embedder,
            route.bot_id,
            reader,
            rt.settings.answer_context_chars,
            query=said[-1] if said else None,
        )
    return ContextPack(chat_id, summary, preferences, tuple(i for i in last.items), known)


async def route_and_summary(rt: Runtime, chat_id: str) -> tuple[RouteChat, Route, str | None]:
    """The Chat's route and its rolling summary (None before the first), decrypted after the read
    (D9.8). The summary is the Chat's history (D9.17): whoever reads the Chat's messages, or
    answers in it, may read it."""

    async def load(
        tx: AsyncManagedTransaction,
    ) -> tuple[RouteChat, Route, conversation_q.SummaryNode | None]:
        row, route = await load_route(rt, tx, chat_id)
        return row, route, await conversation_q.summary(tx, chat_id=chat_id)

    row, route, saved = await read(rt.driver, load)
    summary = None
    if saved is not None and "text" in saved:
        summary = route.cipher.decrypt(Kind.CHAT_SUMMARY, chat_id, saved["text"])
    return row, route, summary


async def _preferences(rt: Runtime, route: Route, reader: memory.Reader) -> list[memory.Entry]:
    async def work(tx: AsyncManagedTransaction) -> list[memory_q.EntryMap]:
        await memory_q.shared_lock(tx, bot_id=route.bot_id)
        return await memory_q.list_visible(
            tx, bot_id=route.bot_id, statuses=["active"], tags=[PREFERENCES], **reader.params
        )

    rows = await read(rt.driver, work)
    return [memory.decrypt_entry(route.cipher, row) for row in rows]
