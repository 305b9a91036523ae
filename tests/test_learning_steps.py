"""A Chat's learning steps take turns (its one step slot, D9.25) and an execution's job never
begins a step that might outlast it (D9.9, C4, C6): an execution that cannot go on in its job goes
on in a new one — a new epoch, queued at once — and never ends failed for waiting."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from typing import Any

import pytest
from neo4j.exceptions import ServiceUnavailable
from pydantic import SecretStr

from graph.driver import make_driver
from learning.executions import ExecutionRunner
from learning.gateway import Gateway
from services import slots
from services.runtime import Runtime, now_ms
from tests.client import Api
from tests.learning_helpers import (
    add_items,
    complete,
    confide,
    executions,
    fact_call,
    first_item,
    learn,
    letters,
    memory_bot_changes,
    memory_world,
    position,
    wait_executions,
)
from tests.memory_helpers import visible
from tests.model_server import ModelServer, Recorded, Reply
from tests.proxies import CuttableProxy
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("learning_worker")


async def queued_in_the_graph_only(rt: Runtime, turn: str) -> dict[str, Any]:
    """The Turn completed and its execution queued in the graph only, not on arq: this process's
    runner takes it, not the suite's worker."""
    await rt.driver.execute_query(
        "MATCH (t:Turn {id: $t}) SET t.status = 'completed', t.completedAt = $now "
        "WITH t MATCH (x:LearningExecution {turnId: t.id}) SET x.status = 'queued', x.queuedAt = $now",
        t=turn,
        now=now_ms(),
    )
    [queued] = await executions(rt, turn)
    return queued


