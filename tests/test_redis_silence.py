"""A Redis that accepts connections and never answers (paused, or an address that a failover moved
away: the sockets stay open and nothing arrives) holds no request and silences no feed for good:
every Redis command and connection has a deadline (``redis_timeout_seconds``), and the feeds'
listeners ping a silent connection and open a new one when it does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any, cast

import httpx

from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import ApiProcess, WorkerProcess
from tests.feed_helpers import next_event, subscription
from tests.proxies import SilentProxy
from tests.test_removals import FEED, remember
from tests.waiting import until


async def behind_proxy(settings: Settings, service_env: dict[str, str]) -> tuple[SilentProxy, dict[str, str]]:
    """A started SilentProxy to the suite's Redis, and the environment of a process that reaches
    Redis through it, with a timeout of 1 s."""
    proxy = SilentProxy(settings.redis_port)
    await proxy.start()
    return proxy, {
        **service_env,
        "BOTMEMORY_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
        "BOTMEMORY_REDIS_TIMEOUT_SECONDS": "1",
    }


@contextlib.asynccontextmanager
async def api_behind_proxy(
    settings: Settings, service_env: dict[str, str], name: str, redis_seconds: float = 1
) -> AsyncGenerator[tuple[SilentProxy, ApiProcess]]:
    """An API process (its log ``pytest-api-<name>.log``) reaching Redis through a started
    SilentProxy, with a Redis timeout of ``redis_seconds``; both stopped after."""
    proxy, env = await behind_proxy(settings, service_env)
    log_path = settings.data_dir / "logs" / f"pytest-api-{name}.log"
    env["BOTMEMORY_REDIS_TIMEOUT_SECONDS"] = str(redis_seconds)
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    process = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    try:
        yield proxy, process
    finally:
        proxy.hear_again()
        await asyncio.to_thread(process.stop)
        await proxy.close()


async def test_a_silent_redis_holds_no_request_and_silences_no_feed_for_good(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """An API process whose Redis falls silent: a Remember through it commits and answers (its
    announcement gives up after the timeout; before, the request hung for ever, and a client
    that gave up and sent it again made a second entry). Its change feed's listener, whose
    connection went silent, pings it, opens a new one once Redis answers again and catches up
    from the log: the subscriber gets the changes made meanwhile, through this process and
    another (before, the feed stayed silent until the process restarted)."""
    async with api_behind_proxy(settings, service_env, "silent-redis") as (proxy, silent):
        w = await make_world(api, ("ann",))
        ann = w.tokens["ann"]
        async with httpx.AsyncClient(base_url=silent.url, timeout=30) as http:
            through = Api(http, api.admin_token)
            async with subscription(through, ann, w.bot, FEED) as ws:
                proxy.fall_silent()
                here = await remember(through, ann, w.bot, "said while Redis was silent")
                elsewhere = await remember(api, ann, w.bot, "said through another process")
                proxy.hear_again()
                got: list[str] = []
                while elsewhere not in got:
                    got += [e["id"] for e in (await next_event(ws, within=30))["entries"]]
        assert got == [here, elsewhere]


async def test_a_silent_redis_is_waited_out_once_not_for_every_call(
    api: Api, runtime: Runtime, settings: Settings, service_env: dict[str, str]
) -> None:
    """Best-effort Redis calls (changes and turn events announced to other processes, learning
    queued, task slots) each waited out the timeout against a silent Redis, one after another:
    a ``sendMessage`` making several took ~70 s, and clients gave up and sent it again. After
    one finds Redis not answering, the process skips the next ones (counted); what they carried
    is made up for as when one fails (here: the change log). It probes Redis meanwhile and uses
    it again as soon as it answers (a fixed window of silence went on skipping, turn events
    lost and model calls given the calm answer, for its whole length after a single miss)."""
    async with api_behind_proxy(settings, service_env, "quiet-redis", redis_seconds=3) as (proxy, silent):
        w = await make_world(api, ("ann",))
        ann = w.tokens["ann"]
        async with httpx.AsyncClient(base_url=silent.url, timeout=60) as http:

            async def metric(line: str) -> bool:
                return line in (await http.get("/metrics")).text.splitlines()

            through = Api(http, api.admin_token)
            proxy.fall_silent()
            first = await remember(through, ann, w.bot, "announced to nobody")  # waits it out
            second = await remember(through, ann, w.bot, "not even tried")  # skips Redis
            skipped_while_silent = await metric(SKIPPED_ONE)
            proxy.hear_again()
            await until(lambda: metric("botmemory_redis_unanswered 0.0"), "Redis not heard again", within=30)
            announced = runtime.redis.pubsub()  # the suite's own connection, not the proxy's
            await announced.subscribe(f"botmemory:changes:{w.bot}")
            try:
                third = await remember(through, ann, w.bot, "announced again")

                async def heard() -> bool:
                    message = cast(
                        dict[str, Any] | None,
                        await announced.get_message(ignore_subscribe_messages=True, timeout=0.1),
                    )
                    return message is not None and third in json.loads(message["data"])["ids"]

                await until(heard, "the third change was not announced", within=30)
            finally:
                await announced.aclose()  # type: ignore[no-untyped-call]
            skipped_after = await metric(SKIPPED_ONE)
        assert skipped_while_silent and skipped_after  # still the one skipped while silent
        listed = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))
        assert {e["id"] for e in listed.json()["entries"]} == {first, second, third}


SKIPPED_ONE = 'botmemory_redis_skipped_total{kind="change"} 1.0'

#: Requests sent at once to an API whose Redis is silent.
AT_ONCE = 8


async def test_requests_wait_for_a_silent_redis_side_by_side_not_in_turn(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """Requests at once through an API whose Redis falls silent each wait for their own Redis
    call, side by side: the proxy has every one's call (an announcement on a connection of the
    pool, or a new connection's handshake) while none of them has answered. The pool made its new
    connections under one lock: each request's call waited for the one before it to time out, and
    the last request for them all."""
    # A timeout long enough for every request's write to commit before the first call times out.
    async with api_behind_proxy(settings, service_env, "side-by-side", redis_seconds=10) as (proxy, silent):
        w = await make_world(api, ("ann",))
        ann = w.tokens["ann"]
        async with httpx.AsyncClient(base_url=silent.url, timeout=300) as http:
            through = Api(http, api.admin_token)
            proxy.fall_silent()
            asked = proxy.asked
            sent = [
                asyncio.create_task(remember(through, ann, w.bot, f"said at once, {n}"))
                for n in range(AT_ONCE)
            ]

            async def all_asked() -> bool:
                return proxy.asked - asked >= AT_ONCE or any(s.done() for s in sent)

            await until(
                all_asked, lambda: f"{proxy.asked - asked} of {AT_ONCE} calls reached Redis", within=120
            )
            answered_early = [s.done() for s in sent]
            made = [await s for s in sent]
        assert not any(answered_early), f"{sum(answered_early)} answered before every call reached Redis"
        proxy.hear_again()
        listed = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))
        assert set(made) <= {e["id"] for e in listed.json()["entries"]}


async def test_a_worker_whose_redis_falls_silent_starts_again_and_polls_anew(
    settings: Settings, service_env: dict[str, str]
) -> None:
    """The worker polls its queue with the same deadlines: when Redis falls silent the poll fails,
    the worker starts itself afresh (as when Redis refuses it) and polls again once Redis answers
    (before, its poll waited for ever and nothing told anyone)."""
    proxy, env = await behind_proxy(settings, service_env)
    log_path = settings.data_dir / "logs" / "pytest-worker-silent-redis.log"
    offset = log_path.stat().st_size if log_path.exists() else 0

    async def logged(text: str, times: int = 1) -> None:
        async def seen() -> bool:
            return (await asyncio.to_thread(log_path.read_bytes))[offset:].count(text.encode()) >= times

        await until(seen, f"{text!r} logged fewer than {times} times", within=30)

    worker = await asyncio.to_thread(WorkerProcess, log_path, env)
    try:
        await logged("Starting worker for")
        proxy.fall_silent()
        await logged("worker lost Redis (TimeoutError); starting again")
        proxy.hear_again()
        await logged("Starting worker for", 2)  # polling again
    finally:
        await asyncio.to_thread(worker.stop)
        await proxy.close()


async def test_a_worker_whose_redis_refuses_its_password_says_so_and_exits(
    settings: Settings, service_env: dict[str, str]
) -> None:
    """A wrong password (or one given to a Redis without any) is no lost connection: the worker
    started itself again once a second for ever, logging "worker lost Redis". It says which
    setting to check, once, and exits."""
    host_port = settings.redis_url.split("//", 1)[1].split("/", 1)[0]
    env = {**service_env, "BOTMEMORY_REDIS_URL": f"redis://:not-the-password@{host_port}/0"}
    log_path = settings.data_dir / "logs" / "pytest-worker-wrong-password.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    worker = await asyncio.to_thread(WorkerProcess, log_path, env)
    try:
        assert await asyncio.to_thread(worker.proc.wait, 30) == 2
    finally:
        await asyncio.to_thread(worker.stop)
    logged = log_path.read_bytes()[offset:].decode()
    assert logged.count("Redis refused the worker's credentials: check BOTMEMORY_REDIS_URL") == 1
    assert "worker lost Redis" not in logged and "not-the-password" not in logged
