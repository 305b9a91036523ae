"""Seed 004's save-a-message, ``POST /v1/chats/{chatId}/messages`` over Turns (D9.33): a user message
starts a Turn and is rewritten for the caller (N1, D9.16), an assistant message is the Bot's reply
in the Turn it answers and completes it, which lets what the Bot confided on it be learned (L2); who may save what is
``startTurn``'s and ``addItems``' rule (V3, D9.5), and a refused message saves nothing."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.runtime import Runtime
from tests.client import Api, bearer, make_world
from tests.conftest import WorkerProcess
from tests.learning_helpers import confide, fact_call, learn, memory_world, wait_executions
from tests.memory_helpers import visible
from tests.model_server import ModelServer, Reply, ToolCall
from tests.test_openapi import check, spec_of


async def post(api: Api, token: str, chat: str, body: dict[str, Any] | bytes) -> httpx.Response:
    url = f"/v1/chats/{chat}/messages"
    if isinstance(body, bytes):
        headers = {**bearer(token), "Content-Type": "application/json"}
        return await api.http.post(url, content=body, headers=headers)
    return await api.http.post(url, json=body, headers=bearer(token))


async def history(api: Api, token: str, chat: str) -> list[tuple[str, str, str | None, str]]:
    """The chat's Items as (id, kind, text, turnId)."""
    response = await api.http.get(f"/v1/chats/{chat}/messages", headers=bearer(token))
    assert response.status_code == 200, response.text
    return [(m["id"], m["kind"], m["text"], m["turnId"]) for m in response.json()["messages"]]


