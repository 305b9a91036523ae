"""Seed 004's conversation meta (D9.30): a Chat's summary as a map of strings — the id→text map of
its latest messages while the summary stays under ~20,000 characters, the worker's compressed
summary after — listed for the caller's Chats, read by the Chat's people, set by its owner."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from typing import Any

import httpx
import pytest
from neo4j import AsyncManagedTransaction

from graph import conversation as conversation_q
from graph.chats import LOCK_CHAT
from graph.driver import read, write
from services import conversation
from services.auth import authenticate
from services.bootstrap import redis_of
from services.conversation import META_KINDS
from services.crypto import Kind
from services.errors import NotFound
from services.jobs import SUMMARY_SWEEP_AGAIN_MS, enqueue_due_summaries
from services.memory import cipher_of
from services.runtime import Runtime, now_ms
from tests.client import Api, bearer, make_world
from tests.learning_helpers import (
    add_items,
    holding_lock,
    letters,
    long_turn,
    memory_world,
    until_a_transaction_waits_for_a_lock,
)
from tests.memory_helpers import sealed
from tests.model_server import ModelServer, Reply
from tests.waiting import until
from tools.processes import free_port

pytestmark = pytest.mark.usefixtures("learning_worker")


async def meta(api: Api, token: str, chat: str) -> httpx.Response:
    return await api.http.get(f"/v1/chats/{chat}/meta", headers=bearer(token))


async def put(api: Api, token: str, chat: str, body: Any, *, create: bool = False) -> httpx.Response:
    method = "POST" if create else "PUT"
    return await api.http.request(method, f"/v1/chats/{chat}/meta", json=body, headers=bearer(token))


def code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


async def test_meta_is_the_latest_messages_until_its_owner_sets_it(api: Api, runtime: Runtime) -> None:
    """Under the threshold the meta is an id→text map of the recent turns (person and Bot
    messages; notices and tool calls are not turns). POST creates it for a Chat without any, PUT
    replaces it (404 while there is none), and what the owner set stays, encrypted (E1), until
    the next messages follow it."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    empty = await api.chat(ann, w.bot)
    assert (await meta(api, ann, empty)).status_code == 404
    assert code(await put(api, ann, empty, {"summary": {"topic": "x"}})) == "NOT_FOUND"
    created = await put(api, ann, empty, {"summary": {"topic": "Lyon trip", "due": "Friday"}}, create=True)
    assert created.status_code == 201, created.text
    assert created.json() == {
        "chatId": empty,
        "summary": {"topic": "Lyon trip", "due": "Friday"},
        "version": 1,
    }
    assert (await meta(api, ann, empty)).json() == created.json()
    assert code(await put(api, ann, empty, {"summary": {"topic": "again"}}, create=True)) == "CONFLICT"

    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "Plan my trip to Lyon")
    await add_items(
        api, ann, turn["id"], ("TOOL_CALL", "lookup"), ("BOT_MESSAGE", "By train?"), ("NOTICE", "Ann is away")
    )
    await add_items(api, ann, turn["id"], ("PERSON_MESSAGE", "Yes, by train"))
    assert (await meta(api, ann, chat)).json() == {
        "chatId": chat,
        "summary": {"i-1": "Plan my trip to Lyon", "i-3": "By train?", "i-5": "Yes, by train"},
        "version": 0,  # no summary yet
    }
    # A Chat with messages has meta: POST refuses, PUT replaces it and covers every message so far.
    assert code(await put(api, ann, chat, {"summary": {"plan": "x"}}, create=True)) == "CONFLICT"
    replaced = await put(api, ann, chat, {"summary": {"plan": "Lyon by train", "who": "Ann"}})
    assert replaced.status_code == 200, replaced.text
    assert (await meta(api, ann, chat)).json()["summary"] == {"plan": "Lyon by train", "who": "Ann"}
    await add_items(api, ann, turn["id"], ("BOT_MESSAGE", "Booked the 9:04."))
    assert (await meta(api, ann, chat)).json()["summary"] == {
        "plan": "Lyon by train",
        "who": "Ann",
        "i-6": "Booked the 9:04.",
    }
    # The context pack (and so the Bot) reads the owner's map as the Chat's summary, as lines.
    pack = await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(ann))
    assert pack.json()["summary"] == "plan: Lyon by train\nwho: Ann"
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (s:ChatSummary {chatId: $c}) RETURN s.text AS text, s.form AS form", c=chat
    )
    assert records[0]["form"] == "map" and b"Lyon by train" not in sealed(records[0]["text"])
    # Deleting the chat's history deletes its meta (V13, D9.23).
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    assert (await meta(api, ann, chat)).status_code == 404


