"""Conversation context (DESIGN §6, D9.17): the rolling summary at the threshold and under a spent
budget, preferences as entries, and contextPack built for the chat's audience."""

from __future__ import annotations

import json
from typing import Any

import pytest

from graph import conversation as conversation_q
from graph import memory as memory_q
from graph.driver import read, write
from graph.migrations import LATEST, migrate
from learning import summary
from learning.gateway import Gateway
from services import conversation, memory
from services.changes import AddFact, ItemRef, RenameTopic, SetTopics
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, World, bearer
from tests.conftest import WorkerProcess
from tests.learning_helpers import (
    add_items,
    long_turn,
    memory_world,
    set_org,
    spend,
    until_logged,
    wait_summary,
)
from tests.memory_helpers import apply, db_hits, fact, said, sealed
from tests.model_server import ModelServer, Reply, ToolCall

pytestmark = pytest.mark.usefixtures("learning_worker")


async def pack(api: Api, token: str, chat: str) -> Any:
    return await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(token))


async def test_the_summary_is_compressed_past_20000_characters(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.default("summary", Reply(text="Ann sent two long letters, A and B."))
    await long_turn(api, w.tokens["ann"], chat, "A")
    # 10,502 characters: not due. completeTurn decides before it answers: no summary job was
    # queued, none runs, none was asked.
    assert await runtime.redis.exists(f"arq:job:summary:{chat}", f"arq:in-progress:summary:{chat}") == 0
    assert model_server.requests_for("summary") == []
    await long_turn(api, w.tokens["ann"], chat, "B")
    assert await wait_summary(api, w.tokens["ann"], chat) == "Ann sent two long letters, A and B."
    [request] = model_server.requests_for("summary")
    sent = json.loads(request.body["messages"][1]["content"])
    assert [m["speaker"] for m in sent["messages"]] == ["person", "person"] and sent["summary"] is None
    # History, not memory: no entries, no memory change (D9.17); the call is logged and charged.
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (m:Memory {id: $b}) OPTIONAL MATCH (e:Entry {botId: $b}) "
        "OPTIONAL MATCH (c:ModelCall {botId: $b, task: 'summary'}) "
        "RETURN m.version AS version, count(DISTINCT e) AS entries, count(DISTINCT c) AS calls",
        b=w.bot,
    )
    assert dict(records[0]) == {"version": 0, "entries": 0, "calls": 1}
    rows, _, _ = await runtime.driver.execute_query(
        "MATCH (s:ChatSummary {chatId: $c}) RETURN s.text AS t", c=chat
    )
    assert b"long letters" not in sealed(rows[0]["t"])  # encrypted (E1)
    # Deleting the chat's history deletes its summary too (V13).
    await api.gql(
        "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
    )
    assert (await pack(api, w.tokens["ann"], chat)).json()["summary"] is None


