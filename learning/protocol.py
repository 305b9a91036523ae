"""The learning step's model protocol (DESIGN §7) and the server's check of every answer (L3, V6,
V8, D9.2, D9.10).

The request lists the new Items (id, kind, speaker, text) and the learningContext entries with
their ids and topic counts; the model answers with tool calls. :func:`changes_from` turns them
into ``apply_changes`` changes or raises :class:`Violation` — one violation rejects the whole
step. A violation carries a code and a field path only, never the model's text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from learning.gateway import ToolCall
from services.changes import (
    MAX_CONTENT_CHARS,
    MAX_TOPICS,
    AddFact,
    AddObservation,
    Invalidate,
    ItemRef,
    MemoryChange,
    RenameTopic,
    SetTopics,
    Share,
)
from services.ids import new_id
from services.memory import TOPIC

MAX_TOOL_CALLS = 200

LEARN_SYSTEM = (
    "You keep what an assistant (the Bot) learns from its chats. You get the new items of one chat "
    "and the entries already kept, each with its id. Keep what will help the Bot in later work, "
    "using the tools:\n"
    "- add_fact: something a person said or did; cite the ids of the person's messages it rests on "
    "(an app result may support it, never alone).\n"
    "- add_observation: a conclusion drawn from kept entries; cite their ids (or the call id of an "
    "add_fact/add_observation earlier in this answer); confidence 0..1.\n"
    "- invalidate: an entry that stopped being true. set_topics / rename_topic: keep topics tidy "
    "(lowercase words joined by dashes). share: show an entry to a wider audience, only when the "
    "rules of the team say so.\n"
    "A person's preferences (how they like to be answered, worked with or addressed) get the topic "
    "preferences.\n"
    "The Bot's own words and tool calls only show where to look: they never become facts. A notice "
    "is never a person's words. If there is nothing worth keeping, call no tool."
)

_TOPICS_SCHEMA = {"type": "array", "items": {"type": "string"}, "description": "lowercase-with-dashes topics"}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        "add_fact",
        "Keep something a person said or did.",
        {
            "content": {"type": "string"},
            "source_item_ids": {"type": "array", "items": {"type": "string"}},
            "topics": _TOPICS_SCHEMA,
        },
        ["content", "source_item_ids"],
    ),
    _tool(
        "add_observation",
        "Keep a conclusion drawn from kept entries.",
        {
            "content": {"type": "string"},
            "source_entry_ids": {"type": "array", "items": {"type": "string"}},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "topics": _TOPICS_SCHEMA,
        },
        ["content", "source_entry_ids", "confidence"],
    ),
    _tool(
        "invalidate", "Mark a kept entry as no longer true.", {"entry_id": {"type": "string"}}, ["entry_id"]
    ),
    _tool(
        "set_topics",
        "Replace the topics of a kept entry.",
        {"entry_id": {"type": "string"}, "topics": _TOPICS_SCHEMA},
        ["entry_id", "topics"],
    ),
    _tool(
        "rename_topic",
        "Rename a topic on every entry that has it.",
        {"from": {"type": "string"}, "to": {"type": "string"}},
        ["from", "to"],
    ),
    _tool(
        "share",
        "Show a kept entry to a wider audience: for:person:<id>, for:channel:<id> or for:bot.",
        {"entry_id": {"type": "string"}, "audience": {"type": "array", "items": {"type": "string"}}},
        ["entry_id", "audience"],
    ),
]

_FIELDS = {
    "add_fact": ({"content", "source_item_ids"}, {"topics"}),
    "add_observation": ({"content", "source_entry_ids", "confidence"}, {"topics"}),
    "invalidate": ({"entry_id"}, set[str]()),
    "set_topics": ({"entry_id", "topics"}, set[str]()),
    "rename_topic": ({"from", "to"}, set[str]()),
    "share": ({"entry_id", "audience"}, set[str]()),
}


class Violation(Exception):
    """A model answer breaks a rule; ``code`` and ``path`` name it without any content."""

    def __init__(self, code: str, path: str) -> None:
        super().__init__(f"{code} at {path}")
        self.code, self.path = code, path


@dataclass(frozen=True, slots=True)
class EvidenceItem:
    id: str  # i-N within the chat
    kind: str
    speaker: str
    text: str

    def json(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind.lower(), "speaker": self.speaker, "text": self.text}


def request_body(
    system: str,
    items: list[EvidenceItem],
    entries: list[dict[str, Any]],
    topics: Sequence[Mapping[str, object]],
) -> dict[str, Any]:
    """The learning request (§7): deterministic, so recovery finds the saved call by its hash."""
    user = json.dumps(
        {"newItems": [i.json() for i in items], "keptEntries": entries, "topicCounts": topics},
        ensure_ascii=False,
    )
    return {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": TOOLS,
        "tool_choice": "auto",
    }


#: Re-asks of a refused step (D9.21): the violation goes back to the model as a tool error.
MAX_REASKS = 2


def reask_body(
    body: dict[str, Any], text: str | None, calls: tuple[ToolCall, ...], violation: Violation
) -> dict[str, Any]:
    """The request after a refused answer (D9.21): the answer as the assistant's turn, then for
    each of its tool calls a tool message — the refused one names the rule (code and field
    path, never content), the others say they were not applied either (one violation refuses
    the whole answer, D9.10)."""
    refused = (
        f"refused: {violation.code} at {violation.path}. Nothing of this answer was applied; answer again."
    )
    answer: dict[str, Any] = {"role": "assistant", "content": text}
    follow: list[dict[str, Any]] = []
    if calls:
        answer["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
        culprit = _culprit(violation.path, len(calls))
        follow = [
            {
                "role": "tool",
                "tool_call_id": c.id,
                "content": refused
                if i == culprit
                else "not applied: another call of this answer was refused",
            }
            for i, c in enumerate(calls)
        ]
    else:
        follow = [{"role": "user", "content": refused}]
    return {**body, "messages": [*body["messages"], answer, *follow]}


def _culprit(path: str, calls: int) -> int:
    """Which tool call a violation's path (``tool_calls[i]…``) names; the first when none."""
    head = path.split(".", 1)[0]
    if head.startswith("tool_calls[") and head.endswith("]") and head[11:-1].isdigit():
        return min(int(head[11:-1]), calls - 1)
    return 0


