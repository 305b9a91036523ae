"""The scripted model server, driven through the real ``openai`` client (needs neither Neo4j nor Redis)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.model_server import ModelServer, Reply, ToolCall

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]


@pytest.fixture(autouse=True)
def _fresh(model_server: ModelServer) -> None:
    model_server.reset()


def _client(server: ModelServer, timeout: float = 5) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=timeout)


def _task(task: str) -> dict[str, str]:
    return {"X-Botmemory-Task": task}


async def _ask(server: ModelServer, task: str | None, said: str = "Hello") -> str | None:
    """The text of the reply to one user message sent with ``task`` (None: no task header)."""
    async with _client(server) as client:
        response = await client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": said}],
            extra_headers=_task(task) if task is not None else None,
        )
    return response.choices[0].message.content


async def test_plain_text_and_usage(model_server: ModelServer) -> None:
    model_server.script("answer", Reply(text="Hi there", usage=(12, 3)))
    async with _client(model_server) as client:
        response = await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers=_task("answer")
        )
    assert response.object == "chat.completion"
    assert response.model == "gpt-test"
    choice = response.choices[0]
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hi there"
    assert choice.message.tool_calls is None
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (
        12,
        3,
        15,
    )


async def test_no_usage_and_model_override(model_server: ModelServer) -> None:
    model_server.script(None, Reply(text="x", usage=None, model="other-model"))
    async with _client(model_server) as client:
        response = await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert response.usage is None
    assert response.model == "other-model"


async def test_tool_calls_with_parsed_arguments(model_server: ModelServer) -> None:
    model_server.script(
        "extract",
        Reply(
            tool_calls=[
                ToolCall("remember", {"fact": "likes tea", "weight": 2}),
                ToolCall("forget", {"id": "n1"}, id="call_fixed"),
            ]
        ),
    )
    async with _client(model_server) as client:
        response = await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers=_task("extract")
        )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None
    functions = [call for call in calls if call.type == "function"]
    assert [c.function.name for c in functions] == ["remember", "forget"]
    assert json.loads(functions[0].function.arguments) == {"fact": "likes tea", "weight": 2}
    assert functions[0].id.startswith("call_")
    assert functions[1].id == "call_fixed"


async def test_malformed_arguments_pass_through_verbatim(model_server: ModelServer) -> None:
    model_server.script("extract", Reply(tool_calls=[ToolCall("remember", '{"fact": "tea",')]))
    async with _client(model_server) as client:
        response = await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, extra_headers=_task("extract")
        )
    calls = response.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].type == "function"
    assert calls[0].function.arguments == '{"fact": "tea",'


async def test_streaming_reassembles_text_tool_calls_and_usage(model_server: ModelServer) -> None:
    model_server.script(
        "answer",
        Reply(text="Streaming works fine", tool_calls=[ToolCall("remember", {"fact": "tea"})], usage=(7, 4)),
    )
    text: list[str] = []
    content_chunks = 0
    calls: dict[int, dict[str, Any]] = {}
    finish: list[str] = []
    usage: list[tuple[int, int, int]] = []
    async with _client(model_server) as client:
        stream = await client.chat.completions.create(
            model="gpt-test",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=_task("answer"),
        )
        async for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                assert chunk.choices == []
                usage.append(
                    (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens)
                )
            for choice in chunk.choices:
                if choice.delta.content:
                    text.append(choice.delta.content)
                    content_chunks += 1
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = delta.id or call["id"]
                    if delta.function is not None:
                        call["name"] += delta.function.name or ""
                        call["arguments"] += delta.function.arguments or ""
                if choice.finish_reason is not None:
                    finish.append(choice.finish_reason)
    assert "".join(text) == "Streaming works fine"
    assert content_chunks >= 2
    assert list(calls) == [0]
    assert calls[0]["name"] == "remember"
    assert str(calls[0]["id"]).startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"fact": "tea"}
    assert finish == ["tool_calls"]
    assert usage == [(7, 4, 11)]


async def test_streaming_without_include_usage_has_no_usage_chunk(model_server: ModelServer) -> None:
    model_server.script(None, Reply(text="ab"))
    async with _client(model_server) as client:
        stream = await client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ab"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_status_500_raises_internal_server_error(model_server: ModelServer) -> None:
    model_server.script("answer", Reply(status=500))
    async with _client(model_server) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(
                model="gpt-test", messages=MESSAGES, extra_headers=_task("answer")
            )
    assert caught.value.status_code == 500
    assert caught.value.body == {"message": "scripted error", "type": "server_error", "code": None}


async def test_raw_body_override(model_server: ModelServer) -> None:
    model_server.script(
        None,
        Reply(body=b"{not json", status=200),
        Reply(body=b'{"error": {"message": "slow down"}}', status=429),
    )
    async with httpx.AsyncClient(base_url=model_server.base_url) as http:
        first = await http.post("/chat/completions", json={"model": "m", "messages": []})
        assert (first.status_code, first.content) == (200, b"{not json")
        assert first.headers["content-type"] == "application/json"
    async with _client(model_server) as client:
        with pytest.raises(openai.RateLimitError, match="slow down"):
            await client.chat.completions.create(model="gpt-test", messages=MESSAGES)


async def test_delay_longer_than_client_timeout_raises_timeout(model_server: ModelServer) -> None:
    model_server.script("answer", Reply(text="too late", delay=3))
    async with _client(model_server, timeout=0.5) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(
                model="gpt-test", messages=MESSAGES, extra_headers=_task("answer")
            )
    assert len(model_server.requests_for("answer")) == 1


async def test_request_is_recorded_while_still_being_answered(model_server: ModelServer) -> None:
    model_server.script("slow", Reply(text="done", delay=0.5))
    async with _client(model_server) as client:
        pending = asyncio.create_task(
            client.chat.completions.create(model="gpt-test", messages=MESSAGES, extra_headers=_task("slow"))
        )
        recorded = await model_server.wait_for_requests("slow", 1, timeout=2)
        assert not pending.done()
        assert recorded[0].body["messages"] == MESSAGES
        response = await pending
    assert response.choices[0].message.content == "done"


async def test_wait_for_requests_times_out_with_assertion(model_server: ModelServer) -> None:
    with pytest.raises(AssertionError, match="0 of 1 requests"):
        await model_server.wait_for_requests("never", 1, timeout=0.1)


async def test_task_queue_beats_any_task_queue_and_defaults(model_server: ModelServer) -> None:
    model_server.script(None, Reply(text="any-1"), Reply(text="any-2"))
    model_server.script("answer", Reply(text="answer-1"))
    model_server.default("answer", Reply(text="answer-default"))

    assert await _ask(model_server, "answer") == "answer-1"
    assert await _ask(model_server, "answer") == "any-1"
    assert await _ask(model_server, "summarize") == "any-2"
    assert await _ask(model_server, "answer") == "answer-default"
    assert await _ask(model_server, "summarize") == "Thank you for telling me."
    model_server.default(None, Reply(text="global default"))
    assert await _ask(model_server, None) == "global default"
    assert [r.task for r in model_server.requests] == [
        "answer",
        "answer",
        "summarize",
        "answer",
        "summarize",
        None,
    ]


async def test_replies_about_a_text_go_only_to_requests_that_contain_it(model_server: ModelServer) -> None:
    """A test's replies are not taken by other work in flight (another test's idle Turn)."""
    model_server.script("learn", Reply(text="mine-1"), Reply(text="mine-2"), about="case 07")
    model_server.script("learn", Reply(text="plain"))

    def ask(said: str) -> Awaitable[str | None]:
        return _ask(model_server, "learn", said)

    assert await ask("an old Turn") == "plain"
    assert await ask("another old Turn") == "Thank you for telling me."
    assert await ask("book a table, case 07") == "mine-1"
    assert await ask("book a table, case 07") == "mine-2"
    assert await ask("book a table, case 07") == "Thank you for telling me."


async def test_records_hold_body_and_headers(model_server: ModelServer) -> None:
    async with _client(model_server) as client:
        await client.chat.completions.create(
            model="gpt-test", messages=MESSAGES, temperature=0.2, extra_headers=_task("answer")
        )
    (recorded,) = await model_server.wait_for_requests("answer", 1)
    assert recorded.task == "answer"
    assert recorded.path == "/v1/chat/completions"
    assert recorded.headers["x-botmemory-task"] == "answer"
    assert recorded.headers["authorization"] == "Bearer test"
    assert recorded.body == {"model": "gpt-test", "messages": MESSAGES, "temperature": 0.2}
    assert recorded.at > 0
    assert model_server.requests_for("other") == []


async def test_unknown_path_and_bad_body_are_json_errors(model_server: ModelServer) -> None:
    model_server.script(None, Reply(text="kept"))
    async with httpx.AsyncClient(base_url=model_server.base_url) as http:
        response = await http.post("/embeddings", json={})
        listing = await http.get("/models")
        bad = await http.post("/chat/completions", content=b"[1, 2]")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert listing.status_code == 404
    assert bad.status_code == 400
    assert model_server.requests == []
    async with _client(model_server) as client:
        kept = await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert kept.choices[0].message.content == "kept"