async def test_past_the_threshold_the_meta_holds_the_workers_summary(
    api: Api, model_server: ModelServer
) -> None:
    """When the Chat passes ~20,000 characters the worker compresses it: the meta is then that
    summary, and the messages after it; a compression reads an owner's map as its summary so far."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    await put(api, ann, chat, {"summary": {"goal": "a holiday"}}, create=True)
    model_server.default("summary", Reply(text="Ann wrote two long letters about a holiday."))
    await long_turn(api, ann, chat, "A")
    await long_turn(api, ann, chat, "B")

    async def compressed() -> str | None:
        pack = await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(ann))
        summary = pack.json()["summary"]
        return None if summary == "goal: a holiday" else summary

    assert await until(compressed, "the worker's summary") == "Ann wrote two long letters about a holiday."
    [request] = model_server.requests_for("summary")
    assert '"summary": "goal: a holiday"' in request.body["messages"][1]["content"]
    await api.turn(ann, chat, "And a short one")
    read = (await meta(api, ann, chat)).json()
    assert read["summary"] == {
        "summary": "Ann wrote two long letters about a holiday.",
        "i-3": "And a short one",
    }
    # The compression moved the version Ann's map was saved at (1): an edit of that map is stale.
    assert read["version"] > 1
    stale = await put(api, ann, chat, {"summary": {"goal": "a holiday, in Lyon"}, "expected": 1})
    assert stale.status_code == 409 and code(stale) == "CONFLICT"


async def test_the_list_holds_the_chats_you_may_read_that_have_meta(api: Api) -> None:
    """``GET /v1/chats/meta?limit&skip`` → ``{data, total}``: your own Chats and the group chats of
    your channels that have meta, newest first; nobody else's."""
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    first = await api.chat(ann, w.bot)
    await api.turn(ann, first, "first")
    await api.chat(ann, w.bot)  # nothing said: no meta
    group = await api.chat(bob, w.bot, channel=w.channel)
    await api.turn(bob, group, "to the team")
    private = await api.chat(bob, w.bot)
    await api.turn(bob, private, "bob alone")
    cats = await api.chat(w.tokens["cat"], w.bot)
    await api.turn(w.tokens["cat"], cats, "cat alone")

    listed = await api.http.get("/v1/chats/meta", headers=bearer(ann))
    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "data": [
            {"chatId": group, "summary": {"i-1": "to the team"}, "version": 0},
            {"chatId": first, "summary": {"i-1": "first"}, "version": 0},
        ],
        "total": 2,
    }
    page = await api.http.get("/v1/chats/meta?limit=1&skip=1", headers=bearer(ann))
    assert page.json() == {"data": [{"chatId": first, "summary": {"i-1": "first"}, "version": 0}], "total": 2}
    bobs = (await api.http.get("/v1/chats/meta", headers=bearer(bob))).json()
    assert [m["chatId"] for m in bobs["data"]] == [private, group] and bobs["total"] == 2


