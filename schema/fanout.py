"""Subscription events executed and serialised once for all the subscribers they go to.

The change feed hands every local subscriber with the same visible entries the same event
object (``services.changefeed``). Each subscription still runs graphql-core's per-event
execution, but ``EventExecutor`` keys the result on the event: subscribers of one event with
the same operation (document text, operation name, variable values) share one execution, and
its ``data`` is a ``SharedData`` whose JSON is encoded once, on first send
(``botmemory.app.GraphQLApp.encode_json`` wraps it in each subscriber's own message id).
``ExtensionsRunner`` leaves out Strawberry's per-result extension work when no extension of the
operation has any.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, cast

from graphql import ExecutionResult
from graphql.execution import Executor
from strawberry.extensions import SchemaExtension
from strawberry.extensions.context import StreamResultContextManager
from strawberry.extensions.runner import SchemaExtensionsRunner
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.types import ExecutionContext, StreamExecutionResult
from strawberry.utils.await_maybe import await_maybe

from services import metrics

OperationKey = tuple[str, str | None, str]


class SharedData(dict[str, Any]):
    """The ``data`` of a shared result; its compact JSON is computed once."""

    __slots__ = ("_json",)

    def json(self) -> str:
        try:
            return self._json
        except AttributeError:
            self._json: str = json.dumps(self, separators=(",", ":"))
            metrics.SUBSCRIPTION_ENCODINGS.inc()
            return self._json


class EventExecutor(StrawberryGraphQLCoreExecutionContext):
    """Runs one execution per (event, operation); later subscribers reuse its result."""

    _operation_key: OperationKey | None = None

    def build_per_event_executor(self, payload: Any) -> Executor[Any]:
        """The subscription's operation key is computed once (each event's executor copies it);
        an event already executed for this operation needs no executor of its own."""
        if self._operation_key is None and self.operation.loc is not None:
            self._operation_key = (
                self.operation.loc.source.body,
                None if self.operation.name is None else self.operation.name.value,
                json.dumps(self.variable_values.coerced, sort_keys=True, default=str),
            )
        results, key = getattr(payload, "shared_results", None), self._operation_key
        if type(results) is dict and key is not None and key in results:
            shared = cast(dict[OperationKey, ExecutionResult], results)[key]
            return cast(Executor[Any], _Executed(shared))
        return cast(Executor[Any], super().build_per_event_executor(payload))

    def execute_operation(self, serially: bool | None = None) -> Any:
        results = getattr(self.root_value, "shared_results", None)
        key = self._operation_key
        if type(results) is not dict or key is None:
            return super().execute_operation(serially)
        shared = cast(dict[OperationKey, ExecutionResult], results).get(key)
        if shared is not None:
            return shared
        result = super().execute_operation(serially)
        if not isinstance(result, ExecutionResult) or result.errors or result.data is None:
            return result  # awaitable or failed: this subscriber's own, not shared
        shared = results[key] = ExecutionResult(SharedData(result.data), None)
        metrics.SUBSCRIPTION_EXECUTIONS.inc()
        return shared


class ExtensionsRunner(SchemaExtensionsRunner):
    """Strawberry's runner without its per-result work for hooks no extension has.

    Every result of a subscription goes through ``on_stream_result`` (an exit stack over the
    extensions' hooks) and ``get_extensions_results`` (every extension's ``get_results``). None
    of our extensions has either, so for each of the fan-out's messages that was work for
    nothing: 5–10% of the API's time per message with our six extensions (bench/README.md).
    Which extensions have them is decided once per operation; one that has them runs as before.
    """

    def __init__(self, execution_context: ExecutionContext, extensions: list[SchemaExtension] | None = None):
        super().__init__(execution_context, extensions)
        self._stream_hooks = any(
            type(e).on_stream_result is not SchemaExtension.on_stream_result for e in self.extensions
        )
        self._with_results = [
            e for e in self.extensions if type(e).get_results is not SchemaExtension.get_results
        ]

    def on_stream_result(self, result: StreamExecutionResult) -> StreamResultContextManager:
        if self._stream_hooks:
            return super().on_stream_result(result)
        return cast(StreamResultContextManager, _NO_HOOKS)

    async def get_extensions_results(self, ctx: ExecutionContext) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for extension in self._with_results:
            data.update(await await_maybe(extension.get_results()))
        data.update(ctx.extensions_results)
        return data


#: ``async with`` doing nothing (no extension has a per-result hook).
_NO_HOOKS = contextlib.nullcontext()


class _Executed:
    """Stands in for the per-event executor of an event whose result is already shared."""

    __slots__ = ("result",)

    def __init__(self, result: ExecutionResult) -> None:
        self.result = result

    def execute_operation(self, serially: bool | None = None) -> ExecutionResult:
        return self.result


def encode_next(message: object) -> str | None:
    """A ``next`` message whose payload is only shared data, with its JSON reused; else None."""
    if not isinstance(message, dict):
        return None
    fields = cast(dict[str, object], message)
    payload = fields.get("payload")
    if fields.get("type") != "next" or not isinstance(payload, dict):
        return None
    data = cast(dict[str, object], payload).get("data")
    if not isinstance(data, SharedData) or len(cast(dict[str, object], payload)) != 1:
        return None
    metrics.SUBSCRIPTION_MESSAGES.inc()
    return f'{{"id":{json.dumps(fields.get("id"))},"type":"next","payload":{{"data":{data.json()}}}}}'