async def test_a_conversation_saved_as_messages_is_rewritten_for_its_person_and_learned(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    model_server.reset()
    spec = await spec_of(api)
    w = await memory_world(api, ("ann", "bob"))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    said = await post(api, ann, chat, {"message": "I always take the train to Paris.", "role": "user"})
    assert said.status_code == 201, said.text
    check(spec, "post", "/v1/chats/{chat_id}/messages", 201, said.json())
    message, turn = said.json()["message"], said.json()["turn"]
    assert (message["id"], message["kind"], message["text"]) == (
        "i-1",
        "PERSON_MESSAGE",
        "I always take the train to Paris.",
    )
    assert (message["speakerId"], message["turnId"]) == (w.people["ann"], turn["id"])
    # Nothing is remembered yet: the input is kept as it is, and no model is asked (N3).
    assert turn == {"id": turn["id"], "status": "open", "enrichedInput": "I always take the train to Paris."}
    assert model_server.requests_for("rewrite") == []

    # The Bot confides on the Turn (L1); its learning waits for the Turn to complete (L2).
    model_server.script("confide", Reply(text="Remember how Ann travels."))
    model_server.script("learn", learn(fact_call("Ann takes the train to Paris.", "i-1", topics=("travel",))))
    assert await confide(api, ann, turn["id"], "Ann told me how she travels.") == "Remember how Ann travels."
    assert model_server.requests_for("learn") == []
    replied = await post(api, ann, chat, {"message": "Noted: trains it is.", "role": "assistant"})
    assert replied.status_code == 201, replied.text
    check(spec, "post", "/v1/chats/{chat_id}/messages", 201, replied.json())
    assert replied.json()["message"]["kind"] == "BOT_MESSAGE"
    assert replied.json()["message"]["speakerId"] == w.bot
    assert replied.json()["turn"] == {"id": turn["id"], "status": "completed"}  # no enrichedInput for a reply
    # The reply completed the Turn, which lets its learning run (L2).
    [execution] = await wait_executions(runtime, turn["id"])
    assert (execution["status"], execution["learned"]) == ("done", 1)
    [entry] = (await visible(api, ann, w.bot)).values()
    assert entry["content"] == "Ann takes the train to Paris." and entry["sources"] == [
        {"chat": chat, "item": "i-1"}
    ]
    assert await visible(api, w.tokens["bob"], w.bot) == {}

    # The next user message starts a Turn of its own, rewritten with what Ann may see (N1).
    rewrite = ToolCall(
        "rewrite_input", {"text": "Book Paris for me (by train).", "used_entry_ids": [entry["id"]]}
    )
    model_server.script("rewrite", Reply(tool_calls=[rewrite]))
    asked = await post(api, ann, chat, {"message": "Book Paris for me.", "role": "user"})
    assert asked.status_code == 201, asked.text
    second = asked.json()["turn"]
    assert second["id"] != turn["id"]
    assert (second["status"], second["enrichedInput"]) == ("open", "Book Paris for me (by train).")
    [request] = model_server.requests_for("rewrite")
    assert "Ann takes the train to Paris." in json.dumps(request.body)
    # The history keeps the person's words, never the rewrite (N2, D9.16).
    assert await history(api, ann, chat) == [
        ("i-1", "PERSON_MESSAGE", "I always take the train to Paris.", turn["id"]),
        ("i-2", "BOT_MESSAGE", "Noted: trains it is.", turn["id"]),
        ("i-3", "PERSON_MESSAGE", "Book Paris for me.", second["id"]),
    ]


async def test_a_reply_goes_to_the_latest_turn_or_the_one_named_never_to_a_completed_one(api: Api) -> None:
    w = await make_world(api, ("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    chat = await api.chat(ann, w.bot)
    alone = await post(api, ann, chat, {"message": "Hello?", "role": "assistant"})
    assert alone.status_code == 409, alone.text
    assert alone.json()["error"]["code"] == "CONFLICT"
    # What the message is comes first, as for startTurn: an empty one is BAD_INPUT, not CONFLICT.
    empty = await post(api, ann, chat, {"message": " ", "role": "assistant"})
    assert empty.status_code == 422 and empty.json()["error"]["message"] == "message must not be empty"
    assert await history(api, ann, chat) == []

    first = (await post(api, ann, chat, {"message": "Plan my week.", "role": "user"})).json()["turn"]["id"]
    part = await post(api, ann, chat, {"message": "Monday: gym.", "role": "assistant", "complete": False})
    assert part.json()["turn"] == {"id": first, "status": "open"}
    second = (await post(api, ann, chat, {"message": "And the weekend?", "role": "user"})).json()["turn"][
        "id"
    ]
    # A reply naming its Turn goes there, the latest Turn left as it is.
    named = await post(api, ann, chat, {"message": "Tuesday: swim.", "role": "assistant", "turnId": first})
    assert named.json()["turn"] == {"id": first, "status": "completed"}
    latest = await post(api, ann, chat, {"message": "Hike on Saturday.", "role": "assistant"})
    assert latest.json()["turn"] == {"id": second, "status": "completed"}
    for body in (
        {"message": "Too late.", "role": "assistant"},
        {"message": "Too late.", "role": "assistant", "turnId": first},
    ):
        refused = await post(api, ann, chat, body)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "CONFLICT"
    assert [(i, k, t) for i, k, _, t in await history(api, ann, chat)] == [
        ("i-1", "PERSON_MESSAGE", first),
        ("i-2", "BOT_MESSAGE", first),
        ("i-3", "PERSON_MESSAGE", second),
        ("i-4", "BOT_MESSAGE", first),
        ("i-5", "BOT_MESSAGE", second),
    ]

    # Another chat's Turn, and a chat of another person, are not found; nothing is saved.
    bobs = await api.chat(bob, w.bot)
    bobs_turn = (await post(api, bob, bobs, {"message": "Hi.", "role": "user"})).json()["turn"]["id"]
    third = (await post(api, ann, chat, {"message": "One more thing.", "role": "user"})).json()["turn"]["id"]
    for token, where, body in (
        (ann, chat, {"message": "x", "role": "assistant", "turnId": bobs_turn}),
        (ann, bobs, {"message": "x", "role": "assistant", "turnId": bobs_turn}),
        (ann, bobs, {"message": "x", "role": "assistant"}),
        (ann, bobs, {"message": "x", "role": "user"}),
    ):
        refused = await post(api, token, where, body)
        assert refused.status_code == 404, (body, refused.text)
        assert refused.json()["error"]["code"] == "NOT_FOUND"
    assert len(await history(api, ann, chat)) == 6 and len(await history(api, bob, bobs)) == 1
    # A user message may end its own Turn at once (a person's words no reply answers); a reply
    # without a Turn then goes to the latest one still open.
    ended = await post(api, ann, chat, {"message": "Thanks!", "role": "user", "complete": True})
    assert ended.json()["turn"]["status"] == "completed" and ended.json()["turn"]["id"] != third
    late = await post(api, ann, chat, {"message": "Anything else?", "role": "assistant"})
    assert late.json()["turn"] == {"id": third, "status": "completed"}


async def test_a_platform_saves_the_words_of_a_person_of_the_chat_and_notices(api: Api) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    platform = await api.platform_token(w.org)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    bobs = await post(
        api, platform, group, {"message": "Lunch at noon?", "role": "user", "actorId": w.people["bob"]}
    )
    assert bobs.status_code == 201, bobs.text
    assert bobs.json()["message"]["speakerId"] == w.people["bob"]
    notice = await post(api, platform, group, {"message": "Cat was invited.", "role": "notice"})
    assert notice.status_code == 201, notice.text
    assert (notice.json()["message"]["kind"], notice.json()["message"]["speakerId"]) == ("NOTICE", None)
    assert "enrichedInput" not in notice.json()["turn"]  # a notice is no person's words
    for body, status in (
        ({"message": "x", "role": "user"}, 422),  # whose words: a platform names the person
        ({"message": "x", "role": "user", "actorId": w.people["cat"]}, 403),  # not in the channel
        ({"message": "x", "role": "notice", "actorId": w.people["bob"]}, 422),
    ):
        refused = await post(api, platform, group, body)
        assert refused.status_code == status, (body, refused.text)
    # A person saves only their own words, and no notice.
    for body in (
        {"message": "x", "role": "user", "actorId": w.people["bob"]},
        {"message": "x", "role": "notice"},
    ):
        refused = await post(api, w.tokens["ann"], group, body)
        assert refused.status_code == 403, (body, refused.text)
    # Bob's Turn is his: Ann may not reply in it for the Bot, the platform may. Without a Turn,
    # Ann's reply goes to her own open Turn, the platform's to the latest open Turn of a person
    # (never a notice's).
    bobs_turn = bobs.json()["turn"]["id"]
    refused = await post(
        api, w.tokens["ann"], group, {"message": "x", "role": "assistant", "turnId": bobs_turn}
    )
    assert refused.status_code == 403, refused.text
    anns = await post(api, w.tokens["ann"], group, {"message": "I'll book.", "role": "user"})
    anns_turn = anns.json()["turn"]["id"]
    await post(api, platform, group, {"message": "Bob left for lunch.", "role": "notice"})
    again = await post(api, platform, group, {"message": "Sure?", "role": "user", "actorId": w.people["bob"]})
    again_turn = again.json()["turn"]["id"]
    mine = await post(api, w.tokens["ann"], group, {"message": "Booked for Ann.", "role": "assistant"})
    assert mine.json()["turn"] == {"id": anns_turn, "status": "completed"}
    theirs = await post(api, platform, group, {"message": "Sure.", "role": "assistant"})
    assert theirs.json()["turn"] == {"id": again_turn, "status": "completed"}
    reply = {"message": "Noon works.", "role": "assistant", "turnId": bobs_turn}
    assert (await post(api, platform, group, reply)).json()["turn"]["status"] == "completed"
    assert [(k, t) for _, k, t, _ in await history(api, w.tokens["bob"], group)] == [
        ("PERSON_MESSAGE", "Lunch at noon?"),
        ("NOTICE", "Cat was invited."),
        ("PERSON_MESSAGE", "I'll book."),
        ("NOTICE", "Bob left for lunch."),
        ("PERSON_MESSAGE", "Sure?"),
        ("BOT_MESSAGE", "Booked for Ann."),
        ("BOT_MESSAGE", "Sure."),
        ("BOT_MESSAGE", "Noon works."),
    ]
    # The platform may write every chat of its organization, and a Turn of one is still not
    # found in another: the reply goes nowhere.
    other = await api.chat(w.tokens["cat"], w.bot)
    cats = await post(api, platform, other, {"message": "Hi.", "role": "user", "actorId": w.people["cat"]})
    astray = {"message": "x", "role": "assistant", "turnId": cats.json()["turn"]["id"]}
    missed = await post(api, platform, group, astray)
    assert missed.status_code == 404 and missed.json()["error"]["code"] == "NOT_FOUND", missed.text
    assert len(await history(api, w.tokens["bob"], group)) == 8
    assert len(await history(api, w.tokens["cat"], other)) == 1
    # The seed's own body names the chat as conversation_id: the path's, or refused.
    seed = {"message": "Hello", "role": "user", "conversation_id": other, "actorId": w.people["cat"]}
    assert (await post(api, platform, other, seed)).status_code == 201
    elsewhere = await post(api, platform, group, {**seed, "actorId": w.people["bob"]})
    assert elsewhere.status_code == 422, elsewhere.text
    assert elsewhere.json()["error"]["message"] == "conversation_id names another chat than the path"
    assert len(await history(api, w.tokens["bob"], group)) == 8


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{oops", "the body is not valid JSON"),
        (b'{"role": "user"}', "message is required"),
        (b'{"message": 5, "role": "user"}', "message must be a string"),
        (b'{"message": "x", "role": "system"}', "role must be 'user', 'assistant' or 'notice'"),
        (b'{"message": "x", "role": "user", "conversationId": "c"}', "unknown field conversationId"),
        (
            b'{"message": "x", "role": "user", "conversation_id": "c"}',
            "conversation_id names another chat than the path",
        ),
        (b'{"message": "x", "role": "assistant", "actorId": "p"}', "the Bot's reply has no actor"),
        (
            b'{"message": "x", "role": "assistant", "timeZone": "UTC"}',
            "only a person's message is said in a time zone",
        ),
        (
            b'{"message": "x", "role": "user", "turnId": "turn_1"}',
            "a person's message or a notice starts a Turn of its own",
        ),
        (b'{"message": "x", "role": "assistant", "complete": "yes"}', "complete must be true or false"),
        (b'{"message": "x", "role": "user", "saidAt": -1}', "saidAt must be at least 0"),
        (b'{"message": "", "role": "user"}', None),
        (b'{"message": "x", "role": "assistant", "turnId": "not an id!"}', None),
    ],
)
async def test_a_refused_message_names_its_field_and_saves_nothing(
    api: Api, body: bytes, message: str | None
) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    await post(api, w.tokens["ann"], chat, {"message": "Hi.", "role": "user"})
    refused = await post(api, w.tokens["ann"], chat, body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "BAD_INPUT"
    if message is not None:
        assert refused.json()["error"]["message"] == message
    assert len(await history(api, w.tokens["ann"], chat)) == 1


async def test_messages_read_back_under_the_seeds_names_too(api: Api) -> None:
    """Seed 004 lists messages with ``id, message, role, conversation_id, inserted_at`` and a context
    pack with ``last_messages``: each message carries those beside its own names (DESIGN §5: the
    seed's JSON shapes)."""
    spec = await spec_of(api)
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    saved = await post(api, ann, chat, {"message": "Hello", "role": "user", "conversation_id": chat})
    await post(api, ann, chat, {"message": "Hi Ann.", "role": "assistant"})
    assert {k: saved.json()["message"][k] for k in ("message", "role", "conversation_id")} == {
        "message": "Hello",
        "role": "user",
        "conversation_id": chat,
    }
    page = (await api.http.get(f"/v1/chats/{chat}/messages", headers=bearer(ann))).json()
    check(spec, "get", "/v1/chats/{chat_id}/messages", 200, page)
    assert [(m["id"], m["message"], m["role"], m["conversation_id"]) for m in page["messages"]] == [
        ("i-1", "Hello", "user", chat),
        ("i-2", "Hi Ann.", "assistant", chat),
    ]
    assert all(m["inserted_at"] == m["createdAt"] for m in page["messages"])
    pack = (await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(ann))).json()
    check(spec, "get", "/v1/chats/{chat_id}/context", 200, pack)
    assert pack["last_messages"] == pack["lastMessages"] and len(pack["last_messages"]) == 2
