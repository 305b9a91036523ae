"""The built-in runner (sendMessage) and turnEvents: a whole Turn with the Bot's chat model, the
confide tool, the reply streamed, learning from that Turn (L1, L2, N1, D9.16)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from learning.gateway import FIXED_CALM_ANSWER
from learning.runner import (
    EARLIER_INTRO,
    MAX_CONFIDES,
    MAX_UNANSWERED_SAVED,
    SUMMARY_INTRO,
    UNAVAILABLE_REPLY,
)
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, World, bearer
from tests.conftest import ApiProcess
from tests.feed_helpers import opened, subscribed, ws_url
from tests.learning_helpers import (
    add_items,
    fact_call,
    learn,
    long_turn,
    memory_world,
    wait_executions,
    wait_summary,
)
from tests.memory_helpers import fact, said, visible
from tests.model_server import ModelServer, Reply, ToolCall
from tests.proxies import CuttableProxy

SEND = (
    "mutation($c: ID!, $t: String!) { sendMessage(chatId: $c, text: $t) { id reply enrichedInput status } }"
)
EVENTS = "subscription($c: ID!) { turnEvents(chatId: $c) { turnId kind text itemId itemKind } }"
MEMORY_WORDS = ("memory", "memories", "remember", "entry", "entries")


pytestmark = pytest.mark.usefixtures("learning_worker")


async def runner_world(
    api: Api, names: tuple[str, ...] = ("ann", "bob"), channel: tuple[str, ...] = ()
) -> World:
    w = await memory_world(api, names, channel=channel)
    data = await api.admin(
        'mutation($o: ID!) { createBot(organizationId: $o, name: "Ada", model: "chat-model") { id } }',
        {"o": w.org},
    )
    w.bot = data["createBot"]["id"]
    for person in w.people.values():
        await api.grant(w.bot, person)
    return w


def turn_events(api: Api, token: str, chat: str) -> Any:
    """``turnEvents(chatId: chat)``, registered by the server."""
    return subscribed(api, token, EVENTS, {"c": chat}, "turnEvents")


async def events_until_completed(ws: ClientConnection) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert message["type"] == "next", message
        event = message["payload"]["data"]["turnEvents"]
        out.append(event)
        if event["kind"] == "TURN_COMPLETED":
            return out


async def test_runner_turn_with_confide_then_learning(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    trains = await fact(
        runtime, w.bot, "Ann prefers trains", await said(api, w.tokens["ann"], chat, "trains please")
    )
    model_server.reset()
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[
                ToolCall(
                    "rewrite_input",
                    {"text": "Plan my trip to Lyon (I prefer trains).", "used_entry_ids": [trains]},
                )
            ]
        ),
    )
    model_server.script(
        "chat",
        Reply(tool_calls=[ToolCall("confide", {"text": "I am unsure I booked the right date."})]),
        Reply(text="Here is your train plan to Lyon."),
    )
    model_server.script("confide", Reply(text="That is fine. Check the date and tell Ann plainly."))
    model_server.script("learn", learn(fact_call("Ann is travelling to Lyon", "i-2", topics=("travel",))))
    async with turn_events(api, w.tokens["ann"], chat) as ws:
        data = await api.gql(SEND, {"c": chat, "t": "Plan my trip to Lyon."}, w.tokens["ann"])
        events = await events_until_completed(ws)
    turn = data["sendMessage"]
    assert turn["reply"] == "Here is your train plan to Lyon." and turn["status"] == "completed"
    assert turn["enrichedInput"] is None  # only startTurn's caller gets it (D9.16)
    # The Bot saw the rewritten input, its history, and a confide tool without memory words.
    first, second = model_server.requests_for("chat")
    assert first.body["model"] == "chat-model"
    assert first.body["messages"][-1] == {
        "role": "user",
        "content": "Plan my trip to Lyon (I prefer trains).",
    }
    assert {"role": "user", "content": "trains please"} in first.body["messages"]
    # No summary yet: the system message is the Bot's own alone.
    assert SUMMARY_INTRO not in first.body["messages"][0]["content"]
    [tool] = first.body["tools"]
    assert tool["function"]["name"] == "confide"
    assert not any(word in json.dumps(first.body).lower() for word in MEMORY_WORDS)
    # Seed 000: the Bot knows it "only as a place to say how its work goes: when it is stuck,
    # unsure, upset or proud, or when it made a mistake".
    described = tool["function"]["description"]
    assert described.startswith("A place to say how your work goes")
    assert all(word in described for word in ("stuck", "unsure", "upset", "proud", "made a mistake"))
    # The memory Bot "listens and does not judge. It says that a mistake is part of the work. It
    # asks the Bot to tell the person plainly and to fix what it can. It gives no new tasks."
    [confided] = model_server.requests_for("confide")
    listener = confided.body["messages"][0]["content"]
    for said_ in (
        "Listen and do not judge",
        "a mistake is part of the work",
        "tell the person plainly",
        "fix what it can",
        "Give it no new tasks",
    ):
        assert said_ in listener, said_
    # The rewrite "must keep all that the person says and asks".
    [rewrite] = model_server.requests_for("rewrite")
    assert "keeping everything the person says and asks" in rewrite.body["messages"][0]["content"]
    assert second.body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": second.body["messages"][-2]["tool_calls"][0]["id"],
        "content": "That is fine. Check the date and tell Ann plainly.",
    }
    assert first.body["stream"] is True and first.body["stream_options"] == {"include_usage": True}
    # Items: the person's own words, the tool call (name only), the reply.
    data = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { id kind text } } }", {"c": chat}, w.tokens["ann"]
    )
    assert [(m["kind"], m["text"]) for m in data["chat"]["messages"][-3:]] == [
        ("PERSON_MESSAGE", "Plan my trip to Lyon."),
        ("TOOL_CALL", "confide"),
        ("BOT_MESSAGE", "Here is your train plan to Lyon."),
    ]
    # The stream: the person's words, the reply in pieces, the saved reply, the end; never the rewrite.
    kinds = [e["kind"] for e in events]
    assert (
        kinds[0] == "ITEM_ADDED"
        and events[0]["text"] == "Plan my trip to Lyon."
        and kinds[-1] == "TURN_COMPLETED"
    )
    assert (
        "".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA") == "Here is your train plan to Lyon."
    )
    assert ("BOT_MESSAGE", "Here is your train plan to Lyon.") in [(e["itemKind"], e["text"]) for e in events]
    assert "I prefer trains" not in json.dumps(events)
    # Completing the Turn started learning from it (L2).
    await wait_executions(runtime, turn["id"])
    learned = await visible(api, w.tokens["ann"], w.bot)
    assert "Ann is travelling to Lyon" in [e["content"] for e in learned.values()]


async def test_a_long_chats_summary_reaches_the_bot(api: Api, model_server: ModelServer) -> None:
    """Seed 004: the context pack is "used by chatbot inference". Past the summary threshold the
    Bot sees the Chat's rolling summary (history, D9.17) before the last messages it is given."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.default("summary", Reply(text="Ann sent two long letters about Lyon."))
    await long_turn(api, w.tokens["ann"], chat, "A")
    await long_turn(api, w.tokens["ann"], chat, "B")
    assert await wait_summary(api, w.tokens["ann"], chat) == "Ann sent two long letters about Lyon."
    model_server.script("chat", Reply(text="Lyon it is."))
    data = await api.gql(SEND, {"c": chat, "t": "So where am I going?"}, w.tokens["ann"])
    assert data["sendMessage"]["reply"] == "Lyon it is."
    [request] = model_server.requests_for("chat")
    messages = request.body["messages"]
    assert messages[0]["role"] == "system" and [m["role"] for m in messages].count("system") == 1
    assert messages[0]["content"].endswith(f"\n\n{SUMMARY_INTRO}\nAnn sent two long letters about Lyon.")
    assert messages[-1] == {"role": "user", "content": "So where am I going?"}
    # The last messages still follow, oldest first.
    assert [m["content"][:2] for m in messages[1:-1]] == ["A ", "B "]


