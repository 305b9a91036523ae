"""When something was said, as keywords (D9.31): the dates an entry is found by, and the dates a
query names.

An entry is dated by the newest of its sources (``saidAt``: an Item's time as the platform gave
it, else when it was saved). Each process's index gives every entry the terms of that day, in UTC
— its year, its month and its day (a day named without a year is asked for in each of the last
thirty years) — blinded with the Bot's
keys like any keyword (:meth:`services.crypto.Cipher.blind`), held in memory only: the store
keeps ``saidAt``, a plain time like ``createdAt``, and no term. A query's dates become the same
terms, so BM25 ranks the entries said on the day (the month, the year) a question names above
the others as it would rank an entry holding a rare word; "What did Maria share on 16 June,
2023?" meets what was said that day.

A term begins with ``@``, which no keyword token holds, so a date never meets a number of the
text. Dates are read in English: "16 June, 2023", "June 16th 2023", "on the 16th of June",
"2023-06-16", "June 2023", "summer 2023", a year (not "the 1990s"); and, against the time the
query was said, "yesterday", "last night", "N days ago", "N weeks ago", "last Tuesday", "last"
week, month or year. A month and a day without a year need an ordinal or "on" ("Ask Jan 3
questions" names no day); a month named alone ("in June") is left alone ("May", "June" and
"March" are names and words too), and of a numeric date such as 6/7/2023 only the year is read
(day first or month first is anyone's guess). "Today", "tonight" and "this week" are not read:
they are how people ask for what comes next ("where should we eat tonight?"), and every entry
said today would rank above the ones that answer.

A query is read in its speaker's time zone when one is known (D9.32: an Item keeps the zone it was
said in): "yesterday" is the speaker's yesterday, and a day they name is the day they live, which
covers parts of two UTC days unless their zone is UTC; its terms are those UTC days' (an entry's
day stays UTC, the same in every process whoever reads). A month or a year is taken as the same
UTC month or year: its edges are a few hours off at most.
"""

from __future__ import annotations

import hashlib
import io
import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import cache, lru_cache
from importlib import resources
from typing import Final
from zoneinfo import ZoneInfo

from services.crypto import Cipher

_MONTHS: Final = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
#: A month's name or its usual short form (``sept`` too), to its number.
_MONTH_OF: Final = {
    **{name: n for n, name in enumerate(_MONTHS, 1)},
    **{name[:3]: n for n, name in enumerate(_MONTHS, 1)},
    "sept": 9,
}
_MONTH: Final = r"(?P<{0}>" + "|".join(sorted(_MONTH_OF, key=len, reverse=True)) + r")\.?"
_DAY: Final = r"(?P<{0}>[0-3]?\d)(?P<{0}o>st|nd|rd|th)?"
#: A year; not a decade ("the 1990s", "1990's").
_YEAR: Final = r"(?P<{0}>(?:19|20)\d\d)(?!['’]?s\b)"
_SEASONS: Final = {
    "spring": (3, 4, 5),
    "summer": (6, 7, 8),
    "autumn": (9, 10, 11),
    "fall": (9, 10, 11),
    "winter": (1, 2, 12),
}
_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DATES: Final = re.compile(
    "|".join(
        (
            r"\b" + _YEAR.format("iy") + r"-(?P<im>[01]?\d)-(?P<id>[0-3]?\d)(?!\d)",
            r"\b(?P<on1>on\s+)?(?:the\s+)?"
            + _DAY.format("d1")
            + r"\s+(?:of\s+)?"
            + _MONTH.format("m1")
            + r"(?:,?\s*"
            + _YEAR.format("y1")
            + r")?\b",
            r"\b(?P<on2>on\s+)?"
            + _MONTH.format("m2")
            + r"\s+(?:the\s+)?"
            + _DAY.format("d2")
            + r"\b(?!\s*:)"
            + r"(?:,?\s*"
            + _YEAR.format("y2")
            + r")?\b",
            r"\b" + _MONTH.format("m3") + r",?\s*(?:of\s+)?" + _YEAR.format("y3") + r"\b",
            r"\b(?P<season>" + "|".join(_SEASONS) + r")\s+(?:of\s+)?" + _YEAR.format("y4") + r"\b",
            r"\b" + _YEAR.format("y5") + r"\b",
            r"\b(?P<yesterday>yesterday|last\s+night)\b",
            r"\b(?P<ago>[1-9]|[12]\d|30|a|one|two|three|four|five|six|seven)\s+(?P<agounit>day|week)s?\s+ago\b",
            r"\blast\s+(?P<unit>week|month|year)\b",
            r"\blast\s+(?P<weekday>" + "|".join(_WEEKDAYS) + r")\b",
        )
    ),
)
#: What every date _DATES reads holds (a digit, or the words of a relative one): a query without
#: any is not read further (most are not; _DATES over 2,000 characters takes ~0.25 ms).
_ANCHOR: Final = re.compile(r"[0-9]|\b(?:yesterday|ago|last\s+[a-z]+day|last\s+(?:night|week|month|year))\b")
#: How many years back a day named without a year ("on the 16th of June") is sought.
YEARS_BACK: Final = 30
_SMALL: Final = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


