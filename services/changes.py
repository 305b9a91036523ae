"""The changes a Bot's memory accepts, as values, and their checks before anything is applied:
topics (V8), content size, and the shape of each change (D9.2, D9.3). :mod:`services.writepath`
applies them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.errors import BadInput
from services.ids import new_id
from services.memory import TOPIC

Actor = Literal["memory_bot", "person", "promotion", "system"]
MAX_CONTENT_CHARS = 4000
MAX_TOPICS = 20
MAX_CHANGES = 10_000


@dataclass(frozen=True, slots=True)
class ItemRef:
    chat: str
    item: str


@dataclass(frozen=True, slots=True)
class AddFact:
    content: str
    sources: tuple[ItemRef, ...]
    topics: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: new_id("mem"))


@dataclass(frozen=True, slots=True)
class AddObservation:
    content: str
    source_entry_ids: tuple[str, ...]
    confidence: float
    topics: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: new_id("mem"))


@dataclass(frozen=True, slots=True)
class Remember:
    content: str
    person_id: str
    org: str
    topics: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: new_id("mem"))


@dataclass(frozen=True, slots=True)
class Invalidate:
    entry_id: str


@dataclass(frozen=True, slots=True)
class SetTopics:
    entry_id: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RenameTopic:
    """Rename a topic on every entry valid for learning in ``org`` (L4: what the learning of that
    organization is shown, all of it; never another organization's entry on a linked Bot)."""

    old: str
    new: str
    org: str


@dataclass(frozen=True, slots=True)
class Share:
    """Replace the ``for:`` tags with a wider audience, only within every source rule (V6, D9.3)."""

    entry_id: str
    audience: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Revise:
    """New content for an active entry (a content change bumps its place in memory order, D9.14)."""

    entry_id: str
    content: str


@dataclass(frozen=True, slots=True)
class Forget:
    entry_id: str
    person_id: str


MemoryChange = (
    AddFact | AddObservation | Remember | Invalidate | SetTopics | RenameTopic | Share | Revise | Forget
)


@dataclass(frozen=True, slots=True)
class Applied:
    version: int
    entry_ids: tuple[str, ...]
    at: int = 0  # when (epoch ms): the entries' createdAt/updatedAt
    #: Entries the change hid from someone who saw them (D9.24): readers are told at delivery.
    removed: tuple[str, ...] = ()


def check_topics(topics: tuple[str, ...], field_name: str = "topics") -> tuple[str, ...]:
    """Topics only (V8): callers and the model never write colon tags."""
    if len(topics) > MAX_TOPICS:
        raise BadInput(f"at most {MAX_TOPICS} topics", field=field_name)
    for topic in topics:
        if ":" in topic:
            raise BadInput("tags with a colon belong to OpenBot", field=field_name)
        if not TOPIC.fullmatch(topic) or len(topic) > 64:
            raise BadInput("a topic has lowercase letters, numbers and dashes", field=field_name)
    return tuple(dict.fromkeys(topics))


def check_content(content: str) -> str:
    if not content.strip():
        raise BadInput("content must not be empty", field="content")
    if len(content) > MAX_CONTENT_CHARS:
        raise BadInput(f"content is longer than {MAX_CONTENT_CHARS} characters", field="content")
    if "\x00" in content:  # as every other stored text (services.validation.UNSTORABLE)
        raise BadInput("content contains a NUL character", field="content")
    return content


def validate(change: MemoryChange) -> None:
    match change:
        case AddFact() | AddObservation() | Remember():
            check_content(change.content)
            check_topics(change.topics)
        case Revise():
            check_content(change.content)
        case SetTopics():
            check_topics(change.topics)
        case RenameTopic():
            check_topics((change.old, change.new))
        case _:
            pass
    if isinstance(change, AddObservation) and not 0 <= change.confidence <= 1:
        raise BadInput("confidence is between 0 and 1", field="confidence")
    if isinstance(change, AddFact) and not change.sources:
        raise BadInput("a fact needs source items", field="sources")
    if isinstance(change, AddObservation) and not change.source_entry_ids:
        raise BadInput("an observation needs source entries", field="sourceEntryIds")
