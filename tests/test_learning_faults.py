"""Fault injection on the real processes (C4, C5, D9.9): kill -9 and SIGSTOP of workers and the
API never lose work and never apply the same evidence twice."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import signal
import threading
from collections.abc import Iterator
from typing import cast

import pytest
from neo4j import AsyncGraphDatabase

from learning import worker
from learning.executions import ExecutionRunner
from learning.gateway import Gateway
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api
from tests.conftest import SHORT_DEADLINES, ApiProcess, WorkerProcess
from tests.learning_helpers import (
    complete,
    confide,
    executions,
    fact_call,
    learn,
    memory_bot_changes,
    memory_world,
    until_a_transaction_waits_for_a_lock,
    until_logged,
    wait_executions,
)
from tests.memory_helpers import command, fact, said, visible
from tests.model_server import ModelServer
from tests.waiting import until

LEASE = float(SHORT_DEADLINES["BOTMEMORY_LEASE_SECONDS"])
POLL = float(SHORT_DEADLINES["BOTMEMORY_SWEEP_INTERVAL_SECONDS"])


pytestmark = pytest.mark.usefixtures("learning_worker")


@pytest.fixture
def second_worker(settings: Settings, service_env: dict[str, str]) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(settings.data_dir / "logs" / "pytest-worker-2.log", service_env)
    yield worker
    if worker.proc.poll() is None:
        os.kill(worker.proc.pid, signal.SIGCONT)
    worker.stop()


async def saved_learn_calls(rt: Runtime, bot: str) -> int:
    records, _, _ = await rt.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b, task: 'learn', status: 'ok'}) RETURN count(c) AS n", b=bot
    )
    return int(records[0]["n"])


async def test_worker_killed_after_the_model_call_recovers_without_calling_again(
    api: Api, runtime: Runtime, model_server: ModelServer, patient_worker: WorkerProcess
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I speak Portuguese")
    answer = threading.Event()
    model_server.default(
        "learn", learn(fact_call("Ann speaks Portuguese", "i-1", topics=("languages",)), hold=answer)
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    try:
        await model_server.wait_for_requests("learn", 1)
        [x] = await executions(runtime, turn["id"])
        # The model answers once the execution node is locked: the worker then saves its ModelCall
        # (C5) and stops inside its commit transaction, which locks the execution for the
        # compare-and-set.
        async with runtime.driver.session() as session:
            blocker = await session.begin_transaction()
            await (
                await blocker.run(
                    "MATCH (x:LearningExecution {id: $x}) CALL apoc.lock.nodes([x]) RETURN 1", x=x["id"]
                )
            ).consume()
            answer.set()

            async def saved() -> int:
                return await saved_learn_calls(runtime, w.bot)

            await until(saved, "the worker never saved its model call")
            # The worker's commit, inside apply_changes (COMMIT_STEP).
            await until_a_transaction_waits_for_a_lock(
                runtime, running="MATCH (heldX:LearningExecution {id: $id})", given=("id", x["id"])
            )
            patient_worker.kill()
            await blocker.rollback()
    finally:
        answer.set()
    [x] = await executions(runtime, turn["id"])
    assert x["status"] == "running" and x["epoch"] == 0
    patient_worker.restart()
    patient_worker.wait_ready()
    # Taken over once the lease expired (how soon is the learning benchmark's to say).
    [x] = await wait_executions(runtime, turn["id"], within=20)
    assert x["status"] == "done" and x["epoch"] >= 1 and x["learned"] == 1
    assert len(model_server.requests_for("learn")) == 1  # the saved result was reused
    assert await saved_learn_calls(runtime, w.bot) == 1
    assert len(await memory_bot_changes(runtime, w.bot)) == 1
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann speaks Portuguese"
    ]


async def test_api_killed_between_confide_and_completion_loses_nothing(
    api: Api, runtime: Runtime, settings: Settings, service_env: dict[str, str], model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "My daughter is called Rita")
    model_server.script("learn", learn(fact_call("Ann's daughter is Rita", "i-1")))
    doomed = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api-doomed.log", service_env)
    try:
        import httpx

        async with httpx.AsyncClient(base_url=doomed.url, timeout=30) as http:
            response = await http.post(
                "/graphql",
                json={
                    "query": 'mutation($t: ID!) { confide(turnId: $t, text: "I forgot her name") { answer } }',
                    "variables": {"t": turn["id"]},
                },
                headers={"Authorization": f"Bearer {w.tokens['ann']}"},
            )
            assert response.json()["data"]["confide"]["answer"]
    finally:
        doomed.proc.kill()
        doomed.proc.wait(timeout=10)
        doomed.stop()
    # The execution was recorded before the API died. It waits for the Turn's completion, unless
    # the Turn idle timeout (seconds in the test profile) has completed the Turn already.
    [x] = await executions(runtime, turn["id"])
    assert x["status"] in ("waiting", "queued", "running", "done")
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done" and x["learned"] == 1
    confessions = await api.http.get(
        f"/v1/chats/{chat}/confessions", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert [c["text"] for c in confessions.json()["confessions"]] == ["I forgot her name"]


async def test_a_stopped_worker_past_its_lease_never_commits_after_the_takeover(
    api: Api,
    runtime: Runtime,
    model_server: ModelServer,
    worker_process: WorkerProcess,
    second_worker: WorkerProcess,
) -> None:
    second_worker.kill()  # only the first worker may take the job
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I drink my coffee black")
    model_server.default("learn", learn(fact_call("Ann drinks black coffee", "i-1"), delay=0.8))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await model_server.wait_for_requests("learn", 1)
    os.kill(worker_process.proc.pid, signal.SIGSTOP)  # mid-call, holding the lease of epoch 0
    try:
        second_worker.restart()
        second_worker.wait_ready()
        [x] = await wait_executions(runtime, turn["id"], within=20)
        assert x["status"] == "done" and x["epoch"] >= 1
    finally:
        os.kill(worker_process.proc.pid, signal.SIGCONT)
    # The first worker wakes up, gets its answer and tries to commit epoch 0: wait until it says
    # how that ended (its log line for the epoch), then nothing of it may show.
    await until_logged(worker_process.log_path, f"execution {x['id']} epoch 0: ")
    [x] = await executions(runtime, turn["id"])
    assert x["status"] == "done" and x["learned"] == 1
    assert len(await memory_bot_changes(runtime, w.bot)) == 1
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann drinks black coffee"
    ]


async def test_two_workers_racing_on_the_same_evidence_apply_it_once(
    api: Api, runtime: Runtime, model_server: ModelServer, second_worker: WorkerProcess
) -> None:
    """Four executions of one Turn on two workers at once apply its evidence once (C4), and pay
    for it once: a Chat's learning steps take turns (its one step slot in Redis), so those after
    the first read on from where it left the read position and find nothing left to ask about
    (each used to ask the model for the same evidence, all answers but one thrown away)."""
    second_worker.wait_ready()
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I run marathons")
    model_server.default("learn", learn(fact_call("Ann runs marathons", "i-1"), delay=0.3))
    for text in ("one", "two", "three", "four"):
        await confide(api, w.tokens["ann"], turn["id"], text)
    await complete(api, w.tokens["ann"], turn["id"])
    done = await wait_executions(runtime, turn["id"])
    assert [x["status"] for x in done] == ["done"] * 4
    assert sum(x["learned"] for x in done) == 1
    assert len(await memory_bot_changes(runtime, w.bot)) == 1
    assert len(await visible(api, w.tokens["ann"], w.bot)) == 1
    assert len(model_server.requests_for("learn")) == 1  # before: 2–4 (each read the same start)


async def test_a_lost_enqueue_is_recovered_by_the_sweeper(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """completeTurn committed the queued execution, but the API died before its enqueue reached Redis."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I take the 8:15 train")
    model_server.default("learn", learn(fact_call("Ann takes the 8:15 train", "i-1")))
    await confide(api, w.tokens["ann"], turn["id"])
    await runtime.driver.execute_query(
        "MATCH (t:Turn {id: $t}) SET t.status = 'completed', t.completedAt = timestamp() "
        "WITH t MATCH (x:LearningExecution {turnId: t.id}) SET x.status = 'queued', x.queuedAt = 0",
        t=turn["id"],
    )
    [x] = await wait_executions(runtime, turn["id"], within=15)
    assert x["status"] == "done" and x["epoch"] == 0 and x["learned"] == 1


