"""The memory Bot's settings (C3, D9.13), budget (L6, D9.12), model calls (C5, §7), confide
deadlines (L1, D9.11) and confessions (D9.6), end to end on the real stack."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest
import websockets
from neo4j import AsyncManagedTransaction

from graph import learning as learning_q
from graph import memorybot as memorybot_q
from graph import sweeps as sweeps_q
from graph.driver import read, write
from learning.gateway import FIXED_CALM_ANSWER, Call, Gateway, ModelUnavailable, Route, StepKey
from learning.sweeper import sweep_once
from services import memorybot, slots
from services.auth import authenticate
from services.crypto import Kind
from services.errors import NotFound
from services.ids import new_id
from services.memory import cipher_of
from services.runtime import Runtime, now_ms
from services.settings import Settings
from tests.client import Api, bearer
from tests.conftest import ApiProcess
from tests.feed_helpers import ws_url
from tests.learning_helpers import (
    bare_executions,
    complete,
    confide,
    executions,
    fact_call,
    holding_lock,
    learn,
    memory_world,
    position,
    set_org,
    spend,
    until_a_transaction_waits_for_a_lock,
    wait_executions,
)
from tests.memory_helpers import command, fact, said, sealed
from tests.model_server import ModelServer, Reply
from tests.waiting import until
from tools.processes import free_port

pytestmark = pytest.mark.usefixtures("learning_worker")


async def settings_of(api: Api, token: str, bot: str) -> dict[str, Any]:
    response = await api.http.get(f"/v1/bots/{bot}/memory/bot", headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


async def patch(api: Api, token: str, bot: str, body: Any) -> Any:
    return await api.http.patch(f"/v1/bots/{bot}/memory/bot", json=body, headers=bearer(token))


async def confide_then_go_away(api: Api, model_server: ModelServer, token: str, turn: str) -> None:
    """A confide sent on a socket, ended by its client (``complete``) once the model has it;
    returns once the API has ended it: an operation sent after the ``complete`` on the same socket
    is answered (the API reads a socket's messages in order, and cancels an operation as it reads
    its ``complete``; the cancel reaches the confide before anything of the later one is read)."""
    confide_op = 'mutation($t: ID!) { confide(turnId: $t, text: "stuck") { answer } }'
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        payload = {"query": confide_op, "variables": {"t": turn}}
        await ws.send(json.dumps({"id": "c", "type": "subscribe", "payload": payload}))
        await model_server.wait_for_requests("confide", 1)
        await ws.send(json.dumps({"id": "c", "type": "complete"}))
        await ws.send(json.dumps({"id": "after", "type": "subscribe", "payload": {"query": "{ me { id } }"}}))
        message = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert (message["id"], message["type"]) == ("after", "next"), message
        assert message["payload"]["data"]["me"]["id"]


async def model_calls(rt: Runtime, bot: str) -> list[dict[str, Any]]:
    records, _, _ = await rt.driver.execute_query(
        "MATCH (c:ModelCall {botId: $b}) RETURN c {.*} AS c ORDER BY c.at", b=bot
    )
    return [dict(r["c"]) for r in records]


# Settings ---------------------------------------------------------------------------------


async def test_settings_patch_with_expected_version(api: Api) -> None:
    w = await memory_world(api, ("ann",))
    assert await settings_of(api, w.tokens["ann"], w.bot) == {
        "version": 0,
        "instructions": None,
        "concurrency": None,
        "budget": None,
    }
    body = {
        "expected": 0,
        "instructions": "Decisions of the team may be shared with the team.",
        "concurrency": 2,
        "budget": {"period": "month", "limitMicros": 5000000},
    }
    response = await patch(api, w.tokens["ann"], w.bot, body)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 1
    # The same expected again: the settings moved, nothing changes (C3).
    stale = await patch(api, w.tokens["ann"], w.bot, {"expected": 0, "concurrency": 5})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "CONFLICT"
    got = await settings_of(api, w.tokens["ann"], w.bot)
    assert got["concurrency"] == 2 and got["budget"] == {"period": "month", "limitMicros": 5000000}
    assert got["spent"] == {"micros": 0, "unknownCalls": 0}
    # Absent fields stay; null removes a limit.
    response = await patch(api, w.tokens["ann"], w.bot, {"expected": 1, "budget": None, "concurrency": None})
    assert response.json() == {
        "version": 2,
        "instructions": "Decisions of the team may be shared with the team.",
        "concurrency": None,
        "budget": None,
    }
    # The same through GraphQL.
    data = await api.gql(
        "mutation($b: ID!) { updateMemoryBot(botId: $b, expected: 2, concurrency: 3,"
        ' budget: {period: "day", limitMicros: 7}) { version concurrency budget { period limitMicros } } }',
        {"b": w.bot},
        w.tokens["ann"],
    )
    assert data["updateMemoryBot"] == {
        "version": 3,
        "concurrency": 3,
        "budget": {"period": "day", "limitMicros": 7},
    }
    codes = await api.codes(
        "mutation($b: ID!) { updateMemoryBot(botId: $b, expected: 2, concurrency: 4) { version } }",
        {"b": w.bot},
        w.tokens["ann"],
    )
    assert codes == ["CONFLICT"]
    data = await api.gql(
        "query($b: ID!) { memoryBot(botId: $b) { version concurrency } }", {"b": w.bot}, w.tokens["ann"]
    )
    assert data["memoryBot"] == {"version": 3, "concurrency": 3}
    # A Long is a whole number within 64 bits on both surfaces, as REST's JSON numbers are: int()
    # took 1.9 as 1, true as 1 and " 12 " as 12; a version past 64 bits failed inside (500).
    budget = 'mutation($b: ID!, $m: Long!) { updateMemoryBot(botId: $b, expected: 3, budget: {period: "day", limitMicros: $m}) { version } }'
    for bad in (1.9, True, " 12 ", 2**63):
        assert await api.codes(budget, {"b": w.bot, "m": bad}, w.tokens["ann"]) == ["BAD_INPUT"], bad
    assert (await patch(api, w.tokens["ann"], w.bot, {"expected": 1.9})).status_code == 422
    too_big = await patch(api, w.tokens["ann"], w.bot, {"expected": 2**63, "concurrency": 1})
    assert too_big.status_code == 422 and too_big.json()["error"]["code"] == "BAD_INPUT"
    data = await api.gql(
        "query($b: ID!) { memoryBot(botId: $b) { version budget { limitMicros } } }",
        {"b": w.bot},
        w.tokens["ann"],
    )
    assert data["memoryBot"] == {"version": 3, "budget": {"limitMicros": 7}}


async def test_a_write_grant_taken_away_while_a_settings_change_waits_stops_it(
    api: Api, runtime: Runtime
) -> None:
    """C3, D9.13: who may write the settings is read again under the Memory's lock. Checked only
    before it, a PATCH that waited behind a long commit went through after the person's write
    grant was taken away meanwhile."""
    w = await memory_world(api, ("ann",))
    lock = "MATCH (m:Memory {id: $b}) CALL apoc.lock.nodes([m]) RETURN 1"
    async with holding_lock(runtime, lock, b=w.bot):
        changing = asyncio.create_task(patch(api, w.tokens["ann"], w.bot, {"expected": 0, "concurrency": 3}))
        await until_a_transaction_waits_for_a_lock(runtime, given=("botId", w.bot))
        await api.grant(w.bot, w.people["ann"], "READ")
    response = await changing
    assert response.status_code == 403 and response.json()["error"]["code"] == "FORBIDDEN", response.text
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (m:Memory {id: $b}) RETURN m.settingsVersion AS version, m.concurrency AS concurrency", b=w.bot
    )
    assert (records[0]["version"], records[0]["concurrency"]) == (0, None)


async def test_settings_need_write_on_a_bot_that_is_not_linked(api: Api) -> None:
    w = await memory_world(api, ("ann", "bob"))
    await api.grant(w.bot, w.people["bob"], "READ")
    other = await api.organization("linked-org")
    eve, eve_token = await api.person(other, "eve")
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": w.bot, "o": other},
    )
    await api.grant(w.bot, eve, "WRITE")
    stranger_org = await api.organization("stranger")
    _, stranger = await api.person(stranger_org, "sam")
    for token, status in ((w.tokens["bob"], 403), (eve_token, 403), (stranger, 404)):
        got = await api.http.get(f"/v1/bots/{w.bot}/memory/bot", headers=bearer(token))
        assert got.status_code == status, got.text
        changed = await patch(api, token, w.bot, {"expected": 0, "concurrency": 1})
        assert changed.status_code == status
    assert (await settings_of(api, w.tokens["ann"], w.bot))["version"] == 0
    assert (await api.http.get(f"/v1/bots/{w.bot}/memory/bot")).status_code == 401


def _graphql_types_accept(body: dict[str, Any]) -> bool:
    """Whether updateMemoryBot's argument types let ``body``'s values through (then the PATCH model
    refuses them there as it does over REST)."""
    typed = {"expected": int, "concurrency": int, "instructions": str, "budget": dict}
    if "expected" not in body or any(
        k not in typed or isinstance(v, bool) or not isinstance(v, typed[k]) for k, v in body.items()
    ):
        return False
    budget = body.get("budget", {"period": "", "limitMicros": 0})
    return set(budget) == {"period", "limitMicros"}


def _budget_arg(budget: dict[str, Any]) -> str:
    return "budget: {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in budget.items()) + "}"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"concurrency": 1}, "expected"),
        ({"expected": "0"}, "expected"),
        ({"expected": 0, "concurrency": 0}, "concurrency"),
        ({"expected": 0, "concurrency": True}, "concurrency"),
        ({"expected": 0, "budget": {"period": "week", "limitMicros": 1}}, "budget.period"),
        ({"expected": 0, "budget": {"period": "day", "limitMicros": -1}}, "budget.limitMicros"),
        ({"expected": 0, "budget": {"period": "day"}}, "budget.limitMicros"),
        ({"expected": 0, "instructions": 5}, "instructions"),
        ({"expected": 0, "instructions": "x" * 9000}, "instructions"),
        ({"expected": 0, "colour": "red"}, "colour"),
    ],
)
async def test_bad_settings_are_refused_and_change_nothing(
    api: Api, body: dict[str, Any], field: str
) -> None:
    w = await memory_world(api, ("ann",))
    response = await patch(api, w.tokens["ann"], w.bot, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "BAD_INPUT" and field in error["message"], error
    assert (await settings_of(api, w.tokens["ann"], w.bot))["version"] == 0
    if _graphql_types_accept(body):  # the same words from GraphQL's updateMemoryBot
        args = ", ".join(
            f"{k}: {json.dumps(v)}" if k != "budget" else _budget_arg(v) for k, v in body.items()
        )
        answer = await api.raw(
            f'mutation {{ updateMemoryBot(botId: "{w.bot}", {args}) {{ version }} }}', token=w.tokens["ann"]
        )
        [gql_error] = answer["errors"]
        assert gql_error["message"] == error["message"], (gql_error, error)
        assert gql_error["extensions"]["code"] == "BAD_INPUT" and gql_error["extensions"]["field"].startswith(
            field
        )
    malformed = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot", content=b"{not json", headers=bearer(w.tokens["ann"])
    )
    assert malformed.status_code == 422


# Budget and usage -------------------------------------------------------------------------


async def test_a_budget_no_price_could_count_is_refused(api: Api) -> None:
    """D9.25: with no price for the organization's model every call costs "unknown", so a budget
    would never bind — setting one is refused, and nothing changes; removing one is allowed."""
    w = await memory_world(api, ("ann",))
    await set_org(api, w.org, model="a-model-without-a-price")
    response = await patch(
        api, w.tokens["ann"], w.bot, {"expected": 0, "budget": {"period": "day", "limitMicros": 5}}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "BAD_INPUT" and "a-model-without-a-price" in error["message"]
    assert (await settings_of(api, w.tokens["ann"], w.bot))["version"] == 0
    assert (await patch(api, w.tokens["ann"], w.bot, {"expected": 0, "budget": None})).status_code == 200
    await set_org(api, w.org)  # the priced test model
    priced = await patch(
        api, w.tokens["ann"], w.bot, {"expected": 1, "budget": {"period": "day", "limitMicros": 5}}
    )
    assert priced.status_code == 200, priced.text


async def test_spent_budget_gives_the_calm_answer_and_learning_waits_for_a_raised_limit(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    # One call of the scripted model costs 20 micro-USD (10 + 5 tokens at the test price).
    assert (
        await patch(
            api, w.tokens["ann"], w.bot, {"expected": 0, "budget": {"period": "day", "limitMicros": 20}}
        )
    ).status_code == 200
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    model_server.script("confide", Reply(text="Noted, carry on calmly."))
    assert await confide(api, w.tokens["ann"], turn["id"]) == "Noted, carry on calmly."
    assert (await settings_of(api, w.tokens["ann"], w.bot))["spent"] == {"micros": 20, "unknownCalls": 0}
    # Spent: the fixed calm answer without a call; learning waits (not lost).
    assert await confide(api, w.tokens["ann"], turn["id"], "again") == FIXED_CALM_ANSWER
    model_server.default("learn", learn(fact_call("Ann lives in Berlin", "i-1")))
    await complete(api, w.tokens["ann"], turn["id"])
    waiting = await wait_executions(runtime, turn["id"], ("budget",))
    assert len(waiting) == 2
    await sweep_once(runtime)  # what the workers' sweepers run: still waiting while spent
    assert {x["status"] for x in await executions(runtime, turn["id"])} == {"budget"}
    assert [r.task for r in model_server.requests] == ["confide"]
    assert await position(runtime, w.bot, chat) == 0
    # A PATCH that raises the limit releases them (D9.12); the evidence is applied once.
    raised = await patch(
        api, w.tokens["ann"], w.bot, {"expected": 1, "budget": {"period": "day", "limitMicros": 1000}}
    )
    assert raised.status_code == 200
    done = await wait_executions(runtime, turn["id"])
    assert sorted(x["status"] for x in done) == ["done", "done"]
    assert sum(x["learned"] for x in done) == 1
    assert await position(runtime, w.bot, chat) == 1


async def test_calls_in_flight_overshoot_a_spent_budget_by_at_most_the_concurrency(
    api: Api, patient_api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.12: spent is the confirmed cost, so calls already in flight may overshoot the budget, by
    up to ``concurrency`` calls and no more: five confide answers asked at once, two slots, a budget
    of one call — the two that took the slots first are paid, and the three that waited for a
    slot find the budget spent and give the calm answer without a call. The model answers the two
    once all five confessions are in, the three past them on their way to a slot (an API that
    waits for the model as long as that takes: no answer runs out of time)."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    settings = {"expected": 0, "concurrency": 2, "budget": {"period": "day", "limitMicros": 20}}
    assert (await patch(api, ann, w.bot, settings)).status_code == 200
    turns = [await api.turn(ann, await api.chat(ann, w.bot), f"note {n}") for n in range(5)]
    all_in = threading.Event()
    model_server.default("confide", Reply(text="Noted.", hold=all_in))
    answering = asyncio.gather(*(confide(patient_api, ann, t["id"]) for t in turns))

    async def confessions() -> bool:
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (f:Confession {botId: $b}) RETURN count(f) AS n", b=w.bot
        )
        return records[0]["n"] == 5

    try:
        await model_server.wait_for_requests("confide", 2)  # both slots taken, nothing spent yet
        await until(confessions, "the five confessions never came in")
    finally:
        all_in.set()
    answers = await answering
    asked = len(model_server.requests_for("confide"))
    assert asked == 2, answers  # the budget's one call, and the one more in flight beside it
    assert answers.count(FIXED_CALM_ANSWER) == 3
    spent = (await settings_of(api, ann, w.bot))["spent"]["micros"]
    assert spent == 20 * asked


async def test_a_refused_answer_is_not_asked_again_past_the_budget(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A re-ask (D9.21) is a model call: when the answer it would correct spent the budget, the
    step waits for the budget (L6) instead of calling again — re-asks were never checked, so a
    step could spend two calls past it."""
    w = await memory_world(api, ("ann",))
    budget = {"expected": 0, "budget": {"period": "day", "limitMicros": 20}}  # one call of 10 + 5 tokens
    assert (await patch(api, w.tokens["ann"], w.bot, budget)).status_code == 200
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    model_server.script("confide", Reply(text="Noted.", usage=(0, 0)))  # costs nothing
    await confide(api, w.tokens["ann"], turn["id"])
    model_server.default("learn", learn(fact_call("Ann lives in Berlin", "i-1", topics=("for:bot",))))
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"], ("budget",))
    assert x["status"] == "budget"
    assert len(model_server.requests_for("learn")) == 1
    assert (await settings_of(api, w.tokens["ann"], w.bot))["spent"]["micros"] == 20