async def test_the_bot_sees_the_chats_last_messages_oldest_first(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The runner gives the Bot the Chat's last ``runner_history_items`` messages before the Turn,
    oldest first, then the person's new words: with 24 before it, the last 20 (m5…m24). The four
    before them reach it through the meta, in its system message (they were lost until the Chat
    was long enough to be summarised)."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "m1")
    kinds = ("BOT_MESSAGE", "PERSON_MESSAGE")
    await add_items(api, ann, turn["id"], *((kinds[n % 2], f"m{n}") for n in range(2, 25)))
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, ann)
    model_server.script("chat", Reply(text="Noted."))
    data = await api.gql(SEND, {"c": chat, "t": "And now?"}, ann)
    assert data["sendMessage"]["reply"] == "Noted."
    [request] = model_server.requests_for("chat")
    shown = [m["content"] for m in request.body["messages"][1:]]
    assert runtime.settings.runner_history_items == 20
    assert shown == [f"m{n}" for n in range(5, 25)] + ["And now?"]
    system = request.body["messages"][0]["content"]
    assert system.endswith(f"\n\n{EARLIER_INTRO}\nperson: m1\nyou: m2\nperson: m3\nyou: m4")
    # contextPack carries the same meta: every message after the (absent) summary.
    pack = await api.gql("query($c: ID!) { contextPack(chatId: $c) { meta { key text } } }", {"c": chat}, ann)
    texts = [m["text"] for m in pack["contextPack"]["meta"]]
    assert texts[:24] == [f"m{n}" for n in range(1, 25)] and "And now?" in texts


