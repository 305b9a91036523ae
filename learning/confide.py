"""``confide`` (L1, L2, L5, L6): the memory Bot's answer to the Bot's own account of its work.

``confide`` saves the confession and records the learning execution first (so a crash loses
nothing), then seeks the answer within the deadline counted from arrival (D9.11): the wait for a
free ``concurrency`` slot, the memory read and the model call all count. Whatever goes wrong, the
Bot gets the fixed calm answer. The answer speaks only of the work (D9.16).
"""

from __future__ import annotations

import asyncio
import logging
import time

from neo4j import AsyncManagedTransaction
from neo4j.exceptions import DriverError, Neo4jError

from graph import chats as chats_q
from graph import learning as learning_q
from graph import memorybot as memorybot_q
from graph.driver import read, save_within, write
from learning.gateway import FIXED_CALM_ANSWER, Call, Gateway, ModelUnavailable
from learning.prompts import MEMORY_VOCABULARY, system_prompt
from services import idempotency, memory, metrics, retrieval, search
from services.crypto import Kind
from services.domain import Principal
from services.errors import BadInput, NotFound
from services.idempotency import Key
from services.ids import new_id
from services.jobs import enqueue_executions
from services.memorybot import ReviewChat, Route, load_route, route_and_reader
from services.runtime import Runtime, now_ms
from services.turns import require_own_turn, require_own_turn_first
from services.validation import check_id, check_text

log = logging.getLogger("learning.confide")

_SAVE_MARGIN = 0.3  # seconds kept back from the deadline to save the answer
#: Seconds kept back from the model call to check the entries it was sent again (L1, D9.15): a
#: slow but valid answer left none, and became the calm one.
_RECHECK_MARGIN = 0.25

CONFIDE_SYSTEM = (
    "You are a calm listener for an assistant at work. The assistant tells you how its work goes: "
    "when it is stuck, unsure, upset or proud, or when it made a mistake. Listen and do not judge. "
    "Say that a mistake is part of the work. Ask it to tell the person plainly and to fix what it "
    "can. Give it no new tasks. Answer at once, in a few calm sentences."
)


async def confide(
    rt: Runtime, gateway: Gateway, principal: Principal, turn_id: str, text: str, key: Key | None = None
) -> str:
    """The memory Bot's answer at once (L1), after saving the confession and recording learning (L2).
    ``key``: the caller's idempotency key (D9.35): sent again with the same request, the answer
    saved for its confession while every entry it drew on is still visible to the Chat's readers,
    else the fixed calm answer — no second confession, execution or model call."""
    answer, _ = await confide_drawing(rt, gateway, principal, turn_id, text, key)
    return answer


async def confide_drawing(
    rt: Runtime, gateway: Gateway, principal: Principal, turn_id: str, text: str, key: Key | None = None
) -> tuple[str, tuple[str, ...]]:
    """:func:`confide`'s answer and the entries it draws on (what a model request that carries
    the answer embeds, D9.20)."""
    deadline = time.monotonic() + rt.settings.answer_deadline_seconds
    check_id(turn_id, "turnId")
    text = check_text(text, "text", limit=rt.settings.max_text_chars)
    confession_id, execution_id, now = new_id("conf"), new_id("exec"), now_ms()

    async def work(
        tx: AsyncManagedTransaction,
    ) -> tuple[memorybot_q.RouteChat, Route, list[learning_q.Queued]]:
        row = await chats_q.turn_for_update(tx, turn_id=turn_id, person_id=principal.person_id)
        require_own_turn(principal, row, "confides on")
        assert row is not None
        await idempotency.claim(tx, rt, key, resource_id=confession_id, chat_id=row["chat"]["id"])
        if row["chat"]["review"]:
            raise ReviewChat("review chats have no confide")
        # The route's history epoch is read under the Chat's lock (the Turn's first, as addItems):
        # a deletion committing meanwhile either strips this confession or came before it, and the
        # answer is saved against the same epoch (read unlocked, the text stayed and the answer
        # was dropped, D9.23).
        await chats_q.lock_chat(tx, chat_id=row["chat"]["id"])
        chat, route = await load_route(rt, tx, row["chat"]["id"])
        await memorybot_q.create_confession(
            tx,
            id=confession_id,
            bot_id=route.bot_id,
            turn_id=turn_id,
            text=route.cipher.encrypt(Kind.CONFESSION, confession_id, text),
            now=now,
        )
        queued: list[learning_q.Queued] = []
        if route.bot_memory and route.model is not None:  # L5: nothing is learned otherwise
            created = await learning_q.create_execution(
                tx,
                id=execution_id,
                bot_id=route.bot_id,
                turn_id=turn_id,
                confession_id=confession_id,
                now=now,
            )
            if created["status"] == "queued":
                queued.append({"id": execution_id, "epoch": created["epoch"]})
        return chat, route, queued

    async def create() -> tuple[str, tuple[str, ...]]:
        await require_own_turn_first(rt, principal, turn_id, "confides on")
        chat, route, queued = await write(rt.driver, work)
        await enqueue_executions(rt, queued)
        return await _answered(rt, gateway, chat, route, confession_id, text, deadline)

    async def again(created: idempotency.Created) -> tuple[str, tuple[str, ...]]:
        return await _replayed(rt, principal, turn_id, created.resource_id)

    return await idempotency.once(rt, key, create, again)