async def test_meta_access_and_bad_input(api: Api) -> None:
    """Only the Chat's people read its meta (D9.6; others get the 404 of an unknown Chat), only its
    owner sets it (a member gets 403), platform tokens read no history, and bad input is refused
    with BAD_INPUT without changing anything."""
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    ann, bob, cat = w.tokens["ann"], w.tokens["bob"], w.tokens["cat"]
    group = await api.chat(ann, w.bot, channel=w.channel)
    await api.turn(ann, group, "hello team")
    assert (await meta(api, bob, group)).json()["summary"] == {"i-1": "hello team"}
    assert code(await meta(api, cat, group)) == "NOT_FOUND"
    assert code(await put(api, cat, group, {"summary": {"a": "b"}})) == "NOT_FOUND"
    assert code(await put(api, bob, group, {"summary": {"a": "b"}})) == "FORBIDDEN"
    platform = await api.platform_token(w.org)
    assert code(await meta(api, platform, group)) == "FORBIDDEN"
    listed = (await api.http.get("/v1/chats/meta", headers=bearer(platform))).json()
    assert listed["error"]["code"] == "FORBIDDEN" and "/memory/context" in listed["error"]["message"]
    # The admin token reads no history either, and is not sent to the platform tokens' routes.
    refused = (await api.http.get("/v1/chats/meta", headers=bearer(api.admin_token))).json()["error"]
    assert refused == {"code": "FORBIDDEN", "message": "this operation needs a person's token"}
    assert code(await meta(api, ann, "chat_unknown")) == "NOT_FOUND"
    assert code(await meta(api, ann, "not an id!")) == "BAD_INPUT"
    bodies: list[dict[str, Any]] = [
        {"summary": {}},
        {"summary": {"a": 1}},
        {"summary": ["a"]},
        {"summary": {"i-3": "a message id"}},
        {"summary": {"": "empty key"}},
        {"summary": {"k" * 201: "long key"}},
        {"summary": {"a": "x" * 19_998}},  # "a: " and 19,998: one more than the threshold
        # 18,000 characters as keys and values, 23,999 as the lines kept: the worker compressed
        # such a map over its owner's at once.
        {"summary": {f"k{n:04}": "vvvv" for n in range(2_000)}},
        {"summary": {"a": "b"}, "extra": True},
        {},
    ]
    for body in bodies:
        refused = await put(api, ann, group, body)
        assert refused.status_code == 422 and code(refused) == "BAD_INPUT", (body, refused.text)
    malformed = await api.http.put(
        f"/v1/chats/{group}/meta",
        content=b"{not json",
        headers={**bearer(ann), "content-type": "application/json"},
    )
    assert code(malformed) == "BAD_INPUT"
    assert code(await api.http.get("/v1/chats/meta?limit=0", headers=bearer(ann))) == "BAD_INPUT"
    # A skip past 32 bits failed inside Cypher's list slice (500): bad input, on both surfaces.
    for skip in (2**31, 2**62):
        assert code(await api.http.get(f"/v1/chats/meta?skip={skip}", headers=bearer(ann))) == "BAD_INPUT"
    metas = "query($s: Int!) { chatMetas(limit: 50, skip: $s) { total } }"
    assert await api.codes(metas, {"s": 2**31 - 1}, ann) == ["BAD_INPUT"]
    far = await api.gql(
        "query { chatMetas(limit: 50, skip: 1000000000) { total data { chatId } } }", token=ann
    )
    assert far["chatMetas"]["data"] == [] and far["chatMetas"]["total"] >= 1
    assert (await meta(api, ann, group)).json()["summary"] == {"i-1": "hello team"}
    fits = await put(api, ann, group, {"summary": {"a": "x" * 19_997}})  # 20,000 as a line
    assert fits.status_code == 200, fits.text