async def test_a_history_longer_than_one_call_is_summarized_call_after_call(
    api: Api, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    """One summary call covers at most 500 Items. A Turn of 1,100 forty-character Items (44,000
    characters) was summarized through its 500th and the job ended, the 24,000 characters after
    it due and left until the Chat's next Turn. The job now makes the next call itself."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.script("summary", Reply(text="Through 500."), Reply(text="Through 1,000."))
    turn = await api.turn(w.tokens["ann"], chat, "m" * 40)
    for part in range(11):  # the Turn's own input is the first Item: 1,100 in all
        count = 99 if part == 0 else 100
        await add_items(api, w.tokens["ann"], turn["id"], *[("PERSON_MESSAGE", "m" * 40)] * count)
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, w.tokens["ann"])
    await until_logged(learning_worker.log_path, f"summary of {chat}: not_due")
    assert (await pack(api, w.tokens["ann"], chat)).json()["summary"] == "Through 1,000."
    first, second = model_server.requests_for("summary")
    sent = [json.loads(r.body["messages"][1]["content"]) for r in (first, second)]
    assert [len(s["messages"]) for s in sent] == [500, 500]
    assert sent[0]["summary"] is None and sent[1]["summary"] == "Through 500."


async def test_a_chats_characters_not_yet_summarized_are_kept_not_summed(api: Api, runtime: Runtime) -> None:
    """completeTurn asks whether the Chat is due for a summary: it summed every Item after the
    summary, so a Chat whose summaries never came (no model, the budget spent) had its whole
    history read at every Turn. The Chat keeps the count: the same answer, read in the same
    few steps however long the history (db hits of 3 Items against 300), set again by a history
    deletion, and counted for the Chats of before by the migration."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "abc")
    await add_items(api, w.tokens["ann"], turn["id"], ("PERSON_MESSAGE", "de"), ("BOT_MESSAGE", "fghij"))

    async def total() -> int:
        return (await read(runtime.driver, lambda tx: conversation_q.unsummarized(tx, chat_id=chat)))[1]

    assert await total() == 10
    few = await db_hits(runtime, conversation_q.UNSUMMARIZED, {"chatId": chat})
    for _ in range(3):
        await add_items(api, w.tokens["ann"], turn["id"], *[("PERSON_MESSAGE", "k" * 10)] * 99)
    assert await total() == 10 + 2_970
    assert await db_hits(runtime, conversation_q.UNSUMMARIZED, {"chatId": chat}) == few
    await runtime.driver.execute_query(
        "MATCH (ch:Chat {id: $c}) REMOVE ch.unsummarizedChars, ch.summaryInputChars", c=chat
    )
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 17")
    assert await migrate(runtime.driver) == LATEST
    assert await total() == 10 + 2_970
    await api.gql(
        "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
    )
    assert await total() == 0
    await api.turn(w.tokens["ann"], chat, "again")
    assert await total() == 5


#: What a Chat's summary would take in, counted from scratch: its summary's characters and those
#: of its Items after it that still have their text (the reference for ``summaryInputChars``).
RECOUNTED = """
MATCH (ch:Chat {id: $chatId})
OPTIONAL MATCH (s:ChatSummary {chatId: $chatId})
OPTIONAL MATCH (i:Item) WHERE i.chatId = $chatId AND i.seq > coalesce(s.coversThroughSeq, 0) AND i.text IS NOT NULL
WITH coalesce(s.chars, 0) AS summarized, coalesce(sum(i.textLength), 0) AS after
RETURN summarized + after AS total
"""


async def test_what_a_summary_would_take_in_is_kept_through_every_kind_of_write(
    api: Api, runtime: Runtime
) -> None:
    """D9.17: the Chat keeps what its summary would take in (``summaryInputChars``: the summary's
    characters and those after it), which the sweep seeks due Chats by; it must equal the count
    from scratch after new Items, a saved summary, a meta set by a client, a history deletion,
    and the migration that counts it for older Chats (version 23, a Chat with a summary)."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)

    async def kept_and_recounted() -> tuple[int, int]:
        kept = (await read(runtime.driver, lambda tx: conversation_q.unsummarized(tx, chat_id=chat)))[1]
        records, _, _ = await runtime.driver.execute_query(RECOUNTED, chatId=chat)
        return kept, int(records[0]["total"])

    turn = await api.turn(ann, chat, "abc")
    await add_items(api, ann, turn["id"], ("PERSON_MESSAGE", "de"), ("BOT_MESSAGE", "fghij"))
    assert await kept_and_recounted() == (10, 10)
    saved = await write(
        runtime.driver,
        lambda tx: conversation_q.save_summary(
            tx, chatId=chat, botId=w.bot, historyEpoch=0, after=0, through=2, text="sealed", chars=400, now=1
        ),
    )
    assert saved is True
    assert await kept_and_recounted() == (405, 405)  # the summary and the Item after it ("fghij")
    await add_items(api, ann, turn["id"], ("PERSON_MESSAGE", "k" * 30))
    assert await kept_and_recounted() == (435, 435)
    put = await api.http.put(
        f"/v1/chats/{chat}/meta", json={"summary": {"plan": "Lyon"}}, headers=bearer(ann)
    )
    assert put.status_code == 200, put.text
    kept, recounted = await kept_and_recounted()
    assert kept == recounted and 0 < kept < 435  # the meta covers every Item so far
    await add_items(api, ann, turn["id"], ("PERSON_MESSAGE", "m" * 7))
    assert await kept_and_recounted() == (kept + 7, kept + 7)

    await runtime.driver.execute_query("MATCH (ch:Chat {id: $c}) REMOVE ch.summaryInputChars", c=chat)
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 22")
    assert await migrate(runtime.driver) == LATEST
    assert await kept_and_recounted() == (kept + 7, kept + 7)

    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    assert await kept_and_recounted() == (0, 0)
    await api.turn(ann, chat, "again")
    assert await kept_and_recounted() == (5, 5)


async def test_a_context_pack_offers_no_memory_in_a_review_chat_or_with_memory_off(
    api: Api, runtime: Runtime
) -> None:
    """D9.17 (with D9.16, L5): a context pack holds memory and preferences for the Chat's audience,
    and none in a review chat or while the organization has ``botMemory`` off; its messages are
    there either way. Nothing pinned this: a pack built for a review chat, or with memory off,
    would have offered Ann's memory to the Bot."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    normal, review = await api.chat(ann, w.bot), await api.chat(ann, w.bot, review=True)
    src = await said(api, ann, normal, "I drink tea")
    tea = AddFact(content="Ann drinks tea", sources=(ItemRef(*src),), topics=("preferences",))
    await apply(runtime, w.bot, tea)
    await api.turn(ann, review, "Was the answer right?")

    async def offered(chat: str) -> tuple[list[str], list[str], int]:
        got = await pack(api, ann, chat)
        assert got.status_code == 200, got.text
        body = got.json()
        return [p["id"] for p in body["preferences"]], body["memory"]["ids"], len(body["lastMessages"])

    assert await offered(normal) == ([tea.id], [tea.id], 1)
    assert await offered(review) == ([], [], 1)
    await set_org(api, w.org, bot_memory=False)
    assert await offered(normal) == ([], [], 1)
    await set_org(api, w.org, bot_memory=True)
    assert await offered(normal) == ([tea.id], [tea.id], 1)


async def test_a_history_past_the_threshold_is_summarized_though_no_turn_was_completed(
    api: Api, model_server: ModelServer
) -> None:
    """Only completeTurn asked for a summary: a platform that never completes its Turns (they
    count as completed once idle, for learning) had a history growing with no summary, and its
    context pack a hole before the last messages. A new Turn asks too."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.default("summary", Reply(text="Two long letters, never completed."))
    await api.turn(w.tokens["ann"], chat, "A " + "A" * 10_500)
    await api.turn(w.tokens["ann"], chat, "B " + "B" * 10_500)  # past 20,000: this start asks
    assert await wait_summary(api, w.tokens["ann"], chat) == "Two long letters, never completed."


async def test_no_summary_while_the_budget_is_spent(
    api: Api, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    w = await memory_world(api, ("ann",))
    await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "budget": {"period": "day", "limitMicros": 0}},
        headers=bearer(w.tokens["ann"]),
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    model_server.default("summary", Reply(text="Two letters."))
    await long_turn(api, w.tokens["ann"], chat, "A")
    await long_turn(api, w.tokens["ann"], chat, "B")
    # Due, but the budget is spent: the worker's job says so, and asked no model.
    await until_logged(learning_worker.log_path, f"summary of {chat}: budget_spent")
    assert model_server.requests_for("summary") == []
    assert (await pack(api, w.tokens["ann"], chat)).json()["summary"] is None
    await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot", json={"expected": 1, "budget": None}, headers=bearer(w.tokens["ann"])
    )
    await long_turn(api, w.tokens["ann"], chat, "C")
    assert await wait_summary(api, w.tokens["ann"], chat) == "Two letters."


class KilledHere(Exception):
    """The worker killed between a summary's saved call and its saved text."""


async def due_unswept_chat(api: Api, runtime: Runtime) -> tuple[World, str, str]:
    """Ann's Chat of 30,001 characters in a Turn never completed and marked as swept, so that
    only the test makes its summaries (the suite's worker never queues one): world, chat, turn."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "A")
    await runtime.driver.execute_query("MATCH (ch:Chat {id: $c}) SET ch.summarySweptAt = timestamp()", c=chat)
    await add_items(api, ann, turn["id"], *[("PERSON_MESSAGE", "x" * 10_000)] * 3)
    return w, chat, turn["id"]


def _gateway(runtime: Runtime, model_server: ModelServer) -> Gateway:
    """A gateway of this process that asks the suite's model server."""
    return Gateway(
        Settings.model_validate({**runtime.settings.model_dump(), "openai_base_url": model_server.base_url})
    )


async def test_a_summary_whose_call_was_saved_but_not_its_text_is_made_from_that_call(
    api: Api, runtime: Runtime, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C5: recovery reuses a saved result. A summary job killed after its call was saved and
    before its text was paid for the same call again when the summary was made at the next Turn
    or sweep. The call is found by its request's keyed digest in the Chat; a later summary (a new
    request) asks the model anew."""
    model_server.script("summary", Reply(text="Three long letters."), Reply(text="Six long letters."))
    w, chat, turn = await due_unswept_chat(api, runtime)
    ann = w.tokens["ann"]
    gateway = _gateway(runtime, model_server)
    try:

        def killed(*_: object, **__: object) -> None:
            raise KilledHere

        monkeypatch.setattr(conversation_q, "save_summary", killed)
        with pytest.raises(KilledHere):
            await summary.summarize(runtime, gateway, chat)
        monkeypatch.undo()
        assert len(model_server.requests_for("summary")) == 1
        charged = await spend(runtime, w.bot)
        assert charged and all(calls == 1 for calls, _, _ in charged)
        assert await summary.summarize(runtime, gateway, chat) == "saved"
        assert len(model_server.requests_for("summary")) == 1  # made from the saved call
        assert await spend(runtime, w.bot) == charged  # and not charged again
        assert (await pack(api, ann, chat)).json()["summary"] == "Three long letters."
        await add_items(api, ann, turn, *[("PERSON_MESSAGE", "y" * 10_000)] * 3)
        assert await summary.summarize(runtime, gateway, chat) == "saved"
        assert len(model_server.requests_for("summary")) == 2
        assert (await pack(api, ann, chat)).json()["summary"] == "Six long letters."
    finally:
        await gateway.close()


async def test_an_empty_summary_answer_is_asked_again_not_reused(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A saved summary call is reused only for text: an empty answer (the job says "empty") is
    asked again by the next job, as before saved calls were reused."""
    model_server.script("summary", Reply(text="   "), Reply(text="Three long letters."))
    _, chat, _ = await due_unswept_chat(api, runtime)
    gateway = _gateway(runtime, model_server)
    try:
        assert await summary.summarize(runtime, gateway, chat) == "empty"
        assert await summary.summarize(runtime, gateway, chat) == "saved"
        assert len(model_server.requests_for("summary")) == 2
    finally:
        await gateway.close()


async def test_context_pack_is_built_for_the_chats_audience(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    await fact(
        runtime,
        w.bot,
        "Ann wants answers in French",
        await said(api, w.tokens["ann"], private, "fr"),
        topics=("preferences",),
    )
    secret = await fact(
        runtime, w.bot, "Ann is job hunting", await said(api, w.tokens["ann"], private, "job")
    )
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    liked = await fact(
        runtime,
        w.bot,
        "The team likes bullet points",
        await said(api, w.tokens["bob"], group, "bullets"),
        topics=("preferences",),
    )
    ships = await fact(
        runtime, w.bot, "The team ships on Fridays", await said(api, w.tokens["bob"], group, "fridays")
    )
    model_server.reset()
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[
                ToolCall(
                    "rewrite_input",
                    {"text": "When do we ship? (Fridays, in bullets)", "used_entry_ids": [ships]},
                )
            ]
        ),
    )
    turn = await api.turn(w.tokens["ann"], group, "When do we ship?")
    assert turn["enrichedInput"] == "When do we ship? (Fridays, in bullets)"
    for name in ("ann", "bob"):
        got = (await pack(api, w.tokens[name], group)).json()
        assert [p["id"] for p in got["preferences"]] == [liked]
        assert set(got["memory"]["ids"]) == {liked, ships}
        assert (
            secret not in got["memory"]["ids"]
            and "French" not in json.dumps(got)
            and "job" not in got["memory"]["text"]
        )
        assert [m["text"] for m in got["lastMessages"]][-1] == "When do we ship?"
        assert "Fridays, in bullets" not in json.dumps(got)  # never the rewritten input (D9.16)
    # In Ann's private chat the pack is built for Ann: her preference and the team's.
    mine = (await pack(api, w.tokens["ann"], private)).json()
    assert {p["content"] for p in mine["preferences"]} == {
        "Ann wants answers in French",
        "The team likes bullet points",
    }
    assert (await pack(api, w.tokens["cat"], group)).status_code == 404
    data = await api.gql(
        "query($c: ID!) { contextPack(chatId: $c) { summary preferences { id } lastMessages { text } memory { ids } } }",
        {"c": group},
        w.tokens["bob"],
    )
    assert [p["id"] for p in data["contextPack"]["preferences"]] == [liked]
    assert len(data["contextPack"]["lastMessages"]) == 3


