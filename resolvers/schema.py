"""The assembled schema, with limits, caches and error codes on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import (
    AddValidationRules,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    SchemaExtension,
    ValidationCache,
)
from strawberry.extensions.runner import SchemaExtensionsRunner
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.schema import StreamResult
from strawberry.types import ExecutionContext
from strawberry.types.graphql import OperationType

from resolvers.mutation import Mutation
from resolvers.query import Query
from resolvers.subscription import Subscription
from schema.context import PerOperationAuth
from schema.cost import cost_rule
from schema.errors import ErrorCodes, coded_stream
from schema.fanout import EventExecutor, ExtensionsRunner
from schema.roots import OneMutation
from schema.types import LONG_SCALAR, Long
from services.settings import Settings

SNAPSHOT = Path(__file__).resolve().parent.parent / "schema" / "schema.graphql"


class Schema(strawberry.Schema):
    def process_errors(self, errors, execution_context=None):  # type: ignore[no-untyped-def]
        """Logging happens in ErrorCodes, without messages (they may quote user input)."""

    async def stream(
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        operation_extensions: dict[str, Any] | None = None,
        allowed_operation_types: Iterable[OperationType] | None = None,
    ) -> StreamResult:
        """What graphql-transport-ws runs (every operation on a socket): each result coded as
        HTTP's are (``schema.errors.coded_stream``)."""
        source = await super().stream(
            query,
            variable_values,
            context_value,
            root_value,
            operation_name,
            operation_extensions,
            allowed_operation_types,
        )
        return coded_stream(source)

    def create_extensions_runner(
        self, execution_context: ExecutionContext, extensions: list[SchemaExtension]
    ) -> SchemaExtensionsRunner:
        return ExtensionsRunner(execution_context, extensions)


class _ParserCache(ParserCache):
    """Strawberry's, leaving a document that does not parse to Strawberry's own parse, which
    reports the syntax error on every transport (raised from this hook, it ended a WebSocket
    operation with no error sent and the query's text in the log)."""

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        with contextlib.suppress(GraphQLError):
            context.graphql_document = self.cached_parse_document(context.query, **context.parse_options)
        yield


def build_schema(settings: Settings) -> strawberry.Schema:
    # The depth and alias limits' rules are made once: each limiter makes a class of its own, and
    # made per request they were a new key of the validation cache every time, so it never hit
    # and every operation was validated anew (~2 ms of a GraphQL search's ~5 ms through the API).
    limits = (
        QueryDepthLimiter(max_depth=settings.max_query_depth).validation_rules
        + MaxAliasesLimiter(max_alias_count=settings.max_aliases).validation_rules
        + [cost_rule(settings.max_operation_cost), OneMutation]
    )
    extensions: list[Callable[[], SchemaExtension]] = [
        PerOperationAuth,
        lambda: AddValidationRules(limits),
        lambda: MaxTokensLimiter(max_token_count=settings.max_query_tokens),
        lambda: _ParserCache(maxsize=256),
        lambda: ValidationCache(maxsize=256),
        ErrorCodes,
    ]
    return Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        config=StrawberryConfig(auto_camel_case=True, scalar_map={Long: LONG_SCALAR}),
        extensions=extensions,
        execution_context_class=EventExecutor,
    )