async def test_a_meta_reads_its_messages_only_until_past_what_it_shows(api: Api, runtime: Runtime) -> None:
    """A meta shows the newest messages after the summary within ~20,000 characters; its statement
    read up to 100 of them whatever their length (a page of 200 metas: up to ~400 MB read and
    sent to show ~4 MB). It reads them only until past the characters it may show."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "a" * 6_000)
    await add_items(
        api,
        ann,
        turn["id"],
        ("BOT_MESSAGE", "b" * 6_000),
        ("PERSON_MESSAGE", "c" * 6_000),
        ("BOT_MESSAGE", "d" * 6_000),
    )
    rows = await read(
        runtime.driver,
        lambda tx: conversation_q.meta(tx, chat_ids=[chat], kinds=META_KINDS, limit=100, chars=10_000),
    )
    assert [i["seq"] for i in rows[0]["recent"]] == [4, 3]  # 6,000, then 12,000: past 10,000
    # The meta itself: the newest that fit 20,000 characters (read until past them).
    assert list((await meta(api, ann, chat)).json()["summary"]) == ["i-2", "i-3", "i-4"]


async def test_a_refused_meta_write_never_waits_for_the_chats_lock(api: Api, runtime: Runtime) -> None:
    """setChatMeta of a Chat the caller may not set is refused before the Chat's lock: it locked
    the Chat first, so the refusal waited behind whatever held it (a history deletion, a summary,
    a Turn) — telling a busy Chat from an unknown id — and held the Chat's writers meanwhile
    (D9.4). Refused at once while another transaction holds the lock; the owner's write waits."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    stranger = await make_world(api, ("zed",))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    async with holding_lock(runtime, LOCK_CHAT, chatId=group) as release:
        for token, expected in ((stranger.tokens["zed"], "NOT_FOUND"), (w.tokens["bob"], "FORBIDDEN")):
            refused = await asyncio.wait_for(put(api, token, group, {"summary": {"a": "b"}}), 20)
            assert code(refused) == expected, refused.text
        owners = asyncio.create_task(put(api, w.tokens["ann"], group, {"summary": {"a": "b"}}, create=True))
        # The owner's write waits its turn.
        await until_a_transaction_waits_for_a_lock(
            runtime, running="apoc.lock.nodes([ch])", given=("chatId", group)
        )
        release.set()
        assert (await owners).status_code == 201


SET = (
    "mutation($c: ID!, $s: [MetaEntryInput!]!, $create: Boolean) {"
    " setChatMeta(chatId: $c, summary: $s, create: $create) { chatId summary { key text } } }"
)
GET = "query($c: ID!) { chatMeta(chatId: $c) { chatId summary { key text } } }"
LIST = "query($l: Int, $s: Int) { chatMetas(limit: $l, skip: $s) { total data { chatId summary { key text } } } }"


def pairs(**texts: str) -> list[dict[str, str]]:
    return [{"key": key, "text": text} for key, text in texts.items()]


async def test_graphql_reads_and_sets_the_same_meta(api: Api) -> None:
    """GraphQL's ``chatMeta``, ``chatMetas`` and ``setChatMeta`` are the REST routes' twins (D9.30):
    the map as ordered key/text pairs, the same checks, the same codes."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    chat = await api.chat(ann, w.bot, channel=w.channel)
    assert await api.codes(GET, {"c": chat}, ann) == ["NOT_FOUND"]
    assert await api.codes(SET, {"c": chat, "s": pairs(a="b")}, ann) == ["NOT_FOUND"]
    made = await api.gql(SET, {"c": chat, "s": pairs(plan="Lyon", day="Friday"), "create": True}, ann)
    assert made["setChatMeta"] == {"chatId": chat, "summary": pairs(plan="Lyon", day="Friday")}
    assert await api.codes(SET, {"c": chat, "s": pairs(a="b"), "create": True}, ann) == ["CONFLICT"]
    assert await api.codes(SET, {"c": chat, "s": pairs(a="b")}, bob) == ["FORBIDDEN"]
    twice = [{"key": "a", "text": "1"}, {"key": "a", "text": "2"}]
    assert await api.codes(SET, {"c": chat, "s": twice}, ann) == ["BAD_INPUT"]
    assert await api.codes(SET, {"c": chat, "s": pairs(**{"i-1": "x"})}, ann) == ["BAD_INPUT"]
    await api.turn(bob, chat, "Friday works")
    read = await api.gql(GET, {"c": chat}, bob)
    assert read["chatMeta"]["summary"] == [
        *pairs(plan="Lyon", day="Friday"),
        {"key": "i-1", "text": "Friday works"},
    ]
    # REST shows the same map.
    assert (await meta(api, bob, chat)).json()["summary"] == {
        "plan": "Lyon",
        "day": "Friday",
        "i-1": "Friday works",
    }
    listed = await api.gql(LIST, {"l": 10, "s": 0}, bob)
    assert listed["chatMetas"] == {"total": 1, "data": [read["chatMeta"]]}
    assert await api.codes(LIST, {"l": 0, "s": 0}, bob) == ["BAD_INPUT"]


async def test_a_creation_behind_one_in_flight_finds_it_and_conflicts(api: Api, runtime: Runtime) -> None:
    """Concurrent edits: a creation that runs while another one is still open waits for it, then
    finds what it wrote (no row: CONFLICT) instead of overwriting it — the first meta stays."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    cipher = await cipher_of(runtime, w.bot)

    def fields(by: str) -> dict[str, Any]:
        text = cipher.encrypt(Kind.CHAT_SUMMARY, chat, json.dumps({"by": by}))
        return {
            "chatId": chat,
            "kinds": META_KINDS,
            "create": True,
            "expected": None,
            "text": text,
            "chars": 6,
            "now": 0,
        }

    wrote, release = asyncio.Event(), asyncio.Event()

    async def first(tx: AsyncManagedTransaction) -> bool:
        saved = await conversation_q.set_meta(tx, **fields("first"))
        wrote.set()
        await release.wait()  # the transaction stays open, its locks held
        return saved is not None and saved["version"] is not None

    held = asyncio.create_task(write(runtime.driver, first))
    await wrote.wait()
    behind = asyncio.create_task(
        write(runtime.driver, lambda tx: conversation_q.set_meta(tx, **fields("second")))
    )
    await until_a_transaction_waits_for_a_lock(
        runtime, running="MERGE (s:ChatSummary {chatId: $chatId})", given=("chatId", chat)
    )
    release.set()
    assert await held
    assert await behind == {"held": True, "current": 1, "version": None}
    assert (await meta(api, w.tokens["ann"], chat)).json()["summary"] == {"by": "first"}


