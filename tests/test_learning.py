"""Learning end to end (L2–L5, C4–C7, D9.2, D9.9, D9.10, D9.18): confide → the Turn completes →
the real worker asks the scripted model and applies what passes the server's checks."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from graph import learning as learning_q
from graph.driver import read
from graph.memory import TOP_RANK
from graph.migrations import LATEST, migrate
from learning.executions import CONTEXT_CHARS, CONTEXT_TOPICS, MOVED_REASKS
from learning.gateway import FIXED_CALM_ANSWER
from services.changes import Invalidate, MemoryChange, Remember
from services.crypto import Kind
from services.maintenance import LegacyEntry, import_legacy
from services.memory import cipher_of
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, bearer
from tests.conftest import WorkerProcess
from tests.learning_helpers import (
    add_items,
    complete,
    confide,
    executions,
    fact_call,
    first_item,
    learn,
    memory_bot_changes,
    memory_world,
    position,
    set_org,
    wait_executions,
)
from tests.memory_helpers import command, db_hits, fact, said, visible
from tests.model_server import ModelServer, Reply, ToolCall
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("learning_worker")


async def test_learning_waits_for_its_turn_to_complete_and_reads_what_came_after_the_confide(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """L2, D9.11: a confide queues its learning only once the Turn completes: until then the
    execution waits (no worker may take it), and the Items added to the Turn after the confide are
    among what the memory Bot reads."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Please book the train, not the plane.")
    item = await first_item(api, ann, chat)
    model_server.script("confide", Reply(text="That happens."))
    model_server.script("learn", learn(fact_call("Ann takes the train.", item)))
    await confide(api, ann, turn["id"], "I booked the plane.")
    assert [x["status"] for x in await executions(runtime, turn["id"])] == ["waiting"]
    [later] = await add_items(api, ann, turn["id"], ("BOT_MESSAGE", "I booked the train instead."))
    assert [x["status"] for x in await executions(runtime, turn["id"])] == ["waiting"]
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 1)
    [request] = model_server.requests_for("learn")
    read = [i["id"] for i in json.loads(request.body["messages"][1]["content"])["newItems"]]
    assert read == [item, later]


async def test_private_chat_learns_a_fact_for_its_person(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    w = await memory_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "Please always run the tests before saying done.")
    item = await first_item(api, w.tokens["ann"], chat)
    await add_items(api, w.tokens["ann"], turn["id"], ("BOT_MESSAGE", "I said done before testing, sorry."))
    model_server.script("confide", Reply(text="That happens. Tell Ann plainly and run the tests now."))
    model_server.script(
        "learn", learn(fact_call("Run the tests before reporting done.", item, topics=("testing",)))
    )
    answer = await confide(api, w.tokens["ann"], turn["id"], "I reported done without running the tests.")
    assert answer == "That happens. Tell Ann plainly and run the tests now."
    assert model_server.requests_for("learn") == []  # learning waits for the Turn (L2)
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done" and x["learned"] == 1
    mine = await visible(api, w.tokens["ann"], w.bot)
    [entry] = mine.values()
    assert entry["content"] == "Run the tests before reporting done."
    assert set(entry["tags"]) == {
        f"from:{w.people['ann']}",
        f"for:person:{w.people['ann']}",
        f"org:{w.org}",
        f"chat:{chat}",
        "testing",
    }
    assert entry["sources"] == [{"chat": chat, "item": item}]
    assert await visible(api, w.tokens["bob"], w.bot) == {}
    # The request listed the new Items with ids, kinds and speakers (§7) and carried the task header.
    [request] = model_server.requests_for("learn")
    assert request.body["model"] == "test-model"
    asked = json.loads(request.body["messages"][1]["content"])
    listed = asked["newItems"]
    assert [(i["id"], i["kind"], i["speaker"]) for i in listed] == [
        (item, "person_message", f"person:{w.people['ann']}"),
        (f"i-{int(item[2:]) + 1}", "bot_message", "bot"),
    ]
    # What the Bot confided shows the memory Bot where to look (seed, L3): with the Items of its
    # Turn, and no id of its own to cite.
    assert asked["botConfided"] == [
        {"during": [item, f"i-{int(item[2:]) + 1}"], "text": "I reported done without running the tests."}
    ]
    assert "botConfided" in request.body["messages"][0]["content"]
    assert {t["function"]["name"] for t in request.body["tools"]} == {
        "add_fact",
        "add_observation",
        "invalidate",
        "set_topics",
        "rename_topic",
        "share",
    }
    assert await position(runtime, w.bot, chat) == int(item[2:]) + 1
    # The log names the memory Bot as the actor (C2).
    log = await api.http.get(
        f"/v1/bots/{w.bot}/memory/log", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert [c["actor"] for c in log.json()["changes"]] == ["memory_bot"]
    # Learning creates no Chat, Turn or Item (D9.18).
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (i:Item {chatId: $c}) RETURN count(i) AS items", c=chat
    )
    assert records[0]["items"] == 2
    # The model endpoint (it may carry credentials) is not in the worker's log (HTTP clients quiet).
    assert model_server.base_url.split("//")[1] not in learning_worker.log_path.read_text()


