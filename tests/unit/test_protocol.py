"""The check of every model answer (learning/protocol.py; DESIGN §7, L3, V6, V8, D9.2, D9.10):
what becomes a change, and which code and field path refuse the rest."""

from __future__ import annotations

import json
from typing import Any

import pytest

from learning import protocol
from learning.gateway import ToolCall
from learning.protocol import Violation, changes_from, within_chars
from services.changes import (
    AddFact,
    AddObservation,
    Invalidate,
    ItemRef,
    MemoryChange,
    RenameTopic,
    SetTopics,
    Share,
)
from tests.unit.protocol_helpers import CHAT, EVIDENCE, KEPT, ORG, call, fact, refused, run


def test_a_fact_rests_on_person_messages_with_app_results_as_support() -> None:
    [change] = run(fact(["i-1", "i-3", "i-1"], ["drinks", "drinks", "preferences"]))
    assert isinstance(change, AddFact)
    assert change.content == "likes tea"
    assert change.sources == (ItemRef(CHAT, "i-1"), ItemRef(CHAT, "i-3"))
    assert change.topics == ("drinks", "preferences")
    assert change.id.startswith("mem_")


@pytest.mark.parametrize(
    ("sources", "code", "path"),
    [
        (["i-2"], "not_evidence", "tool_calls[0].source_item_ids[0]"),  # the Bot's own words (L3)
        (["i-1", "i-4"], "not_evidence", "tool_calls[0].source_item_ids[1]"),  # a notice
        (["i-1", "i-5"], "not_evidence", "tool_calls[0].source_item_ids[1]"),  # a tool call
        (["i-3"], "app_result_alone", "tool_calls[0].source_item_ids"),  # D9.2
        (["i-1", "i-9"], "unknown_item", "tool_calls[0].source_item_ids[1]"),
        ([], "bad_list", "tool_calls[0].source_item_ids"),
        (["i-1", ""], "bad_string", "tool_calls[0].source_item_ids[1]"),
    ],
)
def test_a_fact_on_anything_but_person_evidence_is_refused(sources: list[str], code: str, path: str) -> None:
    assert refused(fact(sources)) == (code, path)


@pytest.mark.parametrize(
    ("topics", "code", "path"),
    [
        (["Not A Topic"], "bad_topic", "tool_calls[0].topics[0]"),
        (["ok", "for:bot"], "colon_tag", "tool_calls[0].topics[1]"),  # V8: colon tags are the server's
        (["a--b"], "bad_topic", "tool_calls[0].topics[0]"),
        (["-a"], "bad_topic", "tool_calls[0].topics[0]"),
        (["a" * 65], "bad_topic", "tool_calls[0].topics[0]"),
        ([f"t{n}" for n in range(21)], "too_many_topics", "tool_calls[0].topics"),
        ("tea", "bad_list", "tool_calls[0].topics"),
    ],
)
def test_topics_are_checked_v8(topics: Any, code: str, path: str) -> None:
    assert refused(fact(["i-1"], topics)) == (code, path)


def test_twenty_topics_of_64_characters_pass() -> None:
    [change] = run(fact(["i-1"], [f"{n:02d}" + "a" * 62 for n in range(20)]))
    assert isinstance(change, AddFact) and len(change.topics) == 20


def test_observations_cite_kept_entries_or_earlier_calls_of_the_same_answer() -> None:
    changes = run(
        fact(["i-1"], call_id="call-a"),
        call("add_observation", {"content": "c", "source_entry_ids": ["call-a", KEPT], "confidence": 1}),
    )
    added, observation = changes
    assert isinstance(added, AddFact) and isinstance(observation, AddObservation)
    assert observation.source_entry_ids == (added.id, KEPT)
    assert observation.confidence == 1.0 and isinstance(observation.confidence, float)


