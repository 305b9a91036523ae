"""``concurrency`` is one limit per Bot across every process of a deployment (D9.25, D9.12):
slots are leases in Redis, renewed while held, given back by a process that is killed."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from redis.asyncio import Redis

from learning.gateway import FIXED_CALM_ANSWER
from services import slots
from services.bootstrap import redis_of
from services.ids import new_id
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, World
from tests.conftest import ROOT, ApiProcess
from tests.learning_helpers import (
    complete,
    confide,
    fact_call,
    first_item,
    learn,
    memory_world,
    wait_executions,
)
from tests.memory_helpers import visible
from tests.model_server import ModelServer, Reply

#: Another process of the deployment: takes two slots of a Bot with a three-second lease (renewed
#: every second, so a busy machine does not lose them), says so, keeps them past two and a half
#: lease lengths (renewing), says so again, then holds on.
HOLDER = """
import asyncio, sys, time
from redis.asyncio import Redis
from services import slots

async def main() -> None:
    redis = Redis.from_url(sys.argv[1])
    for _ in range(2):
        await slots.take(redis, sys.argv[2], 2, time.monotonic() + 10, 3.0)
    print("held", flush=True)
    await asyncio.sleep(7.5)
    print("still holding", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def line_of(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()


async def test_slots_are_shared_renewed_and_given_back_by_a_killed_process(
    runtime: Runtime, settings: Settings
) -> None:
    redis: Redis = runtime.redis
    bot = new_id("bot")
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        settings.redis_url,
        bot,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert await line_of(holder) == "held"
        assert await slots.held(redis, bot) == 2
        with pytest.raises(slots.Busy):  # both of the limit are held by the other process
            await slots.take(redis, bot, 2, time.monotonic() + 0.2, 1.0)
        assert await line_of(holder) == "still holding"  # 2.5 lease lengths later: renewed
        with pytest.raises(slots.Busy):
            await slots.take(redis, bot, 2, time.monotonic() + 0.2, 1.0)
        # The limit is the caller's at each take: raised to 3, one is free at once.
        release = await slots.take(redis, bot, 3, time.monotonic() + 0.2, 1.0)
        assert await slots.held(redis, bot) == 3
        await release()
        assert await slots.held(redis, bot) == 2
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9
        await holder.wait()
    # Killed: it renews no more, and its slots come back when their leases end.
    release = await slots.take(redis, bot, 2, time.monotonic() + 20, 1.0)
    second = await slots.take(redis, bot, 2, time.monotonic() + 20, 1.0)
    assert await slots.held(redis, bot) == 2
    await release()
    await second()
    assert await slots.held(redis, bot) == 0


async def test_a_release_stops_the_renewer_whenever_it_comes(runtime: Runtime) -> None:
    """A release cancelled the lease's renewer and waited for it. A cancel landing as the renewer's
    Redis command was written was lost (Python 3.11's ``wait_for`` in redis-py), so the renewer
    went on renewing and the release waited for ever: CI saw a learning execution stay
    ``running``, its lease alive, until the suite gave up. Released at a random moment of a short
    lease's renewals, many times: each release returns and the slot is free."""
    redis: Redis = runtime.redis
    bot = new_id("bot")
    moments = random.Random(41)
    for _ in range(300):
        release = await slots.take(redis, bot, 1, time.monotonic() + 10, 0.006)  # renews every 2 ms
        await asyncio.sleep(moments.uniform(0, 0.01))
        await asyncio.wait_for(release(), 60)  # before the fix it could wait for ever
        assert await slots.held(redis, bot) == 0


async def test_a_release_cancelled_midway_still_gives_the_slot_back(runtime: Runtime) -> None:
    """The release waits for the lease's renewer to end before it gives the lease back. A caller
    cancelled meanwhile (a job's timeout, a closed socket) left the lease unreturned — held until
    it expired, and for good when the renewer had also lost its cancel."""
    redis: Redis = runtime.redis
    bot = new_id("bot")

    def renewers() -> set[asyncio.Task[object]]:
        return {t for t in asyncio.all_tasks() if t.get_name() == "slot-lease"}

    others = renewers()  # the session's loop may hold other tests' renewers
    release = await slots.take(redis, bot, 1, time.monotonic() + 10, 30.0)
    releasing = asyncio.ensure_future(release())
    await asyncio.sleep(0)  # the release has begun: it waits for the renewer
    releasing.cancel()
    await asyncio.wait({releasing})
    assert releasing.cancelled()  # the caller's cancel is its own
    await slots.given_back()
    assert await slots.held(redis, bot) == 0  # before the fix: held until the lease ran out
    assert not renewers() - others


class HeldReplies:
    """A TCP proxy in front of Redis that passes every command on at once and, once ``hold`` is
    called, keeps Redis's replies back until ``flow``: a script has run while its caller still
    waits for the answer."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        #: Set when a reply came from Redis while replies were held (what it answered has run).
        self.held_reply = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def hold(self) -> None:
        self.flowing.clear()

    def flow(self) -> None:
        self.flowing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, held: bool) -> None:
            try:
                while data := await src.read(65536):
                    if held and not self.flowing.is_set():
                        self.held_reply.set()
                        await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        for task in (pump(reader, up_writer, False), pump(up_reader, writer, True)):
            self.pumps.add(asyncio.create_task(task))

    async def close(self) -> None:
        self.flow()
        if self.server is not None:
            self.server.close()
        for task in self.pumps:
            task.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)


async def test_a_take_cancelled_while_its_reply_comes_gives_the_slot_back(
    runtime: Runtime, settings: Settings
) -> None:
    """The take's script can take the slot and its caller be cancelled (a job's timeout, a closed
    socket) before the reply is read: the slot was held, by nobody, until its lease ran out (30 s
    here, 15 s for a model call). Now the lease is given back."""
    redis: Redis = runtime.redis
    url = urlsplit(settings.redis_url)
    proxy = HeldReplies(url.hostname or "127.0.0.1", url.port or 6379)
    port = await proxy.start()
    credentials = url.netloc.rpartition("@")[0]
    proxied = urlunsplit(url._replace(netloc=f"{credentials + '@' if credentials else ''}127.0.0.1:{port}"))
    client = redis_of(settings.model_copy(update={"redis_url": proxied}))  # the process's client
    bot = new_id("bot")
    try:
        assert await client.ping()  # connected, replies flowing
        proxy.hold()
        taking = asyncio.create_task(slots.take(client, bot, 1, time.monotonic() + 60, 30.0))
        await proxy.held_reply.wait()  # the script ran; its answer is held back
        assert await slots.held(redis, bot) == 1
        taking.cancel()
        await asyncio.wait({taking})
        assert taking.cancelled()
        proxy.flow()
        await slots.given_back()
        assert await slots.held(redis, bot) == 0  # before: 1, until the lease ran out
    finally:
        await client.aclose(close_connection_pool=True)
        await proxy.close()
        await redis.delete(slots.key_of(bot))


@pytest.mark.usefixtures("learning_worker")
async def one_task_at_a_time(api: Api, w: World) -> None:
    """The Bot's memory Bot gets ``concurrency`` 1 (its settings at version 0), set by Ann."""
    response = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "concurrency": 1},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert response.status_code == 200, response.text


