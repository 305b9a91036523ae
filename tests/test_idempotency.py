"""Idempotency keys (``services.idempotency``): a create sent again with the caller's same key gets
what the first one created, as it stands now, and creates nothing; the same key with another
request is BAD_INPUT; a key is its caller's; a racing second request waits for the first and
answers as it did; the record holds no words (E1), forgets its request with the Chat's history
(D9.23) and is dropped by the worker's sweep once past its time."""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

import httpx
import pytest

from learning.gateway import FIXED_CALM_ANSWER
from learning.sweeper import sweep_once
from services.commands import remember_key
from services.crypto import Kind
from services.domain import Principal
from services.idempotency import LEASE_MS
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import PATIENT_DEADLINES, ApiProcess
from tests.learning_helpers import memory_world, until_a_transaction_waits_for_a_lock
from tests.memory_helpers import command
from tests.model_server import ModelServer, Reply, ToolCall
from tests.test_rest_messages import history, post
from tests.test_runner import runner_world
from tests.waiting import until

START = (
    "mutation($c: ID!, $t: String!, $k: String) { startTurn(chatId: $c, input: $t, idempotencyKey: $k)"
    " { id input enrichedInput status } }"
)
ADD = (
    "mutation($t: ID!, $i: [ItemInput!]!, $k: String) { addItems(turnId: $t, items: $i, idempotencyKey: $k)"
    " { id kind text } }"
)
SEND = (
    "mutation($c: ID!, $t: String!, $k: String) { sendMessage(chatId: $c, text: $t, idempotencyKey: $k)"
    " { id reply status } }"
)
CHAT = "mutation($b: ID!, $k: String) { createChat(botId: $b, idempotencyKey: $k) { id } }"
REMEMBER = (
    "mutation($b: ID!, $c: String!, $k: String) { remember(botId: $b, content: $c, idempotencyKey: $k)"
    " { entry { id content } version } }"
)


async def post_keyed(api: Api, token: str, chat: str, body: dict[str, Any], key: str) -> httpx.Response:
    return await api.http.post(
        f"/v1/chats/{chat}/messages", json=body, headers={**bearer(token), "Idempotency-Key": key}
    )


async def remember_keyed(api: Api, token: str, bot: str, body: dict[str, Any], key: str) -> httpx.Response:
    return await api.http.post(
        f"/v1/bots/{bot}/memory", json=body, headers={**bearer(token), "Idempotency-Key": key}
    )