def test_a_later_call_cannot_be_cited_before_it_exists() -> None:
    obs = call("add_observation", {"content": "c", "source_entry_ids": ["call-b"], "confidence": 0.5})
    assert refused(obs, fact(["i-1"], call_id="call-b")) == (
        "unknown_entry",
        "tool_calls[0].source_entry_ids[0]",
    )


@pytest.mark.parametrize("confidence", [True, 1.5, -0.01, "0.5", None, float("nan"), float("inf")])
def test_confidence_is_a_number_from_0_to_1(confidence: Any) -> None:
    obs = call("add_observation", {"content": "c", "source_entry_ids": [KEPT], "confidence": confidence})
    assert refused(obs) == ("bad_confidence", "tool_calls[0].confidence")


def test_edits_of_kept_entries() -> None:
    assert run(
        call("invalidate", {"entry_id": KEPT}),
        call("set_topics", {"entry_id": KEPT, "topics": []}),
        call("rename_topic", {"from": "tea", "to": "drinks"}),
        call("share", {"entry_id": KEPT, "audience": ["for:bot", "for:channel:ch1"]}),
    ) == [
        Invalidate(KEPT),
        SetTopics(KEPT, ()),
        RenameTopic("tea", "drinks", ORG),
        Share(KEPT, ("for:bot", "for:channel:ch1")),
    ]


@pytest.mark.parametrize(
    ("tool_call", "code", "path"),
    [
        (call("forget", {"entry_id": KEPT}), "unknown_tool", "tool_calls[0].name"),
        (call("invalidate", "{not json"), "malformed_arguments", "tool_calls[0].arguments"),
        (call("invalidate", "[1]"), "malformed_arguments", "tool_calls[0].arguments"),
        (call("invalidate", "[" * 100_000), "malformed_arguments", "tool_calls[0].arguments"),
        (call("invalidate", {}), "missing_field", "tool_calls[0].entry_id"),
        (call("invalidate", {"entry_id": KEPT, "why": "x"}), "unknown_field", "tool_calls[0].<unknown>"),
        (  # the key is the model's words: never in a path, which is stored and logged (E4)
            call("add_fact", {"content": "x", "source_item_ids": ["i-1"], "Ann's passport is 55,12": 1}),
            "unknown_field",
            "tool_calls[0].<unknown>",
        ),
        (call("invalidate", {"entry_id": "mem_other"}), "unknown_entry", "tool_calls[0].entry_id"),
        (call("invalidate", {"entry_id": 7}), "bad_string", "tool_calls[0].entry_id"),
        (
            call("add_fact", {"content": " ", "source_item_ids": ["i-1"]}),
            "bad_string",
            "tool_calls[0].content",
        ),
        (
            call("add_fact", {"content": "x" * 4001, "source_item_ids": ["i-1"]}),
            "too_long",
            "tool_calls[0].content",
        ),
        (call("rename_topic", {"from": "chat:c1", "to": "x"}), "colon_tag", "tool_calls[0].from"),
        (call("rename_topic", {"from": "x", "to": "Y"}), "bad_topic", "tool_calls[0].to"),
        (
            call("share", {"entry_id": KEPT, "audience": ["org:o1"]}),
            "bad_audience",
            "tool_calls[0].audience[0]",
        ),
        (call("share", {"entry_id": KEPT, "audience": []}), "bad_list", "tool_calls[0].audience"),
    ],
)
def test_malformed_calls_are_refused_with_code_and_path(tool_call: ToolCall, code: str, path: str) -> None:
    assert refused(tool_call) == (code, path)


def test_a_request_takes_items_within_its_characters_and_always_its_first() -> None:
    items = [{"textLength": n} for n in (50, 30, 30, 10)]
    assert within_chars(items, 80) == items[:2]
    assert within_chars(items, 200) == items
    assert within_chars([{"textLength": 500}, {"textLength": 1}], 100) == [{"textLength": 500}]
    assert within_chars([], 100) == []