async def test_learning_waiting_for_budget_resumes_next_period(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    assert (
        await patch(
            api, w.tokens["ann"], w.bot, {"expected": 0, "budget": {"period": "month", "limitMicros": 20}}
        )
    ).status_code == 200
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    await confide(api, w.tokens["ann"], turn["id"])  # spends the month's budget
    model_server.default("learn", learn(fact_call("Ann lives in Berlin", "i-1")))
    await complete(api, w.tokens["ann"], turn["id"])
    await wait_executions(runtime, turn["id"], ("budget",))
    # The calendar moves on: this month's spend becomes last month's (UTC periods).
    await runtime.driver.execute_query(
        "MATCH (s:Spend {botId: $b}) WHERE s.period STARTS WITH 'month:' "
        "SET s.period = 'month:2000-01', s.key = s.botId + '|month:2000-01|' + s.org",
        b=w.bot,
    )
    [x] = await wait_executions(runtime, turn["id"], within=10)
    assert x["status"] == "done" and x["learned"] == 1


async def test_the_sweep_looks_at_every_bot_whose_learning_waits_for_budget(runtime: Runtime) -> None:
    """D9.12: the sweeper releases a Bot's budget waits once its budget is free. It looked at the
    first 200 waiting executions, the same ones every sweep: a Bot with that many waiting on a
    budget still spent hid every other Bot, whose new period was never released. It looks at
    Bots now (up to 200 a sweep, drawn at random when there are more)."""
    hog, other = new_id("bot"), new_id("bot")
    waiting = [{"id": f"{hog}-{n}", "botId": hog, "status": "budget"} for n in range(1, 251)]
    async with bare_executions(runtime, *waiting, {"botId": other, "status": "budget"}):
        bots = await read(runtime.driver, lambda tx: sweeps_q.budget_waiting(tx, limit=200))
        assert {hog, other} <= set(bots) and len(bots) == len(set(bots))


async def test_a_bots_budget_waits_are_released_a_batch_at_a_time_longest_waiting_first(
    runtime: Runtime,
) -> None:
    """D9.12, L6: a Bot whose budget was spent for a month parks every execution of its Chats;
    at the new period they were all locked, given a new epoch and queued in one transaction and
    one burst of jobs. They are released a batch at a time, those that waited longest first; the
    sweep releases the rest in its next rounds."""
    bot = new_id("bot")  # no such Bot's settings: the suite's sweeper leaves these alone
    parked = [{"botId": bot, "status": "budget", "queuedAt": at} for at in (30, 10, 20)]
    async with bare_executions(runtime, *parked) as (late, first, second):

        async def release() -> set[str]:
            queued = await write(
                runtime.driver, lambda tx: sweeps_q.release_budget(tx, bot_id=bot, now=now_ms(), limit=2)
            )
            return {q["id"] for q in queued}

        assert await release() == {first, second}
        assert await release() == {late}
        assert await release() == set()


async def test_an_execution_whose_lease_keeps_running_out_ends_crashed(runtime: Runtime) -> None:
    """D9.9: an expired lease starts a new epoch — unless it ran out EXPIRIES_BEFORE_FAILING
    times: a worker that dies on an execution (killed for its memory) took it up again for ever,
    and every job of that worker died with it each time. It ends failed, ``crashed``, then."""
    expired = {"epoch": 3, "attempts": 5, "status": "running", "leaseUntil": 1}
    async with bare_executions(
        runtime,
        {**expired, "expiries": sweeps_q.EXPIRIES_BEFORE_FAILING - 1},
        {**expired, "expiries": 1},
    ) as (doomed, spared):
        queued = await write(
            runtime.driver,
            lambda tx: sweeps_q.sweep(
                tx, sweeps_q.SWEEP_EXPIRED, now=2, limit=10_000, maxExpiries=sweeps_q.EXPIRIES_BEFORE_FAILING
            ),
        )
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (x:LearningExecution) WHERE x.id IN [$d, $s]"
            " RETURN x.id AS id, x.status AS status, x.error AS error, x.epoch AS epoch, x.expiries AS n",
            d=doomed,
            s=spared,
        )
        found = {r["id"]: (r["status"], r["error"], r["epoch"], r["n"]) for r in records}
        assert found[doomed] == ("failed", "crashed", 3, sweeps_q.EXPIRIES_BEFORE_FAILING)
        # The other is queued for a new epoch — by this sweep, or by the sweeper of a worker that
        # runs beside the test (which may then take it up: these executions have no Turn).
        assert found[spared][1] != "crashed" and found[spared][2:] == (4, 2), found[spared]
        assert doomed not in {q["id"] for q in queued}


