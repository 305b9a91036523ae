"""The scripted memory model the evaluation runs behind ``OPENAI_BASE_URL`` (``tests.model_server``).

A learning step is answered with the observations LoCoMo wrote for the sessions of its evidence,
as ``add_fact`` calls citing the Items of their evidence turns that are person messages of that
evidence; rewrites get no tool call (the input is kept); confide answers are a fixed text. The
requests it receives are the record the scores are taken from: each rewrite request lists the
entries offered for a person's input.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from eval.dataset import DialogTurn, Observation
from tests.model_server import ModelServer, Recorded, Reply, ToolCall

MODEL = "locomo-eval-model"
TOPICS = ("locomo",)
CONFIDE_ANSWER = "Thank you for telling me. Keep going as you are."
SUMMARY_TEXT = "Two friends catch up on their lives."
NO_TOOL = "Nothing to add."

_ENTRY_ID = re.compile(r"mem_[0-9a-f]+")


@dataclass(frozen=True, slots=True)
class Fact:
    """One ``add_fact`` call: an observation citing the Items it rests on."""

    content: str
    item_ids: tuple[str, ...]
    evidence: tuple[str, ...]  # the dia ids of those Items
    partial: bool  # some of the observation's evidence turns were not available


@dataclass(frozen=True, slots=True)
class Plan:
    facts: tuple[Fact, ...]
    skipped: tuple[Observation, ...]  # none of their evidence turns was available


def plan(observations: Iterable[Observation], available: Mapping[str, str]) -> Plan:
    """The facts of ``observations`` given ``available`` (dia id → Item id of a person message of
    the execution's evidence): each cites what is available, or is skipped when nothing is."""
    facts: list[Fact] = []
    skipped: list[Observation] = []
    for o in observations:
        cited = [d for d in o.evidence if d in available]
        if not cited:
            skipped.append(o)
            continue
        items = tuple(dict.fromkeys(available[d] for d in cited))
        facts.append(Fact(o.sentence, items, tuple(cited), len(cited) < len(o.evidence)))
    return Plan(tuple(facts), tuple(skipped))


def reply_of(p: Plan) -> Reply:
    if not p.facts:
        return Reply(text=NO_TOOL)
    calls = [
        ToolCall(
            "add_fact",
            {"content": f.content, "source_item_ids": list(f.item_ids), "topics": list(TOPICS)},
        )
        for f in p.facts
    ]
    return Reply(tool_calls=calls)


@dataclass(frozen=True, slots=True)
class Offer:
    """An entry a rewrite request offered (id, text and the day it was said, as sent)."""

    id: str
    text: str
    said: str = ""


@dataclass
class Expected:
    """The chat whose execution runs next: its Items and the observations of its sessions."""

    items: Mapping[str, DialogTurn]  # Item id → dialog turn
    observations: Mapping[int, tuple[Observation, ...]]  # session → observations


@dataclass
class ScriptedModel:
    """The model server with the evaluation's script; one learning execution runs at a time, for
    the chat named by :meth:`expect` (the answer is computed from the request's own Items)."""

    server: ModelServer
    expected: Expected | None = None
    answers: int = 0
    mismatches: list[str] = field(default_factory=list[str])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        """Forget earlier requests; script every task."""
        self.server.reset()
        self.server.default("rewrite", Reply(text=NO_TOOL))
        self.server.default("confide", Reply(text=CONFIDE_ANSWER))
        self.server.default("summary", Reply(text=SUMMARY_TEXT))
        self.server.respond("learn", self._learn)
        with self._lock:
            self.answers = 0
            self.mismatches.clear()

    def expect(self, expected: Expected) -> None:
        with self._lock:
            self.expected = expected

    def mark(self) -> int:
        """A position in the request record (see :meth:`offered`)."""
        return len(self.server.requests)

    def learn_answers(self) -> int:
        with self._lock:
            return self.answers

    def _learn(self, recorded: Recorded) -> Reply:
        items = _new_items(recorded)
        with self._lock:
            expected = self.expected
        available: dict[str, str] = {}
        sessions: set[int] = set()
        problems: list[str] = []
        for item in items:
            turn = None if expected is None else expected.items.get(str(item.get("id")))
            if item.get("kind") != "person_message" or turn is None:
                continue
            if item.get("text") != turn.text:
                problems.append(f"{item.get('id')} is not {turn.dia_id}")
                continue
            available[turn.dia_id] = str(item["id"])
            sessions.add(turn.session)
        observations = (
            [] if expected is None else [o for s in sorted(sessions) for o in expected.observations[s]]
        )
        reply = reply_of(plan(observations, available))
        with self._lock:
            self.answers += 1
            self.mismatches += problems
        return reply

    def requests(self, since: int, tasks: Iterable[str]) -> list[Recorded]:
        """The requests of ``tasks`` received after the mark ``since``."""
        wanted = set(tasks)
        return [r for r in self.server.requests[since:] if r.task in wanted]

    def offered(self, since: int, message: str) -> tuple[Offer, ...]:
        """The entries offered by the rewrite request for ``message`` received after ``since`` (the
        last such request; none when the API made none, i.e. nothing visible fit). A rewrite
        request of another shape fails the run: its offers could not be read exactly."""
        found: tuple[Offer, ...] = ()
        for r in self.requests(since, ("rewrite",)):
            text, offers = _notes(r)
            if text == message:
                found = offers
        return found


def _user(recorded: Recorded) -> str:
    messages = cast(list[dict[str, Any]], recorded.body.get("messages") or [])
    users = [m for m in messages if m.get("role") == "user"]
    content = users[-1].get("content") if users else None
    return content if isinstance(content, str) else ""


def _new_items(recorded: Recorded) -> list[dict[str, Any]]:
    try:
        body = json.loads(_user(recorded))
    except ValueError:
        return []
    raw = cast(dict[str, Any], body).get("newItems") if isinstance(body, dict) else None
    return [cast(dict[str, Any], i) for i in cast(list[Any], raw or []) if isinstance(i, dict)]


def _notes(recorded: Recorded) -> tuple[str, tuple[Offer, ...]]:
    """The message and the notes of a rewrite request (``ValueError`` when its shape changed)."""
    try:
        body = json.loads(_user(recorded))
    except ValueError:
        body = None
    if isinstance(body, dict):
        body = cast(dict[str, Any], body)
        notes, message = body.get("notes"), body.get("message")
        if isinstance(notes, list) and isinstance(message, str):
            raw = [cast(dict[str, Any], n) for n in cast(list[Any], notes) if isinstance(n, dict)]
            return message, tuple(
                Offer(str(n.get("id")), str(n.get("text", "")), str(n.get("said", ""))) for n in raw
            )
    raise ValueError("a rewrite request without the message and notes the harness reads: see eval.scripted")


def mentioned(requests: Iterable[Recorded], contents: Mapping[str, str]) -> set[str]:
    """The ids of ``contents`` (entry id → its text) that any of ``requests`` names by id or holds
    the text of."""
    found: set[str] = set()
    for recorded in requests:
        texts = texts_of(recorded)
        ids = {i for t in texts for i in _ENTRY_ID.findall(t)}
        found |= {i for i, content in contents.items() if i in ids or any(content in t for t in texts)}
    return found


def texts_of(recorded: Recorded) -> list[str]:
    """Every string a request holds: each message's content and, where that content is JSON, every
    string inside it (a rewrite's notes), unescaped — what a leak check looks for words in."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            found.append(value)
            try:
                inner = json.loads(value)
            except ValueError:
                return
            if not isinstance(inner, str):
                walk(inner)
        elif isinstance(value, dict):
            for v in cast(dict[str, Any], value).values():
                walk(v)
        elif isinstance(value, list):
            for v in cast(list[Any], value):
                walk(v)

    walk(recorded.body.get("messages"))
    return found