def test_an_entry_the_answer_invalidated_is_not_cited_after() -> None:
    """An answer that invalidates an entry (of the context, or a fact it adds) and then cites it as
    an observation's source is the answer's violation (``entry_inactive``), asked again and set
    aside (D9.21): only the commit refused it before (CONFLICT: a source no longer active), and
    every later step failed alike. Topics set on it, a share of it or a second invalidation are
    applied by the commit (``test_edits_of_kept_entries``), and an observation made before the
    invalidation is no contradiction (the invalidation reaches what rests on it)."""
    observe = {"content": "x", "source_entry_ids": [KEPT], "confidence": 0.5}
    invalidate = call("invalidate", {"entry_id": KEPT}, "i")
    assert refused(invalidate, call("add_observation", observe, "o")) == (
        "entry_inactive",
        "tool_calls[1].source_entry_ids[0]",
    )
    new_fact = fact(["i-1"], call_id="f")
    assert refused(
        new_fact,
        call("invalidate", {"entry_id": "f"}, "i"),
        call("add_observation", {**observe, "source_entry_ids": ["f"]}, "o"),
    ) == ("entry_inactive", "tool_calls[2].source_entry_ids[0]")
    before = run(call("add_observation", observe, "o"), invalidate)
    assert [type(c) for c in before] == [AddObservation, Invalidate]


def test_a_new_fact_is_shared_only_within_its_own_chats_audience() -> None:
    """A share of an entry the same answer adds: within the audience the evidence's Chat has (a
    new fact's sources are its Items) it is kept — the commit accepts it — and anything wider, or
    any share of a new observation (its sources are entries), is the answer's violation
    (``share_of_new_entry``): only the commit could refuse it, and every later step failed alike."""
    own = frozenset({"for:person:p1"})

    def shared(*calls: ToolCall) -> list[MemoryChange]:
        return changes_from(
            calls, chat_id=CHAT, evidence=EVIDENCE, context_ids={KEPT}, org=ORG, own_audience=own
        )

    new_fact = fact(["i-1"], call_id="f")
    [added, share] = shared(new_fact, call("share", {"entry_id": "f", "audience": ["for:person:p1"]}, "s"))
    assert isinstance(added, AddFact) and isinstance(share, Share) and share.entry_id == added.id
    with pytest.raises(Violation) as wider:
        shared(new_fact, call("share", {"entry_id": "f", "audience": ["for:bot"]}, "s"))
    assert (wider.value.code, wider.value.path) == ("share_of_new_entry", "tool_calls[1].entry_id")
    observation = call(
        "add_observation", {"content": "x", "source_entry_ids": [KEPT], "confidence": 0.5}, "o"
    )
    with pytest.raises(Violation) as of_observation:
        shared(observation, call("share", {"entry_id": "o", "audience": ["for:person:p1"]}, "s"))
    assert of_observation.value.code == "share_of_new_entry"


def test_a_learning_request_carries_what_the_bot_confided_within_its_bound() -> None:
    """The Bot's confessions show the memory Bot where to look (seed, L3): each with the Items of
    its Turn, the first always (cut to CONFIDED_CHARS), then the next while they fit; none, no key."""
    short = protocol.Confided(("i-1", "i-2"), "I broke the build.")
    long = protocol.Confided(("i-3",), "x" * (protocol.CONFIDED_CHARS + 10))

    def confided(*given: protocol.Confided) -> Any:
        body = protocol.request_body("system", [], [], [], given)
        return json.loads(body["messages"][1]["content"]).get("botConfided")

    assert confided() is None
    assert confided(short) == [{"during": ["i-1", "i-2"], "text": "I broke the build."}]
    [cut] = confided(long, short)
    assert len(cut["text"]) == protocol.CONFIDED_CHARS and cut["text"].endswith("…")
    assert confided(short, long) == [{"during": ["i-1", "i-2"], "text": "I broke the build."}]
    many = [protocol.Confided((f"i-{n}",), "y" * 3_000) for n in range(4)]
    assert [c["during"] for c in confided(*many)] == [["i-0"], ["i-1"]]
