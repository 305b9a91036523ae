"""memoryChanges over graphql-transport-ws: authenticated on connect, filtered at delivery (V10, E4)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import socket
from collections.abc import AsyncGenerator, Iterator
from typing import Any, cast

import httpx
import pytest
import strawberry
import websockets
from arq.connections import ArqRedis
from prometheus_client import REGISTRY
from strawberry.extensions import SchemaExtension
from strawberry.types import ExecutionResult, StreamExecutionResult
from websockets.asyncio.client import ClientConnection

from graph import changefeed as changefeed_q
from resolvers.schema import Schema
from schema.errors import ErrorCodes
from schema.fanout import ExtensionsRunner
from services.changefeed import CaughtUp, ChangeEvent, ChangeHub, Subscriber
from services.changes import AddFact, ItemRef, MemoryChange
from services.runtime import Runtime
from services.settings import Settings
from services.turnfeed import TurnHub
from services.writepath import apply_changes
from tests.client import Api, bearer, make_world
from tests.conftest import ApiProcess
from tests.feed_helpers import SUBSCRIBE, next_event, opened, subscribed, subscription, until_opened, ws_url
from tests.memory_helpers import command, fact, said
from tests.waiting import until


async def test_each_subscriber_gets_only_what_it_may_see(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob", "cat"))
    ann_chat = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    src_private = await said(api, w.tokens["ann"], ann_chat, "private")
    src_group = await said(api, w.tokens["ann"], group, "team")
    src_bob = await said(api, w.tokens["bob"], await api.chat(w.tokens["bob"], w.bot), "bob's own")
    async with (
        subscription(api, w.tokens["ann"], w.bot) as ann,
        subscription(api, w.tokens["bob"], w.bot) as bob,
        subscription(api, w.tokens["cat"], w.bot) as cat,
    ):
        private = await fact(runtime, w.bot, "Ann's private fact", src_private)
        got = await next_event(ann)
        assert [e["id"] for e in got["entries"]] == [private] and got["entries"][0][
            "content"
        ] == "Ann's private fact"
        # Bob is removed from the channel: he stops receiving at once; Cat still receives.
        await api.admin(
            "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
            {"c": w.channel, "m": [w.people["ann"], w.people["cat"]]},
        )
        team = await fact(runtime, w.bot, "Team fact", src_group)
        assert [e["id"] for e in (await next_event(ann))["entries"]] == [team]
        assert [e["id"] for e in (await next_event(cat))["entries"]] == [team]
        # Neither the private nor the team fact: the next event Bob gets is his own fact's, written
        # after both (one connection's events come in memory order).
        own = await fact(runtime, w.bot, "Bob's own fact", src_bob)
        assert [e["id"] for e in (await next_event(bob))["entries"]] == [own]


async def test_connection_needs_a_valid_token_and_the_legacy_protocol_is_off(api: Api) -> None:
    """A well-formed token the API does not accept closes 4403 saying so, as REST does; the reason
    that states the payload's shapes is for a payload without a bearer token (it was given for
    both, and read as if the shape were wrong)."""
    w = await make_world(api, ("ann",))
    shapes = 'unauthenticated: connection_init payload is {"Authorization": "Bearer <token>"} or {"token": "<token>"}'
    for payload, reason in (
        ({"Authorization": "Bearer nope"}, "unauthenticated: invalid, expired or revoked token"),
        ({"token": "nope"}, "unauthenticated: invalid, expired or revoked token"),
        ({}, shapes),
        ({"Authorization": "Basic nope"}, shapes),
        ({"Authorization": "Bearer "}, shapes),
    ):
        async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
            await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None, payload
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4403, reason), payload
    async with websockets.connect(ws_url(api), subprotocols=["graphql-ws"]) as legacy:  # type: ignore[list-item]
        init = {"type": "connection_init", "payload": {"Authorization": f"Bearer {w.tokens['ann']}"}}
        with contextlib.suppress(websockets.ConnectionClosed):
            await legacy.send(json.dumps(init))
        with pytest.raises(websockets.ConnectionClosed) as refused:
            await asyncio.wait_for(legacy.recv(), 5)
        assert refused.value.rcvd is not None and refused.value.rcvd.code == 4406


async def revoke(api: Api, issued: dict[str, Any], token: str) -> None:
    """Revoke the token ``issueToken`` gave (``issued``), as its person (``token``)."""
    await api.gql(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": issued["issueToken"]["id"]}, token
    )


async def test_revoked_token_ends_the_subscription(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "x")
    issued = await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"])
    async with subscription(api, issued["issueToken"]["token"], w.bot) as ws:
        await revoke(api, issued, w.tokens["ann"])
        await fact(runtime, w.bot, "after revocation", src)
        message = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert (
            message["type"] == "next"
            and message["payload"]["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        )
        assert "after revocation" not in json.dumps(message)


async def test_a_stream_that_loses_access_ends_at_once_on_a_quiet_bot(api: Api) -> None:
    """A revoked token's (or a person set to NONE's) memoryChanges stream was checked only when
    the Bot next changed: on a quiet Bot it stayed open, holding one of the connection's
    operations, and no UNAUTHENTICATED came. Access changes are announced to the change feed too:
    the stream ends at once, with nothing written to the Bot."""
    w = await make_world(api, ("ann", "bob"))
    issued = await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"])
    async with subscription(api, issued["issueToken"]["token"], w.bot) as ws:
        await revoke(api, issued, w.tokens["ann"])
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert message["payload"]["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED", message
    async with subscription(api, w.tokens["bob"], w.bot) as ws:
        await api.grant(w.bot, w.people["bob"], "NONE")
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert message["type"] == "next" and message["payload"]["errors"], message


async def test_a_stream_ends_when_its_token_expires(api: Api, runtime: Runtime) -> None:
    """A token that expired while its streams were open: memoryChanges and turnEvents went on
    until something happened on the Bot or the chat to check it again. Both now end at its
    expiry, UNAUTHENTICATED, with nothing written meanwhile (the token issued for 60 s, the
    least there is, is made to end in two seconds in the graph)."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    for feed, query, variables in (
        ("memoryChanges", "subscription($b: ID!) { memoryChanges(botId: $b) { version } }", {"b": w.bot}),
        ("turnEvents", "subscription($c: ID!) { turnEvents(chatId: $c) { kind } }", {"c": chat}),
    ):
        issued = await api.gql(
            "mutation { issueToken(expiresInSeconds: 60) { id token } }", token=w.tokens["ann"]
        )
        await runtime.driver.execute_query(
            "MATCH (t:Token {id: $id}) SET t.expiresAt = timestamp() + 2000", id=issued["issueToken"]["id"]
        )
        async with subscribed(api, issued["issueToken"]["token"], query, variables, feed) as ws:
            message = json.loads(await asyncio.wait_for(ws.recv(), 15))
            assert message["payload"]["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED", (feed, message)


async def test_a_change_whose_announcement_was_lost_reaches_the_streams(api: Api, runtime: Runtime) -> None:
    """A change committed by a writer whose announcement never went out (killed after the
    commit, or Redis away then) reached an open stream only when the Bot next changed: on a
    quiet Bot, never. The API process audits the versions of the Bots its streams follow
    (every second in the suite) and catches up from the log. Here the writer's Redis is a port
    nobody listens on: its publish fails, the change stands."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "x")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unheard = ArqRedis(host="127.0.0.1", port=closed, socket_connect_timeout=1)
    try:
        async with subscription(api, w.tokens["ann"], w.bot) as ws:
            entry = await fact(dataclasses.replace(runtime, redis=unheard), w.bot, "told nobody", src)
            got = await next_event(ws)
            assert [(e["id"], e["content"]) for e in got["entries"]] == [(entry, "told nobody")]
    finally:
        await unheard.aclose()


async def test_overlapping_catch_ups_hand_each_change_out_once_in_order(api: Api, runtime: Runtime) -> None:
    """A retry's catch-up and a live event past a gap read the log from the same version at once
    and handed the same changes out twice (and out of order): a Bot's deliveries and catch-ups
    take turns."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "x")
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    hub = ChangeHub(runtime)  # not started: its events are the calls below
    async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
        base = hub.versions[w.bot]
        ids = [await fact(runtime, w.bot, f"fact {n}", src) for n in range(3)]
        live = {"botId": w.bot, "version": base + 3, "ids": [ids[2]], "removed": []}
        await asyncio.gather(hub.catch_up(w.bot), hub.deliver(live), hub.catch_up(w.bot))
        got: list[ChangeEvent] = []
        while not sub.queue.empty():
            event = sub.queue.get_nowait()
            assert event is not None
            got.append(event)
        assert [(e.version, [x.id for x in e.entries]) for e in got] == [
            (base + n + 1, [ids[n]]) for n in range(3)
        ]


async def test_a_change_committed_while_a_subscription_begins_is_not_taken_as_seen(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first local subscriber of a Bot (no ``after``) counted before the hub read the Bot's
    version: a change committed in between was read as the version to start from, its live event
    dropped as considered, and the subscriber never got it. The version is read before the
    subscriber counts: a change committed while it counts is delivered."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "x")
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    hub = ChangeHub(runtime)  # not started: its events are the calls below
    read_versions = changefeed_q.versions
    during: list[tuple[bool, str]] = []

    async def committed_meanwhile(tx: Any, *, bot_ids: list[str]) -> dict[str, int]:
        during.append((w.bot in hub.subscribers, await fact(runtime, w.bot, "said meanwhile", src)))
        return await read_versions(tx, bot_ids=bot_ids)

    monkeypatch.setattr(changefeed_q, "versions", committed_meanwhile)
    async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
        monkeypatch.undo()
        [(counted, meanwhile)] = during
        base = hub.versions[w.bot]
        later = await fact(runtime, w.bot, "said after", src)
        for version, entry in ((base, meanwhile), (base + 1, later)):
            await hub.deliver({"botId": w.bot, "version": version, "ids": [entry], "removed": []})
        got = []
        while not sub.queue.empty():
            event = sub.queue.get_nowait()
            assert isinstance(event, ChangeEvent)
            got.append([e.id for e in event.entries])
        assert got == ([[meanwhile]] if counted else []) + [[later]]


async def test_changes_made_on_another_api_process_are_delivered(api: Api, settings: Settings) -> None:
    w = await make_world(api, ("ann",))
    other = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api-2.log")
    try:
        async with subscription(api, w.tokens["ann"], w.bot) as ws:
            async with httpx.AsyncClient(base_url=other.url) as http:
                second = Api(http, api.admin_token)
                response = await command(
                    second, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "via process two"}
                )
                assert response.status_code == 201
            got = await next_event(ws)
            assert [e["content"] for e in got["entries"]] == ["via process two"]
    finally:
        other.stop()


async def fanout_counts(api: Api) -> dict[str, float]:
    """The API process's counters of shared subscription work (schema.fanout)."""
    text = (await api.http.get("/metrics")).text
    names = ("executions", "encodings", "messages")
    counts: dict[str, float] = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for name in names:
            if line.startswith(f"botmemory_subscription_{name}_total "):
                counts[name] = float(line.split()[1])
    return counts


async def test_each_payload_is_executed_and_serialised_once_per_event_and_operation(
    api: Api, runtime: Runtime
) -> None:
    """Subscribers of one event with the same visible entries and the same operation
    share one execution and one JSON encoding; each still gets its own message id, and another
    selection or another visible set gets its own payload."""
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob", "cat"))
    ann_chat = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    src_private = await said(api, w.tokens["ann"], ann_chat, "private")
    src_group = await said(api, w.tokens["ann"], group, "team")
    ids_only = "subscription($b: ID!) { memoryChanges(botId: $b) { entries { id } } }"
    async with (
        subscription(api, w.tokens["ann"], w.bot, id="a1") as ann1,
        subscription(api, w.tokens["ann"], w.bot, id="a2") as ann2,
        subscription(api, w.tokens["bob"], w.bot, id="b1") as bob,
        subscription(api, w.tokens["cat"], w.bot, query=ids_only, id="c1") as cat,
    ):
        before = await fanout_counts(api)
        team = await fact(runtime, w.bot, "Team fact", src_group)
        raw = {
            name: json.loads(await asyncio.wait_for(ws.recv(), 5))
            for name, ws in (("ann1", ann1), ("ann2", ann2), ("bob", bob), ("cat", cat))
        }
        assert [raw[n]["id"] for n in ("ann1", "ann2", "bob", "cat")] == ["a1", "a2", "b1", "c1"]
        full = [raw[n]["payload"] for n in ("ann1", "ann2", "bob")]
        assert full[0] == full[1] == full[2]
        assert full[0]["data"]["memoryChanges"]["entries"] == [
            {"id": team, "content": "Team fact", "status": "active"}
        ]
        assert raw["cat"]["payload"] == {"data": {"memoryChanges": {"entries": [{"id": team}]}}}
        after = await fanout_counts(api)
        assert {k: after[k] - before[k] for k in after} == {"executions": 2, "encodings": 2, "messages": 4}

        # Ann's private fact goes to her two subscriptions only: one execution, one encoding.
        private = await fact(runtime, w.bot, "Ann's private fact", src_private)
        for ws in (ann1, ann2):
            assert [e["id"] for e in (await next_event(ws))["entries"]] == [private]
        final = await fanout_counts(api)
        assert {k: final[k] - after[k] for k in after} == {"executions": 1, "encodings": 1, "messages": 2}
        # Nothing of it for Bob or Cat: the next event each gets is the team fact written after it.
        later = await fact(runtime, w.bot, "Later team fact", src_group)
        for ws in (bob, cat):
            assert [e["id"] for e in (await next_event(ws))["entries"]] == [later]


async def test_a_subscriber_too_slow_for_its_events_is_ended_not_skipped(api: Api, runtime: Runtime) -> None:
    """A stream never silently skips a change: when a subscriber's queue (100 events) is full,
    the next event ends it (TOO_SLOW) so the client subscribes again and re-reads."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    entry = await fact(runtime, w.bot, "a fact", await said(api, w.tokens["ann"], chat, "x"))
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    hub = ChangeHub(runtime)
    async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
        base = hub.versions[w.bot]  # the memory version when it subscribed: events follow it
        for version in range(base + 1, base + 101):
            await hub.deliver({"botId": w.bot, "version": version, "ids": [entry]})
        assert sub.queue.full() and not sub.too_slow
        await hub.deliver({"botId": w.bot, "version": base + 101, "ids": [entry]})
        assert sub.too_slow and sub.queue.qsize() == 1 and sub.queue.get_nowait() is None
        await hub.deliver({"botId": w.bot, "version": base + 102, "ids": [entry]})
        assert sub.queue.empty()  # nothing after the end


async def test_a_client_that_stops_reading_is_ended_with_too_slow_and_holds_up_nobody(
    api: Api, runtime: Runtime
) -> None:
    """Over real sockets: Ann holds two subscriptions and stops reading one. The other gets
    every event, in order. The stalled one, once read again, has what was already on its way,
    in order and without a gap, and then its end with TOO_SLOW; the events after that are not
    sent to it."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = ItemRef(*await said(api, w.tokens["ann"], chat, "x"))
    # 50 entries of 4,000 characters: every event is a ~200 KB message, so the socket buffers
    # between the API and a client that does not read fill after a few events.
    changes = [AddFact(content=f"{i:04d}" + "x" * 3996, sources=(src,)) for i in range(50)]
    await apply_changes(runtime, w.bot, list[MemoryChange](changes), "memory_bot")
    ids = [c.id for c in changes]
    host, port = ws_url(api).split("//", 1)[1].split("/", 1)[0].split(":")
    stalled_socket = socket.socket()
    stalled_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled_socket.connect((host, int(port)))
    versions = list(range(1_000_000, 1_000_200))

    async def read_all(ws: ClientConnection) -> list[int]:
        return [(await next_event(ws))["version"] for _ in versions]

    async with (
        subscription(api, w.tokens["ann"], w.bot, id="reads") as reading,
        subscription(api, w.tokens["ann"], w.bot, id="stalls", sock=stalled_socket, max_queue=1) as stalled,
    ):
        received = asyncio.create_task(read_all(reading))
        for version in versions:  # as a writer announces its commits (ids only)
            await runtime.redis.publish(
                f"botmemory:changes:{w.bot}", json.dumps({"botId": w.bot, "version": version, "ids": ids})
            )
        assert await asyncio.wait_for(received, 120) == versions
        before_end: list[int] = []
        while True:
            message = json.loads(await asyncio.wait_for(stalled.recv(), 30))
            assert message["id"] == "stalls" and message["type"] == "next"
            if "errors" in message["payload"]:
                break
            before_end.append(message["payload"]["data"]["memoryChanges"]["version"])
        assert message["payload"]["errors"][0]["extensions"]["code"] == "TOO_SLOW"
        assert 0 < len(before_end) < 100 and before_end == versions[: len(before_end)]
        # The operation is complete; none of the events after its end follows.
        assert json.loads(await asyncio.wait_for(stalled.recv(), 5)) == {"id": "stalls", "type": "complete"}
        # The connection answers a ping with nothing of the ended operation before its pong.
        await stalled.send(json.dumps({"type": "ping"}))
        assert json.loads(await asyncio.wait_for(stalled.recv(), 30)) == {"type": "pong"}


# --- the schema's extensions runner (schema.fanout.ExtensionsRunner) ----------------------------


@strawberry.type
class _Query:
    @strawberry.field
    def ok(self) -> bool:
        return True


@strawberry.type
class _Subscription:
    @strawberry.subscription
    async def ticks(self) -> AsyncGenerator[int]:
        for i in range(3):
            yield i


class _Plain(SchemaExtension):
    """Neither a per-result hook nor results: what all our extensions are."""


class _PerResult(SchemaExtension):
    def on_stream_result(self, result: StreamExecutionResult) -> Iterator[None]:
        assert isinstance(result, ExecutionResult)
        result.extensions = {**(result.extensions or {}), "streamed": True}
        yield

    def get_results(self) -> dict[str, Any]:
        return {"counted": 1}


def _tiny_schema(*extensions: type[SchemaExtension]) -> Schema:
    return Schema(query=_Query, subscription=_Subscription, extensions=list(extensions))


async def test_extensions_without_per_result_hooks_cost_nothing_and_others_still_run() -> None:
    """The runner skips the per-result hooks and results only for extensions without them:
    an extension that has them still sees every streamed result and adds its results."""
    plain = _tiny_schema(_Plain)
    assert type(plain.create_extensions_runner(None, [])) is ExtensionsRunner  # type: ignore[arg-type]
    stream = await plain.subscribe("subscription { ticks }")
    assert not isinstance(stream, ExecutionResult)
    got = [r async for r in stream]
    assert [(r.data, r.extensions) for r in got] == [({"ticks": i}, {}) for i in range(3)]

    both = _tiny_schema(_Plain, _PerResult)
    answer = await both.execute("{ ok }")
    assert answer.data == {"ok": True} and answer.extensions == {"counted": 1}
    stream = await both.subscribe("subscription { ticks }")
    assert not isinstance(stream, ExecutionResult)
    got = [r async for r in stream]
    assert [(r.data, r.extensions) for r in got] == [
        ({"ticks": i}, {"counted": 1, "streamed": True}) for i in range(3)
    ]


# --- operations on a socket: authenticated and coded as over HTTP --------------------------------


async def _operation(
    ws: ClientConnection,
    id: str,
    query: str,
    variables: dict[str, Any] | None = None,
    operation_name: str | None = None,
) -> Any:
    """One query or mutation sent on an open socket: its first message (``next`` or ``error``)."""
    payload = {"query": query, "variables": variables or {}}
    if operation_name is not None:
        payload["operationName"] = operation_name
    await ws.send(json.dumps({"id": id, "type": "subscribe", "payload": payload}))
    message = json.loads(await asyncio.wait_for(ws.recv(), 5))
    if message["type"] == "next":
        assert json.loads(await asyncio.wait_for(ws.recv(), 5)) == {"id": id, "type": "complete"}
    return message


async def test_each_operation_on_a_socket_authenticates_its_token_again(api: Api) -> None:
    """A socket runs queries and mutations too, all on the context of its connection: a token
    revoked while it is open stops working for the next operation, as over HTTP — it can neither
    read nor mint a token of its own that would outlive the revocation."""
    w = await make_world(api, ("ann",))
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    memory = "query($b: ID!) { memory(botId: $b) { version } }"
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {issued['token']}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        before = await _operation(ws, "1", memory, {"b": w.bot})
        assert "errors" not in before["payload"] and before["payload"]["data"]["memory"]["version"] >= 0
        await api.gql(
            "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": issued["id"]}, w.tokens["ann"]
        )
        for id, query, variables in (
            ("2", memory, {"b": w.bot}),
            ("3", "mutation { issueToken { token } }", {}),
        ):
            after = await _operation(ws, id, query, variables)
            assert after["payload"]["data"] is None
            assert [e["extensions"]["code"] for e in after["payload"]["errors"]] == ["UNAUTHENTICATED"]


