"""Retrieval by meaning (design §10): ``search`` and ``context(query)`` through the real API and
services, with the default local embedder, under the one visibility check (C1, V10, E1, E2)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import REGISTRY
from threadpoolctl import threadpool_info, threadpool_limits

from graph import context as context_q
from graph import search as search_q
from graph.driver import autocommit
from graph.memory import TOP_RANK, reader_keys
from graph.migrations import LATEST, migrate
from learning import enrichment
from learning.embedders import LocalMiniLM, OpenAIEmbedder
from learning.gateway import Gateway
from services import memory, retrieval, search, turns
from services.bootstrap import open_runtime
from services.changes import AddFact, Invalidate, ItemRef, MemoryChange, Revise, SetTopics, Share
from services.domain import Principal
from services.errors import NotFound
from services.runtime import Runtime
from services.runtime import now_ms as time_ms
from services.settings import Settings
from services.vectorindex import VectorIndexes
from services.writepath import apply_changes
from tests.client import Api, World, bearer, make_world
from tests.conftest import ApiProcess
from tests.learning_helpers import confide, memory_world
from tests.memory_helpers import apply, command, db_hits, fact, observation, said
from tests.model_server import ModelServer, Reply, ToolCall
from tests.waiting import until

SEARCH = "query($b: ID!, $q: String!, $l: Int!) { search(botId: $b, query: $q, limit: $l) { score entry { id content } } }"

FACTS = (
    "Ann has a dog called Rex",
    "Ann works as a baker in Lisbon",
    "Ann's favourite film is Casablanca",
    "Ann is learning to play the cello",
    "Ann visited Zanzibar last spring",
    "Ann is allergic to peanuts",
)


async def remember(api: Api, token: str, bot: str, content: str) -> str:
    response = await command(api, token, bot, {"_tag": "Remember", "content": content, "tags": []})
    assert response.status_code == 201, response.text
    return response.json()["entry"]["id"]


async def learn_facts(
    runtime: Runtime, bot: str, embedder: LocalMiniLM, *contents: str, source: tuple[str, str]
) -> list[str]:
    """Facts the memory Bot learns from one Item (embedded as ``apply_changes`` embeds): their ids."""
    changes = [AddFact(content=c, sources=(ItemRef(*source),)) for c in contents]
    await apply_changes(runtime, bot, list(changes), "memory_bot", embedder=embedder)
    return [c.id for c in changes]


async def rest_search(api: Api, token: str, bot: str, q: str, limit: int = 10) -> Any:
    return await api.http.get(
        f"/v1/bots/{bot}/memory/search",
        params={"q": q, "limit": limit},
        headers={"Authorization": f"Bearer {token}"},
    )


async def test_search_ranks_by_meaning_and_finds_rare_words(api: Api) -> None:
    w = await make_world(api, ("ann", "bob"))
    ids = {c: await remember(api, w.tokens["ann"], w.bot, c) for c in FACTS}
    found = await api.gql(SEARCH, {"b": w.bot, "q": "What pet does she have?", "l": 3}, w.tokens["ann"])
    hits = found["search"]
    assert hits[0]["entry"]["id"] == ids["Ann has a dog called Rex"]
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    # A rare word no sentence encoder knows well is found by its keyword (blind index).
    response = await rest_search(api, w.tokens["ann"], w.bot, "zanzibar", 1)
    assert response.status_code == 200
    assert [r["entry"]["id"] for r in response.json()["results"]] == [ids["Ann visited Zanzibar last spring"]]
    assert response.json()["results"][0]["entry"]["content"] == "Ann visited Zanzibar last spring"


async def test_search_shows_nobody_an_entry_they_may_not_see(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    mine = await remember(api, w.tokens["ann"], w.bot, "Ann keeps her spare key under the blue flowerpot")
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    chat, item = await said(api, w.tokens["ann"], group, "the team offsite is in the flowerpot museum")
    shared = await fact(runtime, w.bot, "The team offsite is at the flowerpot museum", (chat, item))
    seen = await rest_search(api, w.tokens["bob"], w.bot, "where is the flowerpot?", 10)
    assert [r["entry"]["id"] for r in seen.json()["results"]] == [shared]  # V7: not Ann's pinned entry
    ann = await rest_search(api, w.tokens["ann"], w.bot, "where is the flowerpot?", 10)
    assert {r["entry"]["id"] for r in ann.json()["results"]} == {mine, shared}
    # Removed from the channel: the shared fact is gone at once (membership read at query time).
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": w.channel, "m": [w.people["ann"]]},
    )
    gone = await rest_search(api, w.tokens["bob"], w.bot, "where is the flowerpot?", 10)
    assert gone.json()["results"] == []
    # Forget by the only person behind it: retracted, gone from search at once.
    assert (await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": mine})).status_code == 200
    after = await rest_search(api, w.tokens["ann"], w.bot, "where is the spare key?", 10)
    assert mine not in [r["entry"]["id"] for r in after.json()["results"]]


async def test_reads_meet_the_readers_rules_as_they_stand_under_the_lock(api: Api, runtime: Runtime) -> None:
    """C1: a read's readers come from an earlier transaction (a search reads its reader, then
    embeds its query and ranks; an answer checks what it used after the model). Bob, read as a
    member of the channel just before he was removed from it, was shown a fact written for the
    channel after his removal — by search, context and the check of an answer's references — as
    if the removal had not happened. Each statement reads its readers again under the lock."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
    assert bob is not None and w.channel in bob.readers[0]["channels"]  # read as a member
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": w.channel, "m": [w.people["ann"]]},
    )
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    chat, item = await said(api, w.tokens["ann"], group, "the offsite moved to the lighthouse")
    written = await fact(runtime, w.bot, "The team offsite moved to the lighthouse", (chat, item))
    assert [
        h.entry.id for h in await search.search(runtime, None, w.bot, bob, "lighthouse offsite", 10)
    ] == []
    assert (await retrieval.context(runtime, w.bot, bob, 4000)).ids == ()
    assert (await search.context(runtime, None, w.bot, bob, 4000, "lighthouse")).ids == ()
    assert not await retrieval.validate_references(runtime, w.bot, bob, [written])
    # Ann, still a member, reads it through the same statements.
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None
    assert [h.entry.id for h in await search.search(runtime, None, w.bot, ann, "lighthouse offsite", 10)] == [
        written
    ]


async def test_search_scores_count_nothing_the_reader_cannot_see(api: Api) -> None:
    """The scores ``search`` shows are fused from ranks among the entries it shows (§10): Bob's
    private entries, better matches for the query than any of Ann's, change neither what Ann is
    shown nor its scores. Ranked in the whole pool, each of them would have lowered hers, and her
    scores would have told her how many hidden entries match the query better."""
    w = await make_world(api, ("ann", "bob"))
    for content in (
        "Ann saw a quokka on Rottnest Island",
        "Ann's quokka photo won a prize",
        "Ann wants to see a quokka again",
    ):
        await remember(api, w.tokens["ann"], w.bot, content)
    query = {"b": w.bot, "q": "quokka", "l": 10}
    before = (await api.gql(SEARCH, query, w.tokens["ann"]))["search"]
    assert len(before) == 3
    for content in ("quokka", "a quokka", "the quokka", "quokka quokka", "one quokka"):
        await remember(api, w.tokens["bob"], w.bot, content)
    bobs = (await api.gql(SEARCH, query, w.tokens["bob"]))["search"]
    assert len(bobs) == 5 and min(h["score"] for h in bobs) > 0
    assert (await api.gql(SEARCH, query, w.tokens["ann"]))["search"] == before


async def test_search_order_tells_nobody_how_many_hidden_entries_hold_a_word(api: Api) -> None:
    """Keyword scores weigh a word by how rare it is (BM25's idf). Counted over every entry of the
    Bot, a reader who wrote entries holding chosen words could read off the order of their own
    results how many entries they cannot see hold another word: here Ann's entry with "zyxwvut"
    ranked above her entry with "qoppa" (held by four of hers) while Bob's private entries held
    "zyxwvut" fewer than four times, below it once they held it more — one search per guess gave
    the count. Counted over the entries of the keys Ann holds, Bob's count for nothing."""
    w = await make_world(api, ("ann", "bob"))
    ann = w.tokens["ann"]
    for content in (
        "zyxwvut marks the spot",
        "qoppa marks the spot",
        "qoppa one",
        "qoppa two",
        "qoppa three",
    ):
        await remember(api, ann, w.bot, content)
    query = {"b": w.bot, "q": "zyxwvut qoppa", "l": 10}
    before = (await api.gql(SEARCH, query, ann))["search"]
    assert len(before) == 5
    for n in range(7):
        await remember(api, w.tokens["bob"], w.bot, f"zyxwvut note {n}")
    assert len((await api.gql(SEARCH, query, w.tokens["bob"]))["search"]) == 7
    assert (await api.gql(SEARCH, query, ann))["search"] == before


