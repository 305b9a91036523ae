"""`make demo` runs end to end against the running API, the worker and the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from services.settings import Settings
from tests.conftest import ROOT, ApiProcess, WorkerProcess
from tests.model_server import ModelServer, Recorded, Reply, ToolCall


def learn(request: Recorded) -> Reply:
    items = json.loads(request.body["messages"][1]["content"])["newItems"]
    people = [i for i in items if i["kind"] == "person_message"]
    return Reply(
        tool_calls=[
            ToolCall("add_fact", {"content": i["text"], "source_item_ids": [i["id"]], "topics": ["demo"]})
            for i in people
        ]
    )


def rewrite(request: Recorded) -> Reply:
    sent = json.loads(request.body["messages"][1]["content"])
    notes = sent["notes"]
    text = sent["message"] + " (" + "; ".join(n["text"] for n in notes) + ")"
    return Reply(
        tool_calls=[ToolCall("rewrite_input", {"text": text, "used_entry_ids": [n["id"] for n in notes]})]
    )


async def run_demo(api_url: str, *extra: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.demo",
        "--api",
        api_url,
        "--model",
        "test-model",
        "--wait",
        "60",
        *extra,
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    return int(process.returncode or 0), out.decode()


async def test_demo_shows_memory_learned_and_used(
    settings: Settings, service_env: dict[str, str], worker_process: WorkerProcess, model_server: ModelServer
) -> None:
    if worker_process.proc.poll() is not None:
        worker_process.restart()
    worker_process.wait_ready()
    model_server.reset()
    model_server.respond("learn", learn)
    model_server.respond("rewrite", rewrite)
    model_server.default("confide", Reply(text="Thank you. Ask them plainly and carry on."))
    # The demo shows rewrites: its API gets the real answer deadline, not the suite's 3 s, so a
    # busy machine does not turn a rewrite into the kept input.
    patient = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-demo.log",
        {
            **service_env,
            "BOTMEMORY_ANSWER_DEADLINE_SECONDS": "15",
            "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "15",
        },
    )
    try:
        code, out = await run_demo(patient.url)
    finally:
        patient.stop()
    print(out)  # what a user sees (shown with -s and in CI logs of failures)
    assert code == 0, out
    lines = out.splitlines()
    sees = {line.split(" sees:")[0].strip(): line for line in lines if " sees: [" in line}
    assert "vegetarian" in sees["ann"] and "9:30" in sees["ann"]
    assert "9:30" in sees["bob"] and "vegetarian" not in sees["bob"]
    assert sees["cat"].endswith("sees: []")
    received = [line for line in lines if "the Bot receives:" in line]
    assert "vegetarian" in received[0]
    assert "9:30" in received[1] and "vegetarian" not in received[1]


async def test_demo_without_a_model_says_what_to_set(api: object, model_server: ModelServer) -> None:
    from services.settings import load_settings

    settings = load_settings()
    bare = ApiProcess(
        settings, settings.data_dir / "logs" / "pytest-api-nomodel.log", {"OPENAI_BASE_URL": ""}
    )
    try:
        code, out = await run_demo(bare.url)
    finally:
        bare.stop()
    assert code == 2
    assert "OPENAI_BASE_URL" in out and "OPENAI_API_KEY" in out and "make demo DEMO_MODEL=" in out
