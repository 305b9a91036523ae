"""The arguments of the learning step's tools as pydantic models (DESIGN §7, D9.10).

One model per tool is both the JSON schema the model is offered (:data:`TOOLS`) and the check of
what it answers (:func:`parse`): strict types, no unknown fields, the limits of a caller's change
(content length, topics V8, ids). A refusal becomes a :class:`Violation` with a stable code and the
field path of the first error — never the model's text. What depends on the step (which Items are
evidence, which entries may be cited) is checked afterwards by ``learning.protocol``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from services.changes import MAX_CONTENT_CHARS, MAX_TOPICS
from services.memory import TOPIC
from services.validation import UNSTORABLE

M = TypeVar("M", bound=BaseModel)

#: The longest id and the most ids one argument may cite.
MAX_ID_CHARS: Final = 200
MAX_IDS: Final = 100


class Violation(Exception):
    """A model answer breaks a rule; ``code`` and ``path`` name it without any content."""

    def __init__(self, code: str, path: str) -> None:
        super().__init__(f"{code} at {path}")
        self.code, self.path = code, path


def _storable(value: str) -> str:
    if UNSTORABLE.search(value):  # nothing could encrypt it: INTERNAL after the Turn was saved
        raise PydanticCustomError("bad_string", "not storable text")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("bad_string", "blank")
    return _storable(value)


def _topic(value: str) -> str:
    if ":" in value:
        raise PydanticCustomError("colon_tag", "colon tags belong to the server")  # V1, V8
    if not TOPIC.fullmatch(value) or len(value) > 64:
        raise PydanticCustomError("bad_topic", "not a topic")
    return value


def _audience(value: str) -> str:
    if not (value == "for:bot" or value.startswith(("for:person:", "for:channel:"))):
        raise PydanticCustomError("bad_audience", "not an audience")
    return value


Content = Annotated[str, Field(max_length=MAX_CONTENT_CHARS), AfterValidator(_not_blank)]
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_storable)]
Ids = Annotated[list[Id], Field(min_length=1, max_length=MAX_IDS)]
Topic = Annotated[str, AfterValidator(_topic)]
Topics = Annotated[list[Topic], Field(max_length=MAX_TOPICS, description="lowercase-with-dashes topics")]
Audience = Annotated[str, AfterValidator(_audience)]


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AddFact(_Arguments):
    """Keep something a person said or did."""

    content: Content
    source_item_ids: Ids
    topics: Topics = []


class AddObservation(_Arguments):
    """Keep a conclusion drawn from kept entries."""

    content: Content
    source_entry_ids: Ids
    confidence: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    topics: Topics = []


class Invalidate(_Arguments):
    """Mark a kept entry as no longer true."""

    entry_id: Id


class SetTopics(_Arguments):
    """Replace the topics of a kept entry."""

    entry_id: Id
    topics: Topics


class RenameTopic(_Arguments):
    """Rename a topic on every entry that has it."""

    model_config = ConfigDict(populate_by_name=False)

    from_: Topic = Field(alias="from")
    to: Topic


class Share(_Arguments):
    """Show a kept entry to a wider audience: for:person:<id>, for:channel:<id> or for:bot."""

    entry_id: Id
    audience: Annotated[list[Audience], Field(min_length=1, max_length=MAX_IDS)]


class RewriteInput(_Arguments):
    """The person's message rewritten with what helps from the notes."""

    text: Annotated[str, AfterValidator(_not_blank)]
    used_entry_ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_IDS)]


class Confide(BaseModel):
    """A place to say how your work goes: when you are stuck, unsure, upset or proud, or when you
    made a mistake. You get a short answer."""

    # Other fields are ignored, as before; the schema still asks for none.
    model_config = ConfigDict(strict=True, frozen=True, json_schema_extra={"additionalProperties": False})

    text: Annotated[str, AfterValidator(_not_blank)]


Arguments = AddFact | AddObservation | Invalidate | SetTopics | RenameTopic | Share

MODELS: Final[dict[str, type[Arguments]]] = {
    "add_fact": AddFact,
    "add_observation": AddObservation,
    "invalidate": Invalidate,
    "set_topics": SetTopics,
    "rename_topic": RenameTopic,
    "share": Share,
}


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a tool's parameters: no titles (they only cost tokens)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title"}  # pyright: ignore[reportUnknownVariableType]
        if isinstance(node, list):
            return [strip(v) for v in node]  # pyright: ignore[reportUnknownVariableType]
        return node

    schema: dict[str, Any] = strip(model.model_json_schema(by_alias=True))
    schema.pop("description", None)  # the tool's description already says it
    return schema


def tool(name: str, model: type[BaseModel]) -> dict[str, Any]:
    """The tool ``name`` with ``model``'s arguments, in the OpenAI ``tools`` format."""
    description = " ".join((model.__doc__ or name).split())
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": _schema(model)},
    }


#: The tools of a learning step, from the models above.
TOOLS: Final[list[dict[str, Any]]] = [tool(name, model) for name, model in MODELS.items()]

_LIST_FIELDS: Final = frozenset({"source_item_ids", "source_entry_ids", "topics", "audience"})
_TOPIC_FIELDS: Final = frozenset({"topics", "from", "to"})


def _code(error: ErrorDetails) -> str:
    """The stable violation code of one pydantic error (the codes predate the models)."""
    kind, loc = error["type"], error["loc"]
    field = str(loc[0]) if loc else ""
    if kind == "missing":
        return "missing_field"
    if kind == "extra_forbidden":
        return "unknown_field"
    if kind in ("bad_string", "colon_tag", "bad_topic", "bad_audience"):
        return kind
    if field == "confidence":
        return "bad_confidence"
    if len(loc) == 1 and field == "content" and kind == "string_too_long":
        return "too_long"
    if len(loc) == 1 and field == "topics" and kind == "too_long":
        return "too_many_topics"
    if len(loc) == 1 and field in _LIST_FIELDS:
        return "bad_list"
    if field in _TOPIC_FIELDS:
        return "bad_topic"
    return "bad_string"


#: An unknown field's place in a violation's path, for the name the model gave it.
UNKNOWN_FIELD: Final = "<unknown>"


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    return prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def checked(model: type[M], arguments: str) -> M | None:
    """``arguments`` as ``model``, or None when they are not a JSON object of its shape."""
    try:
        parsed = json.loads(arguments)
        return model.model_validate(parsed) if isinstance(parsed, dict) else None
    except (ValueError, RecursionError, TypeError):  # ValidationError is a ValueError
        return None


def parse(name: str, arguments: str, path: str) -> Arguments:
    """The checked arguments of one tool call, or the :class:`Violation` of its first error
    (missing fields first, then unknown ones, then the fields in order)."""
    model = MODELS.get(name)
    if model is None:
        raise Violation("unknown_tool", f"{path}.name")
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError, TypeError):
        raise Violation("malformed_arguments", f"{path}.arguments") from None
    if not isinstance(parsed, dict):
        raise Violation("malformed_arguments", f"{path}.arguments")
    try:
        return model.model_validate(parsed)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        rank = {"missing": 0, "extra_forbidden": 1}
        first = min(enumerate(errors), key=lambda e: (rank.get(e[1]["type"], 2), e[0]))[1]
        loc = tuple(first["loc"])
        if first["type"] == "extra_forbidden":
            # The model chose that key: it may say anything, and a path is stored and logged in
            # the clear (D9.21, E4: a code and a field path, never content).
            loc = (*loc[:-1], UNKNOWN_FIELD)
        raise Violation(_code(first), _path(path, loc)) from None
