"""Checks of raw input shared by the GraphQL and REST adapters."""

from __future__ import annotations

import re

from services.errors import BadInput

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,99}$")


def check_id(value: str, field: str) -> str:
    """An id must look like one of ours; anything else is BAD_INPUT (unknown ones are NOT_FOUND later)."""
    if not _ID.fullmatch(value):
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


def check_page(limit: int, skip: int, *, max_limit: int) -> tuple[int, int]:
    if limit < 1 or limit > max_limit:
        raise BadInput(f"limit must be between 1 and {max_limit}", field="limit")
    if skip < 0:
        raise BadInput("skip must not be negative", field="skip")
    return limit, skip
