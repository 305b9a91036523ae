"""Calls and answers for the protocol tests: a chat's evidence (one Item of each kind) and one kept entry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from learning.gateway import ToolCall
from learning.protocol import EvidenceItem, Violation, changes_from
from services.changes import MemoryChange

CHAT = "chat_1"
KINDS = {
    "i-1": "PERSON_MESSAGE",
    "i-2": "BOT_MESSAGE",
    "i-3": "TOOL_RESULT",
    "i-4": "NOTICE",
    "i-5": "TOOL_CALL",
}
EVIDENCE = {i: EvidenceItem(i, kind, "person:p1", "text") for i, kind in KINDS.items()}
KEPT = "mem_kept"
ORG = "org_1"


def call(name: str, args: dict[str, Any] | str, call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id, name, args if isinstance(args, str) else json.dumps(args))


def run(*calls: ToolCall) -> list[MemoryChange]:
    return changes_from(calls, chat_id=CHAT, evidence=EVIDENCE, context_ids={KEPT}, org=ORG)


def refused(*calls: ToolCall) -> tuple[str, str]:
    with pytest.raises(Violation) as caught:
        run(*calls)
    return caught.value.code, caught.value.path


def fact(sources: list[str], topics: list[str] | None = None, call_id: str = "c1") -> ToolCall:
    args: dict[str, Any] = {"content": "likes tea", "source_item_ids": sources}
    return call("add_fact", args if topics is None else {**args, "topics": topics}, call_id)
