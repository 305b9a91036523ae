"""Hostile model output (L3, V1, V6, V8, D9.2, D9.10, D9.21): one violation rejects the whole
answer and nothing of it is applied; the model is asked again with the violation (code and field
only) at most twice, then the evidence is set aside with the codes and the read position moves
past it (no poison pill); a failure that is not the answer's (the provider, the commit's latest
state) leaves the position for a later execution; the output's text is nowhere in the clear."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from learning.gateway import current_period
from learning.protocol import MAX_REASKS
from services.runtime import Runtime, now_ms
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
from tests.model_server import ModelServer, Recorded, Reply, ToolCall
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
        # Arguments that are not a string (null, an object) as a provider may send them: the
        # client does not check, and json.loads raised a TypeError past the step's checks — the
        # execution failed "internal" with the position unchanged, every later one alike.
        ("policy:malformed_arguments", lambda i: raw_call("add_fact", None)),
        ("policy:malformed_arguments", lambda i: raw_call("add_fact", {"content": CANARY})),
        (
            "policy:unknown_field",
            lambda i: learn(
                ("add_fact", {"content": CANARY, "source_item_ids": [i["person"]], "tags": ["x"]})
            ),
        ),
        (  # a key the model made up is its words: its path says <unknown> (E4, D9.21)
            "policy:unknown_field",
            lambda i: learn(("add_fact", {"content": "a fact", "source_item_ids": [i["person"]], CANARY: 1})),
        ),
        (
            "policy:bad_confidence",
            lambda i: learn(
                ("add_observation", {"content": CANARY, "source_entry_ids": [kept], "confidence": 7})
            ),
        ),
        # Refused only by the commit, it ended the execution failed with the position unchanged:
        # every later execution got the same share and failed again (a poison pill, D9.21).
        (
            "policy:share_outside_sources",
            lambda i: learn(("share", {"entry_id": kept, "audience": ["for:bot"]})),
        ),
        # A share of the fact the same answer adds (by its call's id): the shares' check before
        # the commit passed it by (not stored yet) and the commit refused it, every time.
        (
            "policy:share_of_new_entry",
            lambda i: Reply(
                tool_calls=[
                    ToolCall(
                        "add_fact", {"content": CANARY, "source_item_ids": [i["person"]]}, id="call_new"
                    ),
                    ToolCall("share", {"entry_id": "call_new", "audience": ["for:bot"]}),
                ]
            ),
        ),
        # An answer that invalidates an entry and then cites it ("she changed her mind"): the
        # commit refused it (no longer active), the execution failed with the position unchanged,
        # and every later step of the Chat got the same answer.
        (
            "policy:entry_inactive",
            lambda i: learn(
                ("invalidate", {"entry_id": kept}),
                ("add_observation", {"content": CANARY, "source_entry_ids": [kept], "confidence": 0.5}),
            ),
        ),
        # A valid fact followed by a violation: nothing of the step is applied (D9.10).
        (
            "policy:not_evidence",
            lambda i: learn(fact_call("a fine fact", i["person"]), fact_call(CANARY, i["bot"])),
        ),
        ("model:too_large", lambda i: Reply(text=CANARY + "x" * 10_000_000)),
    ]

    def raw_call(name: str, arguments: Any) -> Reply:
        """An answer of one tool call whose ``arguments`` are sent as the JSON value given."""
        call = {"id": "call_raw", "type": "function", "function": {"name": name, "arguments": arguments}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
        completion = {
            "id": "chatcmpl-raw",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted-model",
            "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return Reply(body=json.dumps(completion).encode())

    for n, (expected, reply) in enumerate(cases):
        chat = await api.chat(w.tokens["ann"], w.bot)
        notice_turn = await api.turn(platform, chat, "the Bot was updated", notice=True)
        await complete(api, platform, notice_turn["id"])
        # The scripted answers go only to requests about this case's Turn: work of earlier tests
        # still in flight (an idle Turn the sweeper queues) must not take them.
        said_now = f"book me a table for two, case {n:02d}"
        turn = await api.turn(platform, chat, said_now, actor=w.people["ann"])
        ids = await add_items(
            api,
            platform,
            turn["id"],
            ("BOT_MESSAGE", "booking now"),
            ("TOOL_CALL", "restaurants.book(2)"),
            ("TOOL_RESULT", "booked at 8pm", "restaurants"),
        )
        items = {"notice": "i-1", "person": "i-2", "bot": ids[0], "tool_call": ids[1], "app": ids[2]}
        refused = expected.startswith("policy:")
        model_server.script("learn", *[reply(items)] * (1 + MAX_REASKS if refused else 1), about=said_now)
        await confide(api, platform, turn["id"])
        await complete(api, platform, turn["id"])
        [x] = await wait_executions(runtime, turn["id"])
        if refused:  # asked again twice with the violation, then set aside; read on past it
            assert (x["status"], x["learned"], x.get("error")) == ("done", 0, None), (expected, x)
            [aside] = x["setAside"]
            codes = aside.split(":", 1)[1].split(",")
            assert len(codes) == 1 + MAX_REASKS and all(c.startswith(expected) for c in codes), aside
            assert CANARY not in aside
            asked = [r for r in model_server.requests_for("learn") if said_now in r.text]
            assert len(asked) == 1 + MAX_REASKS
            assert await position(runtime, w.bot, chat) == 5
        else:
            assert x["status"] == "failed", (expected, x)
            assert x["error"].startswith(expected), (expected, x["error"])
            assert CANARY not in x["error"]
            assert await position(runtime, w.bot, chat) == 0  # unchanged: a later confide learns it again

    assert await memory_bot_changes(runtime, w.bot) == before
    assert list(await visible(api, w.tokens["ann"], w.bot)) == [kept]
    # The canary is in no log, no Redis key or value, and not in Neo4j's files in the clear.
    assert files_containing(settings.data_dir / "logs", CANARY.encode()) == []
    for key in await runtime.redis.keys("*"):
        assert CANARY.encode() not in key
        dumped = await runtime.redis.dump(key)
        assert dumped is None or CANARY.encode() not in dumped
    assert files_containing(settings.data_dir / "neo4j", CANARY.encode()) == []


async def test_a_reask_the_provider_fails_leaves_the_evidence_for_a_later_confide(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: a refused answer is asked again (D9.21); when the provider fails that ask, the answer is
    not to blame: the step fails with the read position unchanged, as on a first ask, and a
    later execution learns the evidence. It set the evidence aside for good (``reask:``)."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I live in Faro")
    model_server.script(
        "learn",
        learn(fact_call("Ann lives in Faro", "i-99")),
        *[Reply(status=500)] * 3,
        about="I live in Faro",
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x.get("error"), x.get("setAside")) == ("failed", "model:provider_error", None), x
    assert await position(runtime, w.bot, chat) == 0
    turn2 = await api.turn(w.tokens["ann"], chat, "and I swim")
    model_server.script("learn", learn(fact_call("Ann lives in Faro", "i-1"), fact_call("Ann swims", "i-2")))
    await confide(api, w.tokens["ann"], turn2["id"])
    await complete(api, w.tokens["ann"], turn2["id"])
    [y] = await wait_executions(runtime, turn2["id"])
    assert (y["status"], y["learned"]) == ("done", 2), y
    assert sorted(e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()) == [
        "Ann lives in Faro",
        "Ann swims",
    ]


async def test_a_failed_step_is_learned_again_by_a_later_confide(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: the read position stays after a failure of the provider; the next execution reads that
    evidence again."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I live in Porto")
    model_server.script("learn", Reply(status=500), Reply(status=500), Reply(status=500))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "failed" and x["error"].startswith("model:")
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


LEARNING = (
    "query($c: ID!) { learning(chatId: $c) { turnId status learned error setAside { first last codes } } }"
)


async def test_a_refused_answer_is_asked_again_then_set_aside_and_learning_goes_on(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.21, the poison pill: a refused answer is asked again with the violation as a tool error
    (code and field, no content); a corrected answer is learned. Refused three times, the evidence
    is set aside with its codes, the read position moves past it and a later plain fact in the
    same chat is learned. The chat's owner sees it (GraphQL and REST); another person does not."""
    w = await memory_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    # 1. Refused once, then corrected.
    turn = await api.turn(w.tokens["ann"], chat, "I play the oboe")
    model_server.script(
        "learn",
        learn(fact_call("Ann plays the oboe " + CANARY, "i-9")),
        learn(fact_call("Ann plays the oboe", "i-1")),
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"], x.get("setAside")) == ("done", 1, None)
    first, again = model_server.requests_for("learn")[-2:]
    assert again.body["messages"][: len(first.body["messages"])] == first.body["messages"]
    answer, error = again.body["messages"][-2:]
    assert answer["role"] == "assistant" and answer["tool_calls"][0]["function"]["name"] == "add_fact"
    assert error == {
        "role": "tool",
        "tool_call_id": answer["tool_calls"][0]["id"],
        "content": "refused: unknown_item at tool_calls[0].source_item_ids[0]. "
        "Nothing of this answer was applied; answer again.",
    }
    # 2. Refused every time (it cites the Bot's own message): set aside, never learned.
    platform = await api.platform_token(w.org)
    poison = await api.turn(platform, chat, "Remember what you said", actor=w.people["ann"])
    [bot_item] = await add_items(api, platform, poison["id"], ("BOT_MESSAGE", "I am a bot"))
    model_server.script("learn", *[learn(fact_call("The bot is " + CANARY, bot_item))] * (1 + MAX_REASKS))
    await confide(api, platform, poison["id"])
    await complete(api, platform, poison["id"])
    [y] = await wait_executions(runtime, poison["id"])
    assert (y["status"], y["learned"]) == ("done", 0)
    assert await position(runtime, w.bot, chat) == 3
    # 3. A later plain fact in the same chat is learned (the refused evidence is not re-read).
    later = await api.turn(w.tokens["ann"], chat, "I moved to Lyon")
    model_server.script("learn", learn(fact_call("Ann moved to Lyon", "i-4")))
    await confide(api, w.tokens["ann"], later["id"])
    await complete(api, w.tokens["ann"], later["id"])
    [z] = await wait_executions(runtime, later["id"])
    assert (z["status"], z["learned"]) == ("done", 1)
    assert (
        "Remember what you said" not in model_server.requests_for("learn")[-1].body["messages"][1]["content"]
    )
    assert sorted(e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()) == [
        "Ann moved to Lyon",
        "Ann plays the oboe",
    ]
    # The owner's view: which evidence was set aside and why; codes only, no content.
    seen = await api.gql(LEARNING, {"c": chat}, w.tokens["ann"])
    by_turn = {e["turnId"]: e for e in seen["learning"]}
    assert by_turn[poison["id"]]["setAside"] == [
        {"first": 2, "last": 3, "codes": ["policy:not_evidence:tool_calls[0].source_item_ids[0]"] * 3}
    ]
    assert by_turn[turn["id"]]["setAside"] == [] and by_turn[turn["id"]]["learned"] == 1
    rest = await api.http.get(
        f"/v1/chats/{chat}/learning", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert rest.status_code == 200
    assert {x["turnId"]: x["setAside"] for x in rest.json()["executions"]}[poison["id"]][0]["first"] == 2
    # Pages say how many there are (a default page held the first 50, and nothing said so).
    total = len(rest.json()["executions"])
    assert total >= 2 and rest.json()["total"] == total
    newest = await api.http.get(
        f"/v1/chats/{chat}/learning?limit=1", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert newest.json() == {"executions": rest.json()["executions"][:1], "total": total}
    assert CANARY not in rest.text and CANARY not in str(seen)
    assert await api.codes(LEARNING, {"c": chat}, w.tokens["bob"]) == ["NOT_FOUND"]


def _filtered(marker: str, *, probe_too: bool) -> Callable[[Recorded], Reply]:
    """A provider whose content filter refuses (400) every learning request holding ``marker``
    (and, ``probe_too``, one without evidence: a provider refusing any request), and otherwise
    learns one fact from each person message it is sent."""

    def answer(request: Recorded) -> Reply:
        items = json.loads(request.body["messages"][1]["content"])["newItems"]
        if marker in request.text or (probe_too and not items):
            refusal = {
                "error": {"message": "filtered", "type": "invalid_request_error", "code": "content_filter"}
            }
            return Reply(status=400, body=json.dumps(refusal).encode())
        said_ = [i for i in items if i["kind"] == "person_message"]
        return learn(*(fact_call(i["text"], i["id"]) for i in said_))

    return answer


async def test_a_message_the_provider_refuses_is_found_and_set_aside(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.21, C6: the provider refuses a request whose evidence holds one message (a content
    filter: 400). The step failed with the read position unchanged, and every later execution of
    the Chat sent the same evidence and was refused again: the Chat learned nothing more. Now the
    step asks again with half as many Items until the one refused is alone; the provider takes
    the request without it, so it is set aside (``model:refused``) and the rest is learned."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    marker = "forbidden-" + secrets.token_hex(4)
    turn = await api.turn(ann, chat, "Ann drinks green tea.")
    await add_items(
        api,
        ann,
        turn["id"],
        ("PERSON_MESSAGE", f"Something {marker}."),
        ("PERSON_MESSAGE", "Ann hums jazz."),
        ("PERSON_MESSAGE", "Ann plays chess."),
    )
    model_server.respond("learn", _filtered(marker, probe_too=False))
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"], x.get("error"), x["setAside"]) == (
        "done",
        3,
        None,
        ["2-2:model:refused"],
    ), x
    assert sorted(e["content"] for e in (await visible(api, ann, w.bot)).values()) == [
        "Ann drinks green tea.",
        "Ann hums jazz.",
        "Ann plays chess.",
    ]
    assert await position(runtime, w.bot, chat) == 4
    # The asks, by how many Items each sent: all four (refused), half (refused), the first alone
    # (learned), the refused one alone (refused), the request without evidence (taken: the Item is
    # set aside), then a full step of what is left. Before, once the Item was set aside, the job
    # asked one Item at a time for the rest of it.
    asked = [
        len(json.loads(r.body["messages"][1]["content"])["newItems"])
        for r in model_server.requests_for("learn")
        if marker in r.text or "Ann drinks green tea." in r.text or "Ann plays chess." in r.text
    ]
    assert asked == [4, 2, 1, 1, 0, 2], asked


async def test_a_provider_refusing_every_request_sets_nothing_aside(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: a provider that refuses any request (a wrong setting, a bad key answered as 400) is not
    the evidence's doing: the step fails with the read position unchanged and nothing set aside,
    and a later execution learns the evidence once the provider takes it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    marker = "refused-" + secrets.token_hex(4)
    turn = await api.turn(ann, chat, f"Ann bakes rye bread, {marker}.")
    model_server.respond("learn", _filtered(marker, probe_too=True))
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x.get("error"), x.get("setAside")) == ("failed", "model:refused", None), x
    assert await position(runtime, w.bot, chat) == 0
    model_server.respond("learn", _filtered("nothing-refused-now", probe_too=False))
    turn2 = await api.turn(ann, chat, "Ann walks to work.")
    await confide(api, ann, turn2["id"])
    await complete(api, ann, turn2["id"])
    [y] = await wait_executions(runtime, turn2["id"])
    assert (y["status"], y["learned"]) == ("done", 2), y


async def test_a_reask_of_one_message_the_provider_refuses_sets_it_aside_without_a_probe(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.21: the first ask of one message was taken and its answer refused; the re-ask, grown by
    that answer, is refused by the provider (400). The message is set aside with the refusal's
    codes and ``reask:refused`` — the provider took its first request, so asking it again without
    evidence would tell nothing and cost a call."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    said_now = "Ann sings " + secrets.token_hex(4)
    turn = await api.turn(ann, chat, said_now)
    refusal = {"error": {"message": "too long", "type": "invalid_request_error"}}
    model_server.script(
        "learn",
        learn(fact_call("Ann sings", "i-99")),  # cites an Item it was not sent: refused, asked again
        Reply(status=400, body=json.dumps(refusal).encode()),
        about=said_now,
    )
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x.get("error")) == ("done", None), x
    [aside] = x["setAside"]
    assert aside.startswith("1-1:policy:unknown_item:") and aside.endswith(",reask:refused"), aside
    assert len([r for r in model_server.requests_for("learn") if said_now in r.text]) == 2
    assert await position(runtime, w.bot, chat) == 1


async def test_a_spent_budget_at_the_probe_waits_for_the_budget(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """L6: the budget spent (by other work) while the provider refused a message's request: the
    request without evidence, which would tell whether the message is to blame, is not sent, and
    the execution waits for the budget, its evidence kept. It ended ``failed: model:refused``, and
    the next execution searched for the refused message again."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    response = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "budget": {"period": "day", "limitMicros": 1000}},
        headers={"Authorization": f"Bearer {ann}"},
    )
    assert response.status_code == 200, response.text
    chat = await api.chat(ann, w.bot)
    marker = "spent-" + secrets.token_hex(4)
    turn = await api.turn(ann, chat, f"Ann hikes, {marker}.")
    loop = asyncio.get_running_loop()

    async def spend_it() -> None:
        await runtime.driver.execute_query(
            "CREATE (:Spend {botId: $b, period: $p, micros: 5000, unknownCalls: 0})",
            b=w.bot,
            p=current_period("day", now_ms()),
        )

    def refuse_and_spend(request: Recorded) -> Reply:
        if marker in request.text:  # the budget is spent while the refused call runs
            asyncio.run_coroutine_threadsafe(spend_it(), loop).result(10)
        return _filtered(marker, probe_too=True)(request)

    model_server.respond("learn", refuse_and_spend)
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"], statuses=("budget", "done", "failed", "skipped"))
    assert (x["status"], x.get("error"), x.get("setAside")) == ("budget", None, None), x
    assert await position(runtime, w.bot, chat) == 0
    probes = [
        r
        for r in model_server.requests_for("learn")
        if not json.loads(r.body["messages"][1]["content"])["newItems"]
    ]
    assert probes == []


async def test_the_learning_view_counts_only_what_the_owner_may_see(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """V10 for counts: a step learning from Ann's chat may change entries of others (its
    learningContext holds the organization's valid entries): an invalidation of Bob's private fact
    was counted in Ann's view of the execution, which told her such an entry existed and changed.
    The view counts the entries the execution added that she may see."""
    w = await memory_world(api, ("ann", "bob"))
    bobs = await fact(
        runtime,
        w.bot,
        "Bob's private plan",
        await said(api, w.tokens["bob"], await api.chat(w.tokens["bob"], w.bot), "plan"),
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I take the train")
    model_server.script(
        "learn", learn(("invalidate", {"entry_id": bobs}), fact_call("Ann takes the train", "i-1"))
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 2)  # two changes were made
    seen = await api.gql(LEARNING, {"c": chat}, w.tokens["ann"])
    assert [e["learned"] for e in seen["learning"]] == [1]  # before: 2, Bob's entry among them
