"""Checks of raw input shared by the GraphQL and REST adapters, and the words of a refused field."""

from __future__ import annotations

import re
from typing import Any, Final

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from services.datewords import zone_names
from services.errors import BadInput

#: Our ids (and what a caller may name as one): a letter or digit, then up to 99 of these.
ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,99}$")


def check_id(value: str, field: str) -> str:
    """An id must look like one of ours; anything else is BAD_INPUT (unknown ones are NOT_FOUND later)."""
    if not ID_PATTERN.fullmatch(value):
        raise BadInput(f"{field} is not a valid id", field=field)
    return value


def check_ids(values: list[str], field: str, *, limit: int = 1000) -> list[str]:
    if len(values) > limit:
        raise BadInput(f"{field} has more than {limit} ids", field=field)
    return sorted({check_id(v, field) for v in values})


def check_name(value: str, field: str = "name", *, limit: int = 200) -> str:
    value = value.strip()
    if not value:
        raise BadInput(f"{field} must not be empty", field=field)
    if len(value) > limit:
        raise BadInput(f"{field} is longer than {limit} characters", field=field)
    if "\x00" in value:
        raise BadInput(f"{field} contains a NUL character", field=field)
    return value


def check_text(value: str, field: str, *, limit: int) -> str:
    """Message text: non-empty, at most ``limit`` characters, no NUL bytes."""
    if not value.strip():
        raise BadInput(f"{field} must not be empty", field=field)
    if len(value) > limit:
        raise BadInput(f"{field} is longer than {limit} characters", field=field)
    if "\x00" in value:
        raise BadInput(f"{field} contains a NUL character", field=field)
    return value


#: How far ahead of this server's clock a given ``saidAt`` may be (another clock's drift).
SAID_AT_SKEW_MS: Final = 5 * 60 * 1000
#: The earliest ``saidAt`` taken (3 March 1973): a time in seconds (the usual mistake) is below
#: it, and no chat history an importer has is older.
MIN_SAID_AT_MS: Final = 100_000_000_000


def check_said_at(value: int | None, field: str, *, now: int) -> int | None:
    """When an Item was said, as a platform importing history gives it (epoch milliseconds): not
    in the future (a few minutes of clock drift allowed), and not a time in seconds."""
    if value is None:
        return None
    if value < MIN_SAID_AT_MS:
        raise BadInput(f"{field} is a time in epoch milliseconds (this looks like seconds)", field=field)
    if value > now + SAID_AT_SKEW_MS:
        raise BadInput(f"{field} is a time in epoch milliseconds, not in the future", field=field)
    return value


def check_time_zone(value: str | None, field: str) -> str | None:
    """A time zone as the IANA database names it ("Europe/Berlin", "America/Los_Angeles", "UTC";
    D9.32, :func:`services.datewords.zone_names`); None: none (UTC)."""
    if value is None:
        return None
    if value not in zone_names():
        raise BadInput(
            f"{field} is not a time zone: name one as the IANA database does, such as Europe/Berlin",
            field=field,
        )
    return value


#: The largest memory context a caller may ask for (characters): a server caller's ``context``,
#: and the MCP server's, which is kept light (this module, not the search stack).
MAX_CONTEXT_CHARS: Final = 100_000
#: The longest query a search takes (a context's query is ranked for its first this many).
MAX_QUERY_CHARS: Final = 2_000

#: What no stored text may hold: NUL, and any surrogate (JSON's ``\ud800`` escape decodes to one
#: alone; no UTF-8 text holds it, so nothing could encrypt it).
UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` without what no stored text may hold (NUL dropped, a lone surrogate as U+FFFD):
    what a model's text loses before anything stores or shows it."""
    if not UNSTORABLE.search(text):
        return text
    return UNSTORABLE.sub(lambda m: "" if m.group() == "\x00" else "\ufffd", text)


#: The largest ``skip`` of a page (Cypher's list slices take 32-bit bounds: a larger one failed
#: inside, 500, where it is bad input).
MAX_SKIP: Final = 1_000_000_000


def check_expected(expected: int | None) -> int | None:
    """An ``expected`` version as read: a whole number from 0 (None: not sent)."""
    if expected is not None and not 0 <= expected < 2**63:
        raise BadInput("expected is a version: a whole number, at least 0", field="expected")
    return expected


def check_page(limit: int, skip: int, *, max_limit: int) -> tuple[int, int]:
    if limit < 1 or limit > max_limit:
        raise BadInput(f"limit is between 1 and {max_limit}", field="limit")
    if not 0 <= skip <= MAX_SKIP:
        raise BadInput(f"skip is between 0 and {MAX_SKIP:,}", field="skip")
    return limit, skip


#: What a refused value is told, by pydantic's error type (others get pydantic's own words).
_TOLD: Final = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_parsing_size": "must be a whole number below 2**63",
    "int_from_float": "must be a whole number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


#: The most characters of one name of a refused field's path that an error quotes.
PATH_PART: Final = 100


def refusal(exc: ValidationError, *, skip: frozenset[str] = frozenset()) -> BadInput:
    """The first refused field of a pydantic model: an unknown one first (the first by path), else
    pydantic's first error; the message starts with the field's path (``command.tags[1]``), the
    location parts in ``skip`` left out (a union's tag). The same words for REST and GraphQL."""
    errors = exc.errors(include_url=False)
    unknown = sorted(_path(e, skip) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return BadInput(f"unknown field {unknown[0]}", field=unknown[0])
    first = errors[0]
    path = _path(first, skip)
    if first["type"] == "json_invalid":
        return BadInput("the body is not valid JSON")
    if not path:
        return BadInput("the body must be a JSON object")
    if first["type"].startswith("union_tag_"):
        path += "._tag"
    return BadInput(f"{path} {_told(first)}", field=path)


def _told(error: ErrorDetails) -> str:
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    match error["type"]:
        case "literal_error":
            return f"must be {ctx['expected']}"
        case "union_tag_invalid":
            return f"must be one of {ctx['expected_tags']}"
        case "union_tag_not_found":
            return "is required"
        case "greater_than":
            return f"must be above {ctx['gt']}"
        case "greater_than_equal":
            return f"must be at least {ctx['ge']}"
        case "less_than":
            return f"must be below {ctx['lt']}"
        case "less_than_equal":
            return f"must be at most {ctx['le']}"
        case "string_too_long":
            return f"is at most {ctx['max_length']} characters"
        case "string_too_short" if ctx.get("min_length") == 1:
            return "is empty"
        case kind:
            return _TOLD.get(kind, str(error["msg"]))


def _path(error: ErrorDetails, skip: frozenset[str]) -> str:
    """The field's path, each name quoted in at most PATH_PART characters (a key the caller made
    up, or a key of a map such as a chat meta's, is theirs and of any length)."""
    path = ""
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in skip:
            name = part[:PATH_PART] + ("…" if len(part) > PATH_PART else "")
            path += f".{name}" if path else name
    return path