async def test_an_execution_that_waits_out_its_job_for_the_chats_step_slot_goes_on_in_a_new_one(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """While another execution of the Chat holds its step slot (here the test holds it), an
    execution waited a step deadline and two leases, then ended ``failed: learning_busy``: its
    Turn's evidence stayed unlearned until the Chat confided again, although nothing had failed.
    It goes on under a new epoch now (as often as the slot is busy), and learns once it is free."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann keeps bees on the roof.")
    item = await first_item(api, ann, chat)
    model_server.script("learn", learn(fact_call("Ann keeps bees on the roof.", item)))
    release = await slots.take_key(
        runtime.redis, slots.step_key_of(w.bot, chat), 1, time.monotonic() + 10, lease_seconds=3.0
    )
    try:
        await confide(api, ann, turn["id"], "Noted the bees.")
        await complete(api, ann, turn["id"])

        async def handed_on() -> dict[str, Any] | None:
            [x] = await executions(runtime, turn["id"])
            assert x["status"] != "failed", x  # before: failed, learning_busy
            return x if x["epoch"] >= 1 else None

        await until(handed_on, "the waiting execution never went on under a new epoch", within=60)
        assert model_server.requests_for("learn") == []  # nobody asked while the slot was held
    finally:
        await release()
    [x] = await wait_executions(runtime, turn["id"], within=60)
    assert (x["status"], x["learned"], x.get("error")) == ("done", 1, None), x
    assert [e["content"] for e in (await visible(api, ann, w.bot)).values()] == [
        "Ann keeps bees on the roof."
    ]


async def test_a_job_gives_its_worker_slot_back_while_its_chats_step_slot_is_busy(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.25: a job whose Chat's step slot is held hands its execution on (a new epoch, its job
    waiting in the queue) after a short wait, not at its step deadline: waiting a deadline (two
    minutes) in the job, a Chat with ten Turns learning at once held every job slot of a worker
    and every other Chat's learning waited. Here the deadline is ten minutes and the slot stays
    held: the job ends, handed on, while it is."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann grows basil.")
    item = await first_item(api, ann, chat)
    await confide(api, ann, turn["id"], "Noted the basil.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    model_server.script("learn", learn(fact_call("Ann grows basil.", item)))
    settings = runtime.settings.model_copy(update={"step_deadline_seconds": 600.0})
    runner = ExecutionRunner(dataclasses.replace(runtime, settings=settings), Gateway(settings), "test")
    release = await slots.take_key(
        runtime.redis, slots.step_key_of(w.bot, chat), 1, time.monotonic() + 10, lease_seconds=3.0
    )
    try:
        running = asyncio.create_task(runner.run(queued["id"], 0))

        async def handed_on() -> dict[str, Any] | None:
            [x] = await executions(runtime, turn["id"])
            return x if x["epoch"] >= 1 else None

        await until(handed_on, "the job waited for the step slot instead of handing on", within=60)
        assert await running == "handed_on:slot"
        assert model_server.requests_for("learn") == []
    finally:
        await release()
        await runner.gateway.close()
    [x] = await wait_executions(runtime, turn["id"], within=60)  # the suite's worker goes on
    assert (x["status"], x["learned"]) == ("done", 1), x


async def test_a_job_begins_no_step_that_might_outlast_it_and_its_execution_goes_on_in_a_new_one(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """An execution with more evidence than one step reads (here one Item a step) ran step after
    step in one job, past arq's job timeout (two step deadlines and a margin) when the steps were
    slow: arq cancelled it mid-call, the call unsaved and its cost uncounted, and the sweeper began
    the execution again. A job begins a step only within its first step deadline now, so every
    step it begins ends within its timeout; the rest goes on in a new job (here the suite's
    worker's), each Item asked about once."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann swims at seven.")
    first = await first_item(api, ann, chat)
    second, third = await add_items(
        api,
        ann,
        turn["id"],
        ("PERSON_MESSAGE", "Ann cycles at eight."),
        ("PERSON_MESSAGE", "Ann rows at nine."),
    )
    await confide(api, ann, turn["id"], "Noted the sports.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    # Each step's model call takes a little over half a step deadline: a second step may begin
    # within the job's first deadline, a third never.
    step = 4.0
    slow = True  # the suite's worker, which goes on, has the suite's shorter model timeout

    def one_fact_a_message(request: Recorded) -> Reply:
        items = json.loads(request.body["messages"][1]["content"])["newItems"]
        said = [i for i in items if i["kind"] == "person_message"]
        return learn(*(fact_call(i["text"], i["id"]) for i in said), delay=step * 0.55 if slow else 0.0)

    model_server.respond("learn", one_fact_a_message)
    settings = runtime.settings.model_copy(
        update={
            "step_deadline_seconds": step,
            "max_evidence_items": 1,
            "model_attempt_timeout_seconds": step,
            "openai_base_url": model_server.base_url,
            "openai_api_key": SecretStr("sk-test"),
        }
    )
    gateway = Gateway(settings)
    await gateway.warm_up()  # as a worker does before its first job
    try:
        outcome = await ExecutionRunner(dataclasses.replace(runtime, settings=settings), gateway, "test").run(
            queued["id"], 0
        )
    finally:
        await gateway.close()
        slow = False
    assert outcome == "handed_on:time"  # before: "done", all three steps in one job
    [x] = await wait_executions(runtime, turn["id"], within=60)
    assert (x["status"], x["epoch"], x["learned"]) == ("done", 1, 3), x
    assert sorted(e["content"] for e in (await visible(api, ann, w.bot)).values()) == [
        "Ann cycles at eight.",
        "Ann rows at nine.",
        "Ann swims at seven.",
    ]
    asked = [
        i["id"]
        for r in model_server.requests_for("learn")
        for i in json.loads(r.body["messages"][1]["content"])["newItems"]
    ]
    assert sorted(asked) == sorted([first, second, third])  # each Item asked about once
    assert len(await memory_bot_changes(runtime, w.bot)) == 3


async def test_a_step_sends_at_most_its_characters_of_evidence(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A step's evidence was bounded by count alone: 200 Items of up to 20,000 characters passed
    any model's context, the provider refused the same request every time (provider_error, the
    read position unchanged) and the Chat learned no more. A step now sends at most
    ``max_evidence_chars`` (60,000) of Items' text, its first Item whatever its size; the rest
    goes in the next step of the same execution."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Here are my notes.")
    big = letters("ABCD")
    await add_items(api, ann, turn["id"], *(("PERSON_MESSAGE", text) for text in big))
    model_server.respond("learn", lambda _: learn())
    await confide(api, ann, turn["id"], "Took the notes.")
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done", x
    sent = [
        [i["text"] for i in json.loads(r.body["messages"][1]["content"])["newItems"]]
        for r in model_server.requests_for("learn")
        if "Here are my notes." in r.text or big[3][:40] in r.text
    ]
    assert len(sent) == 2, [len(s) for s in sent]
    assert all(sum(len(t) for t in texts) <= 60_000 for texts in sent)
    assert sorted(t for texts in sent for t in texts if len(t) > 100) == big  # each asked about once


async def test_a_job_asked_to_stop_ends_its_step_and_hands_the_rest_on(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.9: a worker asked to stop (``ExecutionRunner.stopping``) lets the step running end and
    begins no other: the execution's rest goes on in a new epoch, queued at once (here taken by
    the suite's worker), each Item asked about once."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann paints on Sundays.")
    await add_items(api, ann, turn["id"], ("PERSON_MESSAGE", "Ann sails in May."))
    await confide(api, ann, turn["id"], "Noted the hobbies.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def one_fact_a_message(request: Recorded) -> Reply:
        loop.call_soon_threadsafe(stopping.set)  # asked to stop while the step's call runs
        items = json.loads(request.body["messages"][1]["content"])["newItems"]
        said = [i for i in items if i["kind"] == "person_message"]
        return learn(*(fact_call(i["text"], i["id"]) for i in said))

    model_server.respond("learn", one_fact_a_message)
    settings = runtime.settings.model_copy(
        update={
            "max_evidence_items": 1,
            "openai_base_url": model_server.base_url,
            "openai_api_key": SecretStr("sk-test"),
        }
    )
    gateway = Gateway(settings)
    await gateway.warm_up()
    try:
        runner = ExecutionRunner(dataclasses.replace(runtime, settings=settings), gateway, "test", stopping)
        assert await runner.run(queued["id"], 0) == "handed_on:stopping"
    finally:
        await gateway.close()
    [x] = await wait_executions(runtime, turn["id"], within=60)
    assert (x["status"], x["epoch"], x["learned"]) == ("done", 1, 2), x
    assert sorted(e["content"] for e in (await visible(api, ann, w.bot)).values()) == [
        "Ann paints on Sundays.",
        "Ann sails in May.",
    ]
    asked = [
        i["text"]
        for r in model_server.requests_for("learn")
        for i in json.loads(r.body["messages"][1]["content"])["newItems"]
        if i["kind"] == "person_message"
    ]
    assert sorted(asked) == ["Ann paints on Sundays.", "Ann sails in May."]  # each asked about once


async def test_an_outage_during_a_step_is_not_its_failure_and_its_evidence_is_learned_once_back(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C4, C6 ("a restart keeps the work"): Neo4j gone past the driver's retries while a step
    commits (a failover, a restart, a dropped commit) was caught with every other error and the
    execution ended ``failed: internal:ServiceUnavailable`` whenever the database was back in
    time to record it: its Turn's evidence was never learned. The job now ends with the outage
    (logged, D9.9) and records nothing; the lease lapses and the sweeper queues the execution
    again, and it is learned once. (This runner reaches Neo4j through a proxy the test cuts while
    the model answers; the suite's worker, which takes the next epoch, does not.)"""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann keeps goats.")
    item = await first_item(api, ann, chat)
    answered = threading.Event()
    model_server.default("learn", learn(fact_call("Ann keeps goats.", item), hold=answered))
    await confide(api, ann, turn["id"], "Noted the goats.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    proxy = CuttableProxy(runtime.settings.neo4j_bolt_port)
    await proxy.listen()
    settings = runtime.settings.model_copy(
        update={"openai_base_url": model_server.base_url, "openai_api_key": SecretStr("sk-test")}
    )
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    cut_off = make_driver(f"bolt://127.0.0.1:{proxy.port}", settings.neo4j_user, password, retry_seconds=1.0)
    gateway = Gateway(settings)
    await gateway.warm_up()
    runner = ExecutionRunner(dataclasses.replace(runtime, settings=settings, driver=cut_off), gateway, "test")
    try:
        running = asyncio.create_task(runner.run(queued["id"], 0))
        await model_server.wait_for_requests("learn", 1)  # the step's inputs are read: now cut
        await proxy.cut()
        answered.set()
        with pytest.raises(ServiceUnavailable):  # before: "failed:internal:ServiceUnavailable"
            await running
    finally:
        answered.set()
        await gateway.close()
        await cut_off.close()
    [x] = await wait_executions(runtime, turn["id"], within=60)
    assert (x["status"], x["learned"]) == ("done", 1) and x["epoch"] >= 1, x
    assert [e["content"] for e in (await visible(api, ann, w.bot)).values()] == ["Ann keeps goats."]
    assert len(await memory_bot_changes(runtime, w.bot)) == 1


async def test_a_step_ends_at_its_deadline_even_within_one_model_attempt(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: a learning step over its deadline (here 4 s) ends the execution with a safe
    failure, the read position staying, even while the model attempt it waits on may take far
    longer (here 60 s, and the model never answers): the attempt is cut at the step's deadline,
    and no attempt follows it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Ann moved to Berlin.")
    await confide(api, ann, turn["id"], "Noted the move.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    never = threading.Event()
    model_server.script("learn", Reply(text="too late", hold=never))
    settings = runtime.settings.model_copy(
        update={
            "step_deadline_seconds": 4.0,
            "model_attempt_timeout_seconds": 60.0,
            "openai_base_url": model_server.base_url,
        }
    )
    runner = ExecutionRunner(dataclasses.replace(runtime, settings=settings), Gateway(settings), "test")
    try:
        await asyncio.wait_for(runner.run(queued["id"], 0), 100)
    finally:
        never.set()
        await runner.gateway.close()
    [x] = await executions(runtime, turn["id"])
    assert (x["status"], x.get("error")) == ("failed", "model:timeout"), x
    assert len(model_server.requests_for("learn")) == 1
    assert await position(runtime, w.bot, chat) == 0