async def preference_hits(runtime: Runtime, bot: str, reader: memory.Reader) -> int:
    """The database hits of the preferences' statement (PROFILE) for ``reader``."""
    params = memory_q.preferences_params(bot_id=bot, limit=conversation.MAX_PREFERENCES, **reader.params)
    return await db_hits(runtime, memory_q.LOCKED_PREFERENCES, params)


async def test_preferences_follow_their_topic_and_are_found_without_the_other_entries(
    api: Api, runtime: Runtime
) -> None:
    """An entry is one of contextPack's preferences while its topics hold ``preferences``
    (D9.17): learned so, given the topic (SetTopics, RenameTopic) or losing it; a pack holds the
    first MAX_PREFERENCES in memory order. They are found by their label
    (``entry_preference_audience``): sixty more entries of the Bot add fewer than sixty database
    hits to the statement (the tag filter over every visible entry added them all), and an
    upgrade labels the ones written before it (migration 12)."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    src = await said(api, ann, chat, "short please")
    short = await fact(runtime, w.bot, "Ann likes short answers", src, topics=("preferences",))
    tea = await fact(runtime, w.bot, "Ann drinks tea", src, topics=("drinks",))

    async def preferences() -> set[str]:
        got = await pack(api, ann, chat)
        assert got.status_code == 200, got.text
        return {p["id"] for p in got.json()["preferences"]}

    assert await preferences() == {short}
    await apply(runtime, w.bot, SetTopics(tea, ("preferences", "drinks")))
    assert await preferences() == {short, tea}
    await apply(runtime, w.bot, SetTopics(short, ("style",)))
    assert await preferences() == {tea}
    await apply(runtime, w.bot, RenameTopic("style", "preferences", w.org))
    assert await preferences() == {short, tea}
    await apply(runtime, w.bot, RenameTopic("preferences", "likes", w.org))
    assert await preferences() == set()
    await apply(runtime, w.bot, RenameTopic("likes", "preferences", w.org))
    assert await preferences() == {short, tea}

    reader = await memory.chat_reader(runtime, chat)
    assert reader is not None
    before = await preference_hits(runtime, w.bot, reader)
    await apply(
        runtime, w.bot, *(AddFact(content=f"Ann fact {k}", sources=(ItemRef(*src),)) for k in range(60))
    )
    assert await preference_hits(runtime, w.bot, reader) < before + 60
    assert await preferences() == {short, tea}

    many = [
        AddFact(content=f"Ann likes format {k}", sources=(ItemRef(*src),), topics=("preferences",))
        for k in range(conversation.MAX_PREFERENCES + 1)
    ]
    await apply(runtime, w.bot, *many)
    assert await preferences() == {c.id for c in many[1:]}  # the first 20 in memory order: the newest
    await apply(runtime, w.bot, *(SetTopics(c.id, ()) for c in many))
    assert await preferences() == {short, tea}

    await runtime.driver.execute_query("MATCH (e:Entry {botId: $b}) REMOVE e:Preference", b=w.bot)
    assert await preferences() == set()
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 11")
    assert await migrate(runtime.driver) == LATEST
    assert await preferences() == {short, tea}
