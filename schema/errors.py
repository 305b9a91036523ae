"""Stable ``extensions.code`` on every GraphQL error; unexpected errors are masked and logged safely."""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Collection, Iterator
from contextlib import aclosing
from typing import Final

from graphql import GraphQLError, Node, VariableDefinitionNode, print_ast
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import StreamResult
from strawberry.types import ExecutionResult

from services import metrics
from services.errors import ServiceError, unavailable

log = logging.getLogger("botmemory.graphql")

#: A name graphql-core's messages quote (a field, an argument, an operation the caller named) is
#: cut to this many characters, as the REST errors cut theirs: a field named by 900 kB came back
#: whole, to anyone, token or not.
NAME_CHARS: Final = 100
_QUOTED: Final = re.compile("(['\"])([^'\"]{" + str(NAME_CHARS) + "})[^'\"]+\\1")
#: Where graphql-core's messages about a literal go on to quote it.
_VALUE_SAID: Final = (", found", "; found", " Found:", ", but encountered error")
#: A scalar's refusal, quoting the value after its colon ("String cannot represent a non string
#: value: …").
_SCALAR_SAID: Final = re.compile(r"(cannot represent [^:]*value): .*", re.S)
#: A syntax error quoting a literal of the document ("Unexpected String 'my words'.").
_TOKEN_SAID: Final = re.compile(r"(Unexpected (?:BlockString|String|Int|Float)) '.*'", re.S)
#: An enum's refusal of a name it lacks, quoting it ("Value 'my words' does not exist in 'Access'
#: enum."): the last such clause is graphql-core's, whatever the quoted value holds.
_ENUM_SAID: Final = re.compile(r"Value '.*'( does not exist in '\w+' enum\.)", re.S)


def without_values(message: str, nodes: Collection[Node] | None = None) -> str:
    """graphql-core's message for a document or variables it refused, saying where and why but
    not quoting the value it was given — a variable's value, a literal, a token of the document:
    the caller's words, which no error carries (graphql-core quoted up to 240 characters of
    them) — and with long names cut."""
    head, found, rest = message.partition(" has invalid value")
    if found:  # a variable's or an argument's: where in the value (the schema's names), and why
        at, _, reason = rest.partition(": ")
        why = _unquoted(reason) if reason else ""
        node = next(iter(nodes or ()), None)
        if not why and isinstance(node, VariableDefinitionNode):
            why = f"{print_ast(node.type)} expected."
        message = f"{head} has an invalid value{at}" + (f": {why}" if why else ".")
    else:
        message = _unquoted(message)
    return _QUOTED.sub(r"\1\2…\1", message)


def _unquoted(message: str) -> str:
    """``message`` up to where it quotes a value it was given."""
    cut = min((at for at in (message.find(c) for c in _VALUE_SAID) if at >= 0), default=-1)
    if cut >= 0:
        message = message[:cut].rstrip(" .,;:") + "."
    message = _ENUM_SAID.sub(r"Value\1", message)
    return _TOKEN_SAID.sub(r"\1", _SCALAR_SAID.sub(r"\1.", message))


def code_of(error: GraphQLError) -> str:
    original = error.original_error
    if isinstance(original, ServiceError):
        return original.code
    if original is not None and unavailable(original) is not None:
        return "UNAVAILABLE"  # Neo4j or Redis did not answer: the operation may be sent again
    if (
        isinstance(original, GraphQLError)
        and error.path is not None
        and not original.message.startswith("Argument ")
    ):
        # Raised as a field's value was completed: a value its type cannot hold, a null where
        # none may be — ours, and graphql-core quotes the value (a row, up to 240 characters).
        # Only an argument's value is refused at that point for the caller's doing.
        return "INTERNAL"
    if original is None or isinstance(original, GraphQLError):
        return "BAD_INPUT"  # syntax, validation and limit errors
    if error.path is None and error.nodes:
        return "BAD_INPUT"  # a variable's value that its scalar refused
    return "INTERNAL"  # a resolver's, or a subscription's source's (no path, no nodes)


def with_code(error: GraphQLError) -> GraphQLError:
    """The error the client sees: our message and code, or a masked internal error."""
    if error.extensions and "code" in error.extensions:
        return error
    code = code_of(error)
    original = error.original_error
    if code == "INTERNAL":
        message = "internal error"
    elif isinstance(original, ServiceError):
        message = error.message  # ours: quotes no input
    else:
        message = without_values(error.message, error.nodes)
    extensions = dict(error.extensions or {}) if code != "INTERNAL" else {}
    down = None if original is None or isinstance(original, ServiceError) else unavailable(original)
    if down is not None:  # the driver's message names hosts: ours says what to do
        message, extensions = down.message, {}
        log.warning("unavailable at %s: %s", error.path, type(original).__name__)
    extensions["code"] = code
    if isinstance(original, ServiceError) and original.field:
        extensions["field"] = original.field
    if code == "INTERNAL" and original is not None:
        # Type and stack only: exception messages may quote user input or content.
        log.error(
            "internal error at %s: %s\n%s",
            error.path,
            type(original).__name__,
            "".join(traceback.format_tb(original.__traceback__)),
        )
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=None,
        extensions=extensions,
    )


def code_all(errors: list[GraphQLError]) -> list[GraphQLError]:
    """``errors`` as the client sees them (:func:`with_code`), each counted by its code."""
    coded = [with_code(e) for e in errors]
    for e in coded:
        metrics.REQUESTS.labels(surface="graphql", code=(e.extensions or {})["code"]).inc()
    return coded


class ErrorCodes(SchemaExtension):
    """Puts a stable code on each error of the operation's result (after limits and execution).
    A streamed operation's results are sent before this runs: :func:`coded_stream` codes those."""

    def on_operation(self) -> Iterator[None]:
        yield
        if getattr(self.execution_context.context, "streamed", False):
            return
        result = self.execution_context.result
        errors = getattr(result, "errors", None)
        if result is not None and errors:
            result.errors = code_all(errors)  # type: ignore[union-attr]


async def coded_stream(source: StreamResult) -> StreamResult:
    """``Schema.stream``'s results (graphql-transport-ws: queries, mutations and subscription
    events) with every error coded and internal ones masked, as HTTP gets them."""
    async with aclosing(source):
        async for result in source:
            if isinstance(result, ExecutionResult) and result.errors:
                result.errors = code_all(result.errors)
            yield result