async def test_a_lease_is_kept_by_the_servers_clock_not_a_workers(runtime: Runtime) -> None:
    """D9.9, C4: a lease is taken, renewed and found expired by Neo4j's clock. By each worker's
    own, a worker whose clock ran a minute behind took leases that had run out when taken, and a
    sweeper whose clock ran a minute ahead expired every other worker's running executions: a
    second paid run of each."""
    minute = 60_000
    async with bare_executions(runtime, {}) as (x,):
        claimed = await write(
            runtime.driver,
            lambda tx: learning_q.claim(
                tx, id=x, epoch=0, worker="w", now=now_ms() - minute, lease_ms=30_000
            ),
        )
        assert claimed is not None
        assert await write(
            runtime.driver, lambda tx: learning_q.renew_lease(tx, id=x, epoch=0, lease_ms=30_000)
        )
        queued = await write(
            runtime.driver,
            lambda tx: sweeps_q.sweep(
                tx,
                sweeps_q.SWEEP_EXPIRED,
                now=now_ms() + minute,
                limit=10_000,
                maxExpiries=sweeps_q.EXPIRIES_BEFORE_FAILING,
            ),
        )
        assert x not in {q["id"] for q in queued}
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (x:LearningExecution {id: $id}) RETURN x.status AS status, x.epoch AS epoch,"
            " x.leaseUntil - timestamp() AS left",
            id=x,
        )
        assert [(r["status"], r["epoch"]) for r in records] == [("running", 0)]
        assert 0 < records[0]["left"] <= 30_000


