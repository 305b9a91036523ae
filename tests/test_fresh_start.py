"""Start is boring (issue 17): `make up`'s command (``python -m tools.devstack up``) on an empty data
directory — a new Neo4j store, an empty Redis, then the API (which migrates) and the worker (which
waits for the schema) started together — succeeds every time, and ``down`` stops it all.
``python -m bench.fresh_start`` runs the same 20 times (20/20 recorded in the closing note)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.fresh_start import start_once


@pytest.mark.parametrize("run", range(3))
async def test_the_whole_stack_starts_from_an_empty_data_directory(run: int, tmp_path: Path) -> None:
    started, _, said = await asyncio.to_thread(start_once, 21687 + 10 * run, tmp_path / "data")
    assert started, f"a fresh start failed; it printed: {said}"
