"""Pure parts of the MCP server: the bearer header, the ``context`` budget (N3's line rule) and
reading the API's answers."""

from __future__ import annotations

import traceback

import pytest

from botmemory.mcp import Entry, Hit, bearer, configured_api_url, fit, read
from botmemory.mcp_api import ApiError
from services.settings import ConfigurationError


def hit(entry_id: str, content: str, score: float = 1.0) -> Hit:
    return Hit(score=score, entry=Entry(id=entry_id, layer="pinned", content=content, tags=[], saidAt=0))


def test_bearer_takes_only_a_bearer_token() -> None:
    assert bearer({"authorization": "Bearer abc"}) == "abc"
    assert bearer({"authorization": "bearer  abc "}) == "abc"
    assert bearer({"authorization": "Basic abc"}) is None
    assert bearer({"authorization": "Bearer "}) is None
    assert bearer({}) is None
    assert bearer(None) is None


def test_fit_keeps_whole_lines_best_first_within_the_budget() -> None:
    hits = [hit("a", "x" * 10), hit("b", "y" * 50), hit("c", "z" * 5)]
    # "- " + 10, then "\n- " + 5 = 12 + 8 = 20 characters; the 50-character line does not fit.
    found = fit(hits, 20)
    assert (found.text, found.ids) == (f"- {'x' * 10}\n- {'z' * 5}", ["a", "c"])
    assert len(found.text) == 20
    assert fit(hits, 19).ids == ["a"]
    assert fit(hits, 11).ids == ["c"]
    assert (fit([], 100).text, fit([], 100).ids) == ("", [])


def test_an_answer_of_another_shape_is_unavailable_without_its_values() -> None:
    """pydantic's error quotes the values it refused (an entry's content), and the MCP SDK logs an
    unexpected error of a tool with its causes: an answer this server cannot read (the API of
    another version) is UNAVAILABLE, said and chained without it."""
    secret = "Ann's passport is in the blue tin"
    with pytest.raises(ApiError) as refused:
        read(Hit, {"score": 1.0, "entry": {"id": "e_1", "content": secret}})
    assert refused.value.code == "UNAVAILABLE" and "Hit" in str(refused.value)
    told = "".join(traceback.format_exception(refused.value))
    assert secret not in told
    assert read(Hit, hit("e_1", "tea").model_dump(by_alias=True)) == hit("e_1", "tea")


def test_the_api_url_is_the_one_the_apis_settings_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BOTMEMORY_API_URL`` when given; else the API's own settings (it was always
    http://127.0.0.1:8000, whatever ``BOTMEMORY_API_PORT`` said)."""
    monkeypatch.delenv("BOTMEMORY_API_URL", raising=False)
    monkeypatch.delenv("BOTMEMORY_API_HOST", raising=False)
    monkeypatch.setenv("BOTMEMORY_API_PORT", "58123")
    assert configured_api_url() == "http://127.0.0.1:58123"
    for host, reached in (("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("10.1.2.3", "10.1.2.3")):
        monkeypatch.setenv("BOTMEMORY_API_HOST", host)
        assert configured_api_url() == f"http://{reached}:58123"
    monkeypatch.setenv("BOTMEMORY_API_URL", "https://memory.example/")
    assert configured_api_url() == "https://memory.example/"
    monkeypatch.delenv("BOTMEMORY_API_URL")
    monkeypatch.setenv("BOTMEMORY_API_PORT", "eighty")
    with pytest.raises(ConfigurationError, match="api_port"):
        configured_api_url()
