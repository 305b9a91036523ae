"""Hostile model output (L3, V1, V6, V8, D9.2, D9.10): one violation rejects the whole step,
nothing is applied, the read position stays, and the output's text is nowhere in the clear."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest

from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api
from tests.learning_helpers import (
    add_items,
    complete,
    confide,
    fact_call,
    learn,
    memory_bot_changes,
    memory_world,
    position,
    wait_executions,
)
from tests.memory_helpers import fact, said, visible
from tests.model_server import ModelServer, Reply
from tests.test_encryption import files_containing

CANARY = "CANARY" + secrets.token_hex(10)


pytestmark = pytest.mark.usefixtures("learning_worker")


async def test_hostile_answers_are_rejected_whole(
    api: Api, runtime: Runtime, settings: Settings, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob"))
    other = await memory_world(api, ("eve",))
    foreign_chat = await api.chat(other.tokens["eve"], other.bot)
    foreign_entry = await fact(
        runtime, other.bot, "Eve's secret", await said(api, other.tokens["eve"], foreign_chat, "my secret")
    )
    platform = await api.platform_token(w.org)
    # A private fact of Ann already kept: the memory Bot may not share it with everyone (V6).
    kept_chat = await api.chat(w.tokens["ann"], w.bot)
    kept = await fact(
        runtime, w.bot, "Ann's private note", await said(api, w.tokens["ann"], kept_chat, "note")
    )
    before = await memory_bot_changes(runtime, w.bot)

    cases: list[tuple[str, Callable[[dict[str, str]], Reply]]] = [
        ("policy:colon_tag", lambda i: learn(fact_call(CANARY, i["person"], topics=("for:bot",)))),
        ("policy:bad_topic", lambda i: learn(fact_call(CANARY, i["person"], topics=("Not A Topic",)))),
        ("policy:not_evidence", lambda i: learn(fact_call(CANARY, i["bot"]))),
        ("policy:not_evidence", lambda i: learn(fact_call(CANARY, i["tool_call"]))),
        ("policy:not_evidence", lambda i: learn(fact_call(CANARY, i["notice"]))),
        ("policy:app_result_alone", lambda i: learn(fact_call(CANARY, i["app"]))),
        ("policy:unknown_item", lambda i: learn(fact_call(CANARY, "i-9999"))),
        ("policy:unknown_item", lambda i: learn(fact_call(CANARY, f"{foreign_chat}/i-1"))),
        (
            "policy:unknown_entry",
            lambda i: learn(
                (
                    "add_observation",
                    {"content": CANARY, "source_entry_ids": [foreign_entry], "confidence": 0.5},
                )
            ),
        ),
        ("policy:unknown_entry", lambda i: learn(("invalidate", {"entry_id": foreign_entry}))),
        ("policy:malformed_arguments", lambda i: learn(("add_fact", '{"content": "' + CANARY + '", '))),
        ("policy:unknown_tool", lambda i: learn(("drop_everything", {"why": CANARY}))),
        (
            "policy:unknown_field",
            lambda i: learn(
                ("add_fact", {"content": CANARY, "source_item_ids": [i["person"]], "tags": ["x"]})
            ),
        ),
        (
            "policy:bad_confidence",
            lambda i: learn(
                ("add_observation", {"content": CANARY, "source_entry_ids": [kept], "confidence": 7})
            ),
        ),
        ("rejected:CONFLICT", lambda i: learn(("share", {"entry_id": kept, "audience": ["for:bot"]}))),
        # A valid fact followed by a violation: nothing of the step is applied (D9.10).
        (
            "policy:not_evidence",
            lambda i: learn(fact_call("a fine fact", i["person"]), fact_call(CANARY, i["bot"])),
        ),
        ("model:too_large", lambda i: Reply(text=CANARY + "x" * 10_000_000)),
    ]
    for expected, reply in cases:
        chat = await api.chat(w.tokens["ann"], w.bot)
        notice_turn = await api.turn(platform, chat, "the Bot was updated", notice=True)
        await complete(api, platform, notice_turn["id"])
        turn = await api.turn(platform, chat, "book me a table for two", actor=w.people["ann"])
        ids = await add_items(
            api,
            platform,
            turn["id"],
            ("BOT_MESSAGE", "booking now"),
            ("TOOL_CALL", "restaurants.book(2)"),
            ("TOOL_RESULT", "booked at 8pm", "restaurants"),
        )
        items = {"notice": "i-1", "person": "i-2", "bot": ids[0], "tool_call": ids[1], "app": ids[2]}
        model_server.script("learn", reply(items))
        await confide(api, platform, turn["id"])
        await complete(api, platform, turn["id"])
        [x] = await wait_executions(runtime, turn["id"])
        assert x["status"] == "failed", (expected, x)
        assert x["error"].startswith(expected), (expected, x["error"])
        assert CANARY not in x["error"]
        assert await position(runtime, w.bot, chat) == 0  # unchanged: a later confide learns it again

    assert len(model_server.requests_for("learn")) == len(cases)
    assert await memory_bot_changes(runtime, w.bot) == before
    assert list(await visible(api, w.tokens["ann"], w.bot)) == [kept]
    # The canary is in no log, no Redis key or value, and not in Neo4j's files in the clear.
    assert files_containing(settings.data_dir / "logs", CANARY.encode()) == []
    for key in await runtime.redis.keys("*"):
        assert CANARY.encode() not in key
        dumped = await runtime.redis.dump(key)
        assert dumped is None or CANARY.encode() not in dumped
    assert files_containing(settings.data_dir / "neo4j", CANARY.encode()) == []


async def test_a_failed_step_is_learned_again_by_a_later_confide(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: the read position stays after a safe failure; the next execution reads that evidence."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I live in Porto")
    model_server.script("learn", learn(fact_call("x", "i-1", topics=("Bad:Topic",))))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "failed"
    turn2 = await api.turn(w.tokens["ann"], chat, "and I cycle to work")
    model_server.script(
        "learn", learn(fact_call("Ann lives in Porto", "i-1"), fact_call("Ann cycles to work", "i-2"))
    )
    await confide(api, w.tokens["ann"], turn2["id"])
    await complete(api, w.tokens["ann"], turn2["id"])
    [y] = await wait_executions(runtime, turn2["id"])
    assert y["status"] == "done"
    second = model_server.requests_for("learn")[-1]
    assert "I live in Porto" in second.body["messages"][1]["content"]
    assert sorted(e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()) == [
        "Ann cycles to work",
        "Ann lives in Porto",
    ]
    assert await position(runtime, w.bot, chat) == 2