async def test_search_refuses_bad_input_with_clear_codes(api: Api) -> None:
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    for params, field in (
        ({"q": "   "}, "q"),
        ({"q": "x" * 2001}, "q"),
        ({}, "q"),  # documented as optional (default ""), then refused as "query is empty"
        ({"q": "dog", "limit": 0}, "limit"),
        ({"q": "dog", "limit": 101}, "limit"),
        ({"q": "dog", "limit": "ten"}, "limit"),
    ):
        response = await api.http.get(
            f"/v1/bots/{w.bot}/memory/search", params=params, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 422, (params, response.text)
        assert response.json()["error"]["code"] == "BAD_INPUT"
        assert response.json()["error"]["message"].startswith(field + " "), (params, response.text)
    unknown = await rest_search(api, token, "bot_" + "0" * 32, "dog")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NOT_FOUND"
    assert await api.codes(SEARCH, {"b": w.bot, "q": "", "l": 5}, token) == ["BAD_INPUT"]
    assert (await rest_search(api, "nope", w.bot, "dog")).status_code == 401


def _decryptions(kind: str) -> float:
    return REGISTRY.get_sample_value("botmemory_decryptions_total", {"kind": kind}) or 0.0


async def test_context_with_a_query_offers_what_answers_it_in_memory_order(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    w = await make_world(api, ("ann",))
    ids = {c: await remember(api, w.tokens["ann"], w.bot, c) for c in FACTS}
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    embedder = LocalMiniLM()
    try:
        # Room for two lines: relevance chooses them, memory order (newest first) presents them.
        room = len("- Ann has a dog called Rex\n- Ann is allergic to peanuts")
        before = _decryptions("entry")
        got = await search.context(
            runtime, embedder, w.bot, reader, room, query="Which animal lives with Ann?"
        )
        assert ids["Ann has a dog called Rex"] in got.ids
        assert len(got.ids) <= 2 and len(got.text) <= room
        assert _decryptions("entry") - before == len(got.ids)  # E2: only what is returned
        order = [i for i in reversed(list(ids.values())) if i in got.ids]
        assert list(got.ids) == order  # chosen by relevance, shown in memory order
        # Without a query it is the memory-order context, newest first.
        plain = await search.context(runtime, embedder, w.bot, reader, room, query=None)
        assert plain.ids[0] == ids[FACTS[-1]]
    finally:
        await embedder.aclose()


async def test_rewrites_packs_and_confide_answers_are_offered_what_answers_them(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Every place that offers memory to a model asks by meaning (design §10): the rewrite by the
    person's input, ``contextPack`` by the latest person message, the confide answer by the Bot's
    words (seed 000: they "only show the memory Bot where to look"). The entry that answers is the
    oldest, and memory order would leave it out of the 4,000 characters."""
    model_server.reset()
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    source = await said(api, w.tokens["ann"], chat, "where things are")
    embedder = LocalMiniLM()
    try:
        [tin] = await learn_facts(
            runtime, w.bot, embedder, "Ann keeps her passport in the blue Zanzibar tin", source=source
        )
        fillers = [
            f"Ann's errand {n}: water the {plant} on shelf {n} and note how tall it grew this week"
            for n, plant in enumerate(("fern", "basil", "cactus", "orchid", "ivy") * 12)
        ]
        await learn_facts(runtime, w.bot, embedder, *fillers, source=source)
    finally:
        await embedder.aclose()
    reader = await memory.chat_reader(runtime, chat)
    assert reader is not None
    in_order = await retrieval.context(runtime, w.bot, reader, runtime.settings.answer_context_chars)
    assert in_order.ids and tin not in in_order.ids  # what every consumer was offered before

    model_server.script(
        "rewrite", Reply(tool_calls=[ToolCall("rewrite_input", {"text": "t", "used_entry_ids": [tin]})])
    )
    turn = await api.turn(w.tokens["ann"], chat, "Where did I put my passport?")
    [rewrite] = model_server.requests_for("rewrite")
    notes = json.loads(rewrite.body["messages"][1]["content"])["notes"]
    assert tin in [n["id"] for n in notes]

    data = await api.gql(
        "query($c: ID!) { contextPack(chatId: $c) { memory { ids } } }", {"c": chat}, w.tokens["ann"]
    )
    assert tin in data["contextPack"]["memory"]["ids"]

    model_server.script("confide", Reply(text="It happens. Tell Ann plainly."))
    await confide(api, w.tokens["ann"], turn["id"], "I could not find the Zanzibar tin she asked about.")
    [answer] = model_server.requests_for("confide")
    assert "Ann keeps her passport in the blue Zanzibar tin" in answer.body["messages"][0]["content"]


async def errands_world(api: Api) -> tuple[World, str, tuple[str, str]]:
    """Ann, her private chat and the Item the errands are learnt from."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    return w, chat, await said(api, w.tokens["ann"], chat, "lists")


async def learn_errands(
    runtime: Runtime, bot: str, embedder: LocalMiniLM, source: tuple[str, str]
) -> list[str]:
    """140 short facts (~20 characters each): their ids."""
    return await learn_facts(
        runtime, bot, embedder, *(f"Ann's errand {n:03d}" for n in range(140)), source=source
    )


async def test_context_with_a_query_fills_its_budget_with_short_lines(api: Api, runtime: Runtime) -> None:
    """Relevance chooses what fills the budget (design §10): 140 entries of ~20 characters fill
    4,000 characters as 140 lines. It asks for what the budget holds at the Bot's mean line
    length (100 before any is known: 50 entries) and at most 100 — the budget was left two thirds
    empty — and now asks again when every entry it asked for fit with room to spare."""
    w, chat, source = await errands_world(api)
    embedder = LocalMiniLM()
    try:
        ids = await learn_errands(runtime, w.bot, embedder, source)
        reader = await memory.chat_reader(runtime, chat)
        assert reader is not None
        got = await search.context(runtime, embedder, w.bot, reader, 4000, query="Which errand is next?")
        assert sorted(got.ids) == sorted(ids) and len(got.text) <= 4000
        again = await search.context(runtime, embedder, w.bot, reader, 4000, query="errands")
        assert sorted(again.ids) == sorted(ids)
    finally:
        await embedder.aclose()


async def test_what_context_learns_of_a_readers_lines_is_kept_for_that_reader(
    api: Api, runtime: Runtime
) -> None:
    """How many entries ``context(query)`` asks for follows the mean length of the lines it gave
    (which entries fill the budget may follow it). Kept per Bot, one reader's lines steered
    another's answer and the time of their search. Kept per reader of the Bot now: Ann's long
    lines move her mean, not Bob's."""
    w = await make_world(api, ("ann", "bob"))
    source = await said(api, w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot), "notes")
    for n in range(6):
        await fact(runtime, w.bot, f"Ann's garden note {n}: " + "tomatoes need water " * 20, source)
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
    assert ann is not None and bob is not None
    default = search.context_wanted(runtime, search.reader_scope(w.bot, bob), 4000)
    got = await search.context(runtime, None, w.bot, ann, 4000, query="garden tomatoes")
    assert len(got.ids) == 6  # lines of ~420 characters: Ann's mean now says so
    assert search.context_wanted(runtime, search.reader_scope(w.bot, ann), 4000) < default
    assert search.context_wanted(runtime, search.reader_scope(w.bot, bob), 4000) == default
    # context without a query sizes its first read by the same mean, kept per reader too (per Bot,
    # Ann's long lines made Bob's first page smaller, and his reads took more statements).
    assert len((await retrieval.context(runtime, w.bot, ann, 4000)).ids) == 6
    assert runtime.line_lengths.mean(w.bot) is None  # before: Ann's lines, kept for the Bot
    assert runtime.line_lengths.mean(search.reader_scope(w.bot, bob)) is None


async def test_context_with_a_query_fills_its_budget_past_an_entry_that_does_not_fit(
    api: Api, runtime: Runtime
) -> None:
    """An entry whose line is longer than the budget, among those asked for, is skipped (N3), and the others fill
    the budget: it asked again only when every entry asked for fit, so one that did not left
    the budget three quarters empty (49 of 140 short lines)."""
    w, chat, source = await errands_world(api)
    embedder = LocalMiniLM()
    try:
        ids = await learn_errands(runtime, w.bot, embedder, source)
        longest = ("Ann's errand list: " + "errand " * 600)[:3999]  # as long as an entry may be
        await learn_facts(runtime, w.bot, embedder, longest, source=source)
        reader = await memory.chat_reader(runtime, chat)
        assert reader is not None
        got = await search.context(runtime, embedder, w.bot, reader, 4000, query="Which errand is next?")
        assert sorted(got.ids) == sorted(ids) and len(got.text) <= 4000
    finally:
        await embedder.aclose()


class Counting:
    """The real embedder, with the texts it was asked for."""

    def __init__(self, inner: LocalMiniLM) -> None:
        self.inner = inner
        self.asked: list[list[str]] = []

    @property
    def id(self) -> str:
        return self.inner.id

    @property
    def dims(self) -> int:
        return self.inner.dims

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.asked.append(list(texts))
        return await self.inner.embed(texts)

    async def aclose(self) -> None:
        """The inner embedder is closed by whoever made it."""


class Gated(Counting):
    """The real embedder, which answers once ``gate`` is set (``called`` tells it was asked)."""

    def __init__(self, inner: LocalMiniLM) -> None:
        super().__init__(inner)
        self.gate, self.called = asyncio.Event(), asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.called.set()
        await self.gate.wait()
        return await super().embed(texts)


async def test_the_logs_times_never_run_backwards_as_its_versions_go_up(api: Api, runtime: Runtime) -> None:
    """A change took its time before it embedded its entries: one whose embedding was slow
    committed after a later change with the earlier time (write-path review). Both kinds of
    change (new entries only, one statement; and any other) take it once they hold the lock."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = ItemRef(*await said(api, w.tokens["ann"], chat, "x"))
    base = await fact(runtime, w.bot, "base", (src.chat, src.item))
    inner = LocalMiniLM()
    try:
        for slow_change in (
            [AddFact(content="slow to embed", sources=(src,))],
            [AddFact(content="slow with a change", sources=(src,)), SetTopics(base, ("later",))],
        ):
            gated = Gated(inner)
            slow = asyncio.create_task(
                apply_changes(runtime, w.bot, list[MemoryChange](slow_change), "memory_bot", embedder=gated)
            )
            await gated.called.wait()
            asked = time_ms()

            async def ticked(asked: int = asked) -> bool:  # past the slow change's start
                return time_ms() > asked

            await until(ticked, "the clock never moved", within=5, every=0.001)
            quick = await apply(runtime, w.bot, AddFact(content="quick", sources=(src,)))
            gated.gate.set()
            late = await slow
            assert late.version > quick.version and late.at >= quick.at, (late, quick)
    finally:
        await inner.aclose()


async def test_a_query_embedded_early_is_embedded_once_and_ranks_the_same(api: Api, runtime: Runtime) -> None:
    """``startTurn`` starts the query's embedding beside the Turn's write (search.EarlyQuery): the
    search then takes that embedding (the text embedded once, as the search strips it) and
    chooses what it would have chosen; any other text goes to the embedder."""
    w = await make_world(api, ("ann",))
    for c in FACTS:
        await remember(api, w.tokens["ann"], w.bot, c)
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    inner = LocalMiniLM()
    counting = Counting(inner)
    try:
        question = "Which animal lives with Ann?"
        early = search.EarlyQuery(counting, f"  {question}\n")
        early.start()
        early.start()  # a retried write starts it again: still once
        got = await search.context(runtime, early, w.bot, reader, 60, query=question)
        assert counting.asked == [[question]]
        assert got == await search.context(runtime, inner, w.bot, reader, 60, query=question)
        assert got.ids
        await early.aclose()  # already taken: nothing to drop
        unused = search.EarlyQuery(counting, "Where does Ann park her bicycle?")
        unused.start()
        hits = await search.search(runtime, unused, w.bot, reader, "dog", 3)
        await unused.aclose()
        assert hits and sorted(counting.asked[1:]) == [["Where does Ann park her bicycle?"], ["dog"]]
    finally:
        await inner.aclose()


async def test_start_turn_embeds_its_query_only_for_a_caller_who_may_write_the_chat(
    api: Api, runtime: Runtime
) -> None:
    """``startTurn`` embeds the person's words beside the Turn's write, but only once the caller
    may write the Chat: started before that check, any token with any chat id (another
    organization's, or none) spent the process's one embedder on a refused request (D9.4)."""
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    theirs = await api.chat(other.tokens["zed"], other.bot)
    mine = await api.chat(w.tokens["ann"], w.bot)
    ann = Principal("person", person_id=w.people["ann"], organization_id=w.org)
    inner = LocalMiniLM()
    counting = Counting(inner)
    gateway = cast(Gateway, SimpleNamespace(embedder=counting))
    try:
        for chat in (theirs, "chat_unknown"):
            with pytest.raises(NotFound):
                await enrichment.start_turn(
                    runtime, gateway, ann, chat, "Where is my bicycle?", actor_id=None, notice=False
                )
        assert counting.asked == []
        early = search.EarlyQuery(counting, "Where is my bicycle?")
        try:
            await turns.start_turn(
                runtime, ann, mine, "Where is my bicycle?", actor_id=None, notice=False, allowed=early.start
            )
            assert counting.asked == [["Where is my bicycle?"]]  # started beside the write
        finally:
            await early.aclose()
    finally:
        await inner.aclose()


async def test_two_api_processes_agree_at_once_after_every_kind_of_change(
    api: Api, runtime: Runtime, settings: Settings, service_env: dict[str, str]
) -> None:
    """Each API process keeps its own vector index; neither is ever stale across a memory version:
    an entry written through one process is found by the other at once, and Forget, invalidation,
    a narrowing and a widening of its audience, purge and a removal from a channel take effect in
    both at once (C1, design §10)."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    other = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api-second.log", service_env)
    try:
        async with httpx.AsyncClient(base_url=other.url, timeout=30) as http:
            second = Api(http, api.admin_token)

            async def ids(on: Api, name: str, q: str) -> list[str]:
                response = await rest_search(on, w.tokens[name], w.bot, q, 10)
                assert response.status_code == 200, response.text
                return [r["entry"]["id"] for r in response.json()["results"]]

            first_note = await remember(api, w.tokens["ann"], w.bot, "Ann parks her bicycle by the river")
            assert await ids(second, "ann", "where is the bike?") == [first_note]  # cold load of B
            # Written through A after B loaded its index: B finds it at once, by meaning.
            new = await remember(api, w.tokens["ann"], w.bot, "Ann's violin lessons are on Fridays")
            assert (await ids(second, "ann", "when does she practise music?"))[0] == new
            # Forget through B: gone on A at once.
            assert (
                await command(second, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": new})
            ).status_code == 200
            assert new not in await ids(api, "ann", "when does she practise music?")
            # A group fact, then invalidation (written by the memory Bot) and a channel removal.
            group = await api.chat(w.tokens["ann"], w.bot, w.channel)
            source = await said(api, w.tokens["bob"], group, "the kayak club meets at the lake")
            kayak = await fact(runtime, w.bot, "The kayak club meets at the lake", source)
            assert await ids(second, "bob", "kayak") == [kayak]
            await apply(runtime, w.bot, Invalidate(kayak))
            assert await ids(api, "bob", "kayak") == [] and await ids(second, "bob", "kayak") == []
            again = await fact(runtime, w.bot, "The kayak club moved to the harbour", source)
            assert again in await ids(second, "ann", "kayak")
            # Narrowed to Bob (who said it) before either index saw it, then widened back (Share):
            # both follow.
            canoe = await fact(runtime, w.bot, "The kayak club rents a canoe", source)
            await apply(runtime, w.bot, Share(canoe, (f"for:person:{w.people['bob']}",)))
            assert canoe not in await ids(api, "ann", "canoe") and canoe not in await ids(
                second, "ann", "canoe"
            )
            await apply(runtime, w.bot, Share(canoe, (f"for:channel:{w.channel}",)))
            assert canoe in await ids(api, "ann", "canoe") and canoe in await ids(second, "ann", "canoe")
            await second.admin(
                "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
                {"c": w.channel, "m": [w.people["bob"]]},
            )
            assert again not in await ids(api, "ann", "kayak")
            assert set(await ids(api, "bob", "kayak")) == {again, canoe}
            # Purge by the chat's tag through A: gone on B.
            purged = await api.http.post(
                f"/v1/bots/{w.bot}/memory/purge",
                json={"tag": f"chat:{group}"},
                headers={"Authorization": f"Bearer {w.tokens['bob']}"},
            )
            assert purged.status_code == 200, purged.text
            assert await ids(second, "bob", "kayak") == []
    finally:
        other.stop()


async def test_a_reader_is_ranked_among_the_entries_of_their_keys_never_stale(
    api: Api, runtime: Runtime
) -> None:
    """The index proposes only entries whose audience key the reader holds (design §10): Bob sees
    2 of 62 entries, and every candidate his searches walk passes — none of Ann's 60 is proposed.
    The index holds each entry's key as of the last change, since a change of key is stamped like
    a new vector: a new fact, a narrowing and a widening (Share, V6), an invalidation and a
    removal from the channel each show at once."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    mine = await said(api, w.tokens["ann"], private, "notes to self")
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    ours = await said(api, w.tokens["ann"], group, "team news")
    embedder = LocalMiniLM()
    try:
        await learn_facts(
            runtime,
            w.bot,
            embedder,
            *(f"Ann's errand number {n} is about the bakery" for n in range(60)),
            source=mine,
        )
        cake, lunch = await learn_facts(
            runtime, w.bot, embedder, "The team cake is on Friday", "The team lunch is at noon", source=ours
        )
        bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
        assert bob is not None
        keys = tuple(reader_keys(list(bob.readers)))

        async def found(query: str) -> list[str]:
            reader = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
            assert reader is not None  # read per search, as a request does
            return [h.entry.id for h in await search.search(runtime, embedder, w.bot, reader, query, 10)]

        assert set(await found("bakery errand")) == {cake, lunch}
        assert runtime.vectors.passing(w.bot, keys) == 1.0  # nothing of Ann's was walked
        # A new fact he may see: found at once.
        (party,) = await learn_facts(runtime, w.bot, embedder, "The team party is in the garden", source=ours)
        assert party in await found("party")
        # Narrowed to Ann before any search saw it (the index takes it in with Ann's key), then
        # widened back to the channel: found at once.
        (picnic,) = await learn_facts(runtime, w.bot, embedder, "The team picnic is by the lake", source=ours)
        await apply(runtime, w.bot, Share(picnic, (f"for:person:{w.people['ann']}",)))
        assert picnic not in await found("picnic")
        await apply(runtime, w.bot, Share(picnic, (f"for:channel:{w.channel}",)))
        assert picnic in await found("picnic")
        # Invalidated: gone at once.
        await apply(runtime, w.bot, Invalidate(cake))
        assert cake not in await found("cake")
        # Out of the channel: his keys change, so do the entries proposed to him.
        await api.admin(
            "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
            {"c": w.channel, "m": [w.people["ann"]]},
        )
        assert await found("party") == []
    finally:
        await embedder.aclose()


async def test_an_older_catch_up_arriving_late_never_puts_an_entry_back(api: Api, runtime: Runtime) -> None:
    """Two searches of one Bot run at once; the answer of the statement that read earlier may be
    taken in last. It then holds the picnic as it was (narrowed to Ann) under a sequence older
    than the index's: taken in, it would put the old audience key back, the index would call it
    current, and Bob would never be proposed the picnic again from this process."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    ours = await said(api, w.tokens["ann"], group, "team news")
    embedder = LocalMiniLM()
    try:
        (picnic,) = await learn_facts(runtime, w.bot, embedder, "The team picnic is by the lake", source=ours)
        await apply(runtime, w.bot, Share(picnic, (f"for:person:{w.people['ann']}",)))
        ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
        bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
        assert ann is not None and bob is not None
        assert [h.entry.id for h in await search.search(runtime, embedder, w.bot, ann, "picnic", 5)] == [
            picnic
        ]
        index = runtime.vectors.of(w.bot, embedder.id)
        cipher = await memory.cipher_of(runtime, w.bot)
        loaded = index.seq

        async def statement(after: int) -> Any:
            """A search statement that read the entries stamped after ``after`` (nothing walked)."""
            q = search._Query(w.bot, bob, None, [], 5, False)  # pyright: ignore[reportPrivateUsage]
            return await autocommit(runtime.driver, lambda s: q.run(s, index, [], [], after))

        earlier = await statement(0)  # the picnic narrowed to Ann
        await apply(runtime, w.bot, Share(picnic, (f"for:channel:{w.channel}",)))
        later = await statement(loaded)  # the picnic widened back to the channel
        assert picnic in earlier["fresh"]["ids"] and picnic in later["fresh"]["ids"]
        assert int(earlier["seq"]) < int(later["seq"])
        index.seq = loaded
        search.catch_up(index, cipher, later)
        search.catch_up(index, cipher, earlier)  # arrives last
        assert index.seq == int(later["seq"])
        assert [h.entry.id for h in await search.search(runtime, embedder, w.bot, bob, "picnic", 5)] == [
            picnic
        ]
    finally:
        await embedder.aclose()


async def test_a_reader_who_sees_a_fifth_of_the_entries_finds_the_oldest_that_answers(
    api: Api, runtime: Runtime
) -> None:
    """Bob sees 15 of 75 entries, and what Ann alone sees is nearer to the question than most of
    his: too few of his would be among the nearest of the whole pool. He is ranked among the
    entries of his keys (design §10), and the oldest of his, the one that answers, comes first
    (before session 25, a reader who saw more than 5,000 entries of a large Bot was ranked among
    the newest 5,000 alone)."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    mine = await said(api, w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot), "notes to self")
    ours = await said(api, w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot, w.channel), "team news")
    embedder = LocalMiniLM()
    try:
        (pet,) = await learn_facts(
            runtime, w.bot, embedder, "The team adopted a quokka called Pip", source=ours
        )
        newer = await learn_facts(
            runtime,
            w.bot,
            embedder,
            *(f"The team budget meeting number {n} is on a Monday" for n in range(14)),
            source=ours,
        )
        # What Ann alone sees is nearer to the question than most of what Bob sees.
        await learn_facts(
            runtime,
            w.bot,
            embedder,
            *(f"Ann saw a wild animal number {n} at the zoo" for n in range(60)),
            source=mine,
        )
        question = "Which animal did the team adopt?"
        bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
        assert bob is not None
        for _ in range(2):  # the second search from the rows kept of his keys
            hits = await search.search(runtime, embedder, w.bot, bob, question, 10)
            assert hits[0].entry.id == pet
            assert {h.entry.id for h in hits} <= {pet, *newer}
            assert runtime.vectors.passing(w.bot, tuple(reader_keys(list(bob.readers)))) == 1.0
            offered = await search.context(runtime, embedder, w.bot, bob, 4_000, question)
            assert pet in offered.ids and set(offered.ids) <= {pet, *newer}
    finally:
        await embedder.aclose()


async def test_keywords_alone_find_entries_and_the_upgrade_stamps_older_ones(
    api: Api, runtime: Runtime
) -> None:
    """Without an embedder an entry is found by its blind keywords alone (D9.29: the process's
    index holds every entry with keywords, stamped with the derived-data sequence). Entries that
    got keywords without a vector before schema version 10 had no stamp; the upgrade gives them
    one, and a process that loads the Bot afterwards finds them."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    item = await said(api, w.tokens["ann"], chat, "I went to Zanzibar")
    zanzibar, cello = (
        AddFact(content="Ann visited Zanzibar", sources=(ItemRef(*item),)),
        AddFact(content="Ann plays the cello", sources=(ItemRef(*item),)),
    )
    await apply_changes(runtime, w.bot, [zanzibar, cello], "memory_bot", embedder=None)
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None

    async def found(rt: Runtime, query: str) -> list[str]:
        return [h.entry.id for h in await search.search(rt, None, w.bot, ann, query, 5)]

    assert await found(runtime, "zanzibar") == [zanzibar.id]
    # As written before version 10: keywords, no stamp. A process loading the Bot misses them…
    await runtime.driver.execute_query("MATCH (e:Entry {botId: $b}) REMOVE e.vecSeq", b=w.bot)
    assert await found(dataclasses.replace(runtime, vectors=VectorIndexes()), "zanzibar") == []
    # …until the upgrade stamps them.
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 9")
    assert await migrate(runtime.driver) == LATEST
    fresh = dataclasses.replace(runtime, vectors=VectorIndexes())
    assert await found(fresh, "zanzibar") == [zanzibar.id]
    assert await found(fresh, "cello") == [cello.id]


async def ann_learns(
    api: Api, runtime: Runtime, contents: list[str]
) -> tuple[World, list[AddFact], memory.Reader]:
    """A world of Ann alone whose memory Bot learnt ``contents`` from one Item of her chat (keywords
    only: no embedder), and Ann as a reader."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    item = await said(api, w.tokens["ann"], chat, "notes")
    facts = [AddFact(content=c, sources=(ItemRef(*item),)) for c in contents]
    await apply_changes(runtime, w.bot, list(facts), "memory_bot", embedder=None)
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None
    return w, facts, ann


async def test_names_and_words_of_any_script_are_found_by_their_keywords(api: Api, runtime: Runtime) -> None:
    """Keyword recall for names and rare words in any script (DESIGN §10, ``services.keywords``
    since scheme 2): written without an embedder, so only the blind keywords can find them;
    accents fold (a name typed without them is found), Han and kana are matched by pairs of
    characters and Thai by pairs of clusters, Russian cases meet on their stem. With scheme 1
    (``[a-z0-9]`` runs) none of these queries found anything."""
    contents = {
        "Шарик": "Собаку Анны зовут Шарик",
        "jose muller": "Ann met José at the Café Müller",
        "小白": "安娜的猫叫小白",
        "寿司": "アンは東京で寿司を食べた",
        "Γιώργος": "Ο αδελφός της Άννας λέγεται Γιώργος",
        "สมชาย": "แอนพบสมชายที่ตลาด",
        "harbour": "Ann walked along the harbour",
    }
    w, learnt, ann = await ann_learns(api, runtime, list(contents.values()))
    facts = dict(zip(contents, learnt, strict=True))
    for query, fact_ in facts.items():
        hits = await search.search(runtime, None, w.bot, ann, query, 5)
        assert [h.entry.id for h in hits] == [fact_.id], query
    # Through the API process (its embedder's vectors are missing here: keywords alone), and in
    # context(query), which offers the entry that holds the word.
    response = await rest_search(api, w.tokens["ann"], w.bot, "ШАРИКА", 1)  # another case
    assert [r["entry"]["id"] for r in response.json()["results"]] == [facts["Шарик"].id]
    offered = await search.context(runtime, None, w.bot, ann, 40, "Jose")
    assert offered.ids == (facts["jose muller"].id,)


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_searches_are_counted_for_operators(api: Api, runtime: Runtime, settings: Settings) -> None:
    """What searches did is on ``/metrics`` (``botmemory_search_*``, README): statements by
    outcome, candidates walked by whether they passed, index loads and catch-ups, queries
    searched by keywords alone because their embedding failed (a real ``openai`` client against
    a port nobody listens on)."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    item = await said(api, w.tokens["ann"], chat, "I went to Zanzibar")
    first = AddFact(content="Ann visited Zanzibar", sources=(ItemRef(*item),))
    await apply_changes(runtime, w.bot, [first], "memory_bot")
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None
    names = ("answered", "caught_up", "lost", "further")
    before = {o: sample("botmemory_search_statements_total", {"outcome": o}) for o in names}
    passed = sample("botmemory_search_candidates_total", {"result": "passed"})
    refused = sample("botmemory_search_candidates_total", {"result": "refused"})
    loads = sample("botmemory_search_index_load_seconds_count")
    caught_up = sample("botmemory_search_index_caught_up_total")

    assert len(await search.search(runtime, None, w.bot, ann, "zanzibar", 5)) == 1
    assert sample("botmemory_search_index_load_seconds_count") == loads + 1  # its first search here
    later = AddFact(content="Ann swam off Zanzibar", sources=(ItemRef(*item),))
    await apply_changes(runtime, w.bot, [later], "memory_bot")
    assert len(await search.search(runtime, None, w.bot, ann, "zanzibar", 5)) == 2
    after = {o: sample("botmemory_search_statements_total", {"outcome": o}) for o in names}
    assert {o: after[o] - before[o] for o in names} == {
        "answered": 2,
        "caught_up": 1,
        "lost": 0,
        "further": 0,
    }
    assert sample("botmemory_search_index_caught_up_total") == caught_up + 1
    assert sample("botmemory_search_candidates_total", {"result": "passed"}) == passed + 3
    assert sample("botmemory_search_candidates_total", {"result": "refused"}) == refused

    with socket.socket() as free:  # a port nobody listens on once closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    down = OpenAIEmbedder(
        settings.model_copy(
            update={
                "embedding_model": "down",
                "embedding_dimensions": 384,
                "embedding_base_url": f"http://127.0.0.1:{port}/v1",
            }
        )
    )
    failed = sample("botmemory_query_embedding_failures_total", {"code": "provider_error"})
    try:
        hits = await search.search(runtime, down, w.bot, ann, "zanzibar", 5)
    finally:
        await down.aclose()
    assert {h.entry.id for h in hits} == {first.id, later.id}  # by keywords alone
    assert sample("botmemory_query_embedding_failures_total", {"code": "provider_error"}) == failed + 1
    # The API process counts its own.
    response = await rest_search(api, w.tokens["ann"], w.bot, "zanzibar", 5)
    assert len(response.json()["results"]) == 2
    text = (await api.http.get("/metrics")).text
    answered = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('botmemory_search_statements_total{outcome="answered"} ')
    )
    assert answered >= 1


async def test_an_index_is_loaded_in_pages_and_holds_every_entry(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first search of a Bot in a process reads its entries' derived data in records of
    ``DERIVED_PAGE`` entries (one huge record decodes ~3× slower): every page lands in the index."""
    w, facts, ann = await ann_learns(api, runtime, [f"Ann saw boat {i} in the harbour" for i in range(7)])
    monkeypatch.setattr(search_q, "DERIVED_PAGE", 2)  # 4 pages
    fresh = dataclasses.replace(runtime, vectors=VectorIndexes())
    hits = await search.search(fresh, None, w.bot, ann, "harbour", 10)
    assert {h.entry.id for h in hits} == {f.id for f in facts}
    assert len(fresh.vectors.of(w.bot, "")) == 7


async def test_a_cold_load_takes_no_lock_and_what_a_write_stamps_meanwhile_is_caught_up(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold load reads the Memory's derived-data sequence, then every entry's derived data, with
    no lock (``graph.search.DERIVED_SEQ``): a change of the Bot commits while the load's read is
    open (under the shared lock it would wait for the load to end), and the first search catches
    the index up with what that change stamped before anything is proposed — the revised entry is
    found by its new words only, the new one is found."""
    w, facts, ann = await ann_learns(api, runtime, [f"Ann saw boat {i} in the harbour" for i in range(7)])
    monkeypatch.setattr(search_q, "DERIVED_PAGE", 2)  # 4 pages,
    monkeypatch.setattr(search, "ABSORB_PART", 2)  # fetched one by one: the read stays open
    pages = search_q.derived_pages
    added = AddFact(content="Ann rowed across the harbour at dawn", sources=facts[0].sources)
    changed: list[bool] = []

    async def pages_with_a_change(tx: Any, **kw: Any) -> Any:
        async for page in pages(tx, **kw):
            if not changed:  # after the first page: the load's read is open
                change: list[MemoryChange] = [Revise(facts[0].id, "Ann saw a canoe on the lake"), added]
                await asyncio.wait_for(apply_changes(runtime, w.bot, change, "memory_bot", embedder=None), 30)
                changed.append(True)
            yield page

    monkeypatch.setattr(search_q, "derived_pages", pages_with_a_change)
    fresh = dataclasses.replace(runtime, vectors=VectorIndexes())
    hits = await search.search(fresh, None, w.bot, ann, "harbour", 10)
    assert changed
    assert {h.entry.id for h in hits} == {f.id for f in facts[1:]} | {added.id}
    assert [h.entry.id for h in await search.search(fresh, None, w.bot, ann, "canoe", 10)] == [facts[0].id]


async def test_a_stale_node_id_costs_a_lookup_never_a_result(api: Api, runtime: Runtime) -> None:
    """The walk seeks candidates by the node ids the index holds (D9.29); ids it cannot place (a
    store copied to another database, an entry purged) are looked up by entry id and the search
    asks again, so a stale node id never costs a result."""
    w, facts, ann = await ann_learns(api, runtime, [f"Ann keeps a kayak number {n}" for n in range(5)])

    async def found() -> set[str]:
        return {h.entry.id for h in await search.search(runtime, None, w.bot, ann, "kayak", 10)}

    assert await found() == {f.id for f in facts}
    # As if the store had moved to another database: every node id the index holds is unknown.
    index = runtime.vectors.of(w.bot, "")
    index.upsert(["not-an-entry"], ["4:another-database:1"], [""], [False], [1], [""], None)
    assert index.nodes_of([facts[0].id]) == [""]
    assert await found() == {f.id for f in facts}
    assert index.nodes_of([facts[0].id])[0].startswith("4:")  # learnt again


async def test_a_cold_load_that_fails_part_way_leaves_no_row_behind(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Bot's first search loads its index in parts (ABSORB_PART); a load that failed after a
    part (the connection lost, the driver's retry of its read) kept that part's rows in the
    index, and the next load read the rest into it: an entry purged in between stayed as a row
    no catch-up drops (its purge stamped before the new load's sequence), proposed and counted
    by BM25 until a walk lost it. The failed load discards the index: the next search loads a
    new one."""
    w, facts, ann = await ann_learns(api, runtime, [f"Ann keeps a canoe number {n}" for n in range(4)])
    other = await api.chat(w.tokens["ann"], w.bot)
    gone = AddFact(
        content="Ann keeps a canoe paddle", sources=(ItemRef(*await said(api, w.tokens["ann"], other, "x")),)
    )
    await apply_changes(runtime, w.bot, [gone], "memory_bot", embedder=None)
    fresh = dataclasses.replace(runtime, vectors=VectorIndexes())
    absorb = search._absorb  # pyright: ignore[reportPrivateUsage]

    def absorbs_then_fails(*args: Any) -> None:
        absorb(*args)
        raise OSError("the connection dropped after the first part")

    monkeypatch.setattr(search, "_absorb", absorbs_then_fails)
    with pytest.raises(OSError, match="after the first part"):
        await search.search(fresh, None, w.bot, ann, "canoe", 10)
    monkeypatch.undo()
    index = fresh.vectors.of(w.bot, "")
    assert (len(index), index.seq) == (0, -1)
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{other}"}, headers=bearer(w.tokens["ann"])
    )
    assert purged.json() == {"removed": 1}, purged.text
    lost = sample("botmemory_search_statements_total", {"outcome": "lost"})
    hits = await search.search(fresh, None, w.bot, ann, "canoe", 10)
    assert {h.entry.id for h in hits} == {f.id for f in facts}
    assert sample("botmemory_search_statements_total", {"outcome": "lost"}) == lost  # no ghost met
    assert len(index) == len(facts)


async def test_writes_during_every_attempt_leave_no_entry_out_of_the_search(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search whose statement hands back entries stamped after its index ranked catches up and
    asks again, at most _ATTEMPTS times. Under writes that kept coming, the last answer was the
    one ranked before its catch-up: an entry written just before the search was left out of it.
    Now the last ranking is made with the index caught up and its answer stands, whatever was
    stamped while its own statement ran."""
    w, facts, ann = await ann_learns(api, runtime, ["Ann keeps a kayak on the roof"])
    assert [h.entry.id for h in await search.search(runtime, None, w.bot, ann, "kayak", 10)] == [facts[0].id]
    chat = await api.chat(w.tokens["ann"], w.bot)
    item = ItemRef(*await said(api, w.tokens["ann"], chat, "more notes"))
    trailer = AddFact(content="Ann bought a kayak trailer", sources=(item,))
    await apply_changes(runtime, w.bot, [trailer], "memory_bot", embedder=None)
    walk = search_q.search_entries
    writes = 0

    async def written_beside(tx: Any, found: search_q.Walk) -> Any:
        nonlocal writes
        writes += 1
        filler = AddFact(content=f"Ann waters plant {writes}", sources=(item,))
        await apply_changes(runtime, w.bot, [filler], "memory_bot", embedder=None)
        return await walk(tx, found)

    monkeypatch.setattr(search, "_ATTEMPTS", 1)
    monkeypatch.setattr(search_q, "search_entries", written_beside)
    hits = await search.search(runtime, None, w.bot, ann, "kayak", 10)
    assert writes == 2  # every statement met a write made after its ranking
    assert {h.entry.id for h in hits} == {facts[0].id, trailer.id}


async def test_a_purge_leaves_every_index_at_its_next_catch_up_never_by_lost_walks(
    api: Api, runtime: Runtime
) -> None:
    """A purge records the node ids its entries had, stamped as derived data (``Purged``, D9.20):
    the next search of every process drops them before ranking — no walk meets them, and BM25
    counts them no more. A process that missed the record (kept a day) loses them by walks, all
    the walked candidates looked up at once: twelve of the best candidates purged, asked for
    one, the survivor is found and a later search meets none of them again."""
    w, facts, ann = await ann_learns(api, runtime, ["Ann's kayak paddles hang in the garage"])
    [survivor] = facts
    index = runtime.vectors.of(w.bot, "")

    async def trips(tag: str) -> str:
        other = await api.chat(w.tokens["ann"], w.bot)
        item = await said(api, w.tokens["ann"], other, f"trip notes {tag}")
        made = [
            AddFact(content=f"Ann's kayak trip {n} on the kayak river {tag}", sources=(ItemRef(*item),))
            for n in range(12)
        ]
        await apply_changes(runtime, w.bot, list(made), "memory_bot", embedder=None)
        return other

    async def best() -> list[str]:
        return [h.entry.id for h in await search.search(runtime, None, w.bot, ann, "kayak", 1)]

    async def purge(chat: str) -> None:
        purged = await api.http.post(
            f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{chat}"}, headers=bearer(w.tokens["ann"])
        )
        assert purged.status_code == 200 and purged.json()["removed"] == 12, purged.text

    async def records() -> list[dict[str, Any]]:
        found, _, _ = await runtime.driver.execute_query(
            "MATCH (p:Purged {botId: $b}) RETURN p {.*} AS p ORDER BY p.vecSeq", b=w.bot
        )
        return [dict(r["p"]) for r in found]

    first = await trips("one")
    assert await best() != [survivor.id]  # the index now holds the trips, ranked above them
    documents = index.keywords.documents_of(np.arange(len(index), dtype=np.int64))
    await purge(first)
    lost = sample("botmemory_search_statements_total", {"outcome": "lost"})
    assert await best() == [survivor.id]
    assert sample("botmemory_search_statements_total", {"outcome": "lost"}) == lost  # none met
    assert index.keywords.documents_of(np.arange(len(index), dtype=np.int64)) == documents - 12
    [record] = await records()
    assert len(record["nodes"]) == 12

    # A record older than a day goes with the next purge; a process that missed a record (one
    # gone after a day) loses its entries by walks, and then never meets them again.
    second = await trips("two")
    assert await best() != [survivor.id]
    await runtime.driver.execute_query(
        "MATCH (p:Purged {botId: $b}) SET p.at = p.at - $days", b=w.bot, days=2 * 86_400_000
    )
    await purge(second)
    [newer] = await records()
    assert newer["vecSeq"] > record["vecSeq"]
    await runtime.driver.execute_query("MATCH (p:Purged {botId: $b}) DELETE p", b=w.bot)
    assert await best() == [survivor.id]
    rounds = sample("botmemory_search_statements_total", {"outcome": "lost"}) - lost
    assert 1 <= rounds < 12  # every walked candidate looked up at once, not one a statement
    assert await best() == [survivor.id]
    assert sample("botmemory_search_statements_total", {"outcome": "lost"}) - lost == rounds


async def test_the_index_scans_on_the_threads_the_settings_give_it(settings: Settings) -> None:
    """numpy's BLAS runs on ``index_threads`` threads (1) while a runtime is open (its idle workers
    would spin on the cores Neo4j needs), and gets the limit it had back when the runtime closes.
    The runtime's indexes are bounded by ``index_memory_mb``."""
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        async with open_runtime(settings.model_copy(update={"index_memory_mb": 7})) as rt:
            assert settings.index_threads == 1
            assert _blas_threads() == [1]
            assert rt.vectors.max_bytes == 7 * 2**20
        assert _blas_threads() == before


def _blas_threads() -> list[int]:
    pools = cast(list[dict[str, Any]], threadpool_info())
    return [int(pool["num_threads"]) for pool in pools if pool["user_api"] == "blas"]


async def test_the_walk_keeps_the_first_candidates_that_pass_in_their_order(
    api: Api, runtime: Runtime
) -> None:
    """The search statement walks the candidates best first and keeps the first ``limit`` that
    are active and visible (C1, V10): one hidden from the reader, one invalidated and one whose
    node id is unknown (lost: the caller looks it up and asks again) are passed over in place,
    and ``walked`` says where the walk stopped (design §10: what the pass share is learnt from)."""
    w = await make_world(api, ("ann", "bob"))
    mine = await said(api, w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot), "notes")
    his = await said(api, w.tokens["bob"], await api.chat(w.tokens["bob"], w.bot), "notes")
    own = [AddFact(content=f"Ann's note number {n}", sources=(ItemRef(*mine),)) for n in range(4)]
    hidden = AddFact(content="Bob's own note", sources=(ItemRef(*his),))
    await apply_changes(runtime, w.bot, [*own, hidden], "memory_bot", embedder=None)
    await apply(runtime, w.bot, Invalidate(own[3].id))
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry) WHERE e.botId = $b RETURN e.id AS id, elementId(e) AS node", b=w.bot
    )
    node = {r["id"]: r["node"] for r in records}

    async def walk(cands: list[str], limit: int) -> search_q.SearchRow[search_q.RankedEntry]:
        nodes = [node.get(c, "") for c in cands]
        scores = [1.0 - i / 100 for i in range(len(cands))]
        step = search_q.Walk(w.bot, w.org, ann.params["readers"], cands, nodes, scores, "", 1 << 60, limit)
        found = await autocommit(runtime.driver, lambda s: search_q.search_entries(s, step))
        assert found is not None
        return found

    # hidden, Ann's 0, invalidated, Ann's 1, Ann's 2: the first two that pass are 0 and 1.
    found = await walk([hidden.id, own[0].id, own[3].id, own[1].id, own[2].id], 2)
    assert [r["entry"]["id"] for r in found["ranked"]] == [own[0].id, own[1].id]
    assert (found["visible"], found["walked"], found["lost"]) == (2, 4, [])
    assert [r["score"] for r in found["ranked"]] == [0.99, 0.97]
    # Fewer pass than asked for: the whole list is walked.
    found = await walk([own[2].id, hidden.id], 2)
    assert (found["visible"], found["walked"]) == (1, 2)
    # An unknown node id is lost in place; it counts towards the walk, which stops at the limit.
    found = await walk([own[0].id, "no-such-entry", own[1].id, own[2].id], 2)
    assert found["lost"] == [1] and found["walked"] == 2
    assert [r["entry"]["id"] for r in found["ranked"]] == [own[0].id]


async def test_indexes_dropped_to_stay_within_the_bound_are_loaded_again(api: Api, runtime: Runtime) -> None:
    """With ``index_memory_mb`` too small for two Bots, each search drops the other Bot's index
    (the least recently searched) and a search of that Bot loads it again: the same results, and
    a fact learnt meanwhile is found at once."""
    rt = dataclasses.replace(runtime, vectors=VectorIndexes(max_bytes=1))
    bots: dict[str, tuple[str, memory.Reader, tuple[str, str]]] = {}

    async def learn(name: str, *contents: str) -> None:
        bot, _, item = bots[name]
        facts = [AddFact(content=c, sources=(ItemRef(*item),)) for c in contents]
        await apply_changes(rt, bot, list(facts), "memory_bot", embedder=None)

    for name in ("ann", "bob"):
        w = await make_world(api, (name,))
        item = await said(api, w.tokens[name], await api.chat(w.tokens[name], w.bot), "notes")
        reader = await memory.person_reader_of(rt, w.bot, w.people[name], w.org)
        assert reader is not None
        bots[name] = (w.bot, reader, item)
        await learn(name, *(f"{name} keeps a kayak number {n}" for n in range(3)))

    async def found(name: str) -> set[str]:
        bot, reader, _ = bots[name]
        return {h.entry.content for h in await search.search(rt, None, bot, reader, "kayak", 10)}

    ann_first = await found("ann")
    assert len(ann_first) == 3
    assert len(await found("bob")) == 3
    assert rt.vectors.held() == [(bots["bob"][0], "")]  # ann's index was dropped
    await learn("ann", "ann keeps a kayak in the shed")
    assert await found("ann") == ann_first | {"ann keeps a kayak in the shed"}
    assert rt.vectors.held() == [(bots["ann"][0], "")]


async def test_what_was_stamped_is_sought_by_its_index_whatever_the_statistics(runtime: Runtime) -> None:
    """The search statement's catch-up and a cold load read the entries stamped after a sequence
    through ``entry_vec_seq``, pinned: left to the planner, once that index had been dropped and
    made again (tests/test_migrations.py does) it read every entry of the Bot through
    ``entry_bot`` and filtered — searches at 10k entries took ~26 ms instead of ~2. So are the
    purges' records, through ``purged_bot_seq``."""

    def seeks(plan: Any) -> list[str]:
        details = str(plan.get("args", {}).get("Details", ""))
        found = [details] if plan["operatorType"].startswith("NodeIndexSeek") else []
        return found + [d for child in plan.get("children", []) for d in seeks(child)]

    for statement in (search_q.SEARCH, search_q.SEARCH_CONTEXT, search_q.DERIVED_SINCE):
        async with runtime.driver.session() as session:
            summary = await (await session.run(cast(Any, "EXPLAIN " + statement))).consume()
        assert summary.plan is not None
        assert any("Entry(botId, vecSeq)" in s and "vecSeq > $after" in s for s in seeks(summary.plan)), (
            statement
        )
        if statement is not search_q.DERIVED_SINCE:  # and the purges since, by theirs
            assert any("Purged(botId, vecSeq)" in s for s in seeks(summary.plan)), statement


#: 3 March and 16 June 2023, at noon UTC: two sessions of a history a platform imported.
MARCH_3, JUNE_16 = 1_677_844_800_000, 1_686_916_800_000
MEMORY_DATES = "query($b: ID!) { memory(botId: $b) { entries { id saidAt createdAt } } }"


async def test_a_question_naming_a_day_finds_what_was_said_on_it(api: Api, runtime: Runtime) -> None:
    """D9.31: an entry is dated by the newest of its sources (an observation by its newest
    source entry, a pinned entry when written; a person may date their own words, as a platform
    importing history does), and a query that names a day, a month or a
    season finds what was said then first. The two facts tie on every word of the questions
    ("Maria"), so without dates one order would answer both."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    march = await said(api, w.tokens["ann"], chat, "Maria: here are my holiday photos", said_at=MARCH_3)
    june = await said(
        api, w.tokens["ann"], chat, "Maria: I baked a lemon cake for the party", said_at=JUNE_16
    )
    photos = await fact(runtime, w.bot, "Maria showed everyone her holiday photos", march)
    cake = await fact(runtime, w.bot, "Maria baked a lemon cake for the party", june)
    # "Yesterday" is the day before the query was said (an imported Turn's saidAt): with room for
    # one line, context(query) holds the fact said that day.
    ann = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert ann is not None
    room = len("Maria showed everyone her holiday photos") + 2
    for said_at, first in ((JUNE_16 + 86_400_000, cake), (MARCH_3 + 86_400_000, photos)):
        got = await search.context(
            runtime, None, w.bot, ann, room, "What did Maria do yesterday?", said_at=said_at
        )
        assert got.ids == (first,)
    both = await observation(runtime, w.bot, "Maria likes to share what she makes", photos, cake)
    pinned = await remember(api, w.tokens["ann"], w.bot, "Maria prefers tea")
    dates = {
        e["id"]: (e["saidAt"], e["createdAt"])
        for e in (await api.gql(MEMORY_DATES, {"b": w.bot}, w.tokens["ann"]))["memory"]["entries"]
    }
    assert {k: v[0] for k, v in dates.items() if k != pinned} == {
        photos: MARCH_3,
        cake: JUNE_16,
        both: JUNE_16,
    }
    assert dates[pinned][0] == dates[pinned][1]
    for question, first in (
        ("What did Maria do on 16 June, 2023?", cake),
        ("What did Maria do on March 3rd 2023?", photos),
        ("What did Maria do in June 2023?", cake),
        ("What did Maria do in March, 2023?", photos),
        ("What did Maria do in spring 2023?", photos),
        ("What did Maria do on the 16th of June?", cake),
    ):
        hits = (await api.gql(SEARCH, {"b": w.bot, "q": question, "l": 4}, w.tokens["ann"]))["search"]
        facts = [h["entry"]["id"] for h in hits if h["entry"]["id"] in (photos, cake)]
        assert facts[0] == first, question


async def test_a_context_pack_counts_yesterday_from_when_its_latest_message_was_said(
    api: Api, runtime: Runtime
) -> None:
    """D9.31: ``contextPack`` asks by the latest person message, and that message's "yesterday"
    is the day before it was said (a history imported gives the time), not before the server's
    clock. The fact said that day is the oldest of more than the 4,000 characters hold: neither
    memory order nor the newest-first prior would offer it."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    day = 86_400_000
    that_day = await said(api, w.tokens["ann"], chat, "the kiln", said_at=MARCH_3)
    kiln = await fact(runtime, w.bot, "Ann fired her first bowl in the kiln", that_day)
    later = await said(api, w.tokens["ann"], chat, "errands", said_at=JUNE_16)
    for n in range(60):
        await fact(
            runtime, w.bot, f"Ann's errand {n}: water the plant on shelf {n} and note its height", later
        )
    await said(api, w.tokens["ann"], chat, "What did I do yesterday?", said_at=MARCH_3 + day)
    pack = "query($c: ID!) { contextPack(chatId: $c) { memory { ids } } }"
    ids = (await api.gql(pack, {"c": chat}, w.tokens["ann"]))["contextPack"]["memory"]["ids"]
    assert 0 < len(ids) < 61 and kiln in ids


async def test_a_context_pack_reads_yesterday_where_its_latest_message_was_said(
    api: Api, runtime: Runtime
) -> None:
    """D9.32: ``contextPack``'s "yesterday" is the day before its latest person message in the
    time zone that message was said in (its speaker's): in Auckland (UTC+13 in March) the fact
    said on the morning of 3 March there was said on 2 March in UTC, and "yesterday" asked late
    on 4 March there (the 4th in UTC too) finds it. Read in UTC, yesterday would be the 3rd, and
    the 60 newer facts would fill the 4,000 characters."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    await api.gql('mutation { setTimeZone(timeZone: "Pacific/Auckland") { id } }', None, ann)
    chat = await api.chat(ann, w.bot)
    morning = 1_677_787_200_000  # 2 March 2023, 20:00 UTC: 3 March, 09:00 in Auckland
    kiln = await fact(
        runtime,
        w.bot,
        "Ann fired her first bowl in the kiln",
        await said(api, ann, chat, "kiln", said_at=morning),
    )
    later = await said(api, ann, chat, "errands", said_at=JUNE_16)
    for n in range(60):
        await fact(
            runtime, w.bot, f"Ann's errand {n}: water the plant on shelf {n} and note its height", later
        )
    late = 1_677_925_800_000  # 4 March 2023, 10:30 UTC: 4 March, 23:30 in Auckland
    await said(api, ann, chat, "What did I do yesterday?", said_at=late)
    pack = "query($c: ID!) { contextPack(chatId: $c) { memory { ids } } }"
    ids = (await api.gql(pack, {"c": chat}, ann))["contextPack"]["memory"]["ids"]
    assert 0 < len(ids) < 61 and kiln in ids
    # The same words said in UTC (the Turn's start names the zone) miss it: the day is the 3rd.
    await said(api, ann, chat, "What did I do yesterday?", said_at=late, time_zone="UTC")
    ids = (await api.gql(pack, {"c": chat}, ann))["contextPack"]["memory"]["ids"]
    assert 0 < len(ids) < 61 and kiln not in ids


async def test_a_persons_own_search_reads_the_days_they_name_where_they_live(
    api: Api, runtime: Runtime
) -> None:
    """D9.32: a person's own ``search`` reads the days its query names in their time zone. In
    Auckland (UTC+13 in March) 3 March runs from 11:00 UTC on the 2nd to 11:00 UTC on the 3rd:
    asked there, "on 3 March 2023" meets what was said at 20:00 UTC on 2 March (09:00 on the 3rd
    there) and at 02:00 UTC on 3 March, not what was said on the 4th; read in UTC (her zone
    cleared), it meets only the 3rd's, and the shortest of the others comes next. The three facts
    share one word of the question; the ranking is by keywords."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    await api.gql('mutation { setTimeZone(timeZone: "Pacific/Auckland") { id } }', None, ann)
    chat = await api.chat(ann, w.bot)
    hour = 3_600_000
    morning = 1_677_787_200_000  # 2 March 2023, 20:00 UTC: 3 March, 09:00 in Auckland
    ids = {}
    for name, at, text in (
        ("there", morning, "Maria baked a lemon cake"),
        ("both", morning + 6 * hour, "Maria painted the garden fence"),
        ("later", morning + 48 * hour, "Maria fixed bikes"),  # fewer words: it wins a tie
    ):
        ids[name] = await fact(runtime, w.bot, text, await said(api, ann, chat, text, said_at=at))
    principal = Principal("person", person_id=w.people["ann"], organization_id=w.org)

    async def first_two() -> set[str]:
        hits = await search.person_search(
            runtime, None, principal, w.bot, "What did Maria do on 3 March 2023?", 3
        )
        return {h.entry.id for h in hits[:2]}

    assert await first_two() == {ids["there"], ids["both"]}
    await api.gql("mutation { setTimeZone(timeZone: null) { id } }", None, ann)
    assert await first_two() == {ids["both"], ids["later"]}


async def test_a_group_that_may_read_nothing_walks_nothing(api: Api, runtime: Runtime) -> None:
    """A group chat one of whose members does not use the Bot reads nothing (D9.1, D9.22). The
    readers a statement is passed only name the group's channel (GROUP_SEEK), so its seeks under
    the channel's and the Bot's keys walked every entry of them for nothing — `hasEntries` and
    `context` the whole audience, a search six walks growing fourfold, teaching the index that
    nothing passes. Only the keys that the readers built under the lock hold, while they use the
    Bot, are sought (HELD_KEYS): the cost no longer grows with the entries, and the search stops
    at once. The same for a private chat whose owner lost their grant."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    item = ItemRef(*await said(api, w.tokens["bob"], group, "the team's plans"))

    async def add(first: int) -> None:
        facts = [
            AddFact(content=f"The team plans river trip {n}", sources=(item,))
            for n in range(first, first + 30)
        ]
        await apply(runtime, w.bot, *facts)

    await add(0)
    reader = await memory.chat_reader(runtime, group)
    assert reader is not None
    assert len((await search.context(runtime, None, w.bot, reader, 4000, "river trip")).ids) == 30
    await api.grant(w.bot, w.people["bob"], "NONE")  # one member no longer uses the Bot
    params = {"botId": w.bot, **reader.params, "keys": reader_keys(list(reader.readers)), "top": TOP_RANK}
    hits = await db_hits(runtime, context_q.HAS_VISIBLE, params)
    await add(30)
    assert await db_hits(runtime, context_q.HAS_VISIBLE, params) == hits  # it walked all 60 before
    assert not await retrieval.has_entries(runtime, w.bot, reader)
    further = sample("botmemory_search_statements_total", {"outcome": "further"})
    assert (await search.context(runtime, None, w.bot, reader, 4000, "river trip")).ids == ()
    assert await search.search(runtime, None, w.bot, reader, "river trip", 10) == []
    assert sample("botmemory_search_statements_total", {"outcome": "further"}) == further
    await api.grant(w.bot, w.people["bob"], "READ")  # every member uses it again: it reads again
    assert len((await search.context(runtime, None, w.bot, reader, 4000, "river trip")).ids) == 60

    # The owner of a private chat who lost their grant reads nothing there either (D9.1), and
    # walked every entry of their own and their channel's keys for it.
    private = await api.chat(w.tokens["ann"], w.bot)
    mine = ItemRef(*await said(api, w.tokens["ann"], private, "my own plans"))

    async def add_mine(first: int) -> None:
        facts = [AddFact(content=f"Ann plans a walk {n}", sources=(mine,)) for n in range(first, first + 30)]
        await apply(runtime, w.bot, *facts)

    await add_mine(0)
    owner = await memory.chat_reader(runtime, private)
    assert owner is not None
    own = {"botId": w.bot, **owner.params, "keys": reader_keys(list(owner.readers)), "top": TOP_RANK}
    await api.grant(w.bot, w.people["ann"], "NONE")
    hits = await db_hits(runtime, context_q.HAS_VISIBLE, own)
    await api.grant(w.bot, w.people["ann"], "WRITE")
    await add_mine(30)
    await api.grant(w.bot, w.people["ann"], "NONE")
    assert await db_hits(runtime, context_q.HAS_VISIBLE, own) == hits
    further = sample("botmemory_search_statements_total", {"outcome": "further"})
    assert (await search.context(runtime, None, w.bot, owner, 4000, "a walk")).ids == ()
    assert sample("botmemory_search_statements_total", {"outcome": "further"}) == further
