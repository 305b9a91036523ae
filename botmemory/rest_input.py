"""What callers send to ``/v1``: the request bodies and query parameters as pydantic models, read
and validated by :func:`read_body` and :func:`read_query`. A refusal is a 422 ``BAD_INPUT`` naming
the field's path; the services check the values themselves (ids, text, tags) as for GraphQL."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails
from starlette.requests import Request

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


class Query(BaseModel):
    """Query parameters: strings parsed to their types; parameters we do not know are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


#: A count or a version in a query (whole, and small enough for the graph).
Whole = Annotated[int, Field(ge=0, lt=2**63)]


class PageQuery(Query):
    limit: Whole = 50
    skip: Whole = 0


class MemoryQuery(Query):
    tags: str | None = Field(default=None, description="Comma-separated tags; entries with all of them.")
    limit: Whole | None = Field(default=None, description="A page of 1–1000 entries in memory order.")
    after: str | None = Field(default=None, description="The cursor ``next`` of the page before.")

    @property
    def tag_list(self) -> list[str]:
        return [t.strip() for t in self.tags.split(",") if t.strip()] if self.tags else []

    @property
    def paged(self) -> bool:
        return "limit" in self.model_fields_set or "after" in self.model_fields_set


class SearchQuery(Query):
    q: str = Field(default="", description="What to look for (meaning and keywords).")
    limit: Whole = 10


class ContextQuery(Query):
    limit: Whole = Field(default=4000, description="At most this many characters of text.")
    q: str | None = Field(default=None, description="Choose the entries most relevant to this.")


class LogQuery(Query):
    limit: Whole | None = Field(default=None, description="1–1000 rows (default 1000).")
    before: Whole | None = Field(default=None, description="Only changes below this version.")


async def read_body(request: Request, model: type[M]) -> M:
    """The JSON body as ``model``; anything else is a BadInput naming the first refused field."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise refusal(exc) from None


def read_query(request: Request, model: type[M]) -> M:
    """The query parameters as ``model`` (the last value of a repeated one)."""
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise refusal(exc) from None


#: What a refused value is told, by pydantic's error type (others get pydantic's own words).
_TOLD: Final = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


def refusal(exc: ValidationError) -> BadInput:
    """The first refused field: an unknown one first (the first by path), else pydantic's first
    error; the message starts with the field's path (``command.tags[1]``)."""
    errors = exc.errors(include_url=False)
    unknown = sorted(_path(e) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return BadInput(f"unknown field {unknown[0]}", field=unknown[0])
    first = errors[0]
    path = _path(first)
    if first["type"] == "json_invalid":
        return BadInput("the body is not valid JSON")
    if not path:
        return BadInput("the body must be a JSON object")
    if first["type"].startswith("union_tag_"):
        path += "._tag"
    return BadInput(f"{path} {_told(first)}", field=path)


def _told(error: ErrorDetails) -> str:
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    match error["type"]:
        case "literal_error":
            return f"must be {ctx['expected']}"
        case "union_tag_invalid":
            return f"must be one of {ctx['expected_tags']}"
        case "union_tag_not_found":
            return "is required"
        case "greater_than":
            return f"must be above {ctx['gt']}"
        case "greater_than_equal":
            return f"must be at least {ctx['ge']}"
        case "less_than":
            return f"must be below {ctx['lt']}"
        case "less_than_equal":
            return f"must be at most {ctx['le']}"
        case kind:
            return _TOLD.get(kind, str(error["msg"]))


def _path(error: ErrorDetails) -> str:
    path = ""
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in _COMMAND_TAGS:
            path += f".{part}" if path else part
    return path