async def test_two_editors_of_a_meta_never_overwrite_each_other_unseen(api: Api) -> None:
    """Concurrent edits: the meta has a version (its summary's); a replacement sent with the
    version its editor read (``expected``) is refused with CONFLICT when another replacement came
    first — the first stays, nothing of either is lost unseen — and saved when it did not. Without
    ``expected`` a replacement is saved whatever the version (as before)."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    created = await put(api, ann, chat, {"summary": {"plan": "Lyon"}}, create=True)
    assert created.status_code == 201 and created.json()["version"] == 1
    read = (await meta(api, ann, chat)).json()["version"]  # both editors read version 1
    first = await put(api, ann, chat, {"summary": {"plan": "Lyon by train"}, "expected": read})
    assert first.status_code == 200 and first.json()["version"] == 2
    second = await put(api, ann, chat, {"summary": {"plan": "Lyon by car"}, "expected": read})
    assert second.status_code == 409 and code(second) == "CONFLICT"
    assert "version 2" in second.json()["error"]["message"]
    assert (await meta(api, ann, chat)).json() == {
        "chatId": chat,
        "summary": {"plan": "Lyon by train"},
        "version": 2,
    }
    # GraphQL: the same version, the same refusal; read again, the edit goes through.
    versioned = (
        "mutation($c: ID!, $s: [MetaEntryInput!]!, $e: Int) {"
        " setChatMeta(chatId: $c, summary: $s, expected: $e) { summary { key text } version } }"
    )
    assert await api.codes(versioned, {"c": chat, "s": pairs(plan="Lyon by car"), "e": 1}, ann) == [
        "CONFLICT"
    ]
    now = (await api.gql("query($c: ID!) { chatMeta(chatId: $c) { version } }", {"c": chat}, ann))["chatMeta"]
    saved = await api.gql(versioned, {"c": chat, "s": pairs(plan="Lyon by car"), "e": now["version"]}, ann)
    assert saved["setChatMeta"] == {"summary": pairs(plan="Lyon by car"), "version": 3}
    # Not a version: refused before anything is read; without one, replaced whatever it is.
    bad = await put(api, ann, chat, {"summary": {"plan": "x"}, "expected": -1})
    assert bad.status_code == 422 and code(bad) == "BAD_INPUT"
    assert await api.codes(versioned, {"c": chat, "s": pairs(plan="x"), "e": -1}, ann) == ["BAD_INPUT"]
    blind = await put(api, ann, chat, {"summary": {"plan": "Lyon, whatever"}})
    assert blind.status_code == 200 and blind.json()["version"] == 4
    # A history deletion moves the version too, and it never goes back: an editor who read 4
    # before it cannot set the meta over one created after it (the summary's own count began
    # again at 1 with it).
    await api.turn(ann, chat, "Lyon it is")
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    again = await put(api, ann, chat, {"summary": {"plan": "Nice"}}, create=True)
    assert again.status_code == 201 and again.json()["version"] == 6
    late = await put(api, ann, chat, {"summary": {"plan": "Lyon"}, "expected": 4})
    assert late.status_code == 409 and code(late) == "CONFLICT"
    assert (await meta(api, ann, chat)).json()["summary"] == {"plan": "Nice"}


async def test_a_summary_request_carries_at_most_its_characters_of_messages(
    api: Api, model_server: ModelServer
) -> None:
    """A compression sent up to 500 messages at once (10 million characters): past any model's
    context, the provider refused it every time and the Chat's summary never moved on. A request
    carries at most ``max_evidence_chars`` (60,000) of messages; the next request takes the rest."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    model_server.default("summary", Reply(text="Ann sent four long letters."))
    turn = await api.turn(ann, chat, "Letters follow.")
    big = letters("ABCD")
    await add_items(api, ann, turn["id"], *(("PERSON_MESSAGE", text) for text in big))
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, ann)

    async def covered() -> list[Any] | None:
        asked = [
            r for r in model_server.requests_for("summary") if big[0][:40] in r.text or big[3][:40] in r.text
        ]
        return asked if any(big[3][:40] in r.text for r in asked) else None

    asked = await until(covered, "the summaries of the four letters")
    sent = [json.loads(r.body["messages"][1]["content"])["messages"] for r in asked]
    assert len(sent) >= 2 and all(sum(len(m["text"]) for m in lines) <= 60_000 for lines in sent)


