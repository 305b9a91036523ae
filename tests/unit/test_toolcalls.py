"""The tools' arguments are pydantic models (issue 15 item 4): each model is both the schema the
model is offered and the check of its answer (D9.10, D9.15)."""

from __future__ import annotations

import json

import pytest

from learning import toolcalls
from learning.enrichment import REWRITE_TOOL, _parse  # pyright: ignore[reportPrivateUsage]
from learning.gateway import ToolCall
from learning.runner import CONFIDE_TOOL
from services.validation import storable


def test_each_offered_schema_is_its_model() -> None:
    for tool in toolcalls.TOOLS:
        name = tool["function"]["name"]
        model = toolcalls.MODELS[name]
        parameters = tool["function"]["parameters"]
        assert parameters["additionalProperties"] is False
        aliases = {f.alias or n for n, f in model.model_fields.items()}
        required = {f.alias or n for n, f in model.model_fields.items() if f.is_required()}
        assert set(parameters["properties"]) == aliases
        assert set(parameters["required"]) == required
        assert "title" not in json.dumps(tool)
    assert REWRITE_TOOL["function"]["parameters"]["required"] == ["text", "used_entry_ids"]
    assert CONFIDE_TOOL["function"]["parameters"]["additionalProperties"] is False


def rewrite(arguments: object, name: str = "rewrite_input") -> tuple[str, list[str]] | None:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return _parse((ToolCall("c1", name, text),), {"mem_a", "mem_b"}, 100)


def test_a_rewrite_citing_what_was_sent_is_taken() -> None:
    assert rewrite({"text": "Tea, as always?", "used_entry_ids": ["mem_a", "mem_a", "mem_b"]}) == (
        "Tea, as always?",
        ["mem_a", "mem_b"],
    )


@pytest.mark.parametrize(
    "arguments",
    [
        {"text": "x", "used_entry_ids": ["mem_c"]},  # not sent (D9.15)
        {"text": "x", "used_entry_ids": []},
        {"text": " ", "used_entry_ids": ["mem_a"]},
        {"text": "x" * 101, "used_entry_ids": ["mem_a"]},
        {"text": "a\x00b", "used_entry_ids": ["mem_a"]},
        '{"text": "a \\ud800 b", "used_entry_ids": ["mem_a"]}',  # a lone surrogate, escaped
        {"text": 7, "used_entry_ids": ["mem_a"]},
        {"text": "x", "used_entry_ids": [1]},
        {"text": "x", "used_entry_ids": ["mem_a"], "why": "extra"},
        {"text": "x"},
        "{not json",
        "[1]",
    ],
)
def test_a_rewrite_of_another_shape_keeps_the_input(arguments: object) -> None:
    assert rewrite(arguments) is None


def test_confide_takes_text_and_ignores_other_fields() -> None:
    assert toolcalls.checked(toolcalls.Confide, '{"text": "stuck", "mood": 3}') == toolcalls.Confide(
        text="stuck"
    )
    for bad in ('{"text": ""}', '{"text": 3}', "{}", "nope", '"text"'):
        assert toolcalls.checked(toolcalls.Confide, bad) is None


def test_text_no_stored_text_may_hold_is_refused_in_every_tool() -> None:
    """A lone surrogate (JSON's ``\\ud800`` decodes to one) or NUL in a tool's text: nothing could
    encrypt it, so a rewrite, a confide or a learned fact holding one failed as INTERNAL after its
    Turn was saved; refused as the tools' other bad strings are (bad_string)."""
    assert toolcalls.checked(toolcalls.Confide, '{"text": "stuck \\ud800"}') is None
    assert toolcalls.checked(toolcalls.Confide, '{"text": "stuck \\ud83d\\ude00"}') is not None  # a pair
    for content in ("fact \\udfff", "fact \\u0000"):
        with pytest.raises(toolcalls.Violation) as refused:
            toolcalls.parse("add_fact", '{"content": "' + content + '", "source_item_ids": ["i-1"]}', "c")
        assert (refused.value.code, refused.value.path) == ("bad_string", "c.content")
    with pytest.raises(toolcalls.Violation) as refused:  # an id: it would reach a statement
        toolcalls.parse("invalidate", '{"entry_id": "mem_\\udc00"}', "c")
    assert (refused.value.code, refused.value.path) == ("bad_string", "c.entry_id")


def test_model_text_is_made_storable() -> None:
    assert storable("plain") == "plain"
    assert storable("a\x00b \ud800 c \U0001f600") == "ab \ufffd c \U0001f600"
