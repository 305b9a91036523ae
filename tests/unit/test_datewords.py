"""The dates an entry is found by and the dates a query names (services/datewords.py, D9.31)."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.crypto import Cipher, Keyring
from services.datewords import (
    blind_days,
    blind_query,
    day_of,
    entry_terms,
    query_terms,
    said_minute,
    zone_key,
    zone_names,
    zone_of,
)
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


@pytest.mark.parametrize(
    ("text", "zone", "terms"),
    [
        # 04:00 UTC on 6 December is 20:00 on the 5th in Los Angeles: yesterday is the 4th there,
        # 08:00 on the 4th to 08:00 on the 5th in UTC.
        ("what did I do yesterday?", "America/Los_Angeles", ["@2026-12-04", "@2026-12-05"]),
        ("what did I do yesterday?", None, ["@2026-12-05"]),
        ("what did I do yesterday?", "UTC", ["@2026-12-05"]),
        ("on 16 June 2023", "Asia/Tokyo", ["@2023-06-15", "@2023-06-16"]),
        ("on 16 June 2023", "America/New_York", ["@2023-06-16", "@2023-06-17"]),
        ("in June 2023, in 2022", "Asia/Tokyo", ["@2023-06", "@2022"]),  # months and years as they are
    ],
)
def test_a_day_is_read_in_the_time_zone_it_was_said_in(text: str, zone: str | None, terms: list[str]) -> None:
    at_four = int(datetime(2026, 12, 6, 4, tzinfo=UTC).timestamp() * 1000)
    assert query_terms(text, at_four, zone) == terms


def test_a_model_reads_a_time_in_the_speakers_zone_when_known() -> None:
    at = int(datetime(2023, 6, 16, 13, 56, tzinfo=UTC).timestamp() * 1000)
    assert said_minute(at) == "2023-06-16T13:56Z"
    assert said_minute(at, "America/Los_Angeles") == "2023-06-16T06:56-07:00"
    assert said_minute(at, "Asia/Kolkata") == "2023-06-16T19:26+05:30"
    assert said_minute(at, "UTC") == "2023-06-16T13:56+00:00"  # a person who lives in UTC
    assert said_minute(at, "Gone/Away") == "2023-06-16T13:56Z"  # a zone no longer shipped: unknown


_ZONES = sorted(zone_names())


@given(
    st.sampled_from(_ZONES),
    st.datetimes(min_value=datetime(1971, 1, 2), max_value=datetime(2098, 12, 30)),
    st.integers(min_value=1, max_value=48),
)
def test_a_day_named_in_any_zone_meets_every_entry_said_during_it(
    zone: str, said: datetime, later: int
) -> None:
    """Whatever the zone (its offsets, its summer time, its skipped days), an entry said at any
    instant is met by its local day named by date — whose terms are exactly the UTC days that day
    falls on — and by "yesterday" asked at any later hour whose local day is the next one. The days come from the clock alone (``fromtimestamp`` in the
    zone as the service reads it), not from the code's own way of finding a day's edges."""
    local = zone_of(zone)
    said_ms = int(said.replace(tzinfo=UTC).timestamp() * 1000)
    day = datetime.fromtimestamp(said_ms / 1000, local).date()  # the day its speaker lived
    held = entry_terms(said.date())[2]  # the entry's UTC day
    named = f"on {day.day} {day.strftime('%B')} {day.year}"
    terms = query_terms(named, said_ms, zone)
    assert held in terms
    # No wider than the day: exactly the UTC days its minutes fall on (every 5 minutes from 27
    # hours before to 27 hours after the entry, those of the same local day).
    step = 300_000
    seen = {
        f"@{datetime.fromtimestamp(at / 1000, UTC).date()}"
        for at in range(said_ms - 27 * 12 * step, said_ms + 27 * 12 * step + 1, step)
        if datetime.fromtimestamp(at / 1000, local).date() == day
    }
    assert set(terms) == seen
    asked_ms = said_ms + later * 3_600_000
    if datetime.fromtimestamp(asked_ms / 1000, local).date() == day + timedelta(days=1):
        assert held in query_terms("what did we say yesterday?", asked_ms, zone)


def test_zones_are_the_iana_names_the_package_ships_and_none_other() -> None:
    """D9.32: the zones a person may be in are the ``tzdata`` package's (the same in every
    process), not the host's ``localtime`` nor ``Factory``; a name no longer shipped reads as UTC."""
    names = zone_names()
    assert {"Europe/Berlin", "America/Los_Angeles", "UTC", "Asia/Kolkata"} <= names
    assert not names & {"localtime", "Factory", "posixrules", "", "+02:00"}
    assert zone_of("Europe/Berlin").utcoffset(datetime(2023, 6, 16)) == timedelta(hours=2)
    assert zone_of("Gone/Away") is UTC and zone_of(None) is UTC


def test_a_zone_is_keyed_by_its_rules_not_its_name() -> None:
    """The saved rewrite of an input is found again by the zone's rules (D9.32, N2): "UTC" and
    its other names are no zone, the IANA database's links share their zone's key, and zones of
    other rules (GMT too: its times read "+00:00", not "Z") have keys of their own."""
    assert {zone_key(z) for z in (None, "UTC", "Etc/UTC", "Zulu", "Universal", "Gone/Away")} == {None}
    assert zone_key("US/Pacific") == zone_key("America/Los_Angeles") is not None
    keys = [zone_key(z) for z in ("America/Los_Angeles", "Europe/Berlin", "Asia/Tokyo", "GMT")]
    assert None not in keys and len(set(keys)) == len(keys)


def _groups() -> list[list[str | None]]:
    by_key: dict[str | None, list[str | None]] = {None: [None]}
    for zone in _ZONES:
        by_key.setdefault(zone_key(zone), []).append(zone)
    return [group for group in by_key.values() if len(group) > 1]


@given(
    st.sampled_from(_groups()).flatmap(lambda g: st.tuples(st.sampled_from(g), st.sampled_from(g))),
    st.sampled_from(
        ["What did I do yesterday?", "3 days ago", "last Tuesday", "on 16 June 2023", "last week"]
    ),
    st.datetimes(min_value=datetime(1971, 1, 2), max_value=datetime(2098, 12, 30)),
)
def test_zones_of_one_key_read_every_date_alike(
    pair: tuple[str | None, str | None], text: str, said: datetime
) -> None:
    """Two zones share a key only when they read any date alike (UTC's names with no zone): what
    lets a saved rewrite of words said in one serve the same words said in the other."""
    now = int(said.replace(tzinfo=UTC).timestamp() * 1000)
    assert query_terms(text, now, pair[0]) == query_terms(text, now, pair[1])


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