@cache
def zone_names() -> frozenset[str]:
    """The time zones a person may be in: the IANA database's names as the ``tzdata`` package
    ships them (never the host's files, which hold ``localtime`` and differ from host to host:
    every process reads the same zones), less ``Factory`` (no place)."""
    names = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(names) - {"Factory"}


@lru_cache(maxsize=1024)
def zone_of(name: str | None) -> tzinfo:
    """The time zone of an IANA name as kept (``services.validation.check_time_zone`` took it),
    read from the ``tzdata`` package; UTC for none, and for a name it no longer ships (a zone
    kept before an upgrade of the package removed it: its days read as UTC rather than fail).
    Made from a file, it cannot be pickled: what leaves this module is a date or a string."""
    if name is None or name not in zone_names():
        return UTC
    return ZoneInfo.from_file(io.BytesIO(_zone_file(name)), key=name)


@lru_cache(maxsize=1024)
def zone_key(name: str | None) -> str | None:
    """What tells the rules of a kept zone apart: None for UTC (no zone, a name it no longer
    ships, or a name of the same rules, such as "Etc/UTC" or "Zulu"), else a digest of its file
    in the ``tzdata`` package, which the IANA database's links ("US/Pacific" and
    "America/Los_Angeles") share. Words said in two zones of one key read every date alike."""
    if name is None or name not in zone_names():
        return None
    found = hashlib.sha256(_zone_file(name)).hexdigest()[:16]
    return None if found == hashlib.sha256(_zone_file("UTC")).hexdigest()[:16] else found


def _zone_file(name: str) -> bytes:
    return resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()


def day_of(said_at_ms: int, zone: tzinfo = UTC) -> date:
    """The day of a time in epoch milliseconds, in ``zone`` (UTC by default: an entry's day)."""
    return datetime.fromtimestamp(said_at_ms / 1000, zone).date()