async def test_missing_usage_is_recorded_unknown_and_not_charged(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    await patch(
        api, w.tokens["ann"], w.bot, {"expected": 0, "budget": {"period": "day", "limitMicros": 1000}}
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")
    model_server.script(
        "confide", Reply(text="Thank you.", usage=None), Reply(text="Thanks again.", usage=(100, 50))
    )
    await confide(api, w.tokens["ann"], turn["id"])
    await confide(api, w.tokens["ann"], turn["id"])
    assert (await settings_of(api, w.tokens["ann"], w.bot))["spent"] == {"micros": 200, "unknownCalls": 1}
    first, second = await model_calls(runtime, w.bot)
    assert first["usageKnown"] is False and first.get("costMicros") is None and first["status"] == "ok"
    assert second["usageKnown"] is True and second["costMicros"] == 200
    assert (second["promptTokens"], second["completionTokens"]) == (100, 50)
    # Saved encrypted with its attempts (C5, E1): the confided words are in the request, sealed.
    cipher = await cipher_of(runtime, w.bot)
    assert "I got the dates wrong." in cipher.decrypt(Kind.MODEL_REQUEST, first["id"], first["request"])
    assert b"I got the dates wrong." not in sealed(first["request"])
    assert first["attempts"] == 1 and first["attemptLog"][0].startswith("ok:")


async def test_usage_that_is_not_a_count_is_unknown_never_a_failure_or_a_refund(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The openai client does not check a response's types: a usage of null or text raised a
    TypeError past the save (the call neither saved nor charged, confide a 500 INTERNAL after
    its confession was committed), and a negative count lowered the budget's spend. Such usage is
    unknown now (D9.12: recorded, not charged), and the answer is given as any other."""
    w = await memory_world(api, ("ann",))
    await patch(
        api, w.tokens["ann"], w.bot, {"expected": 0, "budget": {"period": "day", "limitMicros": 1000}}
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")

    def answer(usage: dict[str, Any]) -> Reply:
        message = {"role": "assistant", "content": "Thank you."}
        completion = {
            "id": "chatcmpl-raw",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted-model",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
            "usage": usage,
        }
        return Reply(body=json.dumps(completion).encode())

    odd = [
        {"prompt_tokens": None, "completion_tokens": 5, "total_tokens": 5},
        {"prompt_tokens": "many", "completion_tokens": 5, "total_tokens": 5},
        {"prompt_tokens": -1_000_000, "completion_tokens": 5, "total_tokens": -999_995},
    ]
    model_server.script("confide", *[answer(u) for u in odd], Reply(text="Thanks again.", usage=(100, 50)))
    for _ in range(len(odd) + 1):
        assert await confide(api, w.tokens["ann"], turn["id"]) in ("Thank you.", "Thanks again.")
    assert (await settings_of(api, w.tokens["ann"], w.bot))["spent"] == {"micros": 200, "unknownCalls": 3}
    calls = await model_calls(runtime, w.bot)
    assert [(c["status"], c["usageKnown"]) for c in calls] == [("ok", False)] * 3 + [("ok", True)]


async def test_an_answer_past_its_bytes_is_not_read_whole(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """An answer's size was looked at after it was read whole (and parsed, and written again as
    JSON): one of hundreds of MB took the process's memory several times over. The client's
    transport stops reading past four times ``max_model_answer_bytes`` (1 MB): the call is
    ``too_large`` at its first attempt, not asked again, and the calm answer is given."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hello")
    model_server.script("confide", Reply(text="x" * 20_000_000))
    assert await confide(api, w.tokens["ann"], turn["id"]) == FIXED_CALM_ANSWER
    calls = await model_calls(runtime, w.bot)
    [call] = [c for c in calls if c["task"] == "confide"]
    assert call["status"] == "too_large" and call["attempts"] == 1, calls
    assert call["attemptLog"][0].startswith("too_large:"), call["attemptLog"]
    assert len(model_server.requests_for("confide")) == 1
    # Billed by the provider, so counted (L6): a call of unknown cost, in the day and the month.
    assert [(calls, unknown) for calls, _, unknown in await spend(runtime, w.bot)] == [(1, 1), (1, 1)]


async def test_a_shared_bot_uses_the_model_and_budget_of_the_chats_organization(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    guest_org = await api.organization("guest")
    await set_org(api, guest_org, model="guest-model")
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": w.bot, "o": guest_org},
    )
    gus, gus_token = await api.person(guest_org, "gus")
    await api.grant(w.bot, gus, "WRITE")
    chat = await api.chat(gus_token, w.bot)
    turn = await api.turn(gus_token, chat, "hi")
    await confide(api, gus_token, turn["id"])
    [request] = model_server.requests_for("confide")
    assert request.body["model"] == "guest-model"
    [call] = await model_calls(runtime, w.bot)
    assert call["org"] == guest_org and call["model"] == "guest-model"
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (s:Spend {botId: $b}) RETURN collect(DISTINCT s.org) AS orgs", b=w.bot
    )
    assert records[0]["orgs"] == [guest_org]


