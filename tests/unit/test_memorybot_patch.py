"""The memory-Bot settings PATCH body (services/memorybot.py ``parse_patch``; C3, D9.12, D9.13):
``expected`` plus the fields to change, absent = unchanged and null = none."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.errors import BadInput
from services.memorybot import MAX_CONCURRENCY, MAX_INSTRUCTIONS, parse_patch


def test_only_expected_changes_nothing() -> None:
    assert parse_patch({"expected": 0}) == (0, {})


def test_every_field_as_graph_properties() -> None:
    body = {
        "expected": 7,
        "instructions": "Be brief.",
        "concurrency": 3,
        "budget": {"period": "day", "limitMicros": 5},
    }
    assert parse_patch(body) == (
        7,
        {"instructions": "Be brief.", "concurrency": 3, "budgetPeriod": "day", "budgetLimitMicros": 5},
    )


def test_null_clears_a_field() -> None:
    assert parse_patch({"expected": 1, "instructions": None, "concurrency": None, "budget": None}) == (
        1,
        {"instructions": None, "concurrency": None, "budgetPeriod": None, "budgetLimitMicros": None},
    )


@pytest.mark.parametrize("blank", ["", "   ", "\n\t"])
def test_blank_instructions_are_none(blank: str) -> None:
    assert parse_patch({"expected": 1, "instructions": blank}) == (1, {"instructions": None})


def test_limits_are_inclusive() -> None:
    body = {
        "expected": 0,
        "instructions": "x" * MAX_INSTRUCTIONS,
        "concurrency": MAX_CONCURRENCY,
        "budget": {"period": "month", "limitMicros": 2**62 - 1},
    }
    assert parse_patch(body)[1]["budgetLimitMicros"] == 2**62 - 1
    assert parse_patch({"expected": 0, "concurrency": 1, "budget": {"period": "day", "limitMicros": 0}})[
        1
    ] == {
        "concurrency": 1,
        "budgetPeriod": "day",
        "budgetLimitMicros": 0,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "expected"),
        ({"expected": None}, "expected"),
        ({"expected": -1}, "expected"),
        ({"expected": True}, "expected"),  # a bool is not a version
        ({"expected": 1.0}, "expected"),
        ({"expected": "1"}, "expected"),
        ({"expected": 1, "model": "gpt"}, "model"),
        ({"expected": 1, "zeta": 1, "alpha": 2}, "alpha"),  # the first unknown field, by name
        ({"expected": 1, "instructions": 5}, "instructions"),
        ({"expected": 1, "instructions": "x" * (MAX_INSTRUCTIONS + 1)}, "instructions"),
        ({"expected": 1, "instructions": "a\x00b"}, "instructions"),
        ({"expected": 1, "concurrency": 0}, "concurrency"),
        ({"expected": 1, "concurrency": MAX_CONCURRENCY + 1}, "concurrency"),
        ({"expected": 1, "concurrency": True}, "concurrency"),
        ({"expected": 1, "concurrency": 2.0}, "concurrency"),
        ({"expected": 1, "budget": "day"}, "budget"),
        ({"expected": 1, "budget": {"period": "day"}}, "budget.limitMicros"),
        ({"expected": 1, "budget": {"period": "day", "limitMicros": 1, "x": 1}}, "budget.x"),
        ({"expected": 1, "budget": {"period": "week", "limitMicros": 1}}, "budget.period"),
        ({"expected": 1, "budget": {"period": None, "limitMicros": 1}}, "budget.period"),
        ({"expected": 1, "budget": {"period": "day", "limitMicros": -1}}, "budget.limitMicros"),
        ({"expected": 1, "budget": {"period": "day", "limitMicros": 2**62}}, "budget.limitMicros"),
        ({"expected": 1, "budget": {"period": "day", "limitMicros": 1.5}}, "budget.limitMicros"),
        ({"expected": 1, "budget": {"period": "day", "limitMicros": False}}, "budget.limitMicros"),
    ],
)
def test_bad_patches_name_their_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(BadInput) as caught:
        parse_patch(body)
    assert caught.value.field == field


JSON_VALUE = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.just(dict[str, Any]())
)
BODY = st.dictionaries(
    st.sampled_from(["expected", "instructions", "concurrency", "budget", "other"]),
    JSON_VALUE
    | st.integers(0, 2000)
    | st.fixed_dictionaries({"period": st.sampled_from(["day", "month", "year"]), "limitMicros": JSON_VALUE}),
)


@given(BODY)
def test_a_patch_changes_exactly_the_fields_it_names_or_is_bad_input(body: dict[str, Any]) -> None:
    try:
        result: tuple[int, dict[str, Any]] | BadInput = parse_patch(body)
    except BadInput as exc:
        result = exc
    if isinstance(result, BadInput):
        assert result.field
        return
    expected, values = result
    assert expected == body["expected"] and "other" not in body
    named = {"instructions", "concurrency"} & set(body)
    assert set(values) == named | ({"budgetPeriod", "budgetLimitMicros"} if "budget" in body else set())
