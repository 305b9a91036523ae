"""The built-in Bot runner (``sendMessage``): a whole Turn with the Bot's own chat model.

The person's words open the Turn (and the memory Bot may rewrite them for the Bot, N1); the Bot
sees the Chat's history and the (rewritten) input, and — outside review chats — a ``confide``
tool described only as a place to say how its work goes (L1, D9.16: no memory vocabulary
anywhere the Bot can see). Tool calls are answered, Items saved, the reply streamed to
``turnEvents`` subscribers, and the Turn completed, which lets learning run (L2).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any, Final

from graph.memorybot import RouteChat
from learning import enrichment, toolcalls
from learning.confide import confide_drawing, confide_unanswered, confided_before
from learning.gateway import FIXED_CALM_ANSWER, Call, Gateway, ModelUnavailable
from services import chats, conversation, idempotency, metrics, turns
from services.auth import require_person
from services.conversation import History
from services.domain import ItemKind, Principal, Turn
from services.errors import BadInput, NotFound, Unavailable, unavailable
from services.idempotency import Key
from services.memorybot import Route
from services.runtime import Runtime
from services.turnfeed import TurnEvent, TurnHub
from services.turns import MAX_ITEMS_PER_CALL, NewItem
from services.validation import check_id, check_text

log = logging.getLogger("learning.runner")

MAX_TOOL_ROUNDS = 3
#: The most ``confide`` calls of one reply that the memory Bot answers (each a model call charged
#: to its budget, a confession and a learning execution); past them the Bot gets the fixed calm
#: answer, as when no model can answer (L1).
MAX_CONFIDES = 3
#: Of the confides past MAX_CONFIDES, how many of one reply are saved (with that answer, without a
#: model call or an execution of their own), so the owner's confessions list them; a reply of a
#: thousand calls saves this many, the rest only counted (``botmemory_confide_answers_total``).
MAX_UNANSWERED_SAVED = 10
UNAVAILABLE_REPLY = "Sorry, I cannot answer just now. Please try again in a moment."

CONFIDE_TOOL: Final = toolcalls.tool("confide", toolcalls.Confide)
#: What introduces the Chat's rolling summary to the Bot (before the last messages it sees).
SUMMARY_INTRO: Final = "What was said earlier in this chat, in short:"
EARLIER_INTRO: Final = "Earlier messages of this chat, oldest first:"
_SPOKEN: Final = {ItemKind.PERSON_MESSAGE: "person", ItemKind.BOT_MESSAGE: "you"}


def _system(bot_name: str) -> str:
    return (
        f"You are {bot_name}, an assistant in a chat. Answer the person's latest message helpfully "
        "and plainly."
    )


async def send_message(
    rt: Runtime,
    gateway: Gateway,
    hub: TurnHub | None,
    principal: Principal,
    chat_id: str,
    text: str,
    key: Key | None = None,
) -> Turn:
    """Run a Turn of the Bot for the person's message; returns the Turn with the reply.

    ``key``: the caller's idempotency key. Sent again with the same request, the Turn it started
    is answered again as it stands: with its reply once it has one (completed if it was not), else
    — a request that stopped before its reply was saved — the Bot is asked now. The key is held
    while the reply is made (:func:`services.idempotency.in_flight`): the same request meanwhile
    is CONFLICT."""
    arrived = time.monotonic()
    require_person(principal)
    check_id(chat_id, "chatId")
    check_text(text, "text", limit=rt.settings.max_text_chars)
    if await chats.get_chat(rt, principal, chat_id) is None:
        raise NotFound("chat not found")
    async with idempotency.in_flight(rt, key) as held:
        return await _send(rt, gateway, hub, principal, chat_id, text, arrived, held)


async def _send(
    rt: Runtime,
    gateway: Gateway,
    hub: TurnHub | None,
    principal: Principal,
    chat_id: str,
    text: str,
    arrived: float,
    key: Key | None,
) -> Turn:

    chat, memory_route, earlier = await conversation.route_and_history(rt, chat_id)
    if chat["botModel"] is None:
        raise BadInput("this Bot has no chat model; set one with createBot(model:)", field="chatId")
    # The Bot's own model: none of the memory Bot's instructions, gate or budget apply to it.
    route = replace(
        memory_route,
        model=chat["botModel"],
        instructions=None,
        concurrency=None,
        budget_period=None,
        budget_limit=None,
    )
    turn = await enrichment.start_turn(
        rt, gateway, principal, chat_id, text, actor_id=None, notice=False, arrived=arrived, key=key
    )
    try:
        return await _reply(
            rt, gateway, hub, principal, turn, text, key, chat, (route, memory_route), earlier
        )
    except Exception as exc:
        if unavailable(exc) is None:
            raise
        # The message is saved: "try again" would have a client without a key send it twice.
        raise Unavailable(
            "your message was saved; the Bot's reply may not have been (the database or the event "
            "store is unavailable): send it again with the same idempotency key to get the reply, or "
            "read the chat before sending it again"
        ) from exc


async def _reply(
    rt: Runtime,
    gateway: Gateway,
    hub: TurnHub | None,
    principal: Principal,
    turn: Turn,
    text: str,
    key: Key | None,
    chat: RouteChat,
    routes: tuple[Route, Route],
    earlier: History,
) -> Turn:
    """The Bot's reply to ``turn`` (its Turn just saved, or saved by the first of a request sent
    again), added to it, the Turn completed; ``routes``: the Bot's own model's and its memory
    Bot's."""
    chat_id, (route, memory_route) = turn.chat_id, routes
    if turn.replayed:
        if (answered := await _answered(rt, principal, turn)) is not None:
            return answered
        # Stopped before its reply was saved, or still answering: asked again only in the first case.
        await idempotency.take_over(rt, key)
    history, first, shown = await _history(rt, principal, chat_id, turn.id)
    if not turn.replayed:
        await _publish(hub, chat_id, TurnEvent(turn.id, "ITEM_ADDED", text, f"i-{first}", "PERSON_MESSAGE"))
    # A Chat's earlier history reaches the Bot as its meta (seed 004: the context pack is "used by
    # chatbot inference"; D9.17: history, readable by the Chat's people) — the rolling summary,
    # then the messages after it that come before the last ones it is given — in the one system
    # message: chat templates of several OpenAI-compatible servers accept no other.
    system = _system(chat["botName"])
    if earlier.summary is not None:
        system += f"\n\n{SUMMARY_INTRO}\n{earlier.summary}"
    before = [f"{_SPOKEN[kind]}: {said}" for kind, said in earlier.before(shown)]
    if before:
        system += f"\n\n{EARLIER_INTRO}\n" + "\n".join(before)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        *history,
        {"role": "user", "content": turn.enriched_input or text},
    ]
    # A request sent again after the first stopped before the reply was saved goes on from what the
    # Bot confided then and was answered (D9.35): asked afresh, it would confide again — a second
    # confession, learning execution and memory-Bot call for the one Turn.
    resumed = await confided_before(rt, turn.id) if turn.replayed else []
    for n, (said, answer, _) in enumerate(resumed):
        called = f"confided-{n + 1}"
        arguments = json.dumps({"text": said}, ensure_ascii=False)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": called,
                        "type": "function",
                        "function": {"name": "confide", "arguments": arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": called, "content": answer})
    tools = [] if chat["review"] else [CONFIDE_TOOL]  # review chats have no confide (L1)
    drawn = [entry for _, _, used in resumed for entry in used]
    try:
        reply = await _converse(
            rt, gateway, hub, principal, route, chat_id, turn, messages, tools, len(resumed), drawn
        )
    except Exception as exc:  # the Turn still gets its reply and completes (it stayed open)
        log.warning("the Bot's reply failed (%s); it says it cannot answer", type(exc).__name__)
        reply = UNAVAILABLE_REPLY
    # The reply is made of the history read above: a deletion since keeps none of its words (D9.23).
    [item] = await turns.add_items(
        rt,
        principal,
        turn.id,
        [NewItem(ItemKind.BOT_MESSAGE, reply)],
        made_in_epoch=memory_route.history_epoch,
    )
    await _publish(hub, chat_id, TurnEvent(turn.id, "ITEM_ADDED", item.text, item.id, "BOT_MESSAGE"))
    done = await turns.complete_turn(rt, principal, turn.id)
    await _publish(hub, chat_id, TurnEvent(turn.id, "TURN_COMPLETED"))
    return Turn(
        done.id,
        done.chat_id,
        done.seq,
        done.status,
        done.actor_kind,
        done.actor_id,
        done.created_at,
        done.completed_at,
        text,
        None,
        reply,
    )


async def _answered(rt: Runtime, principal: Principal, turn: Turn) -> Turn | None:
    """A Turn a request sent again started, with its reply (completed now if it was not), when it
    has one or was completed; None when it still waits for its reply."""
    replies = [i for i in await turns.turn_items(rt, principal, turn.id) if i.kind is ItemKind.BOT_MESSAGE]
    if not replies and turn.status != "completed":
        return None
    done = await turns.complete_turn(rt, principal, turn.id) if turn.status != "completed" else turn
    reply = replies[-1].text if replies else None
    return replace(done, input=turn.input, enriched_input=None, reply=reply, replayed=True)


async def _converse(
    rt: Runtime,
    gateway: Gateway,
    hub: TurnHub | None,
    principal: Principal,
    route: Route,
    chat_id: str,
    turn: Turn,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    confided_already: int = 0,
    drawn_already: list[str] | None = None,
) -> str:
    """Ask the Bot's model, answering its tool calls, until it replies in words: at most the
    ``max_text_chars`` of a message (the longest Item; a longer reply was refused after its Turn
    and the person's message were saved, and streamed whole meanwhile). ``confided_already``:
    the Turn's confides ``messages`` carry (counted against MAX_CONFIDES), drawing on
    ``drawn_already``."""
    cap = rt.settings.max_text_chars
    streamed = 0
    # The entries the request embeds (the rewritten input's, then the confide answers'): a purge of
    # any of them strips the saved request (D9.20; saved with none, it stayed).
    drawn: dict[str, None] = dict.fromkeys([*turn.drawn_entry_ids, *(drawn_already or [])])

    async def stream(delta: str) -> None:
        nonlocal streamed
        piece = delta[: max(0, cap - streamed)]
        streamed += len(delta)
        if piece:
            await _publish(hub, chat_id, TurnEvent(turn.id, "REPLY_DELTA", piece))

    confided, saved = min(confided_already, MAX_CONFIDES), max(0, confided_already - MAX_CONFIDES)
    for _ in range(MAX_TOOL_ROUNDS + 1):
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        try:
            call = Call(
                "chat",
                body,
                time.monotonic() + rt.settings.chat_deadline_seconds,
                stream=True,
                on_text=stream,
                charge=False,  # the Bot's own model, not the memory Bot's budget
                entry_ids=tuple(drawn),
            )
            completion = await gateway.complete(rt, route, call)
        except ModelUnavailable:
            return UNAVAILABLE_REPLY
        if not completion.tool_calls or not tools:
            return (completion.text or "")[:cap].strip() or UNAVAILABLE_REPLY
        messages.append(
            {
                "role": "assistant",
                "content": completion.text,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in completion.tool_calls
                ],
            }
        )
        unanswered: list[str] = []  # confided past MAX_CONFIDES: saved together, answered calmly
        for call in completion.tool_calls:
            if call.name == "confide" and confided >= MAX_CONFIDES:
                args = toolcalls.checked(toolcalls.Confide, call.arguments)
                text = None if args is None else args.text[:cap]
                if text is not None and saved < MAX_UNANSWERED_SAVED and _sayable(text, cap):
                    unanswered.append(text)
                    saved += 1
                else:
                    metrics.CONFIDE_ANSWERS.labels(by="fixed").inc()
                answer, used = FIXED_CALM_ANSWER, ()
            else:
                confided += call.name == "confide"
                answer, used = await _tool(
                    rt, gateway, hub, principal, chat_id, turn, call.name, call.arguments
                )
            drawn.update(dict.fromkeys(used))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
        if unanswered:
            await _confided_unanswered(rt, hub, principal, chat_id, turn, unanswered)
    return UNAVAILABLE_REPLY