async def test_the_model_call_runs_outside_the_memory_lock(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C1: while a learning step waits for the model, reads and changes of that memory go on."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I play the cello")
    answer = threading.Event()
    model_server.default("learn", learn(fact_call("Ann plays the cello", "i-1"), hold=answer))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    await model_server.wait_for_requests("learn", 1)
    try:  # the model does not answer until the Remember is through: a lock held across the call would stall it
        remembered = await asyncio.wait_for(
            command(api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "cello on Tuesdays"}), 30
        )
        assert remembered.status_code == 201
        now = await visible(api, w.tokens["ann"], w.bot)
        assert [e["content"] for e in now.values()] == ["cello on Tuesdays"]
    finally:
        answer.set()
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done"
    assert sorted(e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()) == [
        "Ann plays the cello",
        "cello on Tuesdays",
    ]


@pytest.mark.usefixtures("patient_worker")
async def test_the_latest_source_state_is_checked_under_the_write_lock(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C7, D9.23: the chat's history is deleted while the model thinks → nothing of the answer
    commits; the step reads the evidence again, finds no words left, and reads past it without
    asking the model again. The model answers once the deletion has committed."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "My passport number is in the drawer")
    gate = threading.Event()
    model_server.default("learn", learn(fact_call("Ann keeps her passport in the drawer", "i-1"), hold=gate))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    try:
        await model_server.wait_for_requests("learn", 1)
        await api.gql(
            "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
        )
    finally:
        gate.set()
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"], x.get("error")) == ("done", 0, None), x
    assert await memory_bot_changes(runtime, w.bot) == []
    assert await visible(api, w.tokens["ann"], w.bot) == {}
    assert len(model_server.requests_for("learn")) == 1


@pytest.mark.usefixtures("patient_worker")
async def test_an_answer_made_of_deleted_words_commits_nothing_whatever_it_adds(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.23: the history is deleted while the model thinks, and its answer adds only an
    observation (it cites a kept entry, not the deleted Items): it committed, the deleted words in
    a new entry (only facts' Items were checked). The commit holds only while the Chat's history
    is the one the evidence was read from; read again, the evidence has no words left."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    kept_chat = await api.chat(ann, w.bot)
    kept = await fact(runtime, w.bot, "Ann travels often", await said(api, ann, kept_chat, "I travel"))
    chat = await api.chat(ann, w.bot)
    canary = "CANARY" + secrets.token_hex(6)
    turn = await api.turn(ann, chat, f"my passport number is {canary}")
    gate = threading.Event()
    observation = {
        "content": f"Ann's passport number is {canary}",
        "source_entry_ids": [kept],
        "confidence": 0.9,
    }
    model_server.script("learn", learn(("add_observation", observation), hold=gate), about=canary)
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    try:
        await model_server.wait_for_requests("learn", 1)
        await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    finally:
        gate.set()
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"], x.get("error")) == ("done", 0, None), x
    assert list(await visible(api, ann, w.bot)) == [kept]
    assert len(model_server.requests_for("learn")) == 1


async def test_a_worker_asked_to_stop_ends_its_running_step_and_saves_its_call(
    api: Api,
    runtime: Runtime,
    model_server: ModelServer,
    settings: Settings,
    service_env: dict[str, str],
    worker_process: WorkerProcess,
) -> None:
    """C5, D9.9: a worker asked to stop (SIGTERM: a deploy, ``make down``, compose) cancelled its
    running jobs at once — a model call halfway was billed by the provider, never saved nor
    charged, and the next epoch paid for it again. It takes no more jobs now, lets the running
    step end (its call saved, its evidence learned) and then exits."""
    worker_process.kill()  # only this test's worker may take the job
    patient = {"BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "30", "BOTMEMORY_STEP_DEADLINE_SECONDS": "40"}
    stopping = WorkerProcess(
        settings.data_dir / "logs" / "pytest-worker-stop.log", {**service_env, **patient}
    )
    gate = threading.Event()
    try:
        stopping.wait_ready()
        w = await memory_world(api, ("ann",))
        chat = await api.chat(w.tokens["ann"], w.bot)
        turn = await api.turn(w.tokens["ann"], chat, "I collect stamps")
        model_server.script("learn", learn(fact_call("Ann collects stamps", "i-1"), hold=gate))
        await confide(api, w.tokens["ann"], turn["id"])
        await complete(api, w.tokens["ann"], turn["id"])
        await model_server.wait_for_requests("learn", 1)
        logged = stopping.log_path.stat().st_size
        stopping.proc.send_signal(signal.SIGTERM)  # mid-call
        await until_logged(stopping.log_path, "asked to stop", after=logged)
        gate.set()
        assert await asyncio.to_thread(stopping.proc.wait, 60) == 0
    finally:
        gate.set()
        stopping.stop()
    [x] = await executions(runtime, turn["id"])
    assert (x["status"], x["epoch"], x["learned"]) == ("done", 0, 1), x
    assert len(model_server.requests_for("learn")) == 1
    assert await saved_learn_calls(runtime, w.bot) == 1
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann collects stamps"
    ]


async def test_a_learning_job_never_raises_into_arq(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """D9.9: jobs never raise. With Neo4j gone past the driver's retries as the job claims its
    execution (or finishes it), the error reached arq as a failed job; it is a logged outcome now,
    and the sweeper queues the execution again once its lease runs out."""
    dead = AsyncGraphDatabase.driver(
        "bolt://127.0.0.1:1", auth=("neo4j", "unused"), max_transaction_retry_time=0.5, connection_timeout=1
    )
    caplog.set_level(logging.INFO, logger="botmemory.worker")
    try:
        runner = ExecutionRunner(dataclasses.replace(runtime, driver=dead), cast(Gateway, None), "w:1")
        await worker.run_execution({"runner": runner}, "exec_gone", 0)
    finally:
        await dead.close()
    assert "execution exec_gone epoch 0: error:ServiceUnavailable" in caplog.text