async def test_the_bot_sees_every_message_of_a_chat_too_short_to_summarize(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.17: nothing is lost between what the summary covers and the runner's window. The meta
    the runner read held 100 messages: a Chat of 130 short ones (far below the summary threshold)
    showed its Bot none of the first 30. It reads up to 1,000 now, within the threshold's
    characters."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "m1")
    kinds = ("BOT_MESSAGE", "PERSON_MESSAGE")
    for numbers in (range(2, 66), range(66, 131)):  # at most 100 Items a call
        await add_items(api, ann, turn["id"], *((kinds[n % 2], f"m{n}") for n in numbers))
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, ann)
    model_server.script("chat", Reply(text="Noted."))
    await api.gql(SEND, {"c": chat, "t": "And now?"}, ann)
    [request] = model_server.requests_for("chat")
    system = request.body["messages"][0]["content"]
    earlier = system.split(f"\n\n{EARLIER_INTRO}\n", 1)[1].splitlines()
    assert [line.split(": ", 1)[1] for line in earlier] == [f"m{n}" for n in range(1, 111)]
    assert [m["content"] for m in request.body["messages"][1:]] == [f"m{n}" for n in range(111, 131)] + [
        "And now?"
    ]
    # contextPack's meta promises the same (none between the summary and its last ten missing):
    # it read the meta's 100 and lost the first 32 of these 132.
    query = "query($c: ID!) { contextPack(chatId: $c) { meta { key text } } }"
    pack = await api.gql(query, {"c": chat}, ann)
    texts = [m["text"] for m in pack["contextPack"]["meta"]]
    assert texts == [f"m{n}" for n in range(1, 131)] + ["And now?", "Noted."]


