"""Raw-input checks shared by the adapters (services/validation.py) and our ids and tokens
(services/ids.py)."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError

from services.errors import BadInput
from services.ids import hash_token, new_id, new_token
from services.validation import PATH_PART, check_id, check_ids, check_name, check_page, check_text, refusal

ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,99}", fullmatch=True)


@given(ID)
def test_well_formed_ids_pass(value: str) -> None:
    assert check_id(value, "botId") == value


@pytest.mark.parametrize("value", ["", "-a", "_a", "a b", "a/b", "a:b", "é", "a" * 101, "a\x00", " a"])
def test_malformed_ids_are_bad_input_on_their_field(value: str) -> None:
    with pytest.raises(BadInput) as caught:
        check_id(value, "botId")
    assert caught.value.field == "botId"
    assert caught.value.message == "botId is not a valid id"  # the input is never echoed


def test_an_id_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(BadInput):
        check_id("bot_1\n", "botId")


def test_check_ids_sorts_deduplicates_and_limits() -> None:
    assert check_ids(["b", "a", "b"], "memberIds") == ["a", "b"]
    assert check_ids([f"p{n}" for n in range(3)], "memberIds", limit=3) == ["p0", "p1", "p2"]
    with pytest.raises(BadInput, match="more than 3") as caught:
        check_ids(["a"] * 4, "memberIds", limit=3)
    assert caught.value.field == "memberIds"
    with pytest.raises(BadInput):
        check_ids(["a", "not valid"], "memberIds")


def test_check_name() -> None:
    assert check_name("  Acme  ") == "Acme"
    assert check_name("x" * 200) == "x" * 200
    for bad in ("", "   ", "x" * 201):
        with pytest.raises(BadInput) as caught:
            check_name(bad, "botMemoryModel")
        assert caught.value.field == "botMemoryModel"


def test_check_text() -> None:
    assert check_text(" keeps its spaces ", "input", limit=20) == " keeps its spaces "
    assert check_text("x" * 5, "input", limit=5) == "x" * 5
    for bad, message in (("", "empty"), (" \n", "empty"), ("x" * 6, "longer than 5"), ("a\x00b", "NUL")):
        with pytest.raises(BadInput, match=message) as caught:
            check_text(bad, "items[0].text", limit=5)
        assert caught.value.field == "items[0].text"


@pytest.mark.parametrize(("limit", "skip", "field"), [(0, 0, "limit"), (201, 0, "limit"), (1, -1, "skip")])
def test_check_page_refuses(limit: int, skip: int, field: str) -> None:
    with pytest.raises(BadInput) as caught:
        check_page(limit, skip, max_limit=200)
    assert caught.value.field == field


def test_check_page_accepts_the_bounds() -> None:
    assert check_page(1, 0, max_limit=200) == (1, 0)
    assert check_page(200, 10**6, max_limit=200) == (200, 10**6)


@pytest.mark.parametrize("prefix", ["mem", "chat", "turn", "org", "bot", "tok"])
def test_new_ids_carry_their_prefix_128_random_bits_and_pass_check_id(prefix: str) -> None:
    ids = {new_id(prefix) for _ in range(50)}
    assert len(ids) == 50
    for value in ids:
        assert re.fullmatch(rf"{prefix}_[0-9a-f]{{32}}", value)
        assert check_id(value, "id") == value


def test_new_token_is_shown_once_and_stored_as_its_sha256() -> None:
    token_id, token, stored = new_token("bm")
    assert re.fullmatch(r"tok_[0-9a-f]{32}", token_id)
    assert token.startswith("bm_") and len(token) == 3 + 43  # 32 random bytes, urlsafe base64
    assert stored == hash_token(token) == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored
    assert new_token("bm")[1] != token


def test_hash_token_distinguishes_tokens() -> None:
    assert hash_token("bm_a") != hash_token("bm_b")
    assert len(hash_token("")) == 64


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    summary: dict[str, str] = {}


def test_a_refused_fields_path_quotes_each_name_in_a_hundred_characters() -> None:
    """A key the caller made up, or a key of a map (a chat meta's summary), is quoted in the error:
    one of 50,000 characters made a message of 50,000."""
    for body in ({"k" * 50_000: 1}, {"summary": {"k" * 50_000: 5}}):
        with pytest.raises(ValidationError) as refused:
            _Body.model_validate(body)
        told = refusal(refused.value)
        assert (
            len(told.message) < 2 * PATH_PART and told.field is not None and len(told.field) < 2 * PATH_PART
        )
        assert "k" * PATH_PART + "…" in told.message
    with pytest.raises(ValidationError) as refused:
        _Body.model_validate({"summary": {"i-1": 5}})
    assert refusal(refused.value).message == "summary.i-1 must be a string"
