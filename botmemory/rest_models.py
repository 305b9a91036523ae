"""The response bodies of ``/v1`` (DESIGN §5, D9.19) as pydantic models: camelCase on the wire,
built from the services' domain values, serialised by :func:`respond` and described by the
OpenAPI document (botmemory.openapi)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field
from pydantic.alias_generators import to_camel
from starlette.responses import Response

from services.domain import ItemKind
from services.memorybot import MemoryBotSettings


def _absent(value: object) -> bool:
    return value is None


class Out(BaseModel):
    """A response body: built from a domain value's attributes, written with camelCase names."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, from_attributes=True, frozen=True, extra="forbid"
    )


def respond(body: Out, status: int = 200) -> Response:
    """The one serialiser of REST responses: fields left out when built stay out of the JSON."""
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True),
        status_code=status,
        media_type="application/json",
    )


class ErrorDetail(Out):
    code: str = Field(description="BAD_INPUT, UNAUTHENTICATED, FORBIDDEN, NOT_FOUND, CONFLICT, …")
    message: str = Field(description="Safe to show: never content or secrets.")


class ErrorBody(Out):
    """Every REST error (DESIGN §5)."""

    error: ErrorDetail


#: Seed 004's ``role`` of each kind of Item.
_ROLES: dict[ItemKind, Literal["user", "assistant", "tool", "notice"]] = {
    ItemKind.PERSON_MESSAGE: "user",
    ItemKind.BOT_MESSAGE: "assistant",
    ItemKind.TOOL_CALL: "tool",
    ItemKind.TOOL_RESULT: "tool",
    ItemKind.NOTICE: "notice",
}


class ItemOut(Out):
    """An Item of a Chat (D9.19), also under seed 004's names of a message (``message``, ``role``,
    ``conversation_id``, ``inserted_at``)."""

    id: str
    chat_id: str
    turn_id: str
    kind: ItemKind
    text: str | None
    app: str | None
    speaker_id: str | None
    created_at: int
    said_at: int = Field(description="When it was said: the time the platform gave, else createdAt.")
    time_zone: str | None = Field(
        description="The IANA time zone a person's message was said in (D9.32): the one given for it or "
        "for its Turn's start, else its speaker's; null: UTC."
    )

    @computed_field(description="Seed 004's name of text.")
    @property
    def message(self) -> str | None:
        return self.text

    @computed_field(
        description="Seed 004's role: user (a person's message), assistant (the Bot's), tool (a tool "
        "call or an App's result), notice."
    )
    @property
    def role(self) -> Literal["user", "assistant", "tool", "notice"]:
        return _ROLES[self.kind]

    @computed_field(alias="conversation_id", description="Seed 004's name of chatId.")
    @property
    def conversation_id(self) -> str:
        return self.chat_id

    @computed_field(alias="inserted_at", description="Seed 004's name of createdAt.")
    @property
    def inserted_at(self) -> int:
        return self.created_at


class MessagesPage(Out):
    messages: list[ItemOut]
    total: int


class MessageTurn(Out):
    """The Turn a saved message is in, once saved."""

    id: str
    status: Literal["open", "completed"]
    enriched_input: str | None = Field(
        default=None,
        description="A user message with what helps from memory, for you only (as startTurn's "
        "enrichedInput); only for a user message.",
    )


class SavedMessage(Out):
    """A message saved (seed 004's save-a-message) and its Turn."""

    message: ItemOut
    turn: MessageTurn


class ItemSource(Out):
    """An entry learned from an Item of a Chat."""

    chat: str
    item: str


class EntrySource(Out):
    """An entry derived from another entry."""

    entry: str


class EntryOut(Out):
    """A memory entry (the seed's shape, D9.19); ``confidence`` and ``invalidatedAt`` only when set."""

    id: str
    layer: str
    content: str
    tags: list[str]
    sources: list[ItemSource | EntrySource]
    status: str
    created_at: int
    updated_at: int
    confidence: float | None = Field(default=None, exclude_if=_absent)
    invalidated_at: int | None = Field(default=None, exclude_if=_absent)


class EntryList(Out):
    """The entries for you; ``next`` (the cursor of the following page, null after the last) only
    when a page was asked for with ``limit`` or ``after``."""

    entries: list[EntryOut]
    version: int
    next: str | None = None


class ScoredEntry(Out):
    score: float = Field(
        description="Reciprocal-rank fusion of the entry's ranks by meaning and by keywords among the"
        " results returned, plus a small pinned/recency prior: it counts no entry you cannot see."
    )
    entry: EntryOut