async def test_long_last_messages_leave_the_earlier_ones_their_room(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The earlier messages the runner shows fit the summary threshold's characters, counted from
    those before its window: counted from the newest, 20 long last messages (22,000 characters,
    which the Bot sees anyway) took all the room, and the three short ones before them reached
    the Bot nowhere."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "m1")
    kinds = ("BOT_MESSAGE", "PERSON_MESSAGE")
    long = [(kinds[n % 2], f"long {n} " + "x" * 1_100) for n in range(4, 24)]
    await add_items(api, ann, turn["id"], ("BOT_MESSAGE", "m2"), ("PERSON_MESSAGE", "m3"), *long)
    model_server.script("chat", Reply(text="Noted."))
    await api.gql(SEND, {"c": chat, "t": "And now?"}, ann)
    [request] = model_server.requests_for("chat")
    system = request.body["messages"][0]["content"]
    assert system.endswith(f"\n\n{EARLIER_INTRO}\nperson: m1\nyou: m2\nperson: m3"), system[-300:]
    assert [m["content"].split()[1] for m in request.body["messages"][1:-1]] == [str(n) for n in range(4, 24)]


async def test_a_purge_strips_the_bots_own_model_requests_that_carry_the_entries(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The Bot's own model requests (``chat``) carry the rewritten input and the confide answers,
    which draw on entries; they were saved naming no entry, so a purge of those entries left them
    whole (D9.20). They name the entries the rewrite and the answers drew on now, and a purge
    strips them like every other saved request."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    locker = await fact(
        runtime, w.bot, "Ann's locker code is 4711", await said(api, ann, source, "code 4711")
    )
    chat = await api.chat(ann, w.bot)
    rewritten = {"text": "Open my locker (code 4711).", "used_entry_ids": [locker]}
    model_server.script("rewrite", Reply(tool_calls=[ToolCall("rewrite_input", rewritten)]))
    model_server.script(
        "chat",
        Reply(tool_calls=[ToolCall("confide", {"text": "I am unsure about the locker."})]),
        Reply(text="Done."),
    )
    model_server.script("confide", Reply(text="Calmly: the code 4711 is the one."))
    data = await api.gql(SEND, {"c": chat, "t": "Open my locker."}, ann)
    assert data["sendMessage"]["reply"] == "Done."
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{source}"}, headers=bearer(ann)
    )
    assert purged.json() == {"removed": 1}, purged.text
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'chat'}) RETURN c.entryIds AS used, c.request IS NULL AS gone",
        b=w.bot,
    )
    assert [(r["used"], r["gone"]) for r in records] == [([locker], True), ([locker], True)]


async def test_a_reply_confides_at_most_a_few_times(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The rounds of tool calls were bounded, not the calls: every ``confide`` of an answer was
    answered in turn, each a confession, a learning execution and a memory-Bot model call
    charged to its budget (a thousand fit in a megabyte). At most MAX_CONFIDES of a reply are
    answered by the memory Bot; the others get the fixed calm answer, as when no model can answer
    (L1), and MAX_UNANSWERED_SAVED of them are saved together — the owner's confessions list what
    the Bot confided (seed 000), each confide an Item of the Turn — with one learning execution per
    answered one; a reply of a thousand calls saves no more than that."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.reset()
    total = MAX_CONFIDES + MAX_UNANSWERED_SAVED + 3
    many = [ToolCall("confide", {"text": f"Worry number {n}."}) for n in range(total)]
    model_server.script("chat", Reply(tool_calls=many), Reply(text="Here you are."))
    model_server.default("confide", Reply(text="Calmly: carry on."))
    data = await api.gql(SEND, {"c": chat, "t": "Plan my week."}, w.tokens["ann"])
    assert data["sendMessage"]["reply"] == "Here you are."
    assert len(model_server.requests_for("confide")) == MAX_CONFIDES
    answers = [
        m["content"] for m in model_server.requests_for("chat")[-1].body["messages"] if m["role"] == "tool"
    ]
    assert answers == ["Calmly: carry on."] * MAX_CONFIDES + [FIXED_CALM_ANSWER] * (total - MAX_CONFIDES)
    listed = await api.http.get(f"/v1/chats/{chat}/confessions", headers=bearer(w.tokens["ann"]))
    assert sorted((c["text"], c["answer"], c["answeredBy"]) for c in listed.json()["confessions"]) == sorted(
        [(f"Worry number {n}.", "Calmly: carry on.", "model") for n in range(MAX_CONFIDES)]
        + [
            (f"Worry number {n}.", FIXED_CALM_ANSWER, "fixed")
            for n in range(MAX_CONFIDES, MAX_CONFIDES + MAX_UNANSWERED_SAVED)
        ]
    )
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {chatId: $c}) RETURN count(x) AS n", c=chat
    )
    assert records[0]["n"] == MAX_CONFIDES
    history = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { kind text } } }", {"c": chat}, w.tokens["ann"]
    )
    assert [m["text"] for m in history["chat"]["messages"] if m["kind"] == "TOOL_CALL"] == ["confide"] * (
        MAX_CONFIDES + MAX_UNANSWERED_SAVED
    )


