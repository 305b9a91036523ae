"""Stable ``extensions.code`` on every GraphQL error; unexpected errors are masked and logged safely."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import aclosing

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import StreamResult
from strawberry.types import ExecutionResult

from services import metrics
from services.errors import ServiceError, unavailable

log = logging.getLogger("botmemory.graphql")


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
    message = error.message if code != "INTERNAL" else "internal error"
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