class SearchResults(Out):
    """Best first (design §10)."""

    results: list[ScoredEntry]


class MemoryContext(Out):
    """The visible memory as text and the ids of the entries in it (N3)."""

    text: str
    ids: list[str]


class HasEntries(Out):
    has_entries: bool


class Validity(Out):
    valid: bool


class Remembered(Out):
    entry: EntryOut
    version: int


class Forgotten(Out):
    version: int


class ChangeOut(Out):
    version: int
    at: int
    actor: str
    ids: list[str]
    removed: list[str]


class ChangeLog(Out):
    """Newest first; ``next`` is the ``before`` of the next page (null after the last)."""

    changes: list[ChangeOut]
    version: int
    next: int | None


class Purged(Out):
    removed: int


class BudgetOut(Out):
    period: str = Field(description="day or month (UTC)")
    limit_micros: int


class SpentOut(Out):
    """What the current budget period has cost so far, and the calls whose cost is unknown."""

    micros: int
    unknown_calls: int


class SettingsOut(Out):
    """The memory Bot's settings (C3, D9.13); ``spent`` only while a budget is set."""

    version: int
    instructions: str | None
    concurrency: int | None
    budget: BudgetOut | None
    spent: SpentOut | None = None

    @classmethod
    def of(cls, found: MemoryBotSettings) -> SettingsOut:
        fields: dict[str, Any] = {
            "version": found.version,
            "instructions": found.instructions,
            "concurrency": found.concurrency,
            "budget": found.budget,
        }
        if found.spent_micros is not None:
            fields["spent"] = SpentOut(micros=found.spent_micros, unknown_calls=found.unknown_calls or 0)
        return cls.model_validate(fields)


class ConfessionOut(Out):
    id: str
    turn_id: str
    text: str | None  # null once the chat's history is deleted (V13)
    answer: str | None
    entry_ids: list[str]
    answered_by: str | None
    created_at: int


class Confessions(Out):
    """One page, oldest first (``limit``, ``skip``); ``total``: how many the Chat has."""

    confessions: list[ConfessionOut]
    total: int


class EnrichmentOut(Out):
    """A rewrite with its original words; ``text`` is null when withheld (D9.6)."""

    id: str
    turn_id: str
    text: str | None
    original: str | None
    entry_ids: list[str]
    created_at: int


class Enrichments(Out):
    """One page, oldest first (``limit``, ``skip``); ``total``: how many the Chat has."""

    enrichments: list[EnrichmentOut]
    total: int


class SetAsideOut(Out):
    """Evidence a refused step never learned: Items ``first``..``last`` and the refusal codes."""

    first: int
    last: int
    codes: list[str]


class ExecutionOut(Out):
    id: str
    turn_id: str
    status: str
    learned: int
    error: str | None
    set_aside: list[SetAsideOut]
    created_at: int
    ended_at: int | None


class Executions(Out):
    """One page, newest first (``limit``, ``skip``); ``total``: how many the Chat has."""

    executions: list[ExecutionOut]
    total: int


class Preference(Out):
    id: str
    content: str


class ChatMetaOut(Out):
    """Seed 004's ConversationMeta of a Chat (D9.30): its summary — the worker's text under
    ``summary``, or the map its owner set — then ``i-N`` → the text of the latest messages after
    it (under ~20,000 characters the summary is these messages alone)."""

    chat_id: str
    summary: dict[str, str]
    version: int = Field(
        description="Its version (0 before the first summary; a replacement, the worker's compression or a "
        "history deletion moves it, never back): send it as ``expected``."
    )


class ChatMetaList(Out):
    """The meta of the Chats you may read that have one, newest Chat first."""

    data: list[ChatMetaOut]
    total: int


class ContextPackOut(Out):
    """Summary, the first 20 preferences in memory order, the last 10 messages and the visible
    memory of a Chat (D9.17)."""

    chat_id: str
    summary: str | None
    preferences: list[Preference]
    last_messages: list[ItemOut]
    memory: MemoryContext

    @computed_field(alias="last_messages", description="Seed 004's name of lastMessages.")
    @property
    def seed_last_messages(self) -> list[ItemOut]:
        return self.last_messages

    meta: dict[str, str] = Field(
        description="Seed 004's conversation meta (D9.30): the summary, then `i-N` → the messages after "
        "it, so none between the summary and the last messages is left out."
    )
