"""The learning step's model protocol (DESIGN §7) and the server's check of every answer (L3, V6,
V8, D9.2, D9.10).

The request lists the new Items (id, kind, speaker, text) and the learningContext entries with
their ids and topic counts; the model answers with tool calls. :func:`changes_from` turns them
into ``apply_changes`` changes or raises :class:`Violation` — one violation rejects the whole
step. A violation carries a code and a field path only, never the model's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from learning import toolcalls
from learning.gateway import ToolCall
from learning.toolcalls import TOOLS as TOOLS  # re-exported: the request offers them
from learning.toolcalls import Violation as Violation  # re-exported: the runner catches it
from services.changes import (
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
    "The Bot's own words and tool calls only show where to look: they never become facts. "
    "botConfided, what the Bot said of its own work during the items named by 'during' (a mistake, "
    "a doubt), likewise only shows where to look: look there for what a person said, and never "
    "cite or keep the Bot's words. A notice "
    "is never a person's words. Items carry when they were said: in the speaker's own time zone "
    "with its offset ('2023-06-16T06:56-07:00'), or in UTC ('…Z') when it is unknown; entries carry "
    "their day in UTC. Where a person names a time from when they spoke ('yesterday', 'next week'), keep "
    "their words and add the day they spoke, as their item's time gives it ('yesterday, said on "
    "2023-06-16'). If there is nothing worth keeping, call no tool."
)


@dataclass(frozen=True, slots=True)
class EvidenceItem:
    id: str  # i-N within the chat
    kind: str
    speaker: str
    text: str
    #: When it was said, to the minute: local with its offset, or UTC (D9.31, D9.32); "" left out.
    said: str = ""

    def json(self) -> dict[str, str]:
        found = {"id": self.id, "kind": self.kind.lower(), "speaker": self.speaker, "text": self.text}
        if self.said:
            found["said"] = self.said
        return found


@dataclass(frozen=True, slots=True)
class Confided:
    """What the Bot confided during the new Items ``during`` (their ids): where to look, never a
    source (it has no id to cite)."""

    during: tuple[str, ...]
    text: str

    def json(self) -> dict[str, object]:
        return {"during": list(self.during), "text": self.text}


#: Characters of the Bot's confessions a learning request carries at most: the first always (cut
#: to this), then the next while they fit — enough to show where to look, and never what makes a
#: request too long for a model (a Bot may confide at length, and many times in a Turn).
CONFIDED_CHARS: Final = 8_000


def within_confided(confided: Iterable[Confided]) -> list[Confided]:
    """The first of ``confided`` that hold CONFIDED_CHARS characters together (the first cut to
    them); the rest are never taken from ``confided``."""
    taken: list[Confided] = []
    size = 0
    for c in confided:
        if not taken and len(c.text) > CONFIDED_CHARS:
            return [Confided(c.during, c.text[: CONFIDED_CHARS - 1] + "…")]
        size += len(c.text)
        if size > CONFIDED_CHARS:
            break
        taken.append(c)
    return taken


def request_body(
    system: str,
    items: list[EvidenceItem],
    entries: list[dict[str, Any]],
    topics: Sequence[Mapping[str, object]],
    confided: Iterable[Confided] = (),
) -> dict[str, Any]:
    """The learning request (§7): deterministic, so recovery finds the saved call by its hash.
    ``confided`` is taken only as far as the request holds it (:func:`within_confided`)."""
    asked: dict[str, object] = {"newItems": [i.json() for i in items]}
    taken = within_confided(confided)
    if taken:
        asked["botConfided"] = [c.json() for c in taken]
    user = json.dumps(
        {**asked, "keptEntries": entries, "topicCounts": topics},
        ensure_ascii=False,
    )
    return {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": TOOLS,
        "tool_choice": "auto",
    }


#: Re-asks of a refused step (D9.21): the violation goes back to the model as a tool error.
MAX_REASKS = 2

_Item = TypeVar("_Item", bound=Mapping[str, Any])


def within_chars(items: Sequence[_Item], limit: int) -> list[_Item]:
    """The first of ``items`` (each with its ``textLength``) whose texts hold at most ``limit``
    characters together — the first whatever its size, so that every request moves on."""
    taken: list[_Item] = []
    size = 0
    for item in items:
        size += item["textLength"]
        if taken and size > limit:
            break
        taken.append(item)
    return taken


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


def changes_from(
    calls: tuple[ToolCall, ...],
    *,
    chat_id: str,
    evidence: dict[str, EvidenceItem],
    context_ids: set[str],
    org: str,
    own_audience: frozenset[str] = frozenset(),
) -> list[MemoryChange]:
    """Validate every tool call (D9.10) and turn the answer into changes; raise on the first violation.

    Facts rest only on person-message Items of this evidence, App results only as support (L3,
    D9.2); observations and edits cite learningContext entries or entries added earlier in the
    step; topics only (V8); ``share`` audiences are checked against every source rule by the
    step against the memory as it stands, then by ``apply_changes`` under the lock (V6); a
    ``share`` of a fact the same answer adds, only within ``own_audience`` (the audience the
    evidence's Chat itself has: its owner, or its channel); a topic renamed within ``org``, the
    Chat's organization (L4).
    """
    if len(calls) > MAX_TOOL_CALLS:
        raise Violation("too_many_calls", "tool_calls")
    changes: list[MemoryChange] = []
    added: dict[str, str] = {}  # tool-call id -> new entry id
    facts: set[str] = set()  # the new facts' ids: their sources are this Chat's Items
    # Entries the answer invalidated: a later observation citing one is the answer's violation, as
    # the commit would refuse the whole answer (a source no longer active) and every later step of
    # the Chat would get the same answer ("she changed her mind": invalidate, then observe on it).
    # (Topics set on them or a share of them are applied: only a retracted entry is refused.)
    invalidated: set[str] = set()
    for n, call in enumerate(calls):
        path = f"tool_calls[{n}]"
        args = toolcalls.parse(call.name, call.arguments, path)

        def entry_ref(value: str, where: str, *, cited: bool = False) -> str:
            entry = added.get(value, value)
            if entry not in context_ids and entry not in added.values():
                raise Violation("unknown_entry", where)
            if cited and entry in invalidated:
                raise Violation("entry_inactive", where)
            return entry

        match args:
            case toolcalls.AddFact():
                kinds: list[str] = []
                for m, ref in enumerate(args.source_item_ids):
                    item = evidence.get(ref)
                    if item is None:
                        raise Violation("unknown_item", f"{path}.source_item_ids[{m}]")
                    if item.kind not in ("PERSON_MESSAGE", "TOOL_RESULT"):
                        raise Violation("not_evidence", f"{path}.source_item_ids[{m}]")
                    kinds.append(item.kind)
                if "PERSON_MESSAGE" not in kinds:
                    raise Violation("app_result_alone", f"{path}.source_item_ids")
                fact = AddFact(
                    args.content,
                    tuple(ItemRef(chat_id, r) for r in dict.fromkeys(args.source_item_ids)),
                    tuple(dict.fromkeys(args.topics)),
                    id=new_id("mem"),
                )
                added[call.id] = fact.id
                facts.add(fact.id)
                changes.append(fact)
            case toolcalls.AddObservation():
                ids = tuple(
                    dict.fromkeys(
                        entry_ref(r, f"{path}.source_entry_ids[{m}]", cited=True)
                        for m, r in enumerate(args.source_entry_ids)
                    )
                )
                observation = AddObservation(
                    args.content,
                    ids,
                    float(args.confidence),
                    tuple(dict.fromkeys(args.topics)),
                    id=new_id("mem"),
                )
                added[call.id] = observation.id
                changes.append(observation)
            case toolcalls.Invalidate():
                entry = entry_ref(args.entry_id, f"{path}.entry_id")
                invalidated.add(entry)
                changes.append(Invalidate(entry))
            case toolcalls.SetTopics():
                entry = entry_ref(args.entry_id, f"{path}.entry_id")
                changes.append(SetTopics(entry, tuple(dict.fromkeys(args.topics))))
            case toolcalls.RenameTopic():
                changes.append(RenameTopic(args.from_, args.to, org))
            case toolcalls.Share():
                entry = entry_ref(args.entry_id, f"{path}.entry_id")
                within = entry in facts and set(args.audience) <= own_audience
                if entry in added.values() and not within:
                    # A new entry may be shared only within its sources' rule (V6); wider is
                    # refused by the commit alone (the shares are checked before it against what
                    # is stored), so every later step of the Chat got the same answer and failed
                    # again. A new fact's sources are this Chat's: within its own audience.
                    raise Violation("share_of_new_entry", f"{path}.entry_id")
                changes.append(Share(entry, tuple(args.audience)))
    return changes