def _str(args: dict[str, Any], key: str, path: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise Violation("bad_string", f"{path}.{key}")
    return value


def _content(args: dict[str, Any], path: str) -> str:
    value = _str(args, "content", path)
    if len(value) > MAX_CONTENT_CHARS:
        raise Violation("too_long", f"{path}.content")
    return value


def _str_list(args: dict[str, Any], key: str, path: str, *, allow_empty: bool = False) -> list[str]:
    raw = args.get(key, [] if allow_empty else None)
    if not isinstance(raw, list):
        raise Violation("bad_list", f"{path}.{key}")
    value = cast(list[Any], raw)
    if (not value and not allow_empty) or len(value) > 100:
        raise Violation("bad_list", f"{path}.{key}")
    out: list[str] = []
    for n, v in enumerate(value):
        if not isinstance(v, str) or not v or len(v) > 200:
            raise Violation("bad_string", f"{path}.{key}[{n}]")
        out.append(v)
    return out


def _topic(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise Violation("bad_topic", path)
    if ":" in value:
        raise Violation("colon_tag", path)  # V1, V8: colon tags belong to the server
    if not TOPIC.fullmatch(value) or len(value) > 64:
        raise Violation("bad_topic", path)
    return value


def _topics(args: dict[str, Any], path: str) -> tuple[str, ...]:
    topics = _str_list(args, "topics", path, allow_empty=True) if "topics" in args else []
    if len(topics) > MAX_TOPICS:
        raise Violation("too_many_topics", f"{path}.topics")
    return tuple(dict.fromkeys(_topic(t, f"{path}.topics[{n}]") for n, t in enumerate(topics)))


def changes_from(
    calls: tuple[ToolCall, ...],
    *,
    chat_id: str,
    evidence: dict[str, EvidenceItem],
    context_ids: set[str],
) -> list[MemoryChange]:
    """Validate every tool call (D9.10) and turn the answer into changes; raise on the first violation.

    Facts rest only on person-message Items of this evidence, App results only as support (L3,
    D9.2); observations and edits cite learningContext entries or entries added earlier in the
    step; topics only (V8); ``share`` audiences are checked against every source rule by
    ``apply_changes`` under the lock (V6).
    """
    if len(calls) > MAX_TOOL_CALLS:
        raise Violation("too_many_calls", "tool_calls")
    changes: list[MemoryChange] = []
    added: dict[str, str] = {}  # tool-call id -> new entry id
    for n, call in enumerate(calls):
        path = f"tool_calls[{n}]"
        if call.name not in _FIELDS:
            raise Violation("unknown_tool", f"{path}.name")
        try:
            parsed = json.loads(call.arguments)
        except (ValueError, RecursionError):
            raise Violation("malformed_arguments", f"{path}.arguments") from None
        if not isinstance(parsed, dict):
            raise Violation("malformed_arguments", f"{path}.arguments")
        args = cast(dict[str, Any], parsed)
        required, optional = _FIELDS[call.name]
        keys = set(args)
        if not required <= keys:
            raise Violation("missing_field", f"{path}.{sorted(required - keys)[0]}")
        if keys - required - optional:
            raise Violation("unknown_field", f"{path}.{sorted(keys - required - optional)[0]}")

        def entry_ref(value: str, where: str) -> str:
            if value in added:
                return added[value]
            if value not in context_ids and value not in added.values():
                raise Violation("unknown_entry", where)
            return value

        match call.name:
            case "add_fact":
                content = _content(args, path)
                refs = _str_list(args, "source_item_ids", path)
                kinds: list[str] = []
                for m, ref in enumerate(refs):
                    item = evidence.get(ref)
                    if item is None:
                        raise Violation("unknown_item", f"{path}.source_item_ids[{m}]")
                    if item.kind not in ("PERSON_MESSAGE", "TOOL_RESULT"):
                        raise Violation("not_evidence", f"{path}.source_item_ids[{m}]")
                    kinds.append(item.kind)
                if "PERSON_MESSAGE" not in kinds:
                    raise Violation("app_result_alone", f"{path}.source_item_ids")
                fact = AddFact(
                    content,
                    tuple(ItemRef(chat_id, r) for r in dict.fromkeys(refs)),
                    _topics(args, path),
                    id=new_id("mem"),
                )
                added[call.id] = fact.id
                changes.append(fact)
            case "add_observation":
                content = _content(args, path)
                refs = _str_list(args, "source_entry_ids", path)
                ids = tuple(
                    dict.fromkeys(entry_ref(r, f"{path}.source_entry_ids[{m}]") for m, r in enumerate(refs))
                )
                confidence = args.get("confidence")
                if (
                    not isinstance(confidence, int | float)
                    or isinstance(confidence, bool)
                    or not 0 <= confidence <= 1
                ):
                    raise Violation("bad_confidence", f"{path}.confidence")
                observation = AddObservation(
                    content,
                    ids,
                    float(confidence),
                    _topics(args, path),
                    id=new_id("mem"),
                )
                added[call.id] = observation.id
                changes.append(observation)
            case "invalidate":
                changes.append(Invalidate(entry_ref(_str(args, "entry_id", path), f"{path}.entry_id")))
            case "set_topics":
                entry = entry_ref(_str(args, "entry_id", path), f"{path}.entry_id")
                changes.append(SetTopics(entry, _topics(args, path)))
            case "rename_topic":
                changes.append(
                    RenameTopic(_topic(args["from"], f"{path}.from"), _topic(args["to"], f"{path}.to"))
                )
            case _:  # share
                entry = entry_ref(_str(args, "entry_id", path), f"{path}.entry_id")
                audience = _str_list(args, "audience", path)
                for m, a in enumerate(audience):
                    if not (a == "for:bot" or a.startswith(("for:person:", "for:channel:"))):
                        raise Violation("bad_audience", f"{path}.audience[{m}]")
                changes.append(Share(entry, tuple(audience)))
    return changes