async def test_errors_on_a_socket_carry_their_codes(api: Api) -> None:
    """Syntax and validation errors of an operation sent on a socket come back as its ``error``
    message with BAD_INPUT, as over HTTP (a syntax error ended the operation with no error sent)."""
    w = await make_world(api, ("ann",))
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {w.tokens['ann']}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        # (An id of 200 characters, the most an id may hold, is answered as any other.)
        for id, query in (("1", "subscription { memoryChanges(botId: "), ("i" * 200, "query { nope }")):
            message = await _operation(ws, id, query)
            assert message["type"] == "error" and message["id"] == id, message
            assert [e["extensions"]["code"] for e in message["payload"]] == ["BAD_INPUT"]


async def test_a_socket_runs_only_the_operation_a_document_selects(api: Api) -> None:
    """A document of several operations sent on a socket without ``operationName`` ran its first
    one — a mutation nobody chose to run; an empty query, an ``operationName`` naming no operation
    and a document of fragments only were answered INTERNAL. Each is BAD_INPUT with nothing run,
    as over HTTP, and the socket goes on serving."""
    w = await make_world(api, ("ann",))
    remember = 'mutation A { remember(botId: "' + w.bot + '", content: "written unasked") { version } }'
    before = await opened(api, "memoryChanges")
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {w.tokens['ann']}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        for n, (query, name) in enumerate(
            (
                (remember + " query B { me { id } }", None),
                ("", None),
                ("   ", None),
                ("{ me { id } }", "Nope"),
                ("{ me { id } }", ""),
                ("fragment F on Query { me { id } }", None),
            )
        ):
            payload: dict[str, Any] = {"query": query} | ({} if name is None else {"operationName": name})
            await ws.send(json.dumps({"id": f"r{n}", "type": "subscribe", "payload": payload}))
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert (message["id"], message["type"]) == (f"r{n}", "error"), message
            assert [e["extensions"]["code"] for e in message["payload"]] == ["BAD_INPUT"], message
        named = await _operation(ws, "named", remember + " query B { me { id } }", operation_name="B")
        assert named["payload"]["data"]["me"]["id"] == w.people["ann"]
        # An id already running is refused as the protocol says, whatever the document: the socket
        # closes with 4409 (an error for that id would read as the end of the running one).
        live = "subscription($b: ID!) { memoryChanges(botId: $b) { version } }"
        await ws.send(
            json.dumps(
                {"id": "live", "type": "subscribe", "payload": {"query": live, "variables": {"b": w.bot}}}
            )
        )
        await until_opened(api, "memoryChanges", before + 1)
        await ws.send(json.dumps({"id": "live", "type": "subscribe", "payload": {"query": ""}}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4409
    memory = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert memory.json()["entries"] == []


@strawberry.type
class _FailingQuery:
    @strawberry.field
    def fails(self) -> bool:
        raise RuntimeError("Couldn't connect to neo4j-core-2.internal:7687")


@strawberry.type
class _FailingSubscription:
    @strawberry.subscription
    async def fails(self) -> AsyncGenerator[int]:
        yield 1
        raise RuntimeError("Couldn't connect to neo4j-core-2.internal:7687")


async def test_unexpected_errors_of_streamed_operations_are_masked() -> None:
    """What a socket sends is ``Schema.stream``'s results: an unexpected error there — in a
    resolver, or in a subscription's source, which has no path — is "internal error" with code
    INTERNAL, never the exception's text (a database's host, a query's values)."""
    schema = Schema(query=_FailingQuery, subscription=_FailingSubscription, extensions=[ErrorCodes])
    streamed = [r async for r in await schema.stream("subscription { fails }")]
    queried = [r async for r in await schema.stream("{ fails }")]
    assert all(isinstance(r, ExecutionResult) for r in streamed + queried)
    assert [cast(ExecutionResult, r).data for r in streamed] == [{"fails": 1}, None]
    for result in (streamed[1], queried[0]):
        assert isinstance(result, ExecutionResult) and result.errors
        [error] = result.errors
        assert (error.message, error.extensions) == ("internal error", {"code": "INTERNAL"})
        assert "neo4j-core" not in str(error.formatted)


async def _socket(api: Api, token: str) -> tuple[ClientConnection, dict[str, Any] | int]:
    """A socket that sent ``connection_init`` with ``token``: its first message, or its close code."""
    ws = await websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"])  # type: ignore[list-item]
    await ws.send(json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}}))
    try:
        return ws, json.loads(await asyncio.wait_for(ws.recv(), 5))
    except websockets.ConnectionClosed as closed:
        return ws, -1 if closed.rcvd is None else closed.rcvd.code


