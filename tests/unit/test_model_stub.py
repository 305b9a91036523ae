"""The offline model's decisions (tools/model_stub.py, issue 18): which sentences of a learning
step become facts, in the third person, citing their Item; every answer passes the server's check
(DESIGN §7, D9.10); rewrites keep the input (N1); confide and summaries get a fixed text with no
memory words (D9.16); every answer has usage (L6). Also how ``make up`` points the API at it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from learning import protocol
from learning.enrichment import REWRITE_TOOL
from learning.gateway import ToolCall as GatewayCall
from learning.prompts import MEMORY_VOCABULARY
from learning.runner import CONFIDE_TOOL
from services.changes import AddFact, ItemRef
from services.settings import ModelPrice, Settings
from tools.devstack import model_env
from tools.model_server import Reply
from tools.model_stub import answer, facts, task_of, third_person
from tools.stores import STUB_MODEL, procs


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        ("I love sailing on Lake Geneva.", "Loves sailing on Lake Geneva."),
        (
            "I'm vegetarian, so please never suggest meat dishes to me.",
            "Is vegetarian, so please never suggest meat dishes to them.",
        ),
        ("I’ve got two kids", "Has got two kids."),
        ("I study law!", "Studies law."),
        ("I watch films with my sister.", "Watches films with their sister."),
        ("I really enjoy tea.", "Really enjoys tea."),
        ("I don't eat meat.", "Doesn't eat meat."),
        ("I was born in Rome.", "Was born in Rome."),
        ("I am a teacher and I am happy.", "Is a teacher and they are happy."),
        ("I think I like tea.", "Thinks they like tea."),
        ("My cat is grey.", "Their cat is grey."),
        ("We moved to Lyon with our dog.", "They moved to Lyon with their dog."),
        ("Our team standup moved to 9:30 every morning.", "Their team standup moved to 9:30 every morning."),
        ("I 3d-print boats.", "I 3d-print boats."),  # not a plain verb: the person's own words
    ],
)
def test_a_first_person_sentence_is_kept_in_the_third_person(said: str, kept: str) -> None:
    assert third_person(said) == kept


@pytest.mark.parametrize(
    "said",
    [
        "Do I like tea?",
        "I?",
        "Hello there.",
        "You are kind.",
        "Ice is cold.",
        "I, too, like it.",
        "",
        "I " * 300,
    ],
)
def test_anything_but_a_first_person_statement_is_no_fact(said: str) -> None:
    assert third_person(said) is None


def item(id: str, kind: str, text: str) -> dict[str, str]:
    return {
        "id": id,
        "kind": kind,
        "speaker": "person:p1" if kind == "person_message" else "bot",
        "text": text,
    }


ITEMS = [
    item("i-1", "person_message", "Hi! I love tea. Do you?\nMy dog is old."),
    item("i-2", "bot_message", "I love tea too."),  # the Bot's words are never facts (L3)
    item("i-3", "notice", "I am a notice."),  # a notice is never a person's words
    item("i-4", "tool_result", "I found 3 flights."),  # an App result never stands alone (D9.2)
    item("i-5", "person_message", "I love tea."),  # said again: one fact
    item("i-6", "person_message", "What time is it?"),
]


def test_each_person_sentence_cites_its_own_item_once() -> None:
    assert facts(ITEMS) == [("Loves tea.", "i-1"), ("Their dog is old.", "i-1")]
    assert facts(ITEMS, [{"id": "mem_1", "content": "loves tea."}]) == [("Their dog is old.", "i-1")]


def learn_body(items: list[dict[str, str]], kept: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    evidence = [protocol.EvidenceItem(i["id"], i["kind"].upper(), i["speaker"], i["text"]) for i in items]
    return protocol.request_body(protocol.LEARN_SYSTEM, evidence, kept or [], [])


def gateway_calls(reply: Reply) -> tuple[GatewayCall, ...]:
    return tuple(
        GatewayCall(
            f"call_{n}", c.name, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
        )
        for n, c in enumerate(reply.tool_calls)
    )


def test_a_learning_answer_passes_the_server_check() -> None:
    body = learn_body(ITEMS)
    reply = answer("learn", body)
    evidence = {
        i["id"]: protocol.EvidenceItem(i["id"], i["kind"].upper(), i["speaker"], i["text"]) for i in ITEMS
    }
    changes = protocol.changes_from(
        gateway_calls(reply), chat_id="chat_1", evidence=evidence, context_ids=set(), org="org_1"
    )
    assert [(c.content, c.sources) for c in changes if isinstance(c, AddFact)] == [
        ("Loves tea.", (ItemRef("chat_1", "i-1"),)),
        ("Their dog is old.", (ItemRef("chat_1", "i-1"),)),
    ]
    assert reply.usage is not None and min(reply.usage) > 0


def test_nothing_to_learn_and_a_reask_get_no_tool_call() -> None:
    body = learn_body([item("i-1", "person_message", "What time is it?")])
    assert answer("learn", body).tool_calls == []
    reask = protocol.reask_body(
        learn_body(ITEMS),
        None,
        gateway_calls(answer("learn", learn_body(ITEMS))),
        protocol.Violation("x", "tool_calls[0]"),
    )
    nothing = answer("learn", reask)
    assert nothing.tool_calls == [] and nothing.text


def test_rewrites_keep_the_input_and_answers_are_fixed_friendly_texts() -> None:
    rewrite = {"messages": [{"role": "user", "content": "{}"}], "tools": [REWRITE_TOOL]}
    assert answer("rewrite", rewrite).tool_calls == []  # no rewrite_input: the input is kept (N1)
    for task in ("confide", "summary", "chat"):
        reply = answer(task, {"messages": [{"role": "user", "content": "I made a mistake."}]})
        assert reply.text and not reply.tool_calls and reply.usage is not None
        assert not MEMORY_VOCABULARY.search(reply.text)  # D9.16


def test_the_bot_confides_once_then_replies_so_its_turn_is_learned() -> None:
    first = {"messages": [{"role": "user", "content": "I love tea."}], "tools": [CONFIDE_TOOL]}
    [call] = answer("chat", first).tool_calls
    assert call.name == "confide" and isinstance(call.arguments, dict) and call.arguments["text"]
    answered = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": None},
            {"role": "tool", "content": "ok"},
        ],
    }
    assert answer("chat", answered).tool_calls == [] and answer("chat", answered).text
    review = {"messages": first["messages"]}  # review chats offer no confide (L1)
    assert answer("chat", review).tool_calls == []


def test_without_the_task_header_the_offered_tools_name_the_task() -> None:
    assert task_of(None, learn_body(ITEMS)) == "learn"
    assert task_of(None, {"tools": [REWRITE_TOOL]}) == "rewrite"
    assert task_of(None, {"tools": [CONFIDE_TOOL]}) == "chat"
    assert task_of("summary", {"tools": [REWRITE_TOOL]}) == "summary"
    assert answer(None, learn_body(ITEMS)).tool_calls


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("BOTMEMORY_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BOTMEMORY_DATA_DIR", str(tmp_path))


@pytest.mark.usefixtures("clean_env")
def test_make_up_without_a_provider_points_the_services_at_the_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOTMEMORY_API_PORT", "20000")
    monkeypatch.setenv("BOTMEMORY_MODEL_PRICES", '{"gpt-4o-mini": {"input": 150000, "output": 600000}}')
    env = model_env(Settings())
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:20099/v1"
    assert procs(Settings())["model"].markers == ("-m tools.model_stub ", "--port 20099 ")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prices = Settings().model_prices  # what the API and the worker then read
    assert prices[STUB_MODEL] == prices["*"] == ModelPrice(input=0, output=0)  # a budget can be set
    assert prices["gpt-4o-mini"] == ModelPrice(input=150000, output=600000)


@pytest.mark.usefixtures("clean_env")
def test_with_a_provider_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.example.com/v1")
    assert model_env(Settings()) == {}
    monkeypatch.setenv("BOTMEMORY_MODEL_STUB_PORT", "23456")
    assert procs(Settings())["model"].markers[1] == "--port 23456 "
