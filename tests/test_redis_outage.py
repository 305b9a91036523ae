"""A Redis that is down (it refuses connections: stopped, or killed) costs an API process its
feeds' live events, never a flood of log lines, and costs none of its requests: what Redis holds
is best effort or kept in Neo4j."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator

import httpx

from services.settings import Settings
from tests.client import Api
from tests.conftest import ApiProcess, WorkerProcess
from tests.model_server import ModelServer, Reply
from tests.proxies import CuttableProxy
from tests.test_idempotency import SEND
from tests.test_runner import runner_world
from tests.waiting import until

#: The channel patterns an API process listens to (``services.changefeed``, ``services.turnfeed``).
PATTERNS = ("botmemory:changes:*", "botmemory:turns:*", "botmemory:turns:access")


@contextlib.asynccontextmanager
async def api_behind_cut(
    settings: Settings, service_env: dict[str, str], name: str
) -> AsyncGenerator[tuple[CuttableProxy, ApiProcess, int]]:
    """A listening CuttableProxy to the suite's Redis, an API process (its log
    ``pytest-api-<name>.log``) reaching Redis through it, and where its log stood before it started;
    both stopped after."""
    proxy = CuttableProxy(settings.redis_port)
    await proxy.listen()
    env = {
        **service_env,
        "BOTMEMORY_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
        "BOTMEMORY_REDIS_TIMEOUT_SECONDS": "1",
    }
    log_path = settings.data_dir / "logs" / f"pytest-api-{name}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    process = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    try:
        yield proxy, process, offset
    finally:
        await asyncio.to_thread(process.stop)
        await proxy.cut()


async def interruptions(http: httpx.AsyncClient) -> dict[str, float]:
    """``botmemory_feed_interruptions_total`` of the process, by channel pattern."""
    text = (await http.get("/metrics")).text
    found = re.findall(r'^botmemory_feed_interruptions_total\{pattern="([^"]+)"\} (\S+)$', text, re.M)
    return {pattern: float(n) for pattern, n in found}


async def test_feeds_say_once_that_redis_is_down_and_once_that_it_is_back(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """While Redis refuses connections, each feed's listener tries again after a pause that grows,
    and says so once: it logged every failed attempt of every feed, twice a second each, for as
    long as Redis was down. Once Redis is back, each says it listens again."""
    async with api_behind_cut(settings, service_env, "redis-down-feeds") as (proxy, process, offset):

        def logged() -> str:
            return process.log_path.read_bytes()[offset:].decode(errors="replace")

        async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
            await proxy.cut()

            async def tried_thrice() -> bool:
                counted = await interruptions(http)
                return all(counted.get(p, 0) >= 3 for p in PATTERNS)

            await until(tried_thrice, lambda: "feeds tried fewer than 3 times", within=60)
            said = logged()
            lines = {p: said.count(f"{p} interrupted:") for p in PATTERNS}
            assert lines == dict.fromkeys(PATTERNS, 1), lines
            await proxy.listen()

            async def back() -> bool:
                said = logged()
                return all(f"{p} listening again" in said for p in PATTERNS)

            await until(back, lambda: f"not every feed listens again:\n{logged()}", within=60)


async def test_send_message_with_a_key_is_answered_while_redis_is_down(
    api: Api,
    settings: Settings,
    service_env: dict[str, str],
    model_server: ModelServer,
    learning_worker: WorkerProcess,
) -> None:
    """A ``sendMessage`` with an idempotency key held its key on Redis while it answered: with
    Redis down it failed (UNAVAILABLE) where the same call without a key was answered. The hold
    is on the key's record in Neo4j: answered, and sent again, it is the same Turn, the Bot asked
    once."""
    w = await runner_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    model_server.script("chat", Reply(text="Bergen, for the fjords."))
    variables = {"c": chat, "t": "Where should I go in June?", "k": "redis-down-1"}
    async with (
        api_behind_cut(settings, service_env, "redis-down-send") as (proxy, process, _),
        httpx.AsyncClient(base_url=process.url, timeout=60) as http,
    ):
        through = Api(http, api.admin_token)
        await proxy.cut()
        first = (await through.gql(SEND, variables, ann))["sendMessage"]
        again = (await through.gql(SEND, variables, ann))["sendMessage"]
    assert (first["reply"], first["status"]) == ("Bergen, for the fjords.", "completed")
    assert again == first
    assert len(model_server.requests_for("chat")) == 1