async def test_a_message_sent_again_with_its_key_is_saved_once(api: Api) -> None:
    w = await make_world(api, ("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    chat = await api.chat(ann, w.bot)
    said = {"message": "Book me a table for two.", "role": "user"}
    first = await post_keyed(api, ann, chat, said, "key-1")
    again = await post_keyed(api, ann, chat, said, "key-1")
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert again.json() == first.json()  # the same Turn and Item, nothing new
    turn = first.json()["turn"]["id"]
    assert await history(api, ann, chat) == [("i-1", "PERSON_MESSAGE", "Book me a table for two.", turn)]

    # The same key with another message is refused, and saves nothing.
    other = await post_keyed(
        api, ann, chat, {"message": "Book me a table for four.", "role": "user"}, "key-1"
    )
    assert other.status_code == 422, other.text
    assert other.json()["error"] == {
        "code": "BAD_INPUT",
        "message": "this idempotency key was sent with another request",
    }
    # The reply, sent twice with its key: the second finds no open Turn left to answer, and is
    # answered with the first's reply all the same, its Turn completed.
    reply = {"message": "Done: 8 pm.", "role": "assistant"}
    replied = await post_keyed(api, ann, chat, reply, "key-2")
    replied_again = await post_keyed(api, ann, chat, reply, "key-2")
    assert replied.status_code == replied_again.status_code == 201, replied_again.text
    assert replied_again.json() == replied.json()
    assert replied.json()["turn"] == {"id": turn, "status": "completed"}
    unkeyed = await post(api, ann, chat, reply)
    assert unkeyed.status_code == 409  # without its key, a reply needs an open Turn
    assert [row[:3] for row in await history(api, ann, chat)] == [
        ("i-1", "PERSON_MESSAGE", "Book me a table for two."),
        ("i-2", "BOT_MESSAGE", "Done: 8 pm."),
    ]

    # A key is its caller's: Bob's "key-1" is another key, in his own chat.
    bobs = await api.chat(bob, w.bot)
    his = await post_keyed(api, bob, bobs, said, "key-1")
    assert his.status_code == 201 and his.json()["turn"]["id"] != turn


async def ann_with_a_note(api: Api, content: str) -> tuple[str, str, str, str]:
    """A memory world of Ann with a chat of hers and a note she remembered: the Bot, her token,
    the chat and the note's id."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    made = await command(api, ann, w.bot, {"_tag": "Remember", "content": content})
    return w.bot, ann, chat, made.json()["entry"]["id"]


@pytest.mark.parametrize("key", ["", "with space", "x" * 256, "naïve"])
async def test_a_malformed_key_is_refused_before_anything_is_saved(api: Api, key: str) -> None:
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    response = await api.http.post(
        f"/v1/chats/{chat}/messages",
        json={"message": "Hello", "role": "user"},
        headers=[(b"Authorization", f"Bearer {ann}".encode()), (b"Idempotency-Key", key.encode())],
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == {
        "code": "BAD_INPUT",
        "message": "an idempotency key is 1 to 255 visible ASCII characters",
    }
    body = await api.raw(START, {"c": chat, "t": "Hello", "k": key}, ann)
    assert body["errors"][0]["extensions"]["code"] == "BAD_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "idempotencyKey"
    assert await history(api, ann, chat) == []


async def test_start_turn_sent_again_gets_its_rewrite_while_its_notes_stay_visible(
    api: Api, model_server: ModelServer
) -> None:
    model_server.reset()
    bot, ann, chat, note = await ann_with_a_note(api, "Ann is vegetarian.")
    rewrite = ToolCall("rewrite_input", {"text": "Book a vegetarian dinner.", "used_entry_ids": [note]})
    model_server.script("rewrite", Reply(tool_calls=[rewrite]))
    variables = {"c": chat, "t": "Book a dinner.", "k": "dinner-1"}
    first = (await api.gql(START, variables, ann))["startTurn"]
    again = (await api.gql(START, variables, ann))["startTurn"]
    assert first["enrichedInput"] == "Book a vegetarian dinner."
    assert again == first  # the same Turn, its saved rewrite
    assert len(model_server.requests_for("rewrite")) == 1  # asked once
    assert len(await history(api, ann, chat)) == 1

    # Once a note it was sent is no longer visible, the rewrite is not given again (D9.15).
    forgot = await command(api, ann, bot, {"_tag": "Forget", "id": note})
    assert forgot.status_code == 200, forgot.text
    later = (await api.gql(START, variables, ann))["startTurn"]
    assert (later["id"], later["enrichedInput"]) == (first["id"], "Book a dinner.")
    assert len(model_server.requests_for("rewrite")) == 1


CONFIDE = "mutation($t: ID!, $x: String!, $k: String) { confide(turnId: $t, text: $x, idempotencyKey: $k) { answer } }"


async def test_a_confide_sent_again_gets_its_answer_once_and_nothing_more(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A confide sent again with its key: the answer saved for its confession, no second confession,
    learning execution or model call (the memory Bot's budget is spent once)."""
    model_server.reset()
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = (await api.gql(START, {"c": chat, "t": "Plan my trip.", "k": None}, ann))["startTurn"]["id"]
    model_server.script("confide", Reply(text="Ask about the dates first."))
    variables = {"t": turn, "x": "I am unsure what Ann wants.", "k": "conf-1"}
    first = (await api.gql(CONFIDE, variables, ann))["confide"]["answer"]
    again = (await api.gql(CONFIDE, variables, ann))["confide"]["answer"]
    assert first == again == "Ask about the dates first."
    assert len(model_server.requests_for("confide")) == 1
    listed = await api.http.get(f"/v1/chats/{chat}/confessions", headers=bearer(ann))
    assert [c["text"] for c in listed.json()["confessions"]] == ["I am unsure what Ann wants."]
    executions, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN count(x) AS n", t=turn
    )
    assert executions[0]["n"] == 1
    # Another text with the same key is another request.
    other = {**variables, "x": "Something else."}
    assert await api.codes(CONFIDE, other, ann) == ["BAD_INPUT"]


async def test_a_confide_answer_is_given_again_only_while_its_notes_stay_visible(
    api: Api, model_server: ModelServer
) -> None:
    """The answer drew on a note of Ann's; once she forgets it, the confide sent again gets the fixed
    calm answer, not words made of what nobody may see now (V10). After the Chat's history is
    deleted, its digest gone, the key still names its Turn: on another Turn it is refused."""
    model_server.reset()
    bot, ann, chat, note = await ann_with_a_note(api, "Ann flies to Oslo in June.")
    turn = (await api.gql(START, {"c": chat, "t": "Book it.", "k": None}, ann))["startTurn"]["id"]
    model_server.script("confide", Reply(text="She flies to Oslo in June."))
    variables = {"t": turn, "x": "When does Ann fly to Oslo?", "k": "conf-2"}
    assert (await api.gql(CONFIDE, variables, ann))["confide"]["answer"] == "She flies to Oslo in June."
    assert "Ann flies to Oslo in June." in model_server.requests_for("confide")[0].text
    assert (await api.gql(CONFIDE, variables, ann))["confide"]["answer"] == "She flies to Oslo in June."
    forgot = await command(api, ann, bot, {"_tag": "Forget", "id": note})
    assert forgot.status_code == 200, forgot.text
    assert (await api.gql(CONFIDE, variables, ann))["confide"]["answer"] == FIXED_CALM_ANSWER
    assert len(model_server.requests_for("confide")) == 1

    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    later = (await api.gql(START, {"c": chat, "t": "Again.", "k": None}, ann))["startTurn"]["id"]
    assert await api.codes(CONFIDE, {**variables, "t": later}, ann) == ["BAD_INPUT"]


async def test_a_racing_second_start_waits_for_the_first_and_answers_as_it(
    api: Api, runtime: Runtime
) -> None:
    """Both requests pass the look for an earlier record before either commits: the second waits on
    the key's record the first claimed, then answers with the first's Turn (without the claim in
    the creating transaction, it started a second Turn)."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    variables = {"c": chat, "t": "Once only.", "k": "race-1"}
    async with runtime.driver.session() as session:
        held = await session.begin_transaction()
        await held.run("MATCH (ch:Chat {id: $id}) CALL apoc.lock.nodes([ch]) RETURN ch.id", id=chat)
        try:
            first = asyncio.create_task(api.gql(START, variables, ann))
            await until_a_transaction_waits_for_a_lock(runtime, running="nextTurnSeq", given=("chatId", chat))
            second = asyncio.create_task(api.gql(START, variables, ann))
            await until_a_transaction_waits_for_a_lock(runtime, running="MERGE (held:Idempotency")
        finally:
            await held.rollback()
    one, two = (await first)["startTurn"], (await second)["startTurn"]
    assert one == two
    assert [row[:3] for row in await history(api, ann, chat)] == [("i-1", "PERSON_MESSAGE", "Once only.")]


async def until_blocked(rt: Runtime, running: str, count: int) -> None:
    """Until Neo4j shows ``count`` transactions blocked on a lock in a statement holding ``running``."""

    async def blocked() -> bool:
        found, _, _ = await rt.driver.execute_query(
            "SHOW TRANSACTIONS YIELD status, currentQuery "
            "WHERE status STARTS WITH 'Blocked' AND currentQuery CONTAINS $running RETURN count(*) AS n",
            running=running,
        )
        return found[0]["n"] >= count

    await until(blocked, f"never {count} transactions waited in {running!r}", within=30)


async def test_racing_add_items_and_replies_with_one_key_add_once(api: Api, runtime: Runtime) -> None:
    """Two addItems with one key, both past the look for an earlier record and both waiting for the
    Turn's lock: the second takes it after the first's commit and answers with the first's Items
    (its claim is the first's record, held by another request; read by the Turn alone, every
    request for the Turn looked like its holder and added the Items again). So for a reply that
    completes its Turn: the second answers with the first's reply, not CONFLICT."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = (await api.gql(START, {"c": chat, "t": "Start", "k": None}, ann))["startTurn"]["id"]
    items = [{"kind": "BOT_MESSAGE", "text": "Once."}]
    variables = {"t": turn, "i": items, "k": "add-race"}
    reply = {"message": "The end.", "role": "assistant", "turnId": turn}
    async with runtime.driver.session() as session:
        held = await session.begin_transaction()
        await held.run("MATCH (t:Turn {id: $id}) CALL apoc.lock.nodes([t]) RETURN t.id", id=turn)
        try:
            adds = [asyncio.create_task(api.gql(ADD, variables, ann)) for _ in range(2)]
            await until_blocked(runtime, "MATCH (held:Turn {id: $turnId})", 2)
        finally:
            await held.rollback()
    one, two = [(await a)["addItems"] for a in adds]
    assert one == two == [{"id": "i-2", "kind": "BOT_MESSAGE", "text": "Once."}]

    async with runtime.driver.session() as session:
        held = await session.begin_transaction()
        await held.run("MATCH (t:Turn {id: $id}) CALL apoc.lock.nodes([t]) RETURN t.id", id=turn)
        try:
            replies = [asyncio.create_task(post_keyed(api, ann, chat, reply, "reply-race")) for _ in range(2)]
            await until_blocked(runtime, "MATCH (held:Turn {id: $turnId})", 2)
        finally:
            await held.rollback()
    first, second = [await r for r in replies]
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    assert first.json() == second.json()
    assert [row[:3] for row in await history(api, ann, chat)] == [
        ("i-1", "PERSON_MESSAGE", "Start"),
        ("i-2", "BOT_MESSAGE", "Once."),
        ("i-3", "BOT_MESSAGE", "The end."),
    ]


async def test_a_key_past_its_time_is_taken_over_once(api: Api, runtime: Runtime) -> None:
    """A record past its time is new again: the next request with the key creates, and holds it
    from then on — the one after it gets what that request created, not a third."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    variables = {"c": chat, "t": "Again and again.", "k": "old-1"}
    first = (await api.gql(START, variables, ann))["startTurn"]["id"]
    await runtime.driver.execute_query(
        "MATCH (k:Idempotency {chatId: $chat}) SET k.expiresAt = timestamp() - 1", chat=chat
    )
    second = (await api.gql(START, variables, ann))["startTurn"]["id"]
    third = (await api.gql(START, variables, ann))["startTurn"]["id"]
    assert second != first and third == second
    assert len(await history(api, ann, chat)) == 2


async def test_add_items_and_create_chat_sent_again_create_nothing(api: Api) -> None:
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chats = [(await api.gql(CHAT, {"b": w.bot, "k": "chat-1"}, ann))["createChat"]["id"] for _ in range(2)]
    assert chats[0] == chats[1]
    chat = chats[0]
    turn = (await api.gql(START, {"c": chat, "t": "Start", "k": None}, ann))["startTurn"]["id"]
    items = [{"kind": "BOT_MESSAGE", "text": "Part one."}, {"kind": "BOT_MESSAGE", "text": "Part two."}]
    added = [(await api.gql(ADD, {"t": turn, "i": items, "k": "add-1"}, ann))["addItems"] for _ in range(2)]
    assert (
        added[0]
        == added[1]
        == [
            {"id": "i-2", "kind": "BOT_MESSAGE", "text": "Part one."},
            {"id": "i-3", "kind": "BOT_MESSAGE", "text": "Part two."},
        ]
    )
    assert len(await history(api, ann, chat)) == 3
    # The same key for another operation is another request.
    assert await api.codes(START, {"c": chat, "t": "Start", "k": "add-1"}, ann) == ["BAD_INPUT"]


async def test_remember_and_forget_sent_again(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    body = {"command": {"_tag": "Remember", "content": "Ann's locker is number 42."}}
    first = await remember_keyed(api, ann, w.bot, body, "mem-1")
    again = await remember_keyed(api, ann, w.bot, body, "mem-1")
    assert first.status_code == again.status_code == 201, again.text
    assert again.json() == first.json()
    # GraphQL's remember is the same operation: the same key and arguments answer the same.
    content = "Ann's locker is number 42."
    over_graphql = (await api.gql(REMEMBER, {"b": w.bot, "c": content, "k": "mem-1"}, ann))["remember"]
    assert over_graphql["entry"]["id"] == first.json()["entry"]["id"]
    assert over_graphql["version"] == first.json()["version"]
    listed = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))
    assert [e["content"] for e in listed.json()["entries"]] == ["Ann's locker is number 42."]

    forget = {"command": {"_tag": "Forget", "id": first.json()["entry"]["id"]}}
    gone = await remember_keyed(api, ann, w.bot, forget, "forget-1")
    gone_again = await remember_keyed(api, ann, w.bot, forget, "forget-1")
    assert gone.status_code == gone_again.status_code == 200, gone_again.text
    assert gone_again.json() == gone.json()  # not 409: the first took it back
    unkeyed = await command(api, ann, w.bot, forget["command"])
    assert unkeyed.status_code == 409


async def test_a_keyed_requests_digest_is_its_callers_own(api: Api, runtime: Runtime) -> None:
    """E1: a keyed request's record keeps a keyed digest of its arguments, not its words. Made of
    the arguments alone, two callers' same request had the same digest: Bob, reading the store,
    could send a Remember of the words he guessed with a key of his own and see whether Ann's
    private one held them. The digest covers whose key it is; a record claimed before (of the
    arguments alone) still answers its own request sent again."""
    w = await make_world(api, ("ann", "bob"))
    content = "The safe's code is 9-4-1."
    body = {"command": {"_tag": "Remember", "content": content}}
    made: dict[str, Any] = {}
    for name in ("ann", "bob"):
        response = await remember_keyed(api, w.tokens[name], w.bot, body, "note-1")
        assert response.status_code == 201, response.text
        made[name] = response.json()
    found, _, _ = await runtime.driver.execute_query(
        "MATCH (k:Idempotency) WHERE k.resourceId IN $ids RETURN k.id AS id, k.request AS request",
        ids=[m["entry"]["id"] for m in made.values()],
    )
    assert len({r["request"] for r in found}) == 2

    # A record claimed before session 56: the digest of its arguments alone, no ``scoped``.
    ann = Principal("person", person_id=w.people["ann"], organization_id=w.org)
    key = remember_key(ann, "note-1", w.bot, content, [])
    assert key is not None
    await runtime.driver.execute_query(
        "MATCH (k:Idempotency {id: $id}) SET k.request = $request REMOVE k.scoped",
        id=key.id,
        request=runtime.keyring.digest(Kind.REQUEST_DIGEST, key.unscoped),
    )
    again = await remember_keyed(api, w.tokens["ann"], w.bot, body, "note-1")
    assert again.status_code == 201 and again.json() == made["ann"], again.text
    other = {"command": {"_tag": "Remember", "content": "Something else."}}
    refused = await remember_keyed(api, w.tokens["ann"], w.bot, other, "note-1")
    assert refused.json()["error"]["code"] == "BAD_INPUT", refused.text


async def reply_lost(runtime: Runtime, turn_id: str) -> None:
    """The Turn as a request that stopped before its reply was saved leaves it: open, no reply."""
    await runtime.driver.execute_query(
        "MATCH (t:Turn {id: $id})<-[:IN_TURN]-(i:Item {kind: 'BOT_MESSAGE'}) DETACH DELETE i "
        "WITH DISTINCT 1 AS one MATCH (t:Turn {id: $id}) SET t.status = 'open', t.completedAt = null",
        id=turn_id,
    )


async def test_send_message_sent_again_is_answered_once_and_held_while_it_runs(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: object
) -> None:
    model_server.reset()
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    release = threading.Event()
    model_server.script("chat", Reply(text="Lisbon is lovely in May.", hold=release))
    variables = {"c": chat, "t": "Where should I go in May?", "k": "send-1"}
    first = asyncio.create_task(api.gql(SEND, variables, ann))
    try:
        await model_server.wait_for_requests("chat", 1)
        # While the first is answered, the same request is CONFLICT, not a second answer; the key
        # with another message is BAD_INPUT, as it is once the first is answered.
        assert await api.codes(SEND, variables, ann) == ["CONFLICT"]
        assert await api.codes(SEND, {**variables, "t": "And in June?"}, ann) == ["BAD_INPUT"]
    finally:
        release.set()
    answered = (await first)["sendMessage"]
    assert (answered["reply"], answered["status"]) == ("Lisbon is lovely in May.", "completed")
    again = (await api.gql(SEND, variables, ann))["sendMessage"]
    assert again == answered
    assert len(model_server.requests_for("chat")) == 1

    # A request that stopped before its reply was saved (its Turn open, no reply): sent again,
    # the Bot is asked now and the Turn completed.
    await reply_lost(runtime, answered["id"])
    model_server.script("chat", Reply(text="Try Porto too."))
    resumed = (await api.gql(SEND, variables, ann))["sendMessage"]
    assert resumed == {"id": answered["id"], "reply": "Try Porto too.", "status": "completed"}
    assert len(model_server.requests_for("chat")) == 2
    assert [row[:3] for row in await history(api, ann, chat)] == [
        ("i-1", "PERSON_MESSAGE", "Where should I go in May?"),
        ("i-3", "BOT_MESSAGE", "Try Porto too."),
    ]


async def test_a_send_message_cut_off_frees_its_key_within_a_lease(
    api: Api,
    settings: Settings,
    service_env: dict[str, str],
    model_server: ModelServer,
    learning_worker: object,
) -> None:
    """An API process killed while it answers a ``sendMessage`` with a key: sent again, the key is
    CONFLICT, saying it may have been cut off and when to send it again — within a lease the
    process renewed while it ran, not the longest an answer may take (it was held that long, six
    minutes of CONFLICT for nothing running) — then the Bot is asked again, and the Turn has one
    reply."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    release = threading.Event()
    model_server.script("chat", Reply(text="Never said.", hold=release))
    variables = {"c": chat, "t": "Where should I go in May?", "k": "cut-off-1"}
    log_path = settings.data_dir / "logs" / "pytest-api-cut-off.log"
    doomed = await asyncio.to_thread(ApiProcess, settings, log_path, {**service_env, **PATIENT_DEADLINES})
    try:
        async with httpx.AsyncClient(base_url=doomed.url, timeout=60) as http:
            sent = asyncio.create_task(Api(http, api.admin_token).raw(SEND, variables, ann))
            await model_server.wait_for_requests("chat", 1)
            doomed.proc.kill()
            await asyncio.to_thread(doomed.proc.wait)
            with pytest.raises(httpx.HTTPError):
                await sent
    finally:
        release.set()
        await asyncio.to_thread(doomed.stop)
    model_server.script("chat", Reply(text="Try Porto."))
    refused = (await api.raw(SEND, variables, ann))["errors"][0]
    assert refused["extensions"]["code"] == "CONFLICT"
    assert "or was cut off; send it again in " in refused["message"]
    assert int(refused["message"].split(" in ")[-1].removesuffix(" s")) <= LEASE_MS / 1000

    async def answered() -> dict[str, Any] | None:
        body = await api.raw(SEND, variables, ann)
        return None if body.get("errors") else body["data"]["sendMessage"]

    resumed = await until(answered, "the key stayed held", within=60, every=0.5)
    assert (resumed["reply"], resumed["status"]) == ("Try Porto.", "completed")
    assert len(model_server.requests_for("chat")) == 2
    assert [row[1:3] for row in await history(api, ann, chat)] == [
        ("PERSON_MESSAGE", "Where should I go in May?"),
        ("BOT_MESSAGE", "Try Porto."),
    ]


async def test_a_reply_made_again_goes_on_from_what_the_bot_confided_the_first_time(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: object
) -> None:
    """D9.35: a sendMessage that stopped after the Bot confided and before its reply was saved (a
    process killed, the store gone), sent again with its key: the Bot is asked again with what it
    confided and was answered — asked afresh, it confided again, and the Turn had two confessions,
    two learning executions and two memory-Bot calls. Here it does not confide again, and the
    Turn keeps one of each."""
    model_server.reset()
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    model_server.script(
        "chat",
        Reply(tool_calls=[ToolCall("confide", {"text": "I am unsure which May dates suit her."})]),
        Reply(text="Lisbon is lovely in May."),
    )
    model_server.script("confide", Reply(text="That happens: ask her plainly."))
    variables = {"c": chat, "t": "Where should I go in May?", "k": "send-confided"}
    answered = (await api.gql(SEND, variables, ann))["sendMessage"]
    assert answered["reply"] == "Lisbon is lovely in May."
    await reply_lost(runtime, answered["id"])
    model_server.script("chat", Reply(text="Try Porto too."))
    resumed = (await api.gql(SEND, variables, ann))["sendMessage"]
    assert resumed == {"id": answered["id"], "reply": "Try Porto too.", "status": "completed"}
    asked = model_server.requests_for("chat")[-1].body["messages"]
    assert [(m["role"], m.get("content")) for m in asked[-3:]] == [
        ("user", "Where should I go in May?"),
        ("assistant", None),
        ("tool", "That happens: ask her plainly."),
    ]
    [called] = asked[-2]["tool_calls"]
    assert called["function"]["name"] == "confide"
    assert called["function"]["arguments"] == '{"text": "I am unsure which May dates suit her."}'
    assert len(model_server.requests_for("confide")) == 1
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (t:Turn {id: $id}) RETURN COUNT { (t)<-[:ABOUT]-(:Confession) } AS confessions, "
        "COUNT { (t)<-[:IN_TURN]-(:Item {kind: 'TOOL_CALL'}) } AS calls",
        id=answered["id"],
    )
    assert (records[0]["confessions"], records[0]["calls"]) == (1, 1)