async def test_a_summary_whose_queueing_was_lost_is_made_by_the_sweep(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A summary is queued when a Turn starts or completes past the threshold; one whose queueing
    was lost (the API killed after its commit, Redis away or restarted) waited for the Chat's next
    Turn, and a quiet Chat kept its gap between summary and messages. The worker's sweep
    (``jobs.enqueue_due_summaries``, every ten minutes) queues every summary due. Here the
    history passes the threshold by addItems, which queues none, as a lost queueing leaves it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    model_server.default("summary", Reply(text="Ann wrote two long letters."))
    turn = await api.turn(ann, chat, "Two letters follow.")
    big = letters("EF")
    await add_items(api, ann, turn["id"], *(("PERSON_MESSAGE", text) for text in big))
    assert not [r for r in model_server.requests_for("summary") if big[0][:40] in r.text]
    assert await enqueue_due_summaries(runtime) >= 1

    async def summarized() -> str | None:
        pack = await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(ann))
        return pack.json()["summary"]

    assert await until(summarized, "the swept summary") == "Ann wrote two long letters."


async def test_long_chats_that_are_never_summarized_keep_no_other_out_of_the_sweep(runtime: Runtime) -> None:
    """D9.17: the sweep took the Chats most behind, then left out those without a memory-Bot model
    (never summarized) or swept in the last hour: as many such Chats as it scans, longer than the
    rest, and it queued no other Chat, a lost queueing never made up. They are left out first."""
    tag = secrets.token_hex(6)
    await runtime.driver.execute_query(
        """
        CREATE (none:Organization {id: 'org_nomodel_' + $tag, botMemoryModel: null})
        CREATE (some:Organization {id: 'org_model_' + $tag, botMemoryModel: 'stub-model'})
        WITH none, some
        UNWIND range(1, 10) AS n
        CREATE (:Chat {id: 'chat_nomodel_' + $tag + '_' + n, unsummarizedChars: 2000000000 + n,
                       summaryInputChars: 2000000000 + n})-[:IN_ORG]->(none)
        CREATE (:Chat {id: 'chat_swept_' + $tag + '_' + n, unsummarizedChars: 2000000000 + n,
                       summaryInputChars: 2000000000 + n, summarySweptAt: $later - 60000})-[:IN_ORG]->(some)
        WITH DISTINCT some
        CREATE (:Chat {id: 'chat_due_' + $tag, unsummarizedChars: 1999999999,
                       summaryInputChars: 1999999999})-[:IN_ORG]->(some)
        """,
        tag=tag,
        later=LATER,
    )
    try:
        assert await sweep(runtime, threshold=1000) == [f"chat_due_{tag}"]
    finally:
        await forget_tagged(runtime, tag)