def said_minute(said_at_ms: int, zone: str | None = None) -> str:
    """A time as a model reads when something was said, to the minute: UTC when the speaker's zone
    is unknown ("2023-05-08T13:56Z"), else their local time with its offset
    ("2023-05-08T06:56-07:00", D9.32; a zone no longer known reads as unknown)."""
    local = zone_of(zone)
    if local is UTC:
        return datetime.fromtimestamp(said_at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")
    return datetime.fromtimestamp(said_at_ms / 1000, local).isoformat(timespec="minutes")


def entry_terms(day: date) -> tuple[str, ...]:
    """The terms an entry said on ``day`` is found by: its year, its month, its day. A day named
    without a year is asked for as that day of each of the last YEARS_BACK years (a term of its
    own per entry cost ~1 MB per 100k entries of every index for the rarest kind of date)."""
    return (f"@{day.year}", f"@{day.year}-{day.month:02}", f"@{day.isoformat()}")


def blind_days(cipher: Cipher, said_at: list[int]) -> list[str]:
    """Per time, the blind terms of its day as stored keywords read (space separated), each day's
    made once."""
    made: dict[date, str] = {}
    found: list[str] = []
    for at in said_at:
        day = day_of(at)
        terms = made.get(day)
        if terms is None:
            terms = made[day] = " ".join(cipher.blind(t) for t in entry_terms(day))
        found.append(terms)
    return found


def blind_query(cipher: Cipher, text: str, now_ms: int, zone: str | None = None) -> list[str]:
    """The blind terms of the dates ``text`` names (:func:`query_terms`)."""
    return [cipher.blind(t) for t in query_terms(text, now_ms, zone)]


def _day(year: int, month: int, day: int) -> str | None:
    try:
        return f"@{date(year, month, day).isoformat()}"
    except ValueError:  # 31 June
        return None


def _month_terms(month: int, day: str | None, year: str | None, *, pointed: bool, today: date) -> list[str]:
    """A month with a day, a year or both; a day without a year only when ``pointed`` (an ordinal
    or "on": "Ask Jan 3 questions" and "Tell May 2 jokes" name no day)."""
    if day is not None and year is not None:
        found = _day(int(year), month, int(day))
        return [] if found is None else [found]
    if day is not None:  # that day of each of the last YEARS_BACK years it falls in
        if not pointed:
            return []
        return [t for t in (_day(year, month, int(day)) for year in _years(today)) if t]
    return [] if year is None else [f"@{year}-{month:02}"]


def query_terms(text: str, now_ms: int, zone: str | None = None) -> list[str]:
    """The terms of the dates ``text`` names, in order, each once (``now_ms``: when it was said,
    for "yesterday" and the like; ``zone``: the IANA time zone it was said in, None for UTC — a
    day is then the UTC days its hours fall on)."""
    text = text.lower()
    if not _ANCHOR.search(text):
        return []
    local = zone_of(zone)
    today = day_of(now_ms, local)
    found: list[str] = []
    for m in _DATES.finditer(text):
        g = m.groupdict()
        if g["iy"]:
            terms = [t for t in [_day(int(g["iy"]), int(g["im"]), int(g["id"]))] if t]
        elif g["m1"] or g["m2"]:
            pointed = bool(g["on1"] or g["on2"] or g["d1o"] or g["d2o"])
            terms = _month_terms(
                _MONTH_OF[g["m1"] or g["m2"]],
                g["d1"] or g["d2"],
                g["y1"] or g["y2"],
                pointed=pointed,
                today=today,
            )
        elif g["m3"]:
            terms = [f"@{g['y3']}-{_MONTH_OF[g['m3']]:02}"]
        elif g["season"]:
            terms = [f"@{g['y4']}-{month:02}" for month in _SEASONS[g["season"]]]
        elif g["y5"]:
            terms = [f"@{g['y5']}"]
        elif g["yesterday"]:
            terms = [_days_ago(today, 1)]
        elif g["ago"]:
            count = int(g["ago"]) if g["ago"].isdigit() else _SMALL[g["ago"]]
            if g["agounit"] == "day":
                terms = [_days_ago(today, count)]
            else:  # the week around the day N weeks back
                terms = [_days_ago(today, 7 * count + n) for n in range(-3, 4)]
        elif g["weekday"]:
            back = (today.weekday() - _WEEKDAYS.index(g["weekday"]) - 1) % 7 + 1
            terms = [_days_ago(today, back)]
        else:
            terms = _last(today, g["unit"])
        found += terms
    if local is not UTC:
        found = [u for t in found for u in _utc_days(t, local)]
    return list(dict.fromkeys(found))


@lru_cache(maxsize=4096)
def _utc_days(term: str, zone: tzinfo) -> tuple[str, ...]:
    """A local day's term as the terms of the UTC days its hours fall on (one or two; a month's or
    a year's term as it is)."""
    if len(term) != len("@2023-06-16"):
        return (term,)
    day = date.fromisoformat(term[1:])
    first = datetime.combine(day, time(), zone).astimezone(UTC)
    last = datetime.combine(day + timedelta(days=1), time(), zone).astimezone(UTC) - timedelta(microseconds=1)
    return tuple(f"@{first.date() + timedelta(days=n)}" for n in range((last.date() - first.date()).days + 1))


def _years(today: date) -> range:
    """The years a day named without one is sought in, the latest first."""
    return range(today.year, today.year - YEARS_BACK - 1, -1)


def _days_ago(today: date, back: int) -> str:
    return f"@{(today - timedelta(days=back)).isoformat()}"


def _last(today: date, unit: str) -> list[str]:
    """ "last week", "last month", "last year": the days of the week before this one (Monday
    first), the month before this one, the year before."""
    if unit == "week":
        monday = today - timedelta(days=today.weekday() + 7)
        return [f"@{(monday + timedelta(days=n)).isoformat()}" for n in range(7)]
    if unit == "month":
        month = today.month - 1 or 12
        year = today.year if month < today.month else today.year - 1
        return [f"@{year}-{month:02}"]
    return [f"@{today.year - 1}"]