async def test_a_key_forgets_its_request_with_the_history_and_goes_when_past_its_time(
    api: Api, runtime: Runtime
) -> None:
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    said = {"message": "Canary-idem words.", "role": "user"}
    first = (await post_keyed(api, ann, chat, said, "gone-1")).json()
    # The record holds a keyed digest of the request, never its words (E1).
    found, _, _ = await runtime.driver.execute_query(
        "MATCH (k:Idempotency {chatId: $chat}) RETURN properties(k) AS k", chat=chat
    )
    [record] = [r["k"] for r in found]
    assert len(record["request"]) == 64 and "Canary-idem" not in repr(record)

    deleted = await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    assert deleted["deleteChatHistory"]["items"] == 1
    found, _, _ = await runtime.driver.execute_query(
        "MATCH (k:Idempotency {chatId: $chat}) RETURN k.request AS request", chat=chat
    )
    assert [r["request"] for r in found] == [None]
    # Sent again, it still answers with its Turn, whose words are gone.
    again = await post_keyed(api, ann, chat, said, "gone-1")
    assert again.status_code == 201, again.text
    assert again.json()["turn"]["id"] == first["turn"]["id"]
    assert again.json()["message"]["text"] is None
    # The key still names its operation: as a reply, it is another request.
    as_reply = await post_keyed(
        api, ann, chat, {"message": "Canary-idem words.", "role": "assistant"}, "gone-1"
    )
    assert as_reply.status_code == 422, as_reply.text

    # Past its time, the sweep drops it, and the key is new again.
    await runtime.driver.execute_query(
        "MATCH (k:Idempotency {chatId: $chat}) SET k.expiresAt = timestamp() - 1", chat=chat
    )
    await sweep_once(runtime)
    found, _, _ = await runtime.driver.execute_query(
        "MATCH (k:Idempotency {chatId: $chat}) RETURN count(k) AS n", chat=chat
    )
    assert found[0]["n"] == 0
    anew = await post_keyed(api, ann, chat, said, "gone-1")
    assert anew.status_code == 201 and anew.json()["turn"]["id"] != first["turn"]["id"]