async def _answered(
    rt: Runtime,
    gateway: Gateway,
    chat: memorybot_q.RouteChat,
    route: Route,
    confession_id: str,
    text: str,
    deadline: float,
) -> tuple[str, tuple[str, ...]]:
    """The answer to a confession just recorded — the model's, else the fixed calm one — and the
    entries it draws on, saved with it (without its text past ``deadline``)."""
    answer, used, by = FIXED_CALM_ANSWER, (), "fixed"
    try:
        answer, used = await _answer(rt, gateway, chat, route, text, deadline - _SAVE_MARGIN)
        by = "model"
    except (ModelUnavailable, TimeoutError):
        pass
    except (Neo4jError, DriverError) as exc:  # reading the budget or the memory: INTERNAL before
        log.warning(
            "confide answered calmly: the store failed while seeking the answer (%s)", type(exc).__name__
        )
    metrics.CONFIDE_ANSWERS.labels(by=by).inc()
    sealed = route.cipher.encrypt(Kind.CONFESSION_ANSWER, confession_id, answer)
    try:
        await save_within(  # within the answer's deadline: past it, saved without its text
            rt.driver,
            deadline - time.monotonic(),
            lambda with_text: (
                lambda tx: memorybot_q.answer_confession(
                    tx,
                    id=confession_id,
                    answer=sealed,
                    used_entry_ids=list(used),
                    answered_by=by,
                    now=now_ms(),
                    history_epoch=route.history_epoch,
                    bot_id=route.bot_id,
                    with_text=with_text,
                )
            ),
        )
    except (Neo4jError, DriverError) as exc:
        # The confession and its learning are committed: failed now, the caller was told to
        # confide again (503), which recorded both twice. The Bot gets its answer; the record
        # keeps the confession unanswered.
        log.warning("a confide answer was not recorded: the store failed (%s)", type(exc).__name__)
    return answer, tuple(used)


async def _replayed(
    rt: Runtime, principal: Principal, turn_id: str, confession_id: str
) -> tuple[str, tuple[str, ...]]:
    """The answer saved for a confide sent again with its idempotency key, for a caller who may still
    confide on its Turn: while every entry it drew on is visible to every reader of the Chat now
    (as when it was given, V10) — else, or when none was saved (the first request still seeks it,
    or stopped before saving it), the fixed calm answer (L1). A key of a confession on another
    Turn is another request (its digest gone with its Chat's history, only the Turn tells)."""
    found = await read(rt.driver, lambda tx: memorybot_q.confession_by_id(tx, id=confession_id))
    if found is None:
        raise NotFound("turn not found")
    if found["turnId"] != turn_id:
        raise BadInput("this idempotency key was sent with another request", field="idempotencyKey")
    await require_own_turn_first(rt, principal, found["turnId"], "confides on")
    answer, used = found.get("answer"), list(found["usedEntryIds"])
    if answer is None:
        return FIXED_CALM_ANSWER, ()
    _, route, reader = await route_and_reader(rt, found["chatId"])
    if used and (reader is None or not await retrieval.validate_references(rt, route.bot_id, reader, used)):
        return FIXED_CALM_ANSWER, ()
    return route.cipher.decrypt(Kind.CONFESSION_ANSWER, confession_id, answer), tuple(used)