def _sayable(text: str, cap: int) -> bool:
    """Whether ``text`` is what a confession may hold (as ``confide`` checks it)."""
    try:
        check_text(text, "text", limit=cap)
    except BadInput:
        return False
    return True


async def _confided_unanswered(
    rt: Runtime, hub: TurnHub | None, principal: Principal, chat_id: str, turn: Turn, texts: list[str]
) -> None:
    """Confides past MAX_CONFIDES of one reply: an Item of the Turn each (the tool's name, as
    :func:`_tool` adds), and their confessions saved with the fixed calm answer they were given."""
    for start in range(0, len(texts), MAX_ITEMS_PER_CALL):
        part = len(texts[start : start + MAX_ITEMS_PER_CALL])
        added = await turns.add_items(rt, principal, turn.id, [NewItem(ItemKind.TOOL_CALL, "confide")] * part)
        for item in added:
            await _publish(hub, chat_id, TurnEvent(turn.id, "ITEM_ADDED", "confide", item.id, "TOOL_CALL"))
    await confide_unanswered(rt, principal, turn.id, texts)


async def _tool(
    rt: Runtime,
    gateway: Gateway,
    hub: TurnHub | None,
    principal: Principal,
    chat_id: str,
    turn: Turn,
    name: str,
    arguments: str,
) -> tuple[str, tuple[str, ...]]:
    """The Bot used a tool: the call is an Item of the Turn (its name only — what it confided is
    in the owner's confessions), and the memory Bot answers; with the entries the answer draws on."""
    if name != "confide":
        return "There is no such tool.", ()
    args = toolcalls.checked(toolcalls.Confide, arguments)
    if args is None:
        return "Say in a few words how your work goes.", ()
    said = args.text
    [item] = await turns.add_items(rt, principal, turn.id, [NewItem(ItemKind.TOOL_CALL, "confide")])
    await _publish(hub, chat_id, TurnEvent(turn.id, "ITEM_ADDED", "confide", item.id, "TOOL_CALL"))
    return await confide_drawing(rt, gateway, principal, turn.id, said[: rt.settings.max_text_chars])


