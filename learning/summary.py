"""The rolling summary of a Chat (DESIGN §6, D9.17).

The summary is part of the Chat's history (encrypted, readable by the Chat's people); the worker
compresses it when the Chat passes the threshold (~20,000 characters), through the memory Bot's
model, budget, concurrency gate and call log, and it creates no entries.
"""

from __future__ import annotations

import json
import time

from neo4j import AsyncManagedTransaction

from graph import conversation as conversation_q
from graph import memorybot as memorybot_q
from graph.driver import read, write
from graph.memorybot import RouteChat
from learning.gateway import Call, Completion, Gateway, ModelUnavailable, StepKey, request_hash
from learning.prompts import system_prompt
from learning.protocol import within_chars
from services.conversation import summary_map, summary_text
from services.crypto import Kind
from services.errors import NotFound
from services.memorybot import Route, load_route
from services.runtime import Runtime, now_ms

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


async def summarize(rt: Runtime, gateway: Gateway, chat_id: str) -> str:
    """Compress the Chat's history when it is due (the worker's job); returns what happened."""

    async def load(tx: AsyncManagedTransaction) -> tuple[RouteChat, Route]:
        return await load_route(rt, tx, chat_id)

    try:
        _, route = await read(rt.driver, load)
    except NotFound:
        return "gone"
    if route.model is None:
        return "no_model"
    after, chars = await read(rt.driver, lambda tx: conversation_q.unsummarized(tx, chat_id=chat_id))
    if chars <= rt.settings.summary_threshold_chars:
        return "not_due"
    previous = await read(rt.driver, lambda tx: conversation_q.summary(tx, chat_id=chat_id))
    found = await read(
        rt.driver, lambda tx: conversation_q.items_after(tx, chat_id=chat_id, after=after, limit=_MAX_ITEMS)
    )
    # Within the characters a request may carry: a long import sent 500 Items of up to 20,000
    # characters at once, past any model's context, and the summary never moved on.
    items = within_chars(found, rt.settings.max_evidence_chars)
    if not items:
        return "not_due"
    cipher = route.cipher
    lines = [
        {"speaker": _SPEAKER[i["kind"]], "text": cipher.decrypt(Kind.ITEM, i["uid"], i["text"])}
        for i in items
        if i["text"] is not None and i["kind"] in _SPEAKER
    ]
    # The summary so far as text: the worker's own, or the map the Chat's owner set (D9.30).
    old = summary_text(summary_map(cipher, chat_id, previous))
    body = {
        "messages": [
            {"role": "system", "content": system_prompt(SUMMARY_SYSTEM, route)},
            {"role": "user", "content": json.dumps({"summary": old, "messages": lines}, ensure_ascii=False)},
        ]
    }
    digest = request_hash(cipher, {"model": route.model, **body})
    saved = await read(
        rt.driver, lambda tx: memorybot_q.saved_summary_result(tx, chat_id=chat_id, request_hash=digest)
    )
    completion = None
    if saved is not None:  # asked and saved, its summary not (the worker killed between): C5
        completion = Completion.from_json(
            saved["id"], cipher.decrypt(Kind.MODEL_RESULT, saved["id"], saved["result"])
        )
        if not (completion.text or "").strip():
            completion = None  # an empty answer is asked again, as before
    if completion is None:
        if await gateway.budget_spent(rt, route):
            return "budget_spent"  # the next completed Turn asks again
        deadline = time.monotonic() + rt.settings.step_deadline_seconds
        try:
            # In the background, as learning: without Redis it goes on ungated rather than fail.
            call = Call("summary", body, deadline, step=StepKey(digest))
            completion = await gateway.complete(rt, route, call, gate=True, ungated_without_redis=True)
        except ModelUnavailable as exc:
            return "budget_spent" if exc.code == "budget_spent" else "model:" + exc.code
    text = (completion.text or "").strip()
    if not text:
        return "empty"
    text = text[: rt.settings.summary_threshold_chars // 2]
    saved = await write(
        rt.driver,
        lambda tx: conversation_q.save_summary(
            tx,
            chatId=chat_id,
            botId=route.bot_id,
            after=after,
            through=items[-1]["seq"],
            text=cipher.encrypt(Kind.CHAT_SUMMARY, chat_id, text),
            chars=len(text),
            now=now_ms(),
            historyEpoch=route.history_epoch,
        ),
    )
    return "saved" if saved else "superseded"
