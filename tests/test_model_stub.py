"""The offline model (tools/model_stub.py, issue 18) behind the real stack: a person's plain "I …"
sentence in a Turn of the built-in runner is learned (L2, DESIGN §7) as an entry the person sees in
``memory`` and finds with ``search``; and ``python -m tools.model_stub`` serves it as a process."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import cast

import openai
import pytest
from openai.types.chat import ChatCompletion

from learning import protocol
from services.runtime import Runtime
from tests.client import Api
from tests.conftest import ROOT
from tests.learning_helpers import memory_world, wait_executions
from tools.model_server import ModelServer
from tools.model_stub import CHAT_REPLY, install
from tools.processes import free_port

SEND = "mutation($c: ID!, $t: String!) { sendMessage(chatId: $c, text: $t) { id reply status } }"
MEMORY = "query($b: ID!) { memory(botId: $b) { entries { id content sources { chat item } } } }"
SEARCH = "query($b: ID!, $q: String!) { search(botId: $b, query: $q, limit: 5) { entry { id content } } }"


@pytest.mark.usefixtures("learning_worker")
async def test_a_plain_i_sentence_is_learned_seen_and_found(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    install(model_server)  # the stub answers every task: chat, rewrite, learn, confide, summary
    w = await memory_world(api, ("ann", "bob"))
    data = await api.admin(
        'mutation($o: ID!) { createBot(organizationId: $o, name: "Ada", model: "botmemory-stub") { id } }',
        {"o": w.org},
    )
    bot = data["createBot"]["id"]
    for person in w.people.values():
        await api.grant(bot, person)
    chat = await api.chat(w.tokens["ann"], bot)
    turn = (await api.gql(SEND, {"c": chat, "t": "I love sailing on Lake Geneva."}, w.tokens["ann"]))[
        "sendMessage"
    ]
    assert (turn["reply"], turn["status"]) == (CHAT_REPLY, "completed")  # streamed by the stub
    [execution] = await wait_executions(runtime, turn["id"])
    assert (execution["status"], execution.get("error")) == ("done", None)

    entries = (await api.gql(MEMORY, {"b": bot}, w.tokens["ann"]))["memory"]["entries"]
    assert [(e["content"], e["sources"]) for e in entries] == [
        ("Loves sailing on Lake Geneva.", [{"chat": chat, "item": "i-1"}])
    ]
    found = (await api.gql(SEARCH, {"b": bot, "q": "sailing"}, w.tokens["ann"]))["search"]
    assert [h["entry"]["id"] for h in found] == [entries[0]["id"]]
    # Ann's private chat: Bob sees nothing of it.
    assert (await api.gql(MEMORY, {"b": bot}, w.tokens["bob"]))["memory"]["entries"] == []
    # The Bot confided (its tool call is an Item), so the Turn was learned (L2).
    data = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { kind text } } }", {"c": chat}, w.tokens["ann"]
    )
    assert [(m["kind"], m["text"]) for m in data["chat"]["messages"]] == [
        ("PERSON_MESSAGE", "I love sailing on Lake Geneva."),
        ("TOOL_CALL", "confide"),
        ("BOT_MESSAGE", CHAT_REPLY),
    ]
    assert len(model_server.requests_for("learn")) == 1


async def test_the_stub_runs_as_a_process_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.model_stub",
        "--port",
        str(port),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)  # its first line: ready
        assert b"offline model stub ready on http://127.0.0.1:%d/v1" % port in line, line
        body = protocol.request_body(
            protocol.LEARN_SYSTEM,
            [protocol.EvidenceItem("i-1", "PERSON_MESSAGE", "person:p1", "My boat is called Ida.")],
            [],
            [],
        )
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=10
        ) as client:
            response = cast(
                ChatCompletion,
                await client.chat.completions.create(
                    model="any-name", **body, extra_headers={"X-Botmemory-Task": "learn"}
                ),
            )
        [call] = response.choices[0].message.tool_calls or []
        assert call.type == "function"
        assert call.function.name == "add_fact"
        assert (
            call.function.arguments == '{"content": "Their boat is called Ida.", "source_item_ids": ["i-1"]}'
        )
        assert response.usage is not None and response.usage.total_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, output
    assert b"learn (model any-name): 1 facts" in output
    assert b"Ida" not in output  # counts only: what people said never reaches the log
