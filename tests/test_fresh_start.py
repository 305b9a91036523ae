"""Start is boring (issue 17): `make up`'s command (``python -m tools.devstack up``) on an empty data
directory — a new Neo4j store, an empty Redis, then the API (which migrates) and the worker (which
waits for the schema) started together — succeeds every time, and ``down`` stops it all.
``python -m bench.fresh_start`` runs the same 20 times (20/20 recorded in the closing note)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from bench.fresh_start import start_once


@pytest.mark.parametrize("run", range(3))
async def test_the_whole_stack_starts_from_an_empty_data_directory(run: int, tmp_path: Path) -> None:
    """Beside a local stack (``make up`` then ``make test``, the README's two commands): its worker
    holds the default metrics port 9464, held here too (or already held by that stack), and a
    start of another profile must not need it (all three runs failed on it before)."""
    with contextlib.ExitStack() as held:
        squatter = held.enter_context(socket.socket())
        with contextlib.suppress(OSError):  # already in use (a local stack): the same condition
            squatter.bind(("127.0.0.1", 9464))
            squatter.listen()
        started, _, said = await asyncio.to_thread(
            start_once, free_ports(21687 + 10 * run), tmp_path / "data"
        )
    assert started, f"a fresh start failed; it printed: {said}"


def free_ports(first: int) -> int:
    """The first of four free consecutive ports from ``first`` on (a fixed base collided with the
    same test of another checkout's suite run at the same time)."""
    for base in range(first, first + 2000, 4):
        try:
            with contextlib.ExitStack() as probes:
                for port in range(base, base + 4):
                    probe = probes.enter_context(socket.socket())
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError(f"no four free ports from {first}")