async def test_what_the_bot_confided_while_memory_was_off_never_reaches_a_learning_request(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    """L5: nothing confided while ``botMemory`` was off is learned from, whatever the setting is
    when the execution runs: a confession saved then (``memoryOff``, as Items are marked) is not
    in the Turn's ``botConfided``; one saved while it was on is."""
    model_server.reset()
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Please book the 9:40 train.")
    item = await first_item(api, ann, chat)
    model_server.default("confide", Reply(text="Calmly."))
    model_server.script("learn", learn(fact_call("Ann takes the 9:40 train.", item)))
    await confide(api, ann, turn["id"], "I booked the wrong train at first.")
    await set_org(api, w.org, bot_memory=False)
    await confide(api, ann, turn["id"], "Between us: I never check the timetable.")
    await set_org(api, w.org, bot_memory=True)
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done", x
    [request] = model_server.requests_for("learn")
    asked = json.loads(request.body["messages"][1]["content"])
    assert [c["text"] for c in asked["botConfided"]] == ["I booked the wrong train at first."]
    assert "timetable" not in json.dumps(request.body)


async def test_a_learning_steps_request_is_found_again_by_a_keyed_digest_that_history_deletion_drops(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C5 finds a step's saved call by its request; E1: by an HMAC under the Bot's data key, never
    by a plain hash (a SHA-256 of the request — the evidence, the kept entries — let anyone holding
    the store test a guessed message against it), and V13/D9.23: gone with the Chat's history."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I keep bees on the roof")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script("learn", learn(fact_call("Ann keeps bees", item)))
    await confide(api, w.tokens["ann"], turn["id"], "noted")
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"])
    [request] = model_server.requests_for("learn")
    canonical = json.dumps(request.body, sort_keys=True)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'learn'}) RETURN c.requestHash AS hash", b=w.bot
    )
    [stored] = [r["hash"] for r in records]
    cipher = await cipher_of(runtime, w.bot)
    assert stored == cipher.digest(Kind.MODEL_REQUEST, canonical)
    assert stored != hashlib.sha256(canonical.encode()).hexdigest()
    deleted = await api.gql(
        "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
    )
    assert deleted["deleteChatHistory"]["items"] >= 1
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'learn'}) RETURN c.requestHash AS hash, c.request AS request",
        b=w.bot,
    )
    assert [(r["hash"], r["request"]) for r in records] == [(None, None)]


async def test_a_purge_while_an_answer_is_being_given_leaves_none_of_the_entries_text(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.20 for work in flight: a confide answer (and its model call) drawing on an entry that is
    purged while the model answers was saved after the purge had stripped what existed, so the
    answer and the saved request kept the purged entry's text. The saves read, under the shared
    Memory lock, whether every entry they embed still exists; a purged one leaves them without it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    canary = "zq" + hashlib.sha256(w.bot.encode()).hexdigest()[:10]
    entry = await fact(runtime, w.bot, f"Ann's locker code is {canary}", await said(api, ann, source, "code"))
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "What was my locker code?")
    gate = threading.Event()
    model_server.script("confide", Reply(text="Calmly: you will find it.", hold=gate))
    answering = asyncio.create_task(confide(api, ann, turn["id"], "I could not find the locker code"))
    try:

        async def asked_once() -> bool | None:
            return bool(model_server.requests_for("confide")) or None

        await until(asked_once, "confide was never asked")
        asked = model_server.requests_for("confide")[-1]
        assert canary in asked.text  # the answer draws on the entry
        purged = await api.http.post(
            f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{source}"}, headers=bearer(ann)
        )
        assert purged.json() == {"removed": 1}, purged.text
    finally:
        gate.set()
    # The entry it was sent is gone when the answer comes back: the calm answer instead (L1).
    assert await answering == FIXED_CALM_ANSWER
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'confide'}) RETURN c.request IS NULL AS gone, c.entryIds AS used",
        b=w.bot,
    )
    assert [(r["gone"], r["used"]) for r in records if entry in (r["used"] or [])] == [(True, [entry])]
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (f:Confession {chatId: $c}) RETURN f.answer IS NULL AS gone, f.usedEntryIds AS used", c=chat
    )
    assert [(r["gone"], r["used"]) for r in records] == [(False, [])]


