"""``services.logs.log_tasks`` (``kill -USR1`` of a worker): where each task waits, no values."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.logs import log_tasks


async def _inner(gate: asyncio.Event, secret: str) -> str:
    await gate.wait()
    return secret


async def _outer(gate: asyncio.Event) -> str:
    return await _inner(gate, "canary-value-41")


async def test_each_task_is_logged_with_the_chain_of_awaits_it_waits_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_outer(gate), name="held-task")
    await asyncio.sleep(0)  # the task runs up to its wait
    with caplog.at_level(logging.WARNING):
        log_tasks(logging.getLogger("test.tasks"))
    gate.set()
    assert await task == "canary-value-41"
    [line] = [r.getMessage() for r in caplog.records if "held-task" in r.getMessage()]
    assert "_outer > " in line and "_inner > " in line and line.endswith(" wait")
    assert "test_task_log.py:" in line
    assert "canary" not in caplog.text  # code positions only
    assert caplog.records[-1].getMessage() == "tasks: end"
