"""The assembled schema, with limits, caches and error codes on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import strawberry
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
from strawberry.types import ExecutionContext

from resolvers.mutation import Mutation
from resolvers.query import Query
from resolvers.subscription import Subscription
from schema.errors import ErrorCodes
from schema.fanout import EventExecutor, ExtensionsRunner
from schema.types import LONG_SCALAR, Long
from services.settings import Settings

SNAPSHOT = Path(__file__).resolve().parent.parent / "schema" / "schema.graphql"


class Schema(strawberry.Schema):
    def process_errors(self, errors, execution_context=None):  # type: ignore[no-untyped-def]
        """Logging happens in ErrorCodes, without messages (they may quote user input)."""

    def create_extensions_runner(
        self, execution_context: ExecutionContext, extensions: list[SchemaExtension]
    ) -> SchemaExtensionsRunner:
        return ExtensionsRunner(execution_context, extensions)


def build_schema(settings: Settings) -> strawberry.Schema:
    # The depth and alias limits' rules are made once: each limiter makes a class of its own, and
    # made per request they were a new key of the validation cache every time, so it never hit
    # and every operation was validated anew (~2 ms of a GraphQL search's ~5 ms through the API).
    limits = (
        QueryDepthLimiter(max_depth=settings.max_query_depth).validation_rules
        + MaxAliasesLimiter(max_alias_count=settings.max_aliases).validation_rules
    )
    extensions: list[Callable[[], SchemaExtension]] = [
        lambda: AddValidationRules(limits),
        lambda: MaxTokensLimiter(max_token_count=settings.max_query_tokens),
        lambda: ParserCache(maxsize=256),
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