async def test_review_chats_get_no_confide_tool(api: Api, model_server: ModelServer) -> None:
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot, review=True)
    model_server.script("chat", Reply(text="Reviewed."))
    data = await api.gql(SEND, {"c": chat, "t": "Review this please."}, w.tokens["ann"])
    assert data["sendMessage"]["reply"] == "Reviewed."
    [request] = model_server.requests_for("chat")
    assert "tools" not in request.body


async def test_only_the_chats_people_follow_its_turns(api: Api) -> None:
    """Another's Chat is NOT_FOUND, and its stream is never registered: registered before the
    check, the process read and decrypted the Chat's Items other processes announced meanwhile,
    for a stranger (D9.4)."""
    w = await runner_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    before = await opened(api, "turnEvents")
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {w.tokens['bob']}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        await ws.send(
            json.dumps(
                {"id": "1", "type": "subscribe", "payload": {"query": EVENTS, "variables": {"c": chat}}}
            )
        )
        message = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert (
            message["type"] == "error" or message["payload"]["errors"][0]["extensions"]["code"] == "NOT_FOUND"
        )
        # An id no Chat could have is refused naming the argument (it named "id").
        await ws.send(
            json.dumps(
                {"id": "2", "type": "subscribe", "payload": {"query": EVENTS, "variables": {"c": "!"}}}
            )
        )
        message = json.loads(await asyncio.wait_for(ws.recv(), 5))
        while message.get("id") != "2":  # the first subscription's complete
            message = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert message["payload"]["errors"][0]["extensions"] == {"code": "BAD_INPUT", "field": "chatId"}
    assert await opened(api, "turnEvents") == before
    codes = await api.codes(SEND, {"c": chat, "t": "hi"}, w.tokens["bob"])
    assert codes == ["NOT_FOUND"]


async def test_turn_events_end_when_the_token_is_revoked(api: Api) -> None:
    """A stream of Turn events checks its token again on every saved Item, as it checks the
    Chat's people, and whenever a token is revoked (announced to every API process): revoked, it
    ends as unauthenticated at once, before any Turn's words could reach it."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    async with turn_events(api, issued["token"], chat) as ws:
        await api.gql(
            "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": issued["id"]}, w.tokens["ann"]
        )
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))  # no Turn has started
        assert message["type"] == "next"
        assert [e["extensions"]["code"] for e in message["payload"]["errors"]] == ["UNAUTHENTICATED"]


async def sent_with_events(
    api: Api, token: str, chat: str, text: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """sendMessage, and what a subscriber of the Chat's Turn events saw of it."""
    async with turn_events(api, token, chat) as ws:
        sent = await api.gql(SEND, {"c": chat, "t": text}, token)
        events = await events_until_completed(ws)
    return sent["sendMessage"], events