async def test_the_admins_creates_sent_again_create_nothing(api: Api, runtime: Runtime) -> None:
    """Provisioning retried with its keys makes one organization, Bot and channel; a create refused
    (an unknown organization) keeps no claim, so its key serves the corrected request."""
    org_q = "mutation($n: String!, $k: String) { createOrganization(name: $n, idempotencyKey: $k) { id } }"
    bot_q = (
        "mutation($o: ID!, $n: String!, $k: String) {"
        " createBot(organizationId: $o, name: $n, idempotencyKey: $k) { id } }"
    )
    channel_q = (
        "mutation($o: ID!, $m: [ID!]!, $k: String) {"
        ' createChannel(organizationId: $o, name: "team", memberIds: $m, idempotencyKey: $k) { id } }'
    )
    name = f"org-keyed-{secrets.token_hex(3)}"
    orgs = [(await api.admin(org_q, {"n": name, "k": f"{name}-1"}))["createOrganization"]["id"] for _ in "ab"]
    assert orgs[0] == orgs[1]
    org = orgs[0]
    missing = await api.raw(bot_q, {"o": "org_unknown", "n": "Ada", "k": f"{name}-bot"}, api.admin_token)
    assert missing["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    bots = [
        (await api.admin(bot_q, {"o": org, "n": "Ada", "k": f"{name}-bot"}))["createBot"]["id"] for _ in "ab"
    ]
    assert bots[0] == bots[1]
    person, _ = await api.person(org, "ann")
    channels = [
        (await api.admin(channel_q, {"o": org, "m": [person], "k": f"{name}-ch"}))["createChannel"]["id"]
        for _ in "ab"
    ]
    assert channels[0] == channels[1]
    assert await api.codes(channel_q, {"o": org, "m": [], "k": f"{name}-ch"}, api.admin_token) == [
        "BAD_INPUT"
    ]
    owned, _, _ = await runtime.driver.execute_query(
        "MATCH (b:Bot)-[:OWNED_BY]->(:Organization {id: $o}) RETURN collect(b.id) AS ids", o=org
    )
    assert owned[0]["ids"] == [bots[0]]