async def test_a_due_chat_with_a_long_summary_is_swept_ahead_of_longer_chats_not_due(
    runtime: Runtime,
) -> None:
    """D9.17: the sweep scanned the Chats with the most characters after their summary and only
    then added each one's summary. Long Chats not due (no summary yet, just under the threshold)
    filled the scan ahead of a due Chat whose summary is long and whose backlog short, which the
    sweep then never queued (its summary came at its next Turn, or never for a quiet Chat). What
    a summary would take in is kept on the Chat, and the sweep seeks the due Chats by it."""
    tag = secrets.token_hex(6)
    threshold = 1_999_990_000
    await runtime.driver.execute_query(
        """
        CREATE (o:Organization {id: 'org_model_' + $tag, botMemoryModel: 'stub-model'})
        WITH o
        UNWIND range(1, 1000) AS n
        CREATE (:Chat {id: 'chat_long_' + $tag + '_' + n, unsummarizedChars: $threshold - n,
                       summaryInputChars: $threshold - n})-[:IN_ORG]->(o)
        WITH DISTINCT o
        CREATE (:ChatSummary {chatId: 'chat_due_' + $tag, chars: $threshold, coversThroughSeq: 1})
        CREATE (:Chat {id: 'chat_due_' + $tag, unsummarizedChars: 10,
                       summaryInputChars: $threshold + 10})-[:IN_ORG]->(o)
        """,
        tag=tag,
        threshold=threshold,
    )
    try:
        assert await sweep(runtime, threshold=threshold) == [f"chat_due_{tag}"]
    finally:
        await runtime.driver.execute_query(
            "MATCH (s:ChatSummary {chatId: 'chat_due_' + $tag}) DELETE s", tag=tag
        )
        await forget_tagged(runtime, tag)


async def test_a_due_chat_the_sweep_could_not_queue_is_due_to_the_next_sweep(runtime: Runtime) -> None:
    """D9.17: the sweep marks the Chats it takes as swept (so that the next one takes others), then
    queues them; with Redis away the queueing stopped at the first failure and every Chat not
    queued stayed marked, left out of the sweeps for an hour. Those are unmarked now."""
    tag = secrets.token_hex(6)
    await runtime.driver.execute_query(
        """
        CREATE (o:Organization {id: 'org_model_' + $tag, botMemoryModel: 'stub-model'})
        CREATE (:Chat {id: 'chat_due_' + $tag, unsummarizedChars: 10, summaryInputChars: 3000000000})-[:IN_ORG]->(o)
        """,
        tag=tag,
    )
    away = runtime.settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{free_port()}/0", "redis_timeout_seconds": 1.0}
    )
    redis = redis_of(away)
    try:
        # As of a day later (LATER): the session worker's own sweep, marking it now, changes nothing.
        assert await enqueue_due_summaries(dataclasses.replace(runtime, redis=redis), LATER) >= 1
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (ch:Chat {id: 'chat_due_' + $tag}) RETURN ch.summarySweptAt AS at", tag=tag
        )
        assert records[0]["at"] is None  # before: marked swept now, left out for an hour
    finally:
        await redis.aclose()
        await forget_tagged(runtime, tag)


#: When the tests' sweeps run, as far as the statement knows: a day from now, so that the session
#: worker's own sweep (at its start and every ten minutes), marking a test's Chats as swept now,
#: changes nothing; a Chat "swept in the last hour" was swept a minute before that.
LATER = now_ms() + 86_400_000