# Retries and failures ---------------------------------------------------------------------


async def test_provider_errors_are_retried_then_fail_safely(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    model_server.script("learn", Reply(status=500), Reply(status=503), Reply(status=500))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["error"]) == ("failed", "model:provider_error")
    assert len(model_server.requests_for("learn")) == 3
    call = next(c for c in await model_calls(runtime, w.bot) if c["task"] == "learn")
    assert call["attempts"] == 3 and call["status"] == "provider_error" and call.get("result") is None
    assert [a.split(":")[0] for a in call["attemptLog"]] == ["status-500", "status-503", "status-500"]
    assert await position(runtime, w.bot, chat) == 0
    # A retry that succeeds is one call with two attempts.
    turn2 = await api.turn(w.tokens["ann"], chat, "and I like jazz")
    model_server.script("learn", Reply(status=502), learn(fact_call("Ann lives in Berlin", "i-1")))
    await confide(api, w.tokens["ann"], turn2["id"])
    await complete(api, w.tokens["ann"], turn2["id"])
    [y] = await wait_executions(runtime, turn2["id"])
    assert y["status"] == "done"
    last = [c for c in await model_calls(runtime, w.bot) if c["task"] == "learn"][-1]
    assert last["attempts"] == 2 and last["status"] == "ok"


