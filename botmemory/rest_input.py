"""What callers send to ``/v1``: the request bodies and query parameters as pydantic models, read
and validated by :func:`read_body` and :func:`read_query`. A refusal is a 422 ``BAD_INPUT`` naming
the field's path; the services check the values themselves (ids, text, tags) as for GraphQL."""

from __future__ import annotations

import json
import re
from typing import Annotated, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from services import search, validation
from services.errors import BadInput

M = TypeVar("M", bound=BaseModel)


class Body(BaseModel):
    """A JSON request body: exact types, no field we do not know."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Remember(Body):
    """Remember ``content`` as a pinned entry only you see (D9.19)."""

    tag: Literal["Remember"] = Field(alias="_tag")
    content: str
    tags: list[str] = Field(default_factory=list[str], description="Topics, like names or preferences.")


class Forget(Body):
    """Take back your part of the entry ``id`` (V11)."""

    tag: Literal["Forget"] = Field(alias="_tag")
    id: str


class MemoryCommand(Body):
    command: Annotated[Remember | Forget, Field(discriminator="tag")]


#: The ``_tag`` of a command, which pydantic puts in an error's location.
_COMMAND_TAGS: Final = frozenset({"Remember", "Forget"})


class PurgeBody(Body):
    tag: str = Field(description="One from:, chat:, org: or channel: tag.")


class References(Body):
    ids: list[str] = Field(default_factory=list[str], description="The entries an answer used.")


class MetaBody(Body):
    """A Chat's summary as seed 004's map of strings (D9.30)."""

    summary: dict[str, str] = Field(
        description="Keys of 1–200 characters (not a message id such as i-3) to text; at most "
        "20,000 characters in all."
    )
    expected: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        default=None,
        description="The meta's version you read: 409 CONFLICT when it moved since (another "
        "replacement, the worker's compression, a history deletion). Left out: replaced whatever it is.",
    )


class MessageBody(Body):
    """A message of the Chat, seed 004's shape (its ``conversation_id`` is the path's chat)."""

    model_config = ConfigDict(alias_generator=to_camel)

    message: str
    role: Literal["user", "assistant", "notice"] = Field(
        description="user: a person's message, which starts a Turn (its input, rewritten for you "
        "with what helps from memory as startTurn does); assistant: the Bot's reply, added to the "
        "Turn it answers; notice: a platform's notice, which starts a Turn of its own."
    )
    actor_id: str | None = Field(
        default=None, description="A platform token's user message: the person of the chat who said it."
    )
    turn_id: str | None = Field(
        default=None,
        description="An assistant message: the Turn it answers (yours, open). Left out: the chat's latest Turn.",
    )
    complete: bool | None = Field(
        default=None,
        description="Whether the Turn is completed with this message, which lets what the Bot "
        "confided on it be learned. "
        "Left out: an assistant message completes its Turn, a user message leaves its own open.",
    )
    said_at: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        default=None,
        description="When it was said, in epoch milliseconds, for history imported; left out: now.",
    )
    time_zone: str | None = Field(
        default=None, description="A user message: the IANA time zone it was said in (D9.32)."
    )
    conversation_id: str | None = Field(
        default=None,
        alias="conversation_id",
        description="The seed's name of the chat: the path's chat id when given (else BAD_INPUT).",
    )


class Query(BaseModel):
    """Query parameters: strings parsed to their types; one the route does not take is refused
    (:func:`read_query`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: A count or a version in a query (whole, and small enough for the graph).
Whole = Annotated[int, Field(ge=0, lt=2**63)]


def limit_schema(maximum: int | None = None) -> WithJsonSchema:
    """A ``limit`` in a query: a whole number, documented from 1 (to ``maximum``), its bounds
    checked by the service it goes to, which GraphQL's calls reach too, so both say "limit is
    between 1 and N" (pydantic's bounds said "must be at least 1" or "must be at most 100")."""
    bounds = {"minimum": 1} if maximum is None else {"minimum": 1, "maximum": maximum}
    return WithJsonSchema({"type": "integer", **bounds})


#: How many rows a page holds (the services bound it by their page size or the settings').
PageSize = Annotated[int, limit_schema()]
#: How many hits a search returns.
SearchLimit = Annotated[int, limit_schema(search.MAX_LIMIT)]
#: How many characters a memory context holds.
ContextLimit = Annotated[int, limit_schema(validation.MAX_CONTEXT_CHARS)]


class NoQuery(Query):
    """A route that takes no query parameters (``?x=1`` is refused, as on every route)."""


class PageQuery(Query):
    limit: PageSize = 50
    skip: Whole = Field(default=0, le=validation.MAX_SKIP)


class MemoryQuery(Query):
    tags: str | None = Field(default=None, description="Comma-separated tags; entries with all of them.")
    limit: PageSize | None = Field(default=None, description="A page of 1–1000 entries in memory order.")
    after: str | None = Field(default=None, description="The cursor ``next`` of the page before.")

    @field_validator("tags")
    @classmethod
    def _no_empty_tag(cls, tags: str | None) -> str | None:
        # ``?tags=,`` listed the whole memory: a filter of no tag, wider than anything asked for
        # (GraphQL's ``tags: [","]`` is refused as a malformed tag).
        if tags is not None and not all(t.strip() for t in tags.split(",")):
            raise PydanticCustomError("blank", "holds an empty tag")
        return tags

    @property
    def tag_list(self) -> list[str]:
        return [t.strip() for t in self.tags.split(",")] if self.tags is not None else []

    @property
    def paged(self) -> bool:
        return "limit" in self.model_fields_set or "after" in self.model_fields_set


class SearchQuery(Query):
    """``q`` and ``limit`` checked as ``search`` checks ``query`` and ``limit``, named as the route
    names them (a blank or missing ``q`` was refused as "query is empty")."""

    q: str = Field(
        min_length=1,
        max_length=search.MAX_QUERY_CHARS,
        description="What to look for (meaning and keywords).",
    )
    limit: SearchLimit = 10

    @field_validator("q")
    @classmethod
    def _said(cls, q: str) -> str:
        if not q.strip():
            raise PydanticCustomError("blank", "is blank")
        return q


class ContextQuery(Query):
    limit: ContextLimit = Field(default=4000, description="At most this many characters of text.")
    q: str | None = Field(
        default=None,
        max_length=search.MAX_QUERY_CHARS,  # as context checks query, named as the route names it
        description="Choose the entries most relevant to this.",
    )


class LogQuery(Query):
    limit: PageSize | None = Field(default=None, description="1–1000 rows (default 1000).")
    before: Whole | None = Field(default=None, description="Only changes below this version.")


async def read_body(request: Request, model: type[M]) -> M:
    """The JSON body as ``model``; anything else is a BadInput naming the first refused field. An
    object that names a key twice is refused too (a JSON parser keeps the last: a summary's first
    value was lost, and a body of two commands ran the second), as GraphQL refuses a key twice."""
    read_query(request, NoQuery)  # a route that reads a body takes no query parameters
    kind = request.headers.get("content-type")
    if kind is not None and not _JSON.fullmatch(kind.partition(";")[0].strip().lower()):
        # Read as JSON whatever it said (text/plain was saved); GraphQL refuses it too.
        raise HTTPException(415, "send the body as JSON (Content-Type: application/json)")
    raw = await request.body()
    twice = _named_twice(raw)
    if twice is not None:
        # At most 100 characters of it, as KeyTwice says it (a body's key may be a megabyte long).
        raise BadInput(f"the body names the key {twice[:100]!r} twice in one object", field=twice[:100])
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise refusal(exc) from None


#: A JSON media type (``application/json``, or a ``+json`` one).
_JSON: Final = re.compile(r"application/(?:[\w.-]+\+)?json")


class KeyTwice(ValueError):
    """An object of a JSON text names ``key`` twice (raised by :func:`once`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"an object names the key {key[:100]!r} twice")
        self.key = key


def once(items: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads``'s ``object_pairs_hook`` that refuses an object naming a key twice
    (KeyTwice): a JSON parser keeps the last, and what came first is lost."""
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise KeyTwice(key)
        seen.add(key)
    return dict(items)


def _named_twice(raw: bytes) -> str | None:
    """The first key that an object of the JSON text ``raw`` names twice (None: none, or not JSON,
    which the model's own reading then refuses with its reason)."""
    try:
        json.loads(raw, object_pairs_hook=once)
    except KeyTwice as exc:
        return exc.key
    except (ValueError, RecursionError):  # not JSON, not UTF-8 text, or nested too deep for json
        return None
    return None


def read_query(request: Request, model: type[M]) -> M:
    """The query parameters as ``model``. One the route does not take, or one named twice, is
    refused (422 BAD_INPUT naming it): both were let pass — ``?limt=10`` read the whole memory
    unpaged, and ``?tags=a&tags=b`` kept ``b`` alone, a wider list than asked for."""
    items = request.query_params.multi_items()
    seen: set[str] = set()
    for name, _ in items:
        if name not in model.model_fields:
            takes = ", ".join(model.model_fields) or "none"
            raise BadInput(
                f"unknown query parameter {name[:100]!r} (this route takes {takes})", field=name[:100]
            )
        if name in seen:
            raise BadInput(f"the query names {name!r} twice", field=name)
        seen.add(name)
    try:
        return model.model_validate(dict(items))
    except ValidationError as exc:
        raise refusal(exc) from None


def refusal(exc: ValidationError) -> BadInput:
    """The first refused field (services.validation.refusal), a command's ``_tag`` left out of its path."""
    return validation.refusal(exc, skip=_COMMAND_TAGS)