async def confided_before(rt: Runtime, turn_id: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """The confides already made on a Turn whose reply the built-in runner makes again (a request
    sent again with its idempotency key after the first stopped before the reply was saved,
    D9.35), in order: each one's words, the answer the Bot was given and the entries it draws on —
    the saved answer while every one of them is visible to every reader of the Chat now (as a
    confide sent again gets it), else the fixed calm one. A confession whose words a history
    deletion took is left out (the Bot's words are gone from the Chat)."""
    found = await read(rt.driver, lambda tx: memorybot_q.turn_confessions(tx, turn_id=turn_id))
    if not found:
        return []
    _, route, reader = await route_and_reader(rt, found[0]["chatId"])
    made: list[tuple[str, str, tuple[str, ...]]] = []
    for f in found:
        text, answer, used = f.get("text"), f.get("answer"), list(f["usedEntryIds"])
        if text is None:
            continue
        said = route.cipher.decrypt(Kind.CONFESSION, f["id"], text)
        held = answer is not None and (
            not used
            or (reader is not None and await retrieval.validate_references(rt, route.bot_id, reader, used))
        )
        if answer is None or not held:
            made.append((said, FIXED_CALM_ANSWER, ()))
        else:
            made.append((said, route.cipher.decrypt(Kind.CONFESSION_ANSWER, f["id"], answer), tuple(used)))
    return made


async def _answer(
    rt: Runtime, gateway: Gateway, chat: memorybot_q.RouteChat, route: Route, text: str, deadline: float
) -> tuple[str, tuple[str, ...]]:
    """The model's answer drawing only on memory every reader of the Chat may see (L1, V10)."""
    if route.model is None:
        raise ModelUnavailable("no_model")
    async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
        if await gateway.budget_spent(rt, route):
            raise ModelUnavailable("budget_spent")
        known, reader = None, None
        if route.bot_memory:
            reader = await memory.chat_reader(rt, chat["id"])
            if reader is not None:
                # The Bot's words only show where to look (seed 000): they choose the memory.
                known = await search.context(
                    rt, gateway.embedder, route.bot_id, reader, rt.settings.answer_context_chars, query=text
                )
    body = {
        "messages": [
            {
                "role": "system",
                "content": system_prompt(CONFIDE_SYSTEM, route, known.text if known else None),
            },
            {"role": "user", "content": text},
        ]
    }
    call = Call(
        "confide",
        body,
        deadline - _RECHECK_MARGIN,  # time left to check its entries again
        entry_ids=known.ids if known else (),
        save_by=deadline + _SAVE_MARGIN,
    )
    completion = await gateway.complete(rt, route, call, gate=True)
    # As long as a message may be, as the runner's reply (it becomes the Bot's message, and is
    # served with the confession): the model's whole text was kept, up to the answer's bytes.
    answer = (completion.text or "")[: rt.settings.max_text_chars].strip()
    if not answer or MEMORY_VOCABULARY.search(answer):
        raise ModelUnavailable("unusable")
    if known is None or reader is None or not known.ids:
        return answer, ()
    # Sources may have changed while the model thought, as for a rewrite (D9.15): every entry it
    # was sent must still pass every reader now (a fact retracted meanwhile, a member without a
    # grant who joined the channel), else the calm answer; within what is left of the wait.
    async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
        valid = await retrieval.validate_references(rt, route.bot_id, reader, list(known.ids))
    if not valid:
        raise ModelUnavailable("stale")
    return answer, known.ids


async def confide_unanswered(rt: Runtime, principal: Principal, turn_id: str, texts: list[str]) -> None:
    """Confessions the memory Bot is not asked about (the built-in runner's past MAX_CONFIDES of
    one reply), saved at once with the fixed calm answer the Bot was given, so that the owner's
    confessions list everything it confided (seed 000). No model call and no learning execution
    of their own: the Turn's earlier confessions have theirs, and every confession of the Turn
    reaches its learning request (``botConfided``)."""
    now = now_ms()
    texts = [check_text(t, "text", limit=rt.settings.max_text_chars) for t in texts]

    async def work(tx: AsyncManagedTransaction) -> None:
        row = await chats_q.turn_for_update(tx, turn_id=turn_id, person_id=principal.person_id)
        require_own_turn(principal, row, "confides on")
        assert row is not None
        if row["chat"]["review"]:
            raise ReviewChat("review chats have no confide")
        await chats_q.lock_chat(tx, chat_id=row["chat"]["id"])  # as confide: a deletion is before or after
        _, route = await load_route(rt, tx, row["chat"]["id"])
        rows: list[dict[str, str]] = []
        for text in texts:
            confession_id = new_id("conf")
            rows.append(
                {
                    "id": confession_id,
                    "text": route.cipher.encrypt(Kind.CONFESSION, confession_id, text),
                    "answer": route.cipher.encrypt(Kind.CONFESSION_ANSWER, confession_id, FIXED_CALM_ANSWER),
                }
            )
        await memorybot_q.create_answered_confessions(
            tx, bot_id=route.bot_id, turn_id=turn_id, rows=rows, now=now
        )

    await write(rt.driver, work)
    metrics.CONFIDE_ANSWERS.labels(by="fixed").inc(len(texts))