async def _history(
    rt: Runtime, principal: Principal, chat_id: str, turn_id: str
) -> tuple[list[dict[str, Any]], int, int]:
    """The Chat's last messages before this Turn as chat messages, the Turn's first Item number and
    the number of the oldest Item given (the earlier ones reach the Bot through the meta)."""
    limit = rt.settings.runner_history_items
    _, page = await chats.last_messages(rt, principal, chat_id, limit + 1)
    total = page.total
    first = min((i.seq for i in page.items if i.turn_id == turn_id), default=total)
    # Before this Turn only: another Turn of the Chat may have begun since (a request sent again).
    before = [i for i in page.items if i.turn_id != turn_id and i.seq < first]
    given = before[-limit:] if limit else []
    shown = min((i.seq for i in given), default=first)
    out: list[dict[str, Any]] = []
    for item in given:
        if item.text is None:
            continue
        if item.kind is ItemKind.PERSON_MESSAGE:
            out.append({"role": "user", "content": item.text})
        elif item.kind is ItemKind.BOT_MESSAGE:
            out.append({"role": "assistant", "content": item.text})
        elif item.kind is ItemKind.NOTICE:
            out.append({"role": "user", "content": f"[notice] {item.text}"})
    return out, first, shown


async def _publish(hub: TurnHub | None, chat_id: str, event: TurnEvent) -> None:
    if hub is not None:
        await hub.publish(chat_id, event)
