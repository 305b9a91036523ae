"""The checks of memory changes before anything is applied (services/changes.py: V8, D9.2, D9.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.changes import (
    MAX_CONTENT_CHARS,
    AddFact,
    AddObservation,
    Forget,
    Invalidate,
    ItemRef,
    MemoryChange,
    Remember,
    RenameTopic,
    Revise,
    SetTopics,
    Share,
    check_content,
    check_topics,
    validate,
)
from services.errors import BadInput

WORD = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)
TOPIC = st.lists(WORD, min_size=1, max_size=4).map("-".join)
SRC = (ItemRef("chat_1", "i-1"),)


@given(st.lists(TOPIC, max_size=20))
def test_well_formed_topics_pass_deduplicated_in_order(topics: list[str]) -> None:
    assert check_topics(tuple(topics)) == tuple(dict.fromkeys(topics))


@pytest.mark.parametrize(
    ("topic", "message"),
    [
        ("Not A Topic", "lowercase"),
        ("Tea", "lowercase"),
        ("tea_time", "lowercase"),
        ("tea-", "lowercase"),
        ("-tea", "lowercase"),
        ("tea--time", "lowercase"),
        ("", "lowercase"),
        ("a" * 65, "lowercase"),
        ("for:bot", "colon"),  # V8: colon tags belong to the server
        ("chat:c1", "colon"),
    ],
)
def test_malformed_topics_are_bad_input(topic: str, message: str) -> None:
    with pytest.raises(BadInput, match=message) as caught:
        check_topics(("ok", topic), "tags")
    assert caught.value.field == "tags"


def test_a_topic_of_64_characters_passes() -> None:
    assert check_topics(("a" * 64,)) == ("a" * 64,)


def test_at_most_20_topics_counted_before_deduplication() -> None:
    assert len(check_topics(tuple(f"t{n}" for n in range(20)))) == 20
    with pytest.raises(BadInput, match="20"):
        check_topics(("same",) * 21)


def test_a_topic_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(BadInput):
        check_topics(("tea\n",))


@pytest.mark.parametrize("content", ["", "   ", "\n\t", "x" * (MAX_CONTENT_CHARS + 1)])
def test_bad_content(content: str) -> None:
    with pytest.raises(BadInput) as caught:
        check_content(content)
    assert caught.value.field == "content"


def test_content_up_to_the_limit_passes() -> None:
    assert check_content("x" * MAX_CONTENT_CHARS) == "x" * MAX_CONTENT_CHARS


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (AddFact("fact", ()), "sources"),  # D9.2: a fact rests on Items
        (AddFact(" ", SRC), "content"),
        (AddFact("fact", SRC, ("Bad",)), "topics"),
        (AddObservation("obs", (), 0.5), "sourceEntryIds"),
        (AddObservation("obs", ("mem_1",), 1.01), "confidence"),
        (AddObservation("obs", ("mem_1",), -0.5), "confidence"),
        (AddObservation("obs", ("mem_1",), 0.5, ("for:bot",)), "topics"),
        (Remember("x" * (MAX_CONTENT_CHARS + 1), "p1", "o1"), "content"),
        (Remember("pin", "p1", "o1", ("org:o1",)), "topics"),
        (Revise("mem_1", ""), "content"),
        (SetTopics("mem_1", ("a b",)), "topics"),
        (RenameTopic("tea", "Drinks", "o1"), "topics"),
        (RenameTopic("from:p1", "tea", "o1"), "topics"),
    ],
)
def test_invalid_changes_name_their_field(change: MemoryChange, field: str) -> None:
    with pytest.raises(BadInput) as caught:
        validate(change)
    assert caught.value.field == field
    assert caught.value.extensions == {"code": "BAD_INPUT", "field": field}


@pytest.mark.parametrize(
    "change",
    [
        AddFact("fact", SRC, ("tea",)),
        AddObservation("obs", ("mem_1",), 0.0),
        AddObservation("obs", ("mem_1",), 1.0, ("tea", "tea")),
        Remember("pin", "p1", "o1", ("preferences",)),
        Revise("mem_1", "new"),
        SetTopics("mem_1", ()),
        RenameTopic("tea", "drinks", "o1"),
        Invalidate("mem_1"),
        Share("mem_1", ("for:bot",)),  # the audience is checked under the lock (V6)
        Forget("mem_1", "p1"),
    ],
)
def test_valid_changes_pass(change: MemoryChange) -> None:
    validate(change)


def test_new_entries_get_fresh_ids() -> None:
    first, second = AddFact("a", SRC), AddFact("a", SRC)
    assert first.id.startswith("mem_") and second.id.startswith("mem_") and first.id != second.id
    assert AddObservation("o", ("x",), 0.1).id != Remember("r", "p", "o").id