async def test_a_step_over_its_deadline_fails_safely(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C6: timeouts are retried within the step deadline (4 s in the suite), then a safe failure."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    model_server.default("learn", Reply(delay=10, text="too late"))
    await confide(api, w.tokens["ann"], turn["id"])
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"], within=15)
    # The model answers after 10 s: a timeout after more than one attempt is the step's deadline.
    assert (x["status"], x["error"]) == ("failed", "model:timeout")
    assert len(model_server.requests_for("learn")) >= 2
    assert await position(runtime, w.bot, chat) == 0


async def test_streamed_calls_ask_for_usage(
    runtime: Runtime, settings: Settings, model_server: ModelServer, api: Api
) -> None:
    w = await memory_world(api, ("ann",))
    priced = Settings.model_validate(
        {
            **settings.model_dump(),
            "openai_base_url": model_server.base_url,
            "model_prices": {"test-model": {"input": 1_000_000, "output": 2_000_000}},
        }
    )
    gateway = Gateway(priced)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (b:Bot {id: $b}) RETURN b.keyMaster AS m, b.keyWrapped AS k", b=w.bot
    )
    route = Route(
        w.bot,
        w.org,
        "test-model",
        True,
        None,
        None,
        None,
        None,
        runtime.cipher(w.bot, records[0]["m"], records[0]["k"]),
    )
    model_server.script("stream", Reply(text="streamed answer", usage=(7, 3)))
    try:
        call = Call(
            "stream",
            {"messages": [{"role": "user", "content": "hi"}]},
            time.monotonic() + 5,
            stream=True,
            step=StepKey("h", "exec_test", 0, 1),
        )
        done = await gateway.complete(runtime, route, call)
    finally:
        await gateway.close()
    assert (done.text, done.usage) == ("streamed answer", (7, 3))
    [request] = model_server.requests_for("stream")
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}
    [call] = await model_calls(runtime, w.bot)
    assert call["costMicros"] == 7 + 6 and call["usageKnown"] is True


async def test_an_attempt_sent_and_never_answered_counts_as_a_call_of_unknown_cost(
    runtime: Runtime, settings: Settings, model_server: ModelServer, api: Api
) -> None:
    """L6, the seed's "missing usage is recorded as unknown": an attempt cut by its timeout may
    have been done, and billed, by the provider; it was neither counted nor recorded as unknown,
    so a budgeted Bot on a slow provider spent what its budget never saw. Each is counted now as
    a call of unknown cost beside the answer's confirmed one. An attempt that never reached the
    provider (no connection could be made) is not: nothing was billed."""
    w = await memory_world(api, ("ann",))
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (b:Bot {id: $b}) RETURN b.keyMaster AS m, b.keyWrapped AS k", b=w.bot
    )
    cipher = runtime.cipher(w.bot, records[0]["m"], records[0]["k"])
    route = Route(w.bot, w.org, "test-model", True, None, None, None, None, cipher)

    async def ask(base_url: str) -> str | None:
        gateway = Gateway(
            Settings.model_validate(
                {
                    **settings.model_dump(),
                    "openai_base_url": base_url,
                    "model_attempt_timeout_seconds": 1.0,
                    "model_prices": {"test-model": {"input": 1_000_000, "output": 2_000_000}},
                }
            )
        )
        try:
            done = await gateway.complete(
                runtime,
                route,
                Call("probe", {"messages": [{"role": "user", "content": "hi"}]}, time.monotonic() + 8),
            )
            return done.text
        except ModelUnavailable:
            return None
        finally:
            await gateway.close()

    model_server.script(
        "probe",
        Reply(text="late", usage=(1, 1), delay=3),
        Reply(status=504, body=b"gateway timeout"),  # a proxy before the provider gave up
        Reply(text="in time", usage=(7, 3)),
    )
    assert await ask(model_server.base_url) == "in time"
    [call] = await model_calls(runtime, w.bot)
    assert [a.split(":")[0] for a in call["attemptLog"]] == ["timeout", "status-504", "ok"]
    # Three calls a period (day, month): the answer's 7 + 2 × 3 micro-USD and two of unknown cost.
    assert await spend(runtime, w.bot) == [(3, 13, 2), (3, 13, 2)]  # before: [(1, 13, 0)] × 2

    assert await ask(f"http://127.0.0.1:{free_port()}/v1") is None  # nothing listens there
    unsent = [c for c in await model_calls(runtime, w.bot) if c["id"] != call["id"]]
    assert [a.split(":")[0] for a in unsent[0]["attemptLog"]] == ["unsent"] * len(unsent[0]["attemptLog"])
    assert await spend(runtime, w.bot) == [(3, 13, 2), (3, 13, 2)]


# Confide and confessions ------------------------------------------------------------------


