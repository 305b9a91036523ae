"""The dates an entry is found by and the dates a query names (services/datewords.py, D9.31)."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.crypto import Cipher, Keyring
from services.datewords import blind_days, blind_query, day_of, entry_terms, query_terms
from services.keywords import tokens

#: Saturday 6 December 2026, 10:00 UTC: "now" for the relative dates.
NOW = int(datetime(2026, 12, 6, 10, tzinfo=UTC).timestamp() * 1000)


def _cipher() -> Cipher:
    keyring = Keyring(os.urandom(32))
    return keyring.cipher("bot_dates", keyring.new_data_key("bot_dates"))


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("What did Maria share on 16 June, 2023?", ["@2023-06-16"]),
        ("What did John organize with his friends on May 8, 2022?", ["@2022-05-08"]),
        ("How long has John played drums as of 27 March, 2022?", ["@2022-03-27"]),
        ("on the 3rd of Sept. 2021", ["@2021-09-03"]),
        ("Jan 5th 2024 and 2024-02-29", ["@2024-01-05", "@2024-02-29"]),
        ("What is the board game John tried in September 2022?", ["@2022-09"]),
        ("in March, of 2023", ["@2023-03"]),
        ("What state did Joanna visit in summer 2021?", ["@2021-06", "@2021-07", "@2021-08"]),
        ("Which country did James visit in 2021?", ["@2021"]),
        ("what happened on the 16th of June", [f"@{y}-06-16" for y in range(2026, 1995, -1)]),
        ("on Feb 29", [f"@{y}-02-29" for y in range(2024, 1995, -4)]),
        ("at 1:56 pm on 8 May, 2023", ["@2023-05-08"]),
        ("what did I say yesterday, and last night?", ["@2026-12-05"]),
        ("3 days ago", ["@2026-12-03"]),
        ("a day ago", ["@2026-12-05"]),
        ("two weeks ago", [f"@{date(2026, 11, 22) + timedelta(n)}" for n in (3, 2, 1, 0, -1, -2, -3)]),
        ("last Tuesday", ["@2026-12-01"]),  # NOW is a Sunday
        ("last Sunday", ["@2026-11-29"]),
        ("last month", ["@2026-11"]),
        ("last year", ["@2025"]),
        ("last week", [f"@{date(2026, 11, 23) + timedelta(n)}" for n in range(7)]),
        ("2023-06-16T10:00Z", ["@2023-06-16"]),
        ("on May 2", [f"@{y}-05-02" for y in range(2026, 1995, -1)]),
        # Not dates: a month without a day or a year, a modal verb, numbers, impossible days,
        # decades, a month and a number that is no day; nor what people ask of the time to come.
        ("in June", []),
        ("May I ask what June said?", []),
        ("I have 12 cats and 3 dogs", []),
        ("on June 31, 2023 or 2023-02-30", []),
        ("Ask Jan 3 questions, tell May 2 jokes", []),
        ("music of the 1990s and the 1980's", []),
        ("Where should we eat tonight? Anything this week? Today?", []),
        ("6/7/2023", ["@2023"]),  # its year only: day first or month first is anyone's guess
    ],
)
def test_a_query_names_the_dates_it_names(text: str, terms: list[str]) -> None:
    assert query_terms(text, NOW) == terms


def test_last_month_in_january_is_the_december_before() -> None:
    january = int(datetime(2027, 1, 10, tzinfo=UTC).timestamp() * 1000)
    assert query_terms("last month", january) == ["@2026-12"]


@given(st.dates(min_value=date(1900, 1, 1), max_value=date(2099, 12, 31)))
def test_every_way_a_query_names_a_day_meets_the_entries_said_on_it(day: date) -> None:
    said = int(datetime(day.year, day.month, day.day, 23, 59, tzinfo=UTC).timestamp() * 1000)
    held = set(entry_terms(day_of(said)))
    month = day.strftime("%B")
    for named in (
        f"{day.day} {month}, {day.year}",
        f"{month} {day.day}, {day.year}",
        f"the {day.day}th of {month} {day.year}",
        f"{month[:3]} {day.day} {day.year}",
        day.isoformat(),
        f"{month} {day.year}",
        f"on {day.day} {month}",
        f"{month} {day.day}th",
        f"in {day.year}",
    ):
        terms = query_terms(named, NOW)
        if 1996 <= day.year <= 2026 or str(day.year) in named:  # a day without a year: the last 30
            assert set(terms) & held, named
        if str(day.year) in named:
            assert set(terms) <= held, named


@given(st.text())
def test_no_keyword_of_any_text_is_a_date_term(text: str) -> None:
    """Date terms begin with ``@``, which no keyword token holds: a number never meets a day."""
    assert not any("@" in t for t in tokens(text))


def test_an_entry_holds_its_days_terms_blinded_as_the_query_names_them() -> None:
    cipher = _cipher()
    june = int(datetime(2023, 6, 16, 13, 56, tzinfo=UTC).timestamp() * 1000)
    [held, again, other] = blind_days(cipher, [june, june + 3_600_000, june + 86_400_000])
    assert held == again != other  # one day's terms, whatever the hour
    assert set(blind_query(cipher, "What did Maria share on 16 June, 2023?", NOW)) <= set(held.split())
    assert set(blind_query(cipher, "on 17 June, 2023?", NOW)) <= set(other.split())
    assert not set(blind_query(cipher, "on 17 June, 2023?", NOW)) & set(held.split())
    assert all(len(t) == 13 and t.startswith("k") for t in held.split())  # a stored token's shape
    assert set(held.split()).isdisjoint(blind_days(_cipher(), [june])[0].split())  # per Bot keys
