"""Stable ``extensions.code`` on every GraphQL error; unexpected errors are masked and logged safely."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from services import metrics
from services.errors import ServiceError

log = logging.getLogger("botmemory.graphql")


def code_of(error: GraphQLError) -> str:
    original = error.original_error
    if isinstance(original, ServiceError):
        return original.code
    if error.path is None or original is None:
        return "BAD_INPUT"  # syntax, validation, variable coercion and limit errors
    return "INTERNAL"


def with_code(error: GraphQLError) -> GraphQLError:
    """The error the client sees: our message and code, or a masked internal error."""
    if error.extensions and "code" in error.extensions:
        return error
    code = code_of(error)
    original = error.original_error
    message = error.message if code != "INTERNAL" else "internal error"
    extensions = dict(error.extensions or {}) if code != "INTERNAL" else {}
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


class ErrorCodes(SchemaExtension):
    """Puts a stable code on each error of the operation's result (after limits and execution)."""

    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        errors = getattr(result, "errors", None)
        if result is not None and errors:
            coded = [with_code(e) for e in errors]
            result.errors = coded  # type: ignore[union-attr]
            for e in coded:
                metrics.REQUESTS.labels(surface="graphql", code=(e.extensions or {})["code"]).inc()