async def test_an_answer_drawing_on_a_fact_retracted_while_the_model_thought_is_not_given(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """L1, D9.15: the entries a confide answer was sent are checked again when it comes back, as a
    rewrite's are. Ann forgets her own fact (a retraction, V11) while the model answers: the
    answer that may quote it is not given — the calm answer is, and the confession keeps no
    entry. The same answer with the fact still there is given as the model wrote it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    code = await fact(runtime, w.bot, "Ann's safe code is 4471", await said(api, ann, source, "code"))
    chat = await api.chat(ann, w.bot)
    written = "Calmly: it is 4471, say so."
    for forget in (False, True):
        turn = await api.turn(ann, chat, "What was my safe code?")
        gate = threading.Event()
        model_server.script("confide", Reply(text=written, hold=gate))
        asked = len(model_server.requests_for("confide"))
        answering = asyncio.create_task(confide(api, ann, turn["id"], "I could not open the safe"))
        try:

            async def sent(asked: int = asked) -> bool | None:
                return len(model_server.requests_for("confide")) > asked or None

            await until(sent, "confide was never asked")
            assert "4471" in model_server.requests_for("confide")[-1].text
            if forget:
                forgotten = await command(api, ann, w.bot, {"_tag": "Forget", "id": code})
                assert forgotten.status_code == 200, forgotten.text
        finally:
            gate.set()
        assert await answering == (FIXED_CALM_ANSWER if forget else written)
        await complete(api, ann, turn["id"])
        await wait_executions(runtime, turn["id"])  # its learning asks no later test's model
    data = await api.gql(
        "query($c: ID!) { confessions(chatId: $c) { answer entryIds answeredBy } }", {"c": chat}, ann
    )
    # The first answer, read now, is checked again too: its fact is gone, and so is its text.
    assert sorted(data["confessions"], key=lambda c: c["answeredBy"]) == [
        {"answer": FIXED_CALM_ANSWER, "entryIds": [], "answeredBy": "fixed"},
        {"answer": None, "entryIds": [], "answeredBy": "model"},
    ]


async def test_an_answer_is_not_held_past_its_deadline_by_a_long_memory_change(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The saves of an answer someone waits on check, under the shared Memory lock, that the
    entries they embed still exist (D9.20); a long memory change (a purge, a relabelling) holding
    the lock would have held the answer past its deadline (seed 000: at most 15 seconds; 3 here).
    Past the deadline the model call is saved without its text, and an answer is given while the
    change still holds the lock: the calm one, as the entries the model's was sent cannot be
    checked again meanwhile (L1)."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    entry = await fact(runtime, w.bot, "Ann's locker is number 12", await said(api, ann, source, "locker"))
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Which locker was mine?")
    gate = threading.Event()
    model_server.script("confide", Reply(text="Calmly: it is written down.", hold=gate))
    answering = asyncio.create_task(confide(api, ann, turn["id"], "I forgot the locker"))

    async def asked() -> bool | None:
        return bool(model_server.requests_for("confide")) or None

    async with runtime.driver.session() as session:
        changing = await session.begin_transaction()  # a long memory change: the Memory held
        try:
            await until(asked, "confide was never asked")
            await changing.run("MATCH (m:Memory {id: $b}) SET m.version = m.version", b=w.bot)
            gate.set()
            # Its entries cannot be checked again while the change holds the Memory: the calm
            # answer, within the deadline (L1).
            assert await asyncio.wait_for(answering, 20) == FIXED_CALM_ANSWER
        finally:
            gate.set()
            await changing.rollback()
    # Nothing was left holding the memory: the next change commits (a save cancelled by the client
    # while Neo4j had it wait for the lock took the lock afterwards and held it about a minute).
    remembered = await command(api, ann, w.bot, {"_tag": "Remember", "content": "Ann's locker is now 14"})
    assert remembered.status_code == 201, remembered.text
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'confide'}) WHERE $e IN c.entryIds"
        " RETURN c.request IS NULL AS bare, c.purgedAt IS NULL AS unpurged",
        b=w.bot,
        e=entry,
    )
    assert [(r["bare"], r["unpurged"]) for r in records] == [(True, True)]
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (f:Confession {chatId: $c}) RETURN f.answer IS NULL AS bare, f.usedEntryIds AS used", c=chat
    )
    assert [(r["bare"], r["used"]) for r in records] == [(False, [])]  # the calm answer draws on none


async def test_group_chat_fact_is_for_the_channel_from_the_saved_actor(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A platform token starts the Turn as Bob and adds the Items: `from:` comes from the saved actor (V3)."""
    w = await memory_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    platform = await api.platform_token(w.org)
    chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    turn = await api.turn(platform, chat, "ann: the release moved to Tuesday", actor=w.people["bob"])
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script("learn", learn(fact_call("The release is on Tuesday.", item, topics=("release",))))
    await confide(api, platform, turn["id"])
    await complete(api, platform, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done"
    [entry] = (await visible(api, w.tokens["ann"], w.bot)).values()
    assert f"from:{w.people['bob']}" in entry["tags"] and f"from:{w.people['ann']}" not in entry["tags"]
    assert f"for:channel:{w.channel}" in entry["tags"] and f"channel:{w.channel}" in entry["tags"]
    assert list(await visible(api, w.tokens["bob"], w.bot)) == [entry["id"]]
    assert await visible(api, w.tokens["cat"], w.bot) == {}


async def test_observation_cites_an_earlier_call_and_the_context(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I like short answers")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script(
        "learn",
        learn(
            ("add_fact", {"content": "Ann likes short answers", "source_item_ids": [item]}),
        ),
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"])
    [first] = await visible(api, w.tokens["ann"], w.bot)
    # Second Turn: the context lists the kept entry; an observation cites it and a new fact (by call id).
    turn2 = await api.turn(w.tokens["ann"], chat, "and no emojis please")
    item2 = await first_item(api, w.tokens["ann"], chat)
    reply = learn(
        ("add_fact", {"content": "Ann wants no emojis", "source_item_ids": [item2]}),
        (
            "add_observation",
            {
                "content": "Ann prefers terse plain text",
                "source_entry_ids": [first, "call_fact"],
                "confidence": 0.7,
                "topics": ["style"],
            },
        ),
    )
    reply.tool_calls[0].id = "call_fact"
    model_server.script("learn", reply)
    await confide(api, w.tokens["ann"], turn2["id"])
    await complete(api, w.tokens["ann"], turn2["id"])
    [x] = await wait_executions(runtime, turn2["id"])
    assert x["status"] == "done", x.get("error")
    request = model_server.requests_for("learn")[-1]
    kept = json.loads(request.body["messages"][1]["content"])["keptEntries"]
    assert [e["id"] for e in kept] == [first] and kept[0]["content"] == "Ann likes short answers"
    seen = await visible(api, w.tokens["ann"], w.bot)
    [obs] = [e for e in seen.values() if e["layer"] == "observation"]
    assert obs["confidence"] == 0.7 and "style" in obs["tags"]
    assert {s["entry"] for s in obs["sources"]} == {
        first,
        next(i for i, e in seen.items() if e["content"] == "Ann wants no emojis"),
    }


async def test_nothing_to_learn_moves_the_read_position(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")
    model_server.script("learn", Reply(text="nothing here"))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done" and x["learned"] == 0
    assert await position(runtime, w.bot, chat) == 1
    assert await memory_bot_changes(runtime, w.bot) == []


async def test_a_bot_that_never_confides_learns_nothing(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "remember that I am vegetarian")
    await complete(api, w.tokens["ann"], turn["id"])
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN count(x) AS n", t=turn["id"]
    )
    assert records[0]["n"] == 0
    assert model_server.requests_for("learn") == []


async def test_bot_memory_off_answers_and_learns_nothing(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    await set_org(api, w.org, bot_memory=False)
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I am allergic to nuts")
    model_server.script("confide", Reply(text="Thank you. Carry on."))
    assert await confide(api, w.tokens["ann"], turn["id"]) == "Thank you. Carry on."
    await complete(api, w.tokens["ann"], turn["id"])
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN count(x) AS n", t=turn["id"]
    )
    assert records[0]["n"] == 0


async def test_bot_memory_switched_off_while_waiting_skips(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """`botMemory` is read again when the execution runs (D9.12)."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I am allergic to nuts")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.default("learn", learn(fact_call("Ann is allergic to nuts", item)))
    await confide(api, w.tokens["ann"], turn["id"])
    await set_org(api, w.org, bot_memory=False)
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "skipped"
    assert model_server.requests_for("learn") == []
    await set_org(api, w.org, bot_memory=True)
    assert await visible(api, w.tokens["ann"], w.bot) == {}


async def test_what_was_said_while_memory_was_off_is_never_learned(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Seed 000: with botMemory off "nothing is learned" — nor later: a confide after memory is
    switched back on reads on past the Items said meanwhile (they were evidence for it before)."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    await set_org(api, w.org, bot_memory=False)
    off = await api.turn(w.tokens["ann"], chat, "my door code is 4321")
    await confide(api, w.tokens["ann"], off["id"])
    await complete(api, w.tokens["ann"], off["id"])
    await set_org(api, w.org, bot_memory=True)
    on = await api.turn(w.tokens["ann"], chat, "I like green tea")
    item = "i-2"  # the second Item of the Chat: the door code was the first
    model_server.default("learn", learn(fact_call("Ann likes green tea", item)))
    await confide(api, w.tokens["ann"], on["id"])
    await complete(api, w.tokens["ann"], on["id"])
    [x] = await wait_executions(runtime, on["id"])
    assert x["status"] == "done"
    [request] = model_server.requests_for("learn")
    assert "4321" not in json.dumps(request.body) and "green tea" in json.dumps(request.body)
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann likes green tea"
    ]


async def test_model_null_gives_the_fixed_calm_answer_and_learns_nothing(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",), model=None)
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hi")
    answer = await confide(api, w.tokens["ann"], turn["id"])
    assert answer.startswith("Thank you for telling me.")
    await complete(api, w.tokens["ann"], turn["id"])
    assert model_server.requests == []
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN count(x) AS n", t=turn["id"]
    )
    assert records[0]["n"] == 0


async def test_review_chats_have_no_confide(api: Api, model_server: ModelServer) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot, review=True)
    turn = await api.turn(w.tokens["ann"], chat, "review this")
    codes = await api.codes(
        'mutation($t: ID!) { confide(turnId: $t, text: "hm") { answer } }', {"t": turn["id"]}, w.tokens["ann"]
    )
    assert codes == ["REVIEW_CHAT"]
    assert model_server.requests == []


async def test_the_turn_idle_timeout_counts_as_completed(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """An unfinished Turn counts as completed after the idle timeout (D9.11; 4 s in the suite)."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I work from Lisbon")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script("learn", learn(fact_call("Ann works from Lisbon", item)))
    await confide(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"], within=15)
    assert x["status"] == "done"
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann works from Lisbon"
    ]


async def test_instructions_reach_every_request(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    rule = "Decisions of the team may be shared with the team. Marker-7731."
    response = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "instructions": rule},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert response.status_code == 200, response.text
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"])
    tasks = [r.task for r in model_server.requests]
    assert tasks == ["confide", "learn"]
    for request in model_server.requests:
        assert rule in request.body["messages"][0]["content"]


async def test_purge_removes_saved_model_texts_and_answers_that_embed_the_entries(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.20: purge removes the entries, the saved model-call payloads and answers that embed them."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "My dog is called Bolt")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script("learn", learn(fact_call("Ann's dog is Bolt", item)))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"])
    [entry] = await visible(api, w.tokens["ann"], w.bot)
    # A later answer draws on it, and a later learning request embeds it.
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[ToolCall("rewrite_input", {"text": "walk Bolt the dog", "used_entry_ids": [entry]})]
        ),
    )
    turn2 = await api.turn(w.tokens["ann"], chat, "walk the dog")
    assert turn2["enrichedInput"] == "walk Bolt the dog"
    model_server.script("confide", Reply(text="Take Bolt out calmly."))
    await confide(api, w.tokens["ann"], turn2["id"], "I forgot the walk")
    await complete(api, w.tokens["ann"], turn2["id"])
    await wait_executions(runtime, turn2["id"])
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b}) RETURN c.task AS task, c.entryIds AS used, c.producedIds AS made,"
        " c.request IS NOT NULL AS kept ORDER BY c.at",
        b=w.bot,
    )
    calls = [dict(r) for r in records]
    assert [(c["task"], entry in (c["used"] or []) + (c["made"] or [])) for c in calls] == [
        ("confide", False),
        ("learn", True),
        ("rewrite", True),
        ("confide", True),
        ("learn", True),
    ]
    assert all(c["kept"] for c in calls)
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge",
        json={"tag": f"chat:{chat}"},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert purged.json() == {"removed": 1}
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b}) RETURN c.request IS NULL AS gone, c.result IS NULL AS noResult,"
        " c.costMicros AS cost, c.task AS task, c.requestHash IS NULL AS noHash ORDER BY c.at",
        b=w.bot,
    )
    assert [r["gone"] for r in records] == [False, True, True, True, True]
    # A purged learning step's keyed request digest goes with its request (it was kept before).
    assert [r["noHash"] for r in records if r["task"] == "learn"] == [True, True]
    assert all(r["cost"] == 20 for r in records)  # usage and cost stay for the budget
    confessions = await api.http.get(
        f"/v1/chats/{chat}/confessions", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert [(c["text"], c["answer"]) for c in confessions.json()["confessions"]] == [
        ("I got the dates wrong.", confessions.json()["confessions"][0]["answer"]),
        ("I forgot the walk", None),
    ]
    # A page says how many there are (a default page held the first 50, and nothing said so).
    assert confessions.json()["total"] == 2
    later = await api.http.get(
        f"/v1/chats/{chat}/confessions?limit=1&skip=1", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert later.json() == {"confessions": confessions.json()["confessions"][1:], "total": 2}
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (f:Confession {chatId: $c}) WHERE f.answerPurged RETURN count(f) AS n", c=chat
    )
    assert records[0]["n"] == 1
    # The rewrite that embedded it is gone; the person's own words stay (D9.20).
    rewrites = await api.http.get(
        f"/v1/chats/{chat}/enrichments", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert [(e["text"], e["original"]) for e in rewrites.json()["enrichments"]] == [(None, "walk the dog")]
    assert rewrites.json()["total"] == 1
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (n:Enrichment {chatId: $c}) RETURN n.text IS NULL AS gone", c=chat
    )
    assert [r["gone"] for r in records] == [True]


async def test_queue_and_change_messages_carry_ids_only(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """E4, D9.9: what the API and the worker send to Redis over a Turn's life — its enrichment,
    the confide answer, the learning job they queue, its run and the change it announces — names
    ids, never content: every command Redis receives meanwhile (MONITOR) is free of the secret
    word, the job is ``exec:<id>:<epoch>`` with JSON of ids, and the change event names ids."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    commands: list[str] = []
    watching = asyncio.Event()

    async def watch() -> None:
        async with runtime.redis.monitor() as monitor:
            watching.set()
            async for command in monitor.listen():
                commands.append(command["command"])

    watcher = asyncio.create_task(watch())
    pubsub = runtime.redis.pubsub()
    await pubsub.subscribe(f"botmemory:changes:{w.bot}")
    try:
        await asyncio.wait_for(watching.wait(), 30)
        turn = await api.turn(w.tokens["ann"], chat, "My secret word is PELICAN-42")
        item = await first_item(api, w.tokens["ann"], chat)
        model_server.script("learn", learn(fact_call("Ann's secret word is PELICAN-42", item)))
        await confide(api, w.tokens["ann"], turn["id"])
        await complete(api, w.tokens["ann"], turn["id"])
        [x] = await wait_executions(runtime, turn["id"])
        assert (x["status"], x["learned"]) == ("done", 1)
        data: bytes | None = None
        for _ in range(100):
            message = cast(
                dict[str, Any] | None, await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            )
            if message is not None:
                data = message["data"]
                break
        assert data is not None
        event = json.loads(data)
        assert set(event) == {"botId", "version", "ids", "removed"} and b"PELICAN" not in data
        # MONITOR shows commands in the order Redis ran them: the event's PUBLISH is among those
        # seen once a command sent after it is.
        await runtime.redis.echo(marker := "e4-" + x["id"])
        await until(lambda: asyncio.sleep(0, any(marker in c for c in commands)), "MONITOR lags", within=30)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert [c for c in commands if "PELICAN" in c] == []
    queued = [c for c in commands if f"arq:job:exec:{x['id']}:" in c and '"f"' in c]
    assert queued, "the learning job was not queued through Redis"
    assert all(f'"f":"run_execution","a":["{x["id"]}",' in c.replace(" ", "") for c in queued), queued
    assert any(f"botmemory:changes:{w.bot}" in c and "PUBLISH" in c.upper() for c in commands)


async def linked_guest(api: Api, bot: str) -> str:
    """A new organization the Bot is linked into (D9.4)."""
    guest_org = await api.organization("guest")
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": bot, "o": guest_org},
    )
    return guest_org


async def test_learning_context_is_the_first_300_valid_entries_of_the_chats_organization(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """L4, D9.14, V9: 300 entries in memory order, topic counts over all valid ones, never legacy
    entries or another organization's."""
    w = await memory_world(api, ("ann",))
    guest_org = await linked_guest(api, w.bot)
    ann = w.people["ann"]
    notes: list[MemoryChange] = [Remember(f"note {n}", ann, w.org, ("bulk",)) for n in range(305)]
    notes.append(Remember("guest note", "p_guest", guest_org, ("bulk", "guest")))
    await apply_changes(runtime, w.bot, notes, "person")
    await import_legacy(
        runtime, w.bot, [LegacyEntry("legacy note", ("for:bot", f"org:{w.org}", "bulk", "old"))]
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"])
    [request] = model_server.requests_for("learn")
    body = json.loads(request.body["messages"][1]["content"])
    assert [e["content"] for e in body["keptEntries"]] == [f"note {n}" for n in range(304, 4, -1)]
    assert body["topicCounts"] == [{"topic": "bulk", "count": 305}]
    assert all(
        set(e) <= {"id", "layer", "content", "topics", "audience", "confidence", "said"}
        for e in body["keptEntries"]
    )


async def test_a_rename_reaches_only_what_the_learning_of_its_organization_is_shown(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """L4: a step's ``rename_topic`` renames every entry with the topic that the learning of the
    Chat's organization is shown (valid in it, beyond the first 300), never another
    organization's entry on a Bot linked into both, nor an entry that is no longer valid (its
    history keeps the topic it had). It renamed every entry of the Bot: a person of one
    organization could steer the model into rewriting another's private entries' tags."""
    model_server.reset()
    w = await memory_world(api, ("ann",))
    guest_org = await linked_guest(api, w.bot)
    ann = w.people["ann"]
    kept, gone = Remember("kept", ann, w.org, ("bulk",)), Remember("gone", ann, w.org, ("bulk", "old"))
    guest = Remember("guest note", "p_guest", guest_org, ("bulk",))
    await apply_changes(runtime, w.bot, [kept, gone, guest], "person")
    await apply_changes(runtime, w.bot, [Invalidate(gone.id)], "memory_bot")
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "call it a heap")
    model_server.script("learn", learn(("rename_topic", {"from": "bulk", "to": "heap"})))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done", x
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN e.id AS id, [t IN e.tags WHERE NOT t CONTAINS ':'] AS topics",
        b=w.bot,
    )
    assert {r["id"]: r["topics"] for r in records} == {
        kept.id: ["heap"],
        gone.id: ["bulk", "old"],
        guest.id: ["bulk"],
    }


async def test_learning_context_seeks_the_valid_entries_of_its_organization(
    api: Api, runtime: Runtime
) -> None:
    """L4 through ``entry_valid`` (botId, validOrg, memoryRank; migration 14) and the kept topic
    counts (``graph.topics``): ``validOrg``, set with the labels, and the counts follow an
    invalidation; sixty entries that are not valid for the Chat's organization (another
    organization's) add fewer than sixty database hits to learningContext (the filter over every
    entry of the Bot read each of them); a store upgraded from version 13 gets ``validOrg``, the
    counts and the same context."""
    w = await memory_world(api, ("ann",))
    guest_org = await linked_guest(api, w.bot)
    notes = [Remember(f"note {n}", w.people["ann"], w.org, ("bulk",) if n % 2 else ()) for n in range(6)]
    await apply_changes(runtime, w.bot, list(notes), "person")

    async def context() -> tuple[list[str], list[learning_q.TopicCount]]:
        context = await read(
            runtime.driver,
            lambda tx: learning_q.learning_context(
                tx, bot_id=w.bot, org=w.org, limit=300, chars=CONTEXT_CHARS, topics=CONTEXT_TOPICS
            ),
        )
        return [e["id"] for e in context["entries"]], context["topics"]

    async def hits() -> int:
        params = {
            "botId": w.bot, "org": w.org, "limit": 300, "chars": CONTEXT_CHARS, "topics": CONTEXT_TOPICS, "top": TOP_RANK
        }  # fmt: skip
        return await db_hits(runtime, learning_q.LEARNING_CONTEXT, params)

    assert await context() == ([n.id for n in reversed(notes)], [{"topic": "bulk", "count": 3}])
    await apply_changes(runtime, w.bot, [Invalidate(notes[5].id), Invalidate(notes[0].id)], "memory_bot")
    now = await context()
    assert now == ([n.id for n in reversed(notes[1:5])], [{"topic": "bulk", "count": 2}])

    before = await hits()
    guests = [Remember(f"guest {n}", "p_guest", guest_org, ("bulk",)) for n in range(60)]
    await apply_changes(runtime, w.bot, list(guests), "person")
    assert await hits() < before + 60
    assert await context() == now

    await runtime.driver.execute_query("MATCH (e:Entry {botId: $b}) REMOVE e.validOrg", b=w.bot)
    await runtime.driver.execute_query("MATCH (c:TopicCount {botId: $b}) DELETE c", b=w.bot)
    assert await context() == ([], [])
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 13")
    assert await migrate(runtime.driver) == LATEST
    assert await context() == now


async def test_learning_context_holds_what_a_model_takes(api: Api, runtime: Runtime) -> None:
    """L4 within bounds: 300 long pinned entries and every topic of a long-lived Bot made a request
    no model takes, and every learning step of the organization failed (the provider refused it
    even without evidence). The entries stop at the first that does not fit their characters (the
    first always, as ``context``, N3) and the topics are the most used ones; their counts still
    cover every valid entry."""
    w = await memory_world(api, ("ann",))
    ann = w.people["ann"]
    topics = [("alpha",)] * 3 + [("beta",)] * 2 + [("gamma",)]
    notes = [Remember(f"{n} " + "x" * 998, ann, w.org, t) for n, t in enumerate(topics)]
    await apply_changes(runtime, w.bot, list(notes), "person")
    newest_first = [n.id for n in reversed(notes)]

    async def context(chars: int, topics: int) -> tuple[list[str], list[tuple[str, int]]]:
        found = await read(
            runtime.driver,
            lambda tx: learning_q.learning_context(
                tx, bot_id=w.bot, org=w.org, limit=300, chars=chars, topics=topics
            ),
        )
        return [e["id"] for e in found["entries"]], [(t["topic"], t["count"]) for t in found["topics"]]

    everything = await context(CONTEXT_CHARS, CONTEXT_TOPICS)
    assert everything == (newest_first, [("alpha", 3), ("beta", 2), ("gamma", 1)])
    assert await context(2_500, 2) == (newest_first[:2], [("alpha", 3), ("beta", 2)])
    assert (await context(10, 1))[0] == newest_first[:1]  # the first, however long


async def test_the_model_learns_when_each_item_and_entry_was_said(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.31: the learning request carries when each new Item was said (UTC, to the minute; a
    history imported gives its own times) and the day of each kept entry, so the model can keep
    "yesterday" with the day it was said; the fact learned is dated by its Item."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    june_16 = 1_686_923_760_000  # 16 June 2023, 13:56 UTC
    kept = await fact(runtime, w.bot, "Ann owns a red kayak", await said(api, w.tokens["ann"], chat, "kayak"))
    turn = await api.turn(w.tokens["ann"], chat, "I paddled to the island yesterday", said_at=june_16)
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script(
        "learn", learn(fact_call("Ann paddled to the island yesterday, said on 2023-06-16", item))
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done", x.get("error")
    body = json.loads(model_server.requests_for("learn")[-1].body["messages"][1]["content"])
    assert [(i["id"], i["said"]) for i in body["newItems"]][-1] == (item, "2023-06-16T13:56Z")
    entries = await api.gql(
        "query($b: ID!) { memory(botId: $b) { entries { id content saidAt } } }",
        {"b": w.bot},
        w.tokens["ann"],
    )
    dated = {e["content"]: e for e in entries["memory"]["entries"]}
    assert dated["Ann paddled to the island yesterday, said on 2023-06-16"]["saidAt"] == june_16
    [held] = [e for e in body["keptEntries"] if e["id"] == kept]
    assert (
        held["said"]
        == datetime.fromtimestamp(dated["Ann owns a red kayak"]["saidAt"] / 1000, UTC).date().isoformat()
    )


async def test_the_model_reads_each_items_time_where_it_was_said(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.32: an Item said in a known time zone reaches the learning model in that zone's local
    time with its offset (its "yesterday" is that local day's), one without a zone in UTC."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    await api.gql('mutation { setTimeZone(timeZone: "America/Los_Angeles") { id } }', None, ann)
    chat = await api.chat(ann, w.bot)
    june_16 = 1_686_923_760_000  # 16 June 2023, 13:56 UTC
    turn = await api.turn(ann, chat, "I paddled to the island yesterday", said_at=june_16)
    item = await first_item(api, ann, chat)
    await add_items(api, ann, turn["id"], ("BOT_MESSAGE", "Lovely!"))
    model_server.script(
        "learn", learn(fact_call("Ann paddled to the island yesterday, said on 2023-06-16", item))
    )
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done", x.get("error")
    body = json.loads(model_server.requests_for("learn")[-1].body["messages"][1]["content"])
    said_of = {i["id"]: i["said"] for i in body["newItems"]}
    assert said_of[item] == "2023-06-16T06:56-07:00"
    assert [v for k, v in said_of.items() if k != item] and all(
        v.endswith("Z") for k, v in said_of.items() if k != item
    )  # the Bot's words: no person's zone


async def _texts_of_calls(runtime: Runtime, bot: str) -> list[str]:
    """Every saved model call's request and result of the Bot, decrypted."""
    cipher = await cipher_of(runtime, bot)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b}) RETURN c.id AS id, c.request AS request, c.result AS result", b=bot
    )
    texts = [cipher.decrypt(Kind.MODEL_REQUEST, r["id"], r["request"]) for r in records if r["request"]]
    return texts + [cipher.decrypt(Kind.MODEL_RESULT, r["id"], r["result"]) for r in records if r["result"]]


async def test_a_purge_removes_a_learned_entry_from_the_refused_answers_of_its_step(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.20: a step whose first answer was refused (D9.21) and asked again commits the second; the
    entries it made were recorded on that call only, so a purge of them left their words in the
    refused answer's saved result (and in the re-ask's request, which carries it). Every call of
    the step is recorded as having made them now."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    canary = "zq" + hashlib.sha256(w.bot.encode()).hexdigest()[:10]
    turn = await api.turn(ann, chat, f"My PIN is {canary}")
    item = await first_item(api, ann, chat)
    said_pin = fact_call(f"Ann's PIN is {canary}", item)
    model_server.script(
        "learn",
        learn(said_pin, fact_call("a topic with a colon", item, topics=("for:bot",))),  # refused whole
        learn(said_pin),
    )
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 1), x
    assert sum(canary in t for t in await _texts_of_calls(runtime, w.bot)) >= 3  # asked, refused, re-asked
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{chat}"}, headers=bearer(ann)
    )
    assert purged.json() == {"removed": 1}, purged.text
    left = [t for t in await _texts_of_calls(runtime, w.bot) if canary in t]
    assert left == []  # before: the refused answer's result and the re-ask's request


@pytest.mark.parametrize("taken", ["purge", "forget"])
async def test_a_step_whose_context_was_taken_back_while_the_model_answered_asks_again(
    api: Api, runtime: Runtime, model_server: ModelServer, taken: str
) -> None:
    """D9.20, C7, V11: a step sends the model its learningContext; an entry of it purged, or
    taken back by its person (Forget), while the model answers was gone from their memory, but
    the answer could restate it as a new fact of this Chat, and it committed: the purged words
    were back, tagged with another chat; the forgotten ones were Ann's to see again under a new
    id (Forget: until session 56). A purge or take-back since the step read its inputs makes the
    commit stale: the step reads them again (without the entry) and asks again."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    canary = "zq" + hashlib.sha256(w.bot.encode()).hexdigest()[:10]
    code = await fact(runtime, w.bot, f"Ann's door code is {canary}", await said(api, ann, source, "code"))
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "I use the side door")
    item = await first_item(api, ann, chat)
    gate = threading.Event()
    model_server.script(
        "learn",
        learn(fact_call(f"Ann opens the side door with {canary}", item), hold=gate),
        learn(fact_call("Ann uses the side door", item)),
    )
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    try:
        await model_server.wait_for_requests("learn", 1)
        assert canary in model_server.requests_for("learn")[0].text  # the context holds the entry
        if taken == "purge":
            purged = await api.http.post(
                f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{source}"}, headers=bearer(ann)
            )
            assert purged.json() == {"removed": 1}, purged.text
        else:
            forgot = await command(api, ann, w.bot, {"_tag": "Forget", "id": code})
            assert forgot.status_code == 200, forgot.text
    finally:
        gate.set()
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 1), x
    asked = model_server.requests_for("learn")
    assert len(asked) == 2 and canary not in asked[1].text  # read again without it, asked again
    active = [e["content"] for e in (await visible(api, ann, w.bot)).values() if e["status"] == "active"]
    assert active == ["Ann uses the side door"]  # before: the restated door code


async def test_a_step_refused_by_a_change_made_while_the_model_answered_asks_again(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C7, D9.21: an answer built on a learningContext that another change (here another Chat's
    step invalidating the entry it observes on) made stale while the model answered is refused by
    the commit under the lock — which ended the execution ``failed``, its evidence unlearned until
    the Bot confided in that Chat again. The memory moved since the step read its inputs, so the
    step reads them again and asks again — at most MOVED_REASKS times a job, then it fails."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    door = await fact(runtime, w.bot, "Ann locks the front door", await said(api, ann, source, "locked"))
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "I use the side door now")
    item = await first_item(api, ann, chat)
    gate = threading.Event()
    observed = {"content": "Ann is careful with doors", "source_entry_ids": [door], "confidence": 0.7}
    model_server.script(
        "learn",
        learn(("add_observation", observed), hold=gate),
        learn(fact_call("Ann uses the side door", item)),
    )
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    try:
        await model_server.wait_for_requests("learn", 1)
        await apply_changes(runtime, w.bot, [Invalidate(door)], "memory_bot")
    finally:
        gate.set()
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"], x.get("error")) == ("done", 1, None), x
    asked = model_server.requests_for("learn")
    kept = [[e["id"] for e in json.loads(a.body["messages"][1]["content"])["keptEntries"]] for a in asked]
    assert kept == [[door], []]  # read again without it, asked again
    active = [e["content"] for e in (await visible(api, ann, w.bot)).values() if e["status"] == "active"]
    assert active == ["Ann uses the side door"]

    # Refused again and again while the memory keeps moving: each re-ask is a model call, so a
    # job asks at most MOVED_REASKS times more, then fails as before.
    model_server.reset()
    facts = [
        await fact(runtime, w.bot, f"Ann owns key {n}", await said(api, ann, source, "keys"))
        for n in range(3)
    ]
    again = await api.turn(ann, chat, "I lost a key")
    gates = [threading.Event() for _ in facts]
    model_server.script(
        "learn",
        *(
            learn(
                (
                    "add_observation",
                    {"content": "Ann loses keys", "source_entry_ids": [f], "confidence": 0.5},
                ),
                hold=g,
            )
            for f, g in zip(facts, gates, strict=True)
        ),
    )
    await confide(api, ann, again["id"])
    await complete(api, ann, again["id"])
    try:
        for n, (f, g) in enumerate(zip(facts, gates, strict=True)):
            await model_server.wait_for_requests("learn", n + 1)
            await apply_changes(runtime, w.bot, [Invalidate(f)], "memory_bot")
            g.set()
    finally:
        for g in gates:
            g.set()
    [y] = await wait_executions(runtime, again["id"])
    assert (y["status"], y["error"]) == ("failed", "rejected:CONFLICT"), y
    assert len(model_server.requests_for("learn")) == 1 + MOVED_REASKS
