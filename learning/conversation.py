"""Conversation context (DESIGN §6, D9.17): the rolling summary and ``contextPack``.

The summary is part of the Chat's history (encrypted, readable by the Chat's people); the worker
compresses it when the Chat passes the threshold (~20,000 characters), through the memory Bot's
model, budget, concurrency gate and call log, and it creates no entries. Preferences are memory
entries with the topic ``preferences``. ``contextPack`` is built for the Chat's audience — every
reader of an answer in it — never for the caller alone, and never holds a rewritten input.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import conversation as q
from graph import memory as memory_q
from graph.driver import read, write
from learning.memorybot import load_route, system_prompt
from learning.model import ModelUnavailable, Route
from services import chats, memory
from services.domain import Item, Principal
from services.errors import NotFound
from services.runtime import Runtime, now_ms
from services.validation import check_id

SUMMARY_KIND = "chat-summary"
PREFERENCES = "preferences"
LAST_MESSAGES = 10
_MAX_ITEMS = 500
_SPEAKER = {
    "PERSON_MESSAGE": "person",
    "BOT_MESSAGE": "assistant",
    "TOOL_RESULT": "app",
    "NOTICE": "notice",
}

SUMMARY_SYSTEM = (
    "You keep the running summary of a chat between people and an assistant. You get the summary so "
    "far and the messages after it. Write the new summary: what was asked, said and decided, by whom, "
    "and what is still open. Plain text, as short as it can be while keeping that."
)


async def summarize(rt: Runtime, chat_id: str) -> str:
    """Compress the Chat's history when it is due (the worker's job); returns what happened."""

    async def load(tx: AsyncManagedTransaction) -> tuple[dict[str, Any], Route]:
        return await load_route(rt, tx, chat_id)

    try:
        _, route = await read(rt.driver, load)
    except NotFound:
        return "gone"
    if route.model is None:
        return "no_model"
    after, chars = await read(rt.driver, lambda tx: q.unsummarized(tx, chat_id=chat_id))
    if chars <= rt.settings.summary_threshold_chars:
        return "not_due"
    if await rt.gateway.budget_spent(rt, route):
        return "budget_spent"  # the next completed Turn asks again
    previous = await read(rt.driver, lambda tx: q.summary(tx, chat_id=chat_id))
    items = await read(
        rt.driver, lambda tx: q.items_after(tx, chat_id=chat_id, after=after, limit=_MAX_ITEMS)
    )
    if not items:
        return "not_due"
    cipher = route.cipher
    lines = [
        {"speaker": _SPEAKER[i["kind"]], "text": cipher.decrypt(chats.ITEM_KIND, i["uid"], bytes(i["text"]))}
        for i in items
        if i["text"] is not None and i["kind"] in _SPEAKER
    ]
    old = None
    if previous is not None and previous.get("text") is not None:
        old = cipher.decrypt(SUMMARY_KIND, chat_id, bytes(previous["text"]))
    body = {
        "messages": [
            {"role": "system", "content": system_prompt(SUMMARY_SYSTEM, route)},
            {"role": "user", "content": json.dumps({"summary": old, "messages": lines}, ensure_ascii=False)},
        ]
    }
    deadline = time.monotonic() + rt.settings.step_deadline_seconds
    try:
        release = await rt.gateway.acquire(route, deadline)
        try:
            completion = await rt.gateway.complete(rt, route, task="summary", body=body, deadline=deadline)
        finally:
            release()
    except ModelUnavailable as exc:
        return "model:" + exc.code
    text = (completion.text or "").strip()
    if not text:
        return "empty"
    text = text[: rt.settings.summary_threshold_chars // 2]
    saved = await write(
        rt.driver,
        lambda tx: q.save_summary(
            tx,
            chatId=chat_id,
            botId=route.bot_id,
            after=after,
            through=items[-1]["seq"],
            text=cipher.encrypt(SUMMARY_KIND, chat_id, text),
            chars=len(text),
            now=now_ms(),
        ),
    )
    return "saved" if saved else "superseded"


@dataclass(frozen=True, slots=True)
class ContextPack:
    chat_id: str
    summary: str | None
    preferences: tuple[memory.Entry, ...]
    last_messages: tuple[Item, ...]
    memory: memory.Context

    def json(self, item_json: Any) -> dict[str, Any]:
        return {
            "chatId": self.chat_id,
            "summary": self.summary,
            "preferences": [{"id": e.id, "content": e.content} for e in self.preferences],
            "lastMessages": [item_json(i) for i in self.last_messages],
            "memory": {"text": self.memory.text, "ids": list(self.memory.ids)},
        }


async def context_pack(rt: Runtime, principal: Principal, chat_id: str) -> ContextPack:
    """Summary, preferences, the last 10 messages and the visible memory ``context`` (D9.17)."""
    check_id(chat_id, "chatId")
    chat = await chats.get_chat(rt, principal, chat_id)
    if chat is None:
        raise NotFound("chat not found")
    total = (await chats.messages(rt, principal, chat_id, limit=1, skip=0)).total
    last = await chats.messages(
        rt, principal, chat_id, limit=LAST_MESSAGES, skip=max(total - LAST_MESSAGES, 0)
    )

    async def load(tx: AsyncManagedTransaction) -> tuple[dict[str, Any], Route, dict[str, Any] | None]:
        row, route = await load_route(rt, tx, chat_id)
        return row, route, await q.summary(tx, chat_id=chat_id)

    _, route, saved = await read(rt.driver, load)
    summary = None
    if saved is not None and saved.get("text") is not None:
        summary = route.cipher.decrypt(SUMMARY_KIND, chat_id, bytes(saved["text"]))
    preferences: tuple[memory.Entry, ...] = ()
    known = memory.Context("", ())
    reader = await memory.chat_reader(rt, chat_id)
    # Memory for the Chat's audience; none in review chats or with botMemory off (D9.16, L5).
    if reader is not None and route.bot_memory and not chat.review:
        preferences = tuple(await _preferences(rt, route, reader))
        known = await memory.context(rt, route.bot_id, reader, rt.settings.answer_context_chars)
    return ContextPack(chat_id, summary, preferences, tuple(i for i in last.items), known)


async def _preferences(rt: Runtime, route: Route, reader: memory.Reader) -> list[memory.Entry]:
    async def work(tx: AsyncManagedTransaction) -> list[dict[str, Any]]:
        await memory_q.shared_lock(tx, bot_id=route.bot_id)
        return await memory_q.list_visible(
            tx, bot_id=route.bot_id, statuses=["active"], tags=[PREFERENCES], **reader.params
        )

    rows = await read(rt.driver, work)
    return [memory.decrypt_entry(route.cipher, row) for row in rows]
