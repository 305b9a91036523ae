"""``Context.read_whole_memory``: at most one unpaged ``memory`` per operation, counted per
operation also on a WebSocket connection, whose operations run side by side on one Context."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from schema.context import Context
from services.errors import BadInput


def _connection() -> Context:
    """A WebSocket connection's context (no runtime is touched by the count)."""
    return Context(cast(Any, None), cast(Any, None), None, None, cache_loaders=False)


async def test_an_operation_started_beside_another_does_not_reset_its_count() -> None:
    context = _connection()
    first_read, second_started, first_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def first() -> None:
        context.operation_started()
        context.read_whole_memory()
        first_read.set()
        await second_started.wait()
        with pytest.raises(BadInput, match="one unpaged memory"):
            context.read_whole_memory()
        first_done.set()

    async def second() -> None:
        await first_read.wait()
        context.operation_started()
        second_started.set()
        await first_done.wait()
        context.read_whole_memory()  # its own first: allowed

    await asyncio.gather(asyncio.create_task(first()), asyncio.create_task(second()))


async def test_the_fields_of_one_operation_share_its_count() -> None:
    """graphql-core runs an operation's async fields as tasks of their own: they count together."""
    context = _connection()

    async def operation() -> list[BaseException | None]:
        context.operation_started()

        async def field() -> None:
            await asyncio.sleep(0)
            context.read_whole_memory()

        outcomes = await asyncio.gather(field(), field(), return_exceptions=True)
        return list(outcomes)

    outcomes = await asyncio.create_task(operation())
    assert sum(isinstance(o, BadInput) for o in outcomes) == 1 and outcomes.count(None) == 1