async def sweep(runtime: Runtime, *, threshold: int) -> list[str]:
    """One sweep's statement, as ``jobs.enqueue_due_summaries`` runs it, queueing at most one."""
    return await write(
        runtime.driver,
        lambda tx: conversation_q.summaries_due(
            tx, threshold=threshold, limit=1, sweptBefore=LATER - SUMMARY_SWEEP_AGAIN_MS, now=LATER
        ),
    )


async def forget_tagged(runtime: Runtime, tag: str) -> None:
    await runtime.driver.execute_query(
        "MATCH (n) WHERE n.id ENDS WITH $tag OR n.id CONTAINS '_' + $tag + '_' DETACH DELETE n", tag=tag
    )


async def test_an_owner_removed_while_setting_a_meta_does_not_set_it(api: Api, runtime: Runtime) -> None:
    """D9.6, D9.30: the owner's access is checked in the transaction that writes the meta, under the
    Chat's lock. Checked in a transaction before, an owner removed from the channel while the
    write waited for the Chat (held here) still replaced the meta after the removal."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot, channel=w.channel)
    assert (await put(api, ann, chat, {"summary": {"plan": "Lyon"}}, create=True)).status_code == 201
    async with runtime.driver.session() as session:
        holding = await session.begin_transaction()  # another write of the Chat: it is held
        try:
            await holding.run("MATCH (ch:Chat {id: $c}) CALL apoc.lock.nodes([ch]) RETURN 1", c=chat)
            setting = asyncio.create_task(put(api, ann, chat, {"summary": {"plan": "Paris"}}))
            await until_a_transaction_waits_for_a_lock(runtime, running="Chat {id: $chatId}")
            await api.admin(
                "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
                {"c": w.channel, "m": [w.people["bob"]]},
            )
        finally:
            await holding.rollback()
    assert code(await setting) == "NOT_FOUND"
    assert (await meta(api, w.tokens["bob"], chat)).json()["summary"] == {"plan": "Lyon"}


@pytest.mark.parametrize("one", [True, False])
async def test_a_meta_read_while_its_reader_left_the_channel_is_not_given(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, one: bool
) -> None:
    """D9.6: a group chat's meta (one Chat's, and the list) is its current members'. The caller was
    checked, then the summary and messages read in a later statement: removed from the channel in
    between, they got the meta as it was after their removal. It is checked again once read (as
    contextPack is). Here the removal is made between the two statements."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    await api.turn(w.tokens["ann"], chat, "team news")
    ann = await authenticate(runtime, f"Bearer {w.tokens['ann']}")
    read_meta = conversation_q.meta

    async def removed_first(tx: AsyncManagedTransaction, **params: Any) -> list[conversation_q.MetaRow]:
        await api.admin(
            "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
            {"c": w.channel, "m": [w.people["bob"]]},
        )
        return await read_meta(tx, **params)

    monkeypatch.setattr(conversation_q, "meta", removed_first)
    if one:
        with pytest.raises(NotFound):
            await conversation.chat_meta(runtime, ann, chat)
    else:
        metas, _ = await conversation.chat_metas(runtime, ann, limit=50, skip=0)
        assert chat not in [m.chat_id for m in metas]


async def test_a_chat_that_comes_while_a_page_of_metas_is_read_drops_none_of_it(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D9.6: the list of metas checks its page's Chats again once read. Checked by reading the
    page again, a Chat of the caller's that got its first message in between (newest first, it
    comes before them) shifted the page, and the page's last Chat, which the caller still reads,
    was left out; it is the page's own Chats that are checked."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    await api.turn(w.tokens["ann"], chat, "first")
    ann = await authenticate(runtime, f"Bearer {w.tokens['ann']}")
    read_meta = conversation_q.meta

    async def another_first(tx: AsyncManagedTransaction, **params: Any) -> list[conversation_q.MetaRow]:
        await api.turn(w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot), "a newer chat")
        return await read_meta(tx, **params)

    monkeypatch.setattr(conversation_q, "meta", another_first)
    metas, _ = await conversation.chat_metas(runtime, ann, limit=1, skip=0)
    assert [m.chat_id for m in metas] == [chat]
