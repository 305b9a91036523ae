"""A model answer as a whole (learning/protocol.py, D9.10): one violation rejects it, nothing of
the model's text leaks into a violation, and no answer can raise anything but a Violation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from learning.protocol import MAX_TOOL_CALLS, TOOLS, Violation
from services.changes import MemoryChange, check_topics
from services.errors import BadInput
from tests.unit.protocol_helpers import KEPT, call, fact, refused, run


def test_one_violation_rejects_the_whole_answer_and_names_its_call() -> None:
    assert refused(fact(["i-1"]), fact(["i-1"]), fact(["i-2"])) == (
        "not_evidence",
        "tool_calls[2].source_item_ids[0]",
    )


def test_too_many_calls() -> None:
    assert len(run(*[fact(["i-1"], call_id=f"c{n}") for n in range(MAX_TOOL_CALLS)])) == MAX_TOOL_CALLS
    calls = [fact(["i-1"], call_id=f"c{n}") for n in range(MAX_TOOL_CALLS + 1)]
    assert refused(*calls) == ("too_many_calls", "tool_calls")


def test_a_violation_never_carries_the_models_text() -> None:
    with pytest.raises(Violation) as caught:
        run(fact(["i-1"], ["Secret Plan"]))
    assert "Secret" not in str(caught.value) and "tea" not in str(caught.value)


@given(st.text(max_size=80) | st.from_regex(r"[a-z0-9-]{1,70}", fullmatch=True))
@example("tea-time")
@example("a" * 64)
@example("a" * 65)
@example("for:bot")
@example("Tea")
def test_the_models_topic_check_agrees_with_the_services(topic: str) -> None:
    try:
        check_topics((topic,))
        service_ok = True
    except BadInput:
        service_ok = False
    try:
        run(call("set_topics", {"entry_id": KEPT, "topics": [topic]}))
        model_ok = True
    except Violation:
        model_ok = False
    assert model_ok == service_ok


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=15), inner, max_size=4),
    max_leaves=10,
)
#: Every argument any tool declares, with values that are sometimes right.
NAMES = sorted({name for tool in TOOLS for name in tool["function"]["parameters"]["properties"]})
ARGS = st.fixed_dictionaries(
    {},
    optional={
        name: JSON
        | st.sampled_from(["i-1", "i-3", KEPT, "c0", "tea"])
        | st.lists(st.sampled_from(["i-1", KEPT, "x:y"]))
        for name in NAMES
    },
)


@given(st.lists(st.tuples(st.sampled_from([tool["function"]["name"] for tool in TOOLS]), ARGS), max_size=4))
def test_any_answer_is_either_changes_or_a_violation(answer: list[tuple[str, dict[str, Any]]]) -> None:
    try:
        result: list[MemoryChange] | Violation = run(
            *[call(name, args, f"c{n}") for n, (name, args) in enumerate(answer)]
        )
    except Violation as exc:
        result = exc
    if isinstance(result, Violation):
        assert result.path.startswith("tool_calls[")
    else:
        assert len(result) == len(answer)