@pytest.mark.parametrize("broken", ["cut", "error"])
async def test_a_reply_broken_off_midway_is_no_answer_and_is_not_asked_again(
    api: Api, model_server: ModelServer, broken: str
) -> None:
    """A stream that stops without a finish (the connection closed) was taken as the whole reply,
    cut short; an error event in the stream escaped as INTERNAL and left the Turn open. Both are
    a failed call now: the Turn gets the reply that says the Bot cannot answer and completes, and
    the model is not asked again (a second attempt streamed its text after the first's: "Hello
    worHello world.")."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.script("chat", Reply(text="Hello world, here I am.", broken=broken))  # type: ignore[arg-type]
    turn, events = await sent_with_events(api, w.tokens["ann"], chat, "Hi?")
    assert turn["reply"] == UNAVAILABLE_REPLY
    assert len(model_server.requests_for("chat")) == 1
    deltas = "".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA")
    assert "Hello world, here I am.".startswith(deltas) and deltas != "Hello world, here I am."
    [reply] = [e for e in events if e["kind"] == "ITEM_ADDED" and e["itemKind"] == "BOT_MESSAGE"]
    assert reply["text"] == UNAVAILABLE_REPLY
    assert events[-1]["kind"] == "TURN_COMPLETED"


async def test_a_streamed_answer_past_its_limit_is_not_read_on(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A streamed answer is held to ``max_model_answer_bytes`` (1 MB) of what it keeps as it is
    read: a reply of 1.5 MB is ``too_large`` once it passes the limit, not read to its end and
    then refused; the Turn gets the reply that says the Bot cannot answer."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.script("chat", Reply(text="y" * 1_500_000))
    sent = await api.gql(SEND, {"c": chat, "t": "Write a lot."}, w.tokens["ann"])
    assert sent["sendMessage"]["reply"] == UNAVAILABLE_REPLY
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'chat'}) RETURN c.status AS status, c.attemptLog AS log",
        b=w.bot,
    )
    [(status, log)] = [(r["status"], r["log"]) for r in records]
    assert status == "too_large" and log[0].startswith("too_large:"), log


async def test_a_reply_no_message_could_hold_is_made_one(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The Bot's reply is a message like any other: a NUL or a lone surrogate in the model's text
    (a JSON escape decodes to one) made saving it fail after the Turn and the person's words were
    saved (INTERNAL or BAD_INPUT, the Turn left open), and so did a reply longer than the longest
    message. NUL is dropped, a lone surrogate becomes U+FFFD and the reply stops at the longest
    message, as streamed and as saved."""
    w = await runner_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.script("chat", Reply(text="Hi\x00 there \ud800!"))
    turn, events = await sent_with_events(api, w.tokens["ann"], chat, "Hello?")
    assert turn["reply"] == "Hi there \ufffd!"
    assert "".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA") == "Hi there \ufffd!"
    cap = runtime.settings.max_text_chars
    model_server.script("chat", Reply(text="long " * (cap // 5 + 100)))
    turn, events = await sent_with_events(api, w.tokens["ann"], chat, "And at length?")
    assert turn["reply"] == ("long " * (cap // 5 + 100))[:cap].strip()
    assert len("".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA")) == cap
    assert events[-1]["kind"] == "TURN_COMPLETED"


async def test_one_revocation_ends_every_stream_of_the_token_and_no_other(
    api: Api, model_server: ModelServer
) -> None:
    """A process checks all the Chats followed in it at once when access changes (one statement,
    ``graph.chats.CHATS_PEOPLE``): a revoked token's streams end on every Chat it follows; a
    stream of another token on the same Chat goes on (the next Turn's events reach it, after the
    check that ended the others)."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    first, second = await api.chat(ann, w.bot), await api.chat(ann, w.bot)
    issued = (await api.gql("mutation { issueToken { id token } }", token=ann))["issueToken"]
    async with (
        turn_events(api, issued["token"], first) as gone_first,
        turn_events(api, issued["token"], second) as gone_second,
        turn_events(api, ann, first) as kept,
    ):
        await api.gql("mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": issued["id"]}, ann)
        for ws in (gone_first, gone_second):
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert message["type"] == "next", message
            assert [e["extensions"]["code"] for e in message["payload"]["errors"]] == ["UNAUTHENTICATED"]
        model_server.script("chat", Reply(text="Still here."))
        sent = await api.gql(SEND, {"c": first, "t": "Are you there?"}, ann)
        events = await events_until_completed(kept)
    assert events[0]["text"] == "Are you there?"
    assert {e["turnId"] for e in events} == {sent["sendMessage"]["id"]}
    assert "".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA") == "Still here."


async def test_a_member_removed_while_the_reply_streams_gets_none_of_the_rest(
    api: Api, model_server: ModelServer
) -> None:
    """A group chat's people are its channel's current members (D9.6). Setting a channel's
    members is announced to every API process, which checks its Turn streams again at once: one
    removed while the Bot's reply streams gets none of the rest of it (before, only the next saved
    Item checked, so the rest of the reply still reached them)."""
    w = await runner_world(api, ("ann", "bob"), channel=("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    midway = threading.Event()
    reply = "Here is the first part. The second part names Lyon."
    model_server.script("chat", Reply(text=reply, midway=midway))
    async with turn_events(api, w.tokens["ann"], chat) as ann, turn_events(api, w.tokens["bob"], chat) as bob:
        send = asyncio.create_task(api.gql(SEND, {"c": chat, "t": "Where to?"}, w.tokens["ann"]))
        got: list[dict[str, Any]] = []
        while not any(e["kind"] == "REPLY_DELTA" for e in got):  # the reply has begun (then waits)
            message = json.loads(await asyncio.wait_for(bob.recv(), 10))
            assert message["type"] == "next", message
            got.append(message["payload"]["data"]["turnEvents"])
        await api.admin(
            "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
            {"c": w.channel, "m": [w.people["ann"]]},
        )
        later: list[dict[str, Any]] = []
        while True:  # bob's stream ends before the rest of the reply is streamed
            ended = json.loads(await asyncio.wait_for(bob.recv(), 10))
            assert ended["type"] == "next", ended
            if "errors" in ended["payload"]:
                break
            later.append(ended["payload"]["data"]["turnEvents"])
        assert not [e for e in later if e["kind"] == "REPLY_DELTA"]
        assert [e["extensions"]["code"] for e in ended["payload"]["errors"]] == ["FORBIDDEN"]
        midway.set()
        assert (await send)["sendMessage"]["reply"] == reply
        events = await events_until_completed(ann)
    assert "".join(e["text"] for e in events if e["kind"] == "REPLY_DELTA") == reply
    shown = "".join(e["text"] or "" for e in got + later)
    assert "Lyon" not in shown and shown.startswith("Where to?")


async def test_a_reply_made_before_a_history_deletion_is_saved_without_its_words(
    api: Api, model_server: ModelServer
) -> None:
    """D9.23: work that began before a deletion saves none of the words. The Bot's reply, made of
    the history it was given (here the person's words, repeated), was saved after the owner
    deleted the history — with its text — so the deleted words came back in the chat's messages
    (its model call, by then, kept none). It is saved without words now; the caller still got it."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    gate = threading.Event()
    model_server.reset()
    model_server.script("chat", Reply(text="You said your locker code is 4471.", hold=gate))
    sending = asyncio.create_task(api.gql(SEND, {"c": chat, "t": "my locker code is 4471"}, ann))
    try:
        await model_server.wait_for_requests("chat", 1)
        await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    finally:
        gate.set()
    turn = (await sending)["sendMessage"]
    assert turn["reply"] == "You said your locker code is 4471."  # the caller was answered
    data = await api.gql("query($c: ID!) { chat(id: $c) { messages { kind text } } }", {"c": chat}, ann)
    assert data["chat"]["messages"] == [
        {"kind": "PERSON_MESSAGE", "text": None},
        {"kind": "BOT_MESSAGE", "text": None},  # before: the reply, with the deleted words
    ]


async def test_a_purge_of_an_entry_the_rewrite_was_sent_but_did_not_name_strips_the_chat_calls(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.20: the rewrite is sent two entries and names one as used, while its text draws on the
    other too (a model need not say). The Bot's chat calls carrying the rewritten input were saved
    naming the declared entry only, so a purge of the other left its words in them. They name
    every entry the rewrite was sent now."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    pinned = await api.gql(
        'mutation($b: ID!) { remember(botId: $b, content: "Ann\'s locker is number 12") { entry { id } } }',
        {"b": w.bot},
        ann,
    )
    locker = pinned["remember"]["entry"]["id"]
    source = await api.chat(ann, w.bot)
    code = await fact(runtime, w.bot, "Ann's locker code is 4711", await said(api, ann, source, "code 4711"))
    chat = await api.chat(ann, w.bot)
    rewritten = {"text": "Open locker 12 (code 4711).", "used_entry_ids": [locker]}  # 4711 unsaid
    model_server.script("rewrite", Reply(tool_calls=[ToolCall("rewrite_input", rewritten)]))
    model_server.script("chat", Reply(text="Done."))
    data = await api.gql(SEND, {"c": chat, "t": "Open my locker."}, ann)
    assert data["sendMessage"]["reply"] == "Done."
    sent = [
        n["id"]
        for n in json.loads(model_server.requests_for("rewrite")[-1].body["messages"][1]["content"])["notes"]
    ]
    assert set(sent) == {locker, code}
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{source}"}, headers=bearer(ann)
    )
    assert purged.json() == {"removed": 1}, purged.text
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'chat'}) RETURN c.request IS NULL AS gone", b=w.bot
    )
    assert [r["gone"] for r in records] == [True]  # before: kept, "code 4711" in it


async def test_a_message_saved_before_the_store_went_away_says_so_not_try_again(
    api: Api, settings: Settings, service_env: dict[str, str], model_server: ModelServer
) -> None:
    """sendMessage whose Turn was saved and whose reply met the store gone answered UNAVAILABLE
    "try again": a client without a key sent the message again, and the Chat held it twice. It
    says the message was saved and how to get the reply (the same key), or to read the Chat."""
    proxy = CuttableProxy(settings.neo4j_bolt_port)
    await proxy.listen()
    env = {
        **service_env,
        "BOTMEMORY_NEO4J_URI": f"bolt://127.0.0.1:{proxy.port}",
        "BOTMEMORY_NEO4J_RETRY_SECONDS": "1",
        "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "60",  # the held reply is asked once
    }
    log_path = settings.data_dir / "logs" / "pytest-api-reply-cut.log"
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    cut_off = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    gate = threading.Event()
    try:
        model_server.reset()
        w = await runner_world(api, ("ann",))
        ann = w.tokens["ann"]
        chat = await api.chat(ann, w.bot)
        model_server.script("chat", Reply(text="Lisbon is lovely in May.", hold=gate))
        async with httpx.AsyncClient(base_url=cut_off.url, timeout=60) as http:
            through = Api(http, api.admin_token)
            sending = asyncio.create_task(through.raw(SEND, {"c": chat, "t": "Where in May?"}, ann))
            await model_server.wait_for_requests("chat", 1)  # the Turn and its message are saved
            await proxy.cut()
            gate.set()
            answer = await sending
        [error] = answer["errors"]
        assert error["extensions"]["code"] == "UNAVAILABLE", error
        assert "your message was saved" in error["message"] and "same idempotency key" in error["message"]
        messages = await api.gql("query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, ann)
        assert [m["text"] for m in messages["chat"]["messages"]] == ["Where in May?"]
    finally:
        gate.set()
        await asyncio.to_thread(cut_off.stop)
        await proxy.cut()
