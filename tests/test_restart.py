"""Neo4j restarted (clean stop, start from the same data dir): everything is still there."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from services.settings import Settings
from tests.client import Api, make_world
from tests.conftest import ROOT
from tests.waiting import until
from tools.devstack import app_commands, procs


def devstack(command: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "tools.devstack", command],
        cwd=ROOT,
        env=os.environ,
        check=True,
        timeout=240,
    )


async def test_data_survives_a_neo4j_restart(api: Api) -> None:
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "remember the blue door")
    devstack("down")
    devstack("services")

    # The API process reconnects on its own; token, chat and encrypted text are all intact.
    async def answered() -> dict[str, Any] | None:
        response = await api.raw(
            "query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, world.tokens["ann"]
        )
        return response if response.get("data") and response["data"]["chat"] else None

    response = await until(answered, "the API did not answer again after Neo4j restarted", within=120)
    assert response["data"]["chat"]["messages"] == [{"text": "remember the blue door"}]


def test_the_stack_recognises_the_processes_it_starts(settings: Settings) -> None:
    """`make down` finds the API and the worker by markers on their command lines: every marker
    must be on the command line `make up` uses, or they would be left running."""
    stack = procs(settings)
    for name, command in app_commands(settings).items():
        cmdline = " ".join(command) + " "
        assert all(marker in cmdline for marker in stack[name].markers), (name, cmdline)