async def test_a_socket_runs_so_many_operations_and_a_person_holds_so_many_sockets(
    api: Api, settings: Settings
) -> None:
    """One client could hold any number of subscriptions — each a subscriber that every change is
    checked and executed for — on one socket, or on any number of sockets. An operation past
    ``BOTMEMORY_MAX_SOCKET_OPERATIONS`` running at once on a socket is BAD_INPUT, the socket going
    on (one completed, another runs); a socket past ``BOTMEMORY_MAX_SOCKETS_PER_PERSON`` of its
    person in the API process is closed at ``connection_init`` with 4429, whichever of their
    tokens opens it (counted per token, each token a person issued held as many again), other
    people unaffected; a closed socket gives its place back. A socket that sends no
    ``connection_init`` is closed with 4408 after ``BOTMEMORY_SOCKET_INIT_SECONDS``."""
    w = await make_world(api, ("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    capped = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-capped.log",
        # Past Strawberry's own bound of 100, which refused the 101st without a code.
        {
            "BOTMEMORY_MAX_SOCKET_OPERATIONS": "101",
            "BOTMEMORY_MAX_SOCKETS_PER_PERSON": "2",
            "BOTMEMORY_SOCKET_INIT_SECONDS": "1",
        },
    )
    held: list[ClientConnection] = []
    try:
        async with httpx.AsyncClient(base_url=capped.url) as http:
            other = Api(http, api.admin_token)

            async def subscribe(ws: ClientConnection, id: str) -> None:
                payload = {"query": SUBSCRIBE, "variables": {"b": w.bot}}
                await ws.send(json.dumps({"id": id, "type": "subscribe", "payload": payload}))

            first, ack = await _socket(other, ann)
            held.append(first)
            assert ack == {"type": "connection_ack"}
            before = await opened(other, "memoryChanges")
            for n in range(101):
                await subscribe(first, str(n))
            await until_opened(other, "memoryChanges", before + 101)
            await subscribe(first, "101")
            refused = json.loads(await asyncio.wait_for(first.recv(), 5))
            assert refused["id"] == "101" and refused["type"] == "error", refused
            assert [e["extensions"]["code"] for e in refused["payload"]] == ["BAD_INPUT"]
            assert "at most 101 operations" in refused["payload"][0]["message"]
            await first.send(json.dumps({"id": "1", "type": "complete"}))
            await subscribe(first, "101")  # one completed: another runs
            await until_opened(other, "memoryChanges", before + 102)

            second, ack = await _socket(other, ann)
            held.append(second)
            assert ack == {"type": "connection_ack"}
            third, code = await _socket(other, ann)
            held.append(third)
            assert code == 4429
            another = (await api.gql("mutation { issueToken { token } }", token=ann))["issueToken"]["token"]
            fourth, code = await _socket(other, another)  # another of her tokens: still her sockets
            held.append(fourth)
            assert code == 4429
            bobs, ack = await _socket(other, bob)  # another token's sockets are its own
            held.append(bobs)
            assert ack == {"type": "connection_ack"}
            await second.close()

            async def given_back() -> bool:
                ws, answer = await _socket(other, ann)
                held.append(ws)
                return answer == {"type": "connection_ack"}

            await until(given_back, "a closed socket never gave its person's place back")

            silent = await websockets.connect(ws_url(other), subprotocols=["graphql-transport-ws"])  # type: ignore[list-item]
            held.append(silent)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(silent.recv(), 30)  # closed well before: it never sent connection_init
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
    finally:
        for ws in held:
            await ws.close()
        capped.stop()


async def test_a_sockets_query_string_stays_out_of_the_log(api: Api, settings: Settings) -> None:
    """Uvicorn logs each WebSocket handshake (its error logger, at INFO) with the path and the
    query string: a client that puts its token in the socket's URL, as many do, had it written to
    the API's log. The query string is cut there, as in the access log."""
    w = await make_world(api, ("ann",))
    log = settings.data_dir / "logs" / "pytest-api.log"
    before = await asyncio.to_thread(lambda: log.stat().st_size)
    url = ws_url(api) + "?token=" + w.tokens["ann"]
    async with websockets.connect(url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init", "payload": {"token": w.tokens["ann"]}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"

    def written() -> bytes:
        with log.open("rb") as file:
            file.seek(before)
            return file.read()

    logged = await asyncio.to_thread(written)
    assert b'"WebSocket /graphql"' in logged  # the handshake was logged: its line is what is read
    assert w.tokens["ann"].encode() not in logged


def item_decryptions() -> float:
    return REGISTRY.get_sample_value("botmemory_decryptions_total", {"kind": "item"}) or 0.0


async def test_another_process_s_item_is_decrypted_only_for_a_stream_that_may_read_it(
    api: Api, runtime: Runtime
) -> None:
    """E2: a Turn event announced by another API process carries ids only; the receiving process
    reads the Item and decrypts it for its subscribers of the Chat. It decrypted the Item before
    it judged them again, so a stream that then ended (its token gone, its person no longer of
    the Chat) had the words opened for nobody. A live stream gets the words; a stream whose token
    is not live ends, and nothing is decrypted for it."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "words for a live stream only")
    messages = (await api.http.get(f"/v1/chats/{chat}/messages", headers=bearer(ann))).json()["messages"]
    issued = (await api.gql("mutation { issueToken { id token } }", token=ann))["issueToken"]
    announced = {
        "origin": "another-process",
        "chatId": chat,
        "turnId": turn["id"],
        "kind": "ITEM_ADDED",
        "itemId": messages[0]["id"],
    }
    hub = TurnHub(runtime)
    await hub.start()
    try:
        await asyncio.wait_for(hub.ready.wait(), 10)
        for token_id, live in ((issued["id"], True), ("tok_" + secrets.token_hex(16), False)):
            async with hub.subscribe(chat, w.people["ann"], token_id) as sub:
                before = item_decryptions()
                await runtime.redis.publish(f"botmemory:turns:{chat}", json.dumps(announced))
                event = await asyncio.wait_for(sub.queue.get(), 10)
                if live:
                    assert event is not None and event.text == "words for a live stream only"
                    assert item_decryptions() == before + 1
                else:
                    assert event is None and sub.token_gone
                    assert item_decryptions() == before
    finally:
        await hub.stop()


async def test_a_bot_that_cannot_be_delivered_holds_up_no_other_bot_s_catch_up(
    api: Api, runtime: Runtime
) -> None:
    """After a Redis reconnect (and every audit round) each Bot with local subscribers whose
    memory moved on catches up from the log. One Bot whose catch-up failed for good (here an entry
    whose ciphertext is another entry's: it never decrypts) raised out of the round before the
    Bots after it, so they were never caught up, and a reconnect that raised was tried again and
    again while no event of any Bot was handled. Now that Bot is left to catch up later and the
    others are caught up at once."""
    broken, fine = await make_world(api, ("ann",)), await make_world(api, ("ann",))
    hub = ChangeHub(runtime)  # not started: the round is the call below
    try:
        async with contextlib.AsyncExitStack() as stack:
            subs: list[Subscriber] = []
            for w in (broken, fine):  # the broken Bot first: the round reaches it first
                chat = await api.chat(w.tokens["ann"], w.bot)
                src = await said(api, w.tokens["ann"], chat, "x")
                issued = await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"])
                token_id = issued["issueToken"]["id"]
                subs.append(
                    await stack.enter_async_context(hub.subscribe(w.bot, w.people["ann"], w.org, token_id))
                )
                first = await fact(runtime, w.bot, f"first of {w.bot}", src)
                second = await fact(runtime, w.bot, f"second of {w.bot}", src)
                if w is broken:
                    await runtime.driver.execute_query(
                        "MATCH (a:Entry {id: $a}), (b:Entry {id: $b}) SET a.content = b.content",
                        a=first,
                        b=second,
                    )
            await hub.check_versions("reconnect")
            delivered: list[str] = []
            while not subs[1].queue.empty():
                event = subs[1].queue.get_nowait()
                assert event is not None
                delivered += [e.content for e in event.entries]
            assert delivered == [f"first of {fine.bot}", f"second of {fine.bot}"]
            assert subs[0].queue.empty()
            assert broken.bot in hub._retrying  # pyright: ignore[reportPrivateUsage]
    finally:
        await hub.stop()


async def test_a_replay_misses_no_change_that_a_catch_up_begun_before_it_handed_out(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D9.24, "a reconnecting client misses nothing": a catch-up of the hub's (a gap, a reconnect,
    the audit) takes its subscribers, then reads the log. A client subscribing with ``after``
    meanwhile was not among them; its replay read the log first (the hub's read waiting for a
    connection), a change committed, the hub's read then found it, handed it to the others, and
    moved past it, so the later announcement of it was dropped as considered: the client never
    got it. Here the hub's read waits until the client's replay has read and the change is made."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "x")
    issue = "mutation { issueToken { id token } }"
    tokens = [(await api.gql(issue, token=w.tokens["ann"]))["issueToken"]["id"] for _ in range(2)]
    hub = ChangeHub(runtime)  # not started: the catch-up and the replay are the calls below
    from_log = hub._from_log  # pyright: ignore[reportPrivateUsage]
    hub_reading, hub_may_read = asyncio.Event(), asyncio.Event()
    early_subs: list[Subscriber] = []

    async def hub_reads_late(bot_id: str, local: list[Subscriber], after: int) -> Any:
        if early_subs[0] in local:  # the hub's catch-up (the replay reads for the late one alone)
            hub_reading.set()
            await hub_may_read.wait()
        return await from_log(bot_id, local, after)

    monkeypatch.setattr(hub, "_from_log", hub_reads_late)
    replayed: list[tuple[int, list[str]]] = []
    live: list[tuple[int, list[str]]] = []
    try:
        async with hub.subscribe(w.bot, w.people["ann"], w.org, tokens[0]) as early:
            early_subs.append(early)
            base = hub.versions[w.bot]
            first = await fact(runtime, w.bot, "before the replay", src)
            catching_up = asyncio.create_task(hub.catch_up(w.bot))
            await hub_reading.wait()  # it took its subscribers: the early one alone
            async with hub.subscribe(w.bot, w.people["ann"], w.org, tokens[1]) as late:

                async def replay() -> int:
                    async for event in hub.replay(late, base):
                        if isinstance(event, CaughtUp):
                            return event.version
                        assert event is not None
                        replayed.append((event.version, [e.id for e in event.entries]))
                    raise AssertionError("the replay ended without catching up")

                replaying = asyncio.create_task(replay())

                async def replay_read() -> bool:
                    return bool(replayed) or replaying.done()

                await until(replay_read, "the replay never read the log")
                second = await fact(runtime, w.bot, "after the replay's read", src)
                hub_may_read.set()
                await catching_up
                floor = await replaying
                while not late.queue.empty():
                    event = late.queue.get_nowait()
                    assert event is not None
                    if event.version > floor:  # as the resolver reads its queue after the replay
                        live.append((event.version, [e.id for e in event.entries]))
        assert replayed + live == [(base + 1, [first]), (base + 2, [second])]
    finally:
        hub_may_read.set()
        await hub.stop()


async def test_streams_are_checked_again_when_the_redis_connection_comes_back(
    api: Api, runtime: Runtime
) -> None:
    """A change of who may follow a Bot or a Chat (a token revoked, a person removed) is announced
    on Redis, and every API process checks its streams again. One announced while a process's
    connection was away was lost: a revoked token's memoryChanges stayed open on a quiet Bot, and
    a removed person's turnEvents got the reply's words until the Chat's next saved Item. Both
    hubs check every stream again once they subscribe again. (The token here was never live: as
    one whose revocation was announced while the connection was away.)"""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    gone = "tok_" + secrets.token_hex(16)
    turns, changes = TurnHub(runtime), ChangeHub(runtime)
    await turns.start()
    await changes.start()
    try:
        await asyncio.wait_for(turns.ready.wait(), 10)
        await asyncio.wait_for(changes.access_ready.wait(), 10)
        async with (
            turns.subscribe(chat, w.people["ann"], gone) as turn_stream,
            changes.subscribe(w.bot, w.people["ann"], w.org, gone) as change_stream,
        ):
            await runtime.redis.client_kill_filter(_type="pubsub")  # every pub/sub connection
            assert await asyncio.wait_for(turn_stream.queue.get(), 30) is None and turn_stream.token_gone
            assert await asyncio.wait_for(change_stream.queue.get(), 30) is None
    finally:
        await turns.stop()
        await changes.stop()


async def test_a_replay_from_past_the_memory_s_version_catches_up_at_the_memory_s_version(
    api: Api, runtime: Runtime
) -> None:
    """A client's ``after`` past the Bot's memory version (a restored store, a client's mistake)
    catches up at the memory's version, not at ``after``: the resolver drops live events at or
    below the version a replay reached, so every change up to the client's number was lost."""
    w = await make_world(api, ("ann",))
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    hub = ChangeHub(runtime)
    try:
        async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
            base = hub.versions[w.bot]
            replayed = [event async for event in hub.replay(sub, base + 1_000)]
            assert replayed == [CaughtUp(base)]
    finally:
        await hub.stop()
