"""The opaque page cursor of GET memory (services/memory.py ``list_page``): a position in memory
order that round-trips, and anything else is BAD_INPUT on ``after``, never another error.

The public ``list_page`` needs the database, so its two private helpers are tested directly."""

from __future__ import annotations

import base64

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from graph.memory import TOP_RANK
from services.errors import BadInput
from services.memory import _cursor, _parse_cursor  # pyright: ignore[reportPrivateUsage]

ENTRY_ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,99}", fullmatch=True)
RANK = st.integers(min_value=0, max_value=TOP_RANK - 1)


def raw(text: str) -> str:
    """A cursor made by hand: what a client could send in place of one of ours."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@given(RANK, ENTRY_ID)
@example(0, "a")
@example(TOP_RANK - 1, "m" * 100)
def test_a_cursor_round_trips(rank: int, entry_id: str) -> None:
    cursor = _cursor(rank, entry_id)
    assert _parse_cursor(cursor) == (rank, entry_id)
    assert "=" not in cursor and len(cursor) <= 200  # unpadded url-safe base64, within the limit
    assert set(cursor) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_no_cursor_is_the_start() -> None:
    assert _parse_cursor(None) is None


def test_cursors_are_opaque_but_distinct() -> None:
    assert _cursor(5, "mem_a") != _cursor(5, "mem_b") != _cursor(6, "mem_a")
    assert "mem_a" not in _cursor(5, "mem_a")


@pytest.mark.parametrize(
    "after",
    [
        "",
        "!!!!",
        "a",  # one base64 character cannot be decoded
        raw("5"),  # no entry id
        raw("5:"),
        raw(":mem_1"),
        raw("x:mem_1"),
        raw("5.0:mem_1"),
        raw("-1:mem_1"),
        raw(f"{TOP_RANK}:mem_1"),
        raw("5:mem 1"),
        raw("5:mem_1:x"),
        raw("5:" + "m" * 101),
        base64.urlsafe_b64encode(b"5:\xff\xfe").decode(),  # not UTF-8
        _cursor(5, "mem_1")[:-1],  # cut to a length base64 cannot have
        _cursor(5, "m" * 100) + "A" * 100,  # longer than any cursor of ours
        "é" * 10,
    ],
)
def test_a_tampered_cursor_is_bad_input_on_after(after: str) -> None:
    with pytest.raises(BadInput) as caught:
        _parse_cursor(after)
    assert caught.value.field == "after"
    assert caught.value.message == "after is not a cursor of this listing"


@given(st.text(max_size=220))
def test_any_text_is_a_valid_position_or_bad_input(after: str) -> None:
    try:
        parsed: tuple[int, str] | BadInput | None = _parse_cursor(after)
    except BadInput as exc:
        parsed = exc
    if isinstance(parsed, BadInput):
        assert parsed.field == "after"
    else:
        assert parsed is not None
        rank, entry_id = parsed
        assert 0 <= rank < TOP_RANK and entry_id


@given(RANK, ENTRY_ID, st.data())
def test_a_changed_character_never_crashes(rank: int, entry_id: str, data: st.DataObject) -> None:
    cursor = _cursor(rank, entry_id)
    at = data.draw(st.integers(0, len(cursor) - 1))
    tampered = cursor[:at] + data.draw(st.characters()) + cursor[at + 1 :]
    try:
        parsed = _parse_cursor(tampered)
    except BadInput:
        return
    assert parsed is not None and 0 <= parsed[0] < TOP_RANK