async def test_a_bots_concurrency_binds_across_api_processes(
    api: Api, settings: Settings, service_env: dict[str, str], model_server: ModelServer, runtime: Runtime
) -> None:
    """concurrency 1: a confide answered by one API process holds the Bot's only slot, so a
    confide on another process waits for it until its own deadline and never asks the model."""
    gate = threading.Event()
    model_server.reset()  # a confide an earlier test asked counts for nothing here
    patient = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-patient.log",
        # One attempt lasts until the gate opens, however long the other process takes to give up.
        {
            **service_env,
            "BOTMEMORY_ANSWER_DEADLINE_SECONDS": "60",
            "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "60",
        },
    )
    try:
        w = await memory_world(api, ("ann",))
        await one_task_at_a_time(api, w)
        chat = await api.chat(w.tokens["ann"], w.bot)
        turn = await api.turn(w.tokens["ann"], chat, "hi")
        model_server.default("confide", Reply(text="The first one, answered.", hold=gate))
        async with httpx.AsyncClient(base_url=patient.url, timeout=90) as http:
            first = asyncio.create_task(
                confide(Api(http, api.admin_token), w.tokens["ann"], turn["id"], "first")
            )
            await model_server.wait_for_requests("confide", 1)
            assert await slots.held(runtime.redis, w.bot) == 1
            # The suite's API process (a 3 s answer deadline) finds the one slot taken until then.
            assert await confide(api, w.tokens["ann"], turn["id"], "second") == FIXED_CALM_ANSWER
            gate.set()
            assert await first == "The first one, answered."
        asked = [r.body["messages"][1]["content"] for r in model_server.requests_for("confide")]
        assert asked == ["first"]
        assert await slots.held(runtime.redis, w.bot) == 0
    finally:
        gate.set()
        patient.stop()


@pytest.mark.usefixtures("learning_worker")
async def test_a_learning_step_goes_on_ungated_while_redis_refuses_its_slots(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A Bot with ``concurrency``: while Redis refuses the slots' scripts (here: its ACL; an outage
    or a restart alike), a learning step asked for a slot, got "busy" and ended failed for good —
    that Turn's evidence was learned only if the Chat confided again. It goes on without the slot
    now, as the Chat's step slot already did; an answer someone waits for (confide) still gets the
    calm one at once."""
    w = await memory_world(api, ("ann",))
    await one_task_at_a_time(api, w)
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "Ann takes the 8:10 train on Mondays.")
    item = await first_item(api, w.tokens["ann"], chat)
    model_server.script("learn", learn(fact_call("Ann takes the 8:10 train on Mondays.", item)))
    await runtime.redis.execute_command("ACL", "SETUSER", "default", "-eval", "-evalsha")
    try:
        assert await confide(api, w.tokens["ann"], turn["id"], "Noted the train.") == FIXED_CALM_ANSWER
        await complete(api, w.tokens["ann"], turn["id"])
        [x] = await wait_executions(runtime, turn["id"])
    finally:
        await runtime.redis.execute_command("ACL", "SETUSER", "default", "+eval", "+evalsha")
    assert (x["status"], x["learned"]) == ("done", 1), x
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann takes the 8:10 train on Mondays."
    ]