async def test_confide_draws_only_on_what_every_reader_may_see(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private_chat = await api.chat(w.tokens["ann"], w.bot)
    private = await fact(
        runtime,
        w.bot,
        "Ann is planning a surprise party",
        await said(api, w.tokens["ann"], private_chat, "party"),
    )
    group_chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    shared = await fact(
        runtime, w.bot, "The team deploys on Fridays", await said(api, w.tokens["bob"], group_chat, "fridays")
    )
    turn = await api.turn(w.tokens["ann"], group_chat, "deploy please")
    model_server.script("confide", Reply(text="You can fix it. Tell them plainly."))
    await confide(api, w.tokens["ann"], turn["id"], "I deployed on a Thursday by mistake.")
    [request] = model_server.requests_for("confide")
    system = request.body["messages"][0]["content"]
    assert "The team deploys on Fridays" in system
    assert "surprise party" not in str(request.body)
    [confession] = (
        await api.http.get(f"/v1/chats/{group_chat}/confessions", headers=bearer(w.tokens["ann"]))
    ).json()["confessions"]
    assert confession["text"] == "I deployed on a Thursday by mistake."
    assert confession["answer"] == "You can fix it. Tell them plainly."
    assert confession["entryIds"] == [shared] and private not in confession["entryIds"]
    # Owner only (D9.6): Bob is a member of the group chat but not its owner.
    other = await api.http.get(f"/v1/chats/{group_chat}/confessions", headers=bearer(w.tokens["bob"]))
    assert other.status_code == 404
    assert await api.codes(
        "query($c: ID!) { confessions(chatId: $c) { id } }", {"c": group_chat}, w.tokens["bob"]
    ) == ["NOT_FOUND"]
    # No memory vocabulary in the request the memory Bot makes for the answer (D9.16).
    assert "memory" not in system.lower()


async def test_confession_answers_are_revalidated_on_every_read(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    entry = await fact(
        runtime, w.bot, "Ann prefers mornings", await said(api, w.tokens["ann"], chat, "mornings")
    )
    turn = await api.turn(w.tokens["ann"], chat, "book a call")
    model_server.script("confide", Reply(text="Calm down, pick a morning slot."))
    await confide(api, w.tokens["ann"], turn["id"], "I booked an evening call.")
    data = await api.gql(
        "query($c: ID!) { confessions(chatId: $c) { text answer entryIds answeredBy } }",
        {"c": chat},
        w.tokens["ann"],
    )
    assert data["confessions"] == [
        {
            "text": "I booked an evening call.",
            "answer": "Calm down, pick a morning slot.",
            "entryIds": [entry],
            "answeredBy": "model",
        }
    ]
    assert (await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": entry})).status_code == 200
    data = await api.gql(
        "query($c: ID!) { confessions(chatId: $c) { text answer entryIds } }", {"c": chat}, w.tokens["ann"]
    )
    assert data["confessions"] == [{"text": "I booked an evening call.", "answer": None, "entryIds": []}]


async def test_an_answer_with_memory_words_is_replaced_by_the_calm_answer(
    api: Api, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hi")
    model_server.script("confide", Reply(text="From my memory of you, that is fine."))
    assert await confide(api, w.tokens["ann"], turn["id"]) == FIXED_CALM_ANSWER


async def test_an_answer_longer_than_a_message_is_cut_to_one(
    api: Api, model_server: ModelServer, settings: Settings
) -> None:
    """A confide answer becomes the Bot's message and a confession's answer: the model's whole
    text was kept (up to the answer's million bytes). It is cut as the runner's reply is, to the
    longest a message may be (``max_text_chars``)."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hi")
    model_server.script("confide", Reply(text="Calm down. " + "Breathe slowly. " * 2_000))
    answer = await confide(api, w.tokens["ann"], turn["id"])
    assert answer.startswith("Calm down. Breathe slowly.") and len(answer) == settings.max_text_chars
    page = (await api.http.get(f"/v1/chats/{chat}/confessions", headers=bearer(w.tokens["ann"]))).json()
    assert [len(c["answer"]) for c in page["confessions"]] == [settings.max_text_chars]


async def test_the_wait_for_a_free_slot_counts_toward_the_deadline(
    api: Api, model_server: ModelServer
) -> None:
    """concurrency 1: the second confide waits for the slot past its deadline (3 s in the suite)."""
    w = await memory_world(api, ("ann",))
    await patch(api, w.tokens["ann"], w.bot, {"expected": 0, "concurrency": 1})
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "hi")
    model_server.default("confide", Reply(text="late", delay=10))
    first = asyncio.create_task(confide(api, w.tokens["ann"], turn["id"], "first"))
    await model_server.wait_for_requests("confide", 1)
    second = await confide(api, w.tokens["ann"], turn["id"], "second")
    # The second waited for the slot the first held: it could ask the model only once the first
    # gave up at its deadline, and then had too little of its own left — both get the calm answer.
    # (How long each took is the learning benchmark's to say, not a test's.)
    assert second == FIXED_CALM_ANSWER
    assert await first == FIXED_CALM_ANSWER
    asked = [r.body["messages"][1]["content"] for r in model_server.requests_for("confide")]
    # One slot: every request of the first came before any of the second (no interleaving).
    assert asked[0] == "first" and asked == sorted(asked, key=lambda text: text == "second")


async def test_confide_and_rewrite_answer_within_the_real_15_seconds(
    settings: Settings, service_env: dict[str, str], model_server: ModelServer, api: Api, runtime: Runtime
) -> None:
    """The one test at the real deadline (D9.11): a model that never answers → the calm answer, and
    the input as it is, at 15 s from arrival. The model holds each request until the test has
    the answer: the deadline ended the wait, not an answer, nor an attempt cut short and asked
    again (the attempt's timeout is past the deadline)."""
    real = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-15s.log",
        {
            **service_env,
            "BOTMEMORY_ANSWER_DEADLINE_SECONDS": "15",
            "BOTMEMORY_MODEL_ATTEMPT_TIMEOUT_SECONDS": "60",
        },
    )
    answered = threading.Event()
    try:
        w = await memory_world(api, ("ann",))
        chat = await api.chat(w.tokens["ann"], w.bot)
        turn = await api.turn(w.tokens["ann"], chat, "hi")
        await fact(runtime, w.bot, "Ann likes tea", (chat, "i-1"))
        model_server.default("confide", Reply(text="far too late", hold=answered))
        model_server.default("rewrite", Reply(text="far too late", hold=answered))
        async with httpx.AsyncClient(base_url=real.url, timeout=30) as http:
            for query, variables, field, task, expected in (
                (
                    'mutation($t: ID!) { confide(turnId: $t, text: "stuck") { answer } }',
                    {"t": turn["id"]},
                    "confide",
                    "confide",
                    {"answer": FIXED_CALM_ANSWER},
                ),
                (
                    'mutation($c: ID!) { startTurn(chatId: $c, input: "Make tea") { enrichedInput } }',
                    {"c": chat},
                    "startTurn",
                    "rewrite",
                    {"enrichedInput": "Make tea"},
                ),
            ):
                response = await http.post(
                    "/graphql", json={"query": query, "variables": variables}, headers=bearer(w.tokens["ann"])
                )
                # The calm answer / the input as it is while the model still holds the one request
                # it got.
                assert response.json()["data"][field] == expected
                assert len(model_server.requests_for(task)) == 1
        # Each call was saved as its one attempt timed out at the deadline, unanswered.
        calls = [c for c in await model_calls(runtime, w.bot) if c["task"] in ("confide", "rewrite")]
        assert sorted((c["task"], c["status"], c["attempts"]) for c in calls) == [
            ("confide", "timeout", 1),
            ("rewrite", "timeout", 1),
        ]
    finally:
        answered.set()
        real.stop()


async def test_a_model_call_whose_caller_went_away_is_saved_and_charged(
    api: Api, patient_api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """C5, L6: a confide sent on a socket and ended by its client (``complete``) while the model
    answered was cancelled mid-call — neither saved nor charged, though the provider billed it, so
    a client could spend a Bot's model without its budget ever moving. The call goes on to its
    deadline now, and is saved and charged; nobody is shown its text. The model answers once the
    API has ended the operation (an API that waits for the model as long as that takes)."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "hello")
    gone = threading.Event()
    model_server.default("confide", Reply(text="Noted, much later.", hold=gone))
    try:
        await confide_then_go_away(patient_api, model_server, ann, turn["id"])
    finally:
        gone.set()

    async def saved() -> list[dict[str, Any]]:
        return [c for c in await model_calls(runtime, w.bot) if c["task"] == "confide"]

    [call] = await until(saved, "the abandoned confide call was never saved", within=60)
    assert call["status"] == "ok" and call["costMicros"] == 20
    assert [(calls, micros) for calls, micros, _ in await spend(runtime, w.bot)] == [(1, 20), (1, 20)]


async def test_a_call_whose_caller_went_away_keeps_its_task_slot_until_saved(
    api: Api, patient_api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.12, D9.25: the caller took the Bot's task slot and gave it back in its ``finally``, so a
    cancelled caller gave it back at once while its call ran on: a client ending its operations
    mid-call ran calls beside the Bot's ``concurrency``. The slot is the call's now: held until
    the call is saved. The model answers once the API has ended the operation: the slot is still
    held then; watched while the call runs on, never free before it is saved."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    assert (await patch(api, ann, w.bot, {"expected": 0, "concurrency": 1})).status_code == 200
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "hello")
    gone = threading.Event()
    model_server.default("confide", Reply(text="Noted, much later.", hold=gone))
    try:
        await confide_then_go_away(patient_api, model_server, ann, turn["id"])
        assert await slots.held(runtime.redis, w.bot) == 1  # its caller is gone, the call holds it
    finally:
        gone.set()
    free_before_saved: list[int] = []

    async def saved() -> bool:
        held = await slots.held(runtime.redis, w.bot)
        done = any(c["task"] == "confide" for c in await model_calls(runtime, w.bot))
        if held == 0 and not done:
            free_before_saved.append(held)
        return done

    await until(saved, "the abandoned confide call was never saved", within=60)
    assert free_before_saved == []


async def test_an_owner_view_read_while_its_owner_left_the_channel_is_not_given(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D9.6: a group chat's confessions (and enrichments, the learning view) are its owner's while
    they are one of its people. The owner was checked, then the records read in a later statement:
    removed from the channel in between, they got the records as they were after their removal.
    The owner is checked again once read (as contextPack and the meta are). Here the removal is
    made between the statements."""
    w = await memory_world(api, ("ann", "bob"), channel=("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    turn = await api.turn(w.tokens["ann"], chat, "team news")
    await confide(api, w.tokens["ann"], turn["id"], "We are behind on the release.")
    ann = await authenticate(runtime, f"Bearer {w.tokens['ann']}")
    assert [c.text for c in (await memorybot.confessions(runtime, ann, chat))[0]] == [
        "We are behind on the release."
    ]
    read_records = memorybot_q.list_confessions

    async def removed_first(tx: AsyncManagedTransaction, **params: Any) -> Any:
        await api.admin(
            "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
            {"c": w.channel, "m": [w.people["bob"]]},
        )
        return await read_records(tx, **params)

    monkeypatch.setattr(memorybot_q, "list_confessions", removed_first)
    with pytest.raises(NotFound):
        await memorybot.confessions(runtime, ann, chat)
