"""context, hasEntries, validateReferences (N3, N4) and decrypting only what is returned (E2)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from prometheus_client import REGISTRY

from graph import memory as memory_q
from graph.migrations import LATEST, migrate
from services import memory, retrieval
from services.changes import AddFact, Invalidate, ItemRef, RenameTopic, SetTopics
from services.domain import Principal
from services.runtime import Runtime
from tests.client import Api, World, make_world
from tests.memory_helpers import apply, checked_readers, command, db_hits, fact, said, visible


def entry_decryptions() -> float:
    return REGISTRY.get_sample_value("botmemory_decryptions_total", {"kind": "entry"}) or 0.0


async def test_context_stops_at_the_first_entry_that_does_not_fit(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "facts")
    oldest = await fact(runtime, w.bot, "a" * 10, src)
    middle = await fact(runtime, w.bot, "b" * 50, src)
    newest = await fact(runtime, w.bot, "c" * 10, src)
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    before = entry_decryptions()
    ctx = await retrieval.context(runtime, w.bot, reader, limit=40)
    # Memory order is newest first; the 50-character entry does not fit, so the oldest is not
    # reached even though it would fit (N3), and nothing past the stop is decrypted (E2).
    assert ctx.ids == (newest,)
    assert ctx.text == "- " + "c" * 10
    assert entry_decryptions() - before == 1
    full = await retrieval.context(runtime, w.bot, reader, limit=1000)
    assert full.ids == (newest, middle, oldest)
    assert await retrieval.has_entries(runtime, w.bot, reader)
    tiny = await retrieval.context(runtime, w.bot, reader, limit=3)
    assert tiny.ids == () and tiny.text == ""
    assert await retrieval.has_entries(runtime, w.bot, reader)  # visible even when none fits
    bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
    assert bob is not None and not await retrieval.has_entries(runtime, w.bot, bob)


async def test_validate_references_reads_no_content(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "facts")
    used = await fact(runtime, w.bot, "used in an answer", src)
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    before = entry_decryptions()
    assert await retrieval.validate_references(runtime, w.bot, reader, [used])
    await fact(runtime, w.bot, "a newer entry " + "x" * 3000, src)
    assert await retrieval.validate_references(
        runtime, w.bot, reader, [used]
    )  # new entries never invalidate it
    await apply(runtime, w.bot, Invalidate(used))
    assert not await retrieval.validate_references(runtime, w.bot, reader, [used])  # a revoked source does
    assert entry_decryptions() == before


async def test_group_readers_must_all_pass(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    mine = await fact(runtime, w.bot, "Ann only", await said(api, w.tokens["ann"], private, "mine"))
    team = await fact(runtime, w.bot, "Team", await said(api, w.tokens["bob"], group, "team"))
    readers = await memory.chat_reader(runtime, group)
    assert readers is not None
    # Every member, and the group itself (D9.22): one reader, built from the channel by the
    # statement that checks (the readers passed name the channel); the members' exclusions are
    # read from the channel too.
    checked = await checked_readers(runtime, w.bot, readers)
    assert [(r["id"], r["ids"], r["usesBot"]) for r in checked] == [("#group", ["#group"], True)]
    ctx = await retrieval.context(runtime, w.bot, readers, limit=1000)
    assert ctx.ids == (team,) and mine not in ctx.ids
    # Forgotten by Ann, a member not behind it (an exclusion, V11): not sent for a group that
    # includes her, still for Bob.
    assert (await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": team})).status_code == 200
    assert team not in (await retrieval.context(runtime, w.bot, readers, limit=1000)).ids
    assert team in (await visible(api, w.tokens["bob"], w.bot))
    # Ann leaves the channel: her exclusion no longer hides it from the group (current members).
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": w.channel, "m": [w.people["bob"]]},
    )
    assert (await retrieval.context(runtime, w.bot, readers, limit=1000)).ids == (team,)
    # Forgotten by Bob, the only one behind it: retracted for everyone.
    assert (await command(api, w.tokens["bob"], w.bot, {"_tag": "Forget", "id": team})).status_code == 200
    assert team not in (await retrieval.context(runtime, w.bot, readers, limit=1000)).ids
    # A channel left without members: nobody reads in its group chat.
    await api.admin(
        "mutation($c: ID!) { setChannelMembers(channelId: $c, memberIds: []) { id } }", {"c": w.channel}
    )
    assert await memory.chat_reader(runtime, group) is None


async def test_listing_decrypts_exactly_what_it_returns(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    ann_chat = await api.chat(w.tokens["ann"], w.bot)
    bob_chat = await api.chat(w.tokens["bob"], w.bot)
    for n in range(3):
        await fact(runtime, w.bot, f"ann {n}", await said(api, w.tokens["ann"], ann_chat, f"a{n}"))
    for n in range(4):
        await fact(runtime, w.bot, f"bob {n}", await said(api, w.tokens["bob"], bob_chat, f"b{n}"))
    principal = Principal("person", person_id=w.people["ann"], organization_id=w.org)
    before = entry_decryptions()
    found, _ = await memory.list_entries(runtime, principal, w.bot, [])
    assert len(found) == 3
    assert entry_decryptions() - before == 3


async def hundred_and_fifty_facts(api: Api, runtime: Runtime) -> tuple[World, list[AddFact], memory.Reader]:
    """Ann's world with 150 facts "e000".."e149" (4 characters each) and Ann as the reader."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "facts")
    changes = [AddFact(content=f"e{n:03d}", sources=(ItemRef(*src),)) for n in range(150)]
    await apply(runtime, w.bot, *changes)
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    return w, changes, reader


@pytest.mark.parametrize(("page", "more", "explicit"), [(64, 192, False), (4, 8, True)])
async def test_context_fits_exactly_across_pages(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, page: int, more: int, explicit: bool
) -> None:
    """N3 over several pages of candidates: the limit is met to the character, in memory order —
    within context's one statement (a first page and a second), and, with pages too small for
    that, page by page in one explicit transaction (D9.8)."""
    monkeypatch.setattr(retrieval, "_CONTEXT_PAGE", page)
    monkeypatch.setattr(retrieval, "_CONTEXT_MORE", more)
    w, changes, reader = await hundred_and_fifty_facts(api, runtime)
    explicit_reads: list[object] = []
    real_read = retrieval.read

    async def read(driver: Any, work: Any) -> Any:
        explicit_reads.append(work)
        return await real_read(driver, work)

    monkeypatch.setattr(retrieval, "read", read)
    newest_first = [c.id for c in reversed(changes)]
    # Each line is "- " + 4 characters, joined by newlines: 6 for the first, 7 for each next one.
    exact = await retrieval.context(runtime, w.bot, reader, limit=6 + 7 * 99)
    assert exact.ids == tuple(newest_first[:100]) and len(exact.text) == 6 + 7 * 99
    short = await retrieval.context(runtime, w.bot, reader, limit=6 + 7 * 99 - 1)
    assert short.ids == tuple(newest_first[:99])
    everything = await retrieval.context(runtime, w.bot, reader, limit=10_000)
    assert everything.ids == tuple(newest_first) and everything.text.splitlines()[0] == "- e149"
    assert bool(explicit_reads) == explicit


async def test_context_sizes_its_first_page_by_the_lines_it_returned(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first page of context's statement holds what this Bot's lines say will fit (with a
    quarter to spare): 64 candidates per key before any answer, then budget / mean line. The
    answer is the same whatever the page."""
    w, _, reader = await hundred_and_fifty_facts(api, runtime)
    pages: list[int] = []
    real_context = retrieval.context_q.context

    async def context(tx: Any, *, limit: int, **params: Any) -> Any:
        pages.append(limit)
        return await real_context(tx, limit=limit, **params)

    monkeypatch.setattr(retrieval.context_q, "context", context)
    first = await retrieval.context(runtime, w.bot, reader, limit=6 + 7 * 79)  # 80 lines of 7
    again = await retrieval.context(runtime, w.bot, reader, limit=6 + 7 * 79)
    assert first == again and len(first.ids) == 80
    assert pages == [64, math.ceil((6 + 7 * 79) / 7 * 1.25)]
    small = await retrieval.context(runtime, w.bot, reader, limit=20)  # never below 8
    assert pages[-1] == 8 and len(small.ids) == 3


async def test_get_memory_pages_walk_the_same_list_in_memory_order(api: Api, runtime: Runtime) -> None:
    """GET memory with ``limit``/``after`` (REST and GraphQL): the pages, walked to the end, are
    the unpaged list in the same order — pinned first, history included, others' entries never —
    also with a tag filter; a bad limit or cursor is a 422 / BAD_INPUT naming the field."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    own = await said(api, ann, await api.chat(ann, w.bot), "mine")
    group = await said(api, bob, await api.chat(bob, w.bot, channel=w.channel), "ours")
    theirs = await said(api, bob, await api.chat(bob, w.bot), "bob's")
    changes = [
        AddFact(content=f"{kind} {n}", sources=(ItemRef(*src),), topics=("travel",) if n % 2 else ())
        for n in range(5)
        for kind, src in (("own", own), ("group", group), ("theirs", theirs))
    ]
    await apply(runtime, w.bot, *changes)
    await apply(runtime, w.bot, Invalidate(changes[3].id))  # "own 1": history, still listed
    assert (await command(api, ann, w.bot, {"_tag": "Remember", "content": "pinned"})).status_code == 201

    async def rest_pages(limit: int, tags: str | None = None) -> list[str]:
        ids: list[str] = []
        after: str | None = None
        while True:
            params = (
                {"limit": str(limit)} | ({"after": after} if after else {}) | ({"tags": tags} if tags else {})
            )
            response = await api.http.get(
                f"/v1/bots/{w.bot}/memory", params=params, headers={"Authorization": f"Bearer {ann}"}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert len(body["entries"]) <= limit
            ids += [e["id"] for e in body["entries"]]
            after = body["next"]
            if after is None:
                return ids

    everything = list(await visible(api, ann, w.bot))
    assert len(everything) == 11 and everything[0] not in {c.id for c in changes}  # pinned first
    assert everything[1:] == [c.id for c in reversed(changes) if not c.content.startswith("theirs")]
    for limit in (1, 3, 10, 11, 1000):
        assert await rest_pages(limit) == everything
    assert await rest_pages(2, tags="travel") == list(await visible(api, ann, w.bot, tags="travel"))

    query = "query($b: ID!, $l: Int, $a: String) { memory(botId: $b, limit: $l, after: $a) { entries { id } next } }"
    walked: list[str] = []
    after = None
    while True:
        page = (await api.gql(query, {"b": w.bot, "l": 4, "a": after}, ann))["memory"]
        walked += [e["id"] for e in page["entries"]]
        if (after := page["next"]) is None:
            break
    assert walked == everything

    for bad in ({"limit": "0"}, {"limit": "1001"}, {"limit": "ten"}, {"limit": "3", "after": "not a cursor"}):
        response = await api.http.get(
            f"/v1/bots/{w.bot}/memory", params=bad, headers={"Authorization": f"Bearer {ann}"}
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "BAD_INPUT"
    assert await api.codes(query, {"b": w.bot, "l": 0}, ann) == ["BAD_INPUT"]
    assert await api.codes(query, {"b": w.bot, "l": 2, "a": "bm90IGFuIGlk"}, ann) == ["BAD_INPUT"]


async def test_the_log_pages_back_through_every_change_you_may_see(api: Api, runtime: Runtime) -> None:
    """GET log with ``limit``/``before`` (REST and GraphQL): newest first, the pages walked to
    the end are the unpaged log (rows with nothing the caller may see are left out, so a page may
    be short while ``next`` leads on); a bad limit or version is a 422 / BAD_INPUT."""
    w = await make_world(api, ("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    own = await said(api, ann, await api.chat(ann, w.bot), "mine")
    theirs = await said(api, bob, await api.chat(bob, w.bot), "bob's")
    for n in range(7):
        await fact(runtime, w.bot, f"fact {n}", own if n % 3 else theirs)

    async def log(params: dict[str, str]) -> dict[str, Any]:
        response = await api.http.get(
            f"/v1/bots/{w.bot}/memory/log", params=params, headers={"Authorization": f"Bearer {ann}"}
        )
        assert response.status_code == 200, response.text
        return response.json()

    whole = await log({})
    versions = [c["version"] for c in whole["changes"]]
    assert len(versions) == 4 and versions == sorted(versions, reverse=True) and whole["next"] is None
    for limit in (1, 2, 3, 7):
        walked: list[dict[str, Any]] = []
        params = {"limit": str(limit)}
        while True:
            page = await log(params)
            walked += page["changes"]
            if page["next"] is None:
                break
            params = {"limit": str(limit), "before": str(page["next"])}
        assert walked == whole["changes"]

    query = "query($b: ID!, $l: Int!, $v: Int) { memoryLog(botId: $b, limit: $l, before: $v) { changes { version } next } }"
    first = (await api.gql(query, {"b": w.bot, "l": 3, "v": None}, ann))["memoryLog"]
    rest = (await api.gql(query, {"b": w.bot, "l": 3, "v": first["next"]}, ann))["memoryLog"]
    assert [c["version"] for c in first["changes"] + rest["changes"]] == versions

    for bad in ({"limit": "0"}, {"limit": "1001"}, {"before": "soon"}, {"before": "0"}):
        response = await api.http.get(
            f"/v1/bots/{w.bot}/memory/log", params=bad, headers={"Authorization": f"Bearer {ann}"}
        )
        assert response.status_code == 422 and response.json()["error"]["code"] == "BAD_INPUT", bad
    assert await api.codes(query, {"b": w.bot, "l": 0, "v": None}, ann) == ["BAD_INPUT"]


async def _tagged(
    runtime: Runtime,
    w: World,
    tags: list[str],
    page: tuple[int, tuple[int, str] | None] | None,
    topic_seek_max: int = memory_q.TOPIC_SEEK_MAX,
) -> list[tuple[int, str]]:
    """Ann's GET memory with ``tags`` as the statement gives it ((memoryRank, id) in memory order);
    ``topic_seek_max=-1`` walks her entries even for a topic."""
    async with runtime.driver.session() as session:
        got = await memory_q.lock_reader_and_list(
            session,
            bot_id=w.bot,
            person_id=w.people["ann"],
            org=w.org,
            statuses=["active", "invalidated"],
            tags=tags,
            page=page,
            topic_seek_max=topic_seek_max,
        )
    assert got is not None and got["reader"] is not None
    return [(e["memoryRank"], e["id"]) for e in got["entries"]]


async def test_a_tag_filter_lists_and_pages_the_entries_with_every_kind_of_tag(
    api: Api, runtime: Runtime
) -> None:
    """Seed 000's tag filter for every tag Ann's entries carry (topics, ``for:``, ``chat:``,
    ``org:``, ``from:``, ``channel:``) and for pairs: the list, and its pages of 1 and 3 walked to
    the end, are the unfiltered list's entries with every tag, in memory order — her history
    included, others' entries never; it follows SetTopics and RenameTopic. Both ways to find
    them give that: from a topic's Topic (``graph.topics``) and walking her entries."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    own = await said(api, ann, await api.chat(ann, w.bot), "mine")
    group = await said(api, bob, await api.chat(bob, w.bot, channel=w.channel), "ours")
    theirs = await said(api, bob, await api.chat(bob, w.bot), "bob's")
    topics: tuple[tuple[str, ...], ...] = (("travel",), (), ("travel", "sailing"), ("work",))
    changes = [
        AddFact(content=f"{kind} {n}", sources=(ItemRef(*src),), topics=topics[n % 4])
        for n in range(8)
        for kind, src in (("own", own), ("group", group), ("theirs", theirs))
    ]
    await apply(runtime, w.bot, *changes)
    await apply(runtime, w.bot, Invalidate(changes[6].id))  # "own 2" (travel, sailing): history
    assert (
        await command(api, ann, w.bot, {"_tag": "Remember", "content": "p", "tags": ["sailing"]})
    ).status_code == 201

    everything = await visible(api, ann, w.bot)
    filters = [[t] for t in sorted({t for e in everything.values() for t in e["tags"]})]
    filters += [
        ["travel", "sailing"],
        ["sailing", f"chat:{own[0]}"],
        ["travel", "no-such-topic"],
        ["nothing"],
    ]
    assert len(filters) >= 10 and any(f[0].startswith("for:") for f in filters)
    for tags, seek_max in itertools.product(filters, (memory_q.TOPIC_SEEK_MAX, -1)):
        want = [i for i, e in everything.items() if set(tags) <= set(e["tags"])]
        assert [i for _, i in await _tagged(runtime, w, tags, None, seek_max)] == want, tags
        for limit in (1, 3):
            pages: list[str] = []
            after: tuple[int, str] | None = None
            while True:
                page = await _tagged(runtime, w, tags, (limit, after), seek_max)
                pages += [i for _, i in page]
                if len(page) < limit:
                    break
                after = page[-1]
            assert pages == want, (tags, limit, seek_max)
    sailing = [c.id for c in changes if "sailing" in c.topics and not c.content.startswith("theirs")]
    assert set(await visible(api, ann, w.bot, tags="sailing")) >= set(sailing)

    await apply(runtime, w.bot, SetTopics(changes[0].id, ("sailing",)), RenameTopic("work", "sailing", w.org))
    now = await visible(api, ann, w.bot, tags="sailing")
    assert changes[0].id in now and all("work" not in e["tags"] for e in now.values())
    assert await visible(api, ann, w.bot, tags="work") == {}
    assert list(now) == [i for _, i in await _tagged(runtime, w, ["sailing"], None)]
    assert list(now) == [i for _, i in await _tagged(runtime, w, ["sailing"], None, -1)]


async def test_a_filter_on_a_rare_topic_reads_its_entries_not_the_readers(api: Api, runtime: Runtime) -> None:
    """A tag filter on a topic few entries carry reads them from the topic (``graph.topics``): it
    read every entry the reader may see (122 ms at 100k for a topic on five). Sixty more entries
    of Ann's without the topic add fewer than sixty database hits to a filter on it (the walk
    adds several a candidate), and a topic no entry has reads nothing of hers. A store upgraded
    from version 14 (no links) gets its entries linked (migration 15) and the same list."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    own = await said(api, ann, await api.chat(ann, w.bot), "mine")
    rare = [AddFact(content=f"rare {n}", sources=(ItemRef(*own),), topics=("rare",)) for n in range(3)]
    await apply(runtime, w.bot, *rare)

    async def hits(tags: tuple[str, ...], seek_max: int, page: bool) -> int:
        return await filter_hits(runtime, w, tags, seek_max, page)

    cases = list(
        itertools.product(
            (("rare",), ("rare", "for:bot"), ("none-such",)), (memory_q.TOPIC_SEEK_MAX, -1), (False, True)
        )
    )
    before = {case: await hits(*case) for case in cases}
    await apply(runtime, w.bot, *(AddFact(content=f"other {n}", sources=(ItemRef(*own),)) for n in range(60)))
    after = {case: await hits(*case) for case in cases}
    for case in cases:
        _, seek_max, _ = case
        if seek_max == -1:  # the walk: the reader's entries, each checked
            assert after[case] - before[case] >= 60, case
        else:
            assert after[case] - before[case] < 60, case
    listed = [c.id for c in reversed(rare)]
    assert [i for _, i in await _tagged(runtime, w, ["rare"], None)] == listed

    await runtime.driver.execute_query("MATCH (tp:Topic {botId: $b}) DETACH DELETE tp", b=w.bot)
    assert [i for _, i in await _tagged(runtime, w, ["rare"], None)] == []  # the list reads the links
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 14")
    assert await migrate(runtime.driver) == LATEST
    assert [i for _, i in await _tagged(runtime, w, ["rare"], None)] == listed


async def test_a_filter_on_a_topic_never_reads_entries_of_an_audience_the_reader_is_not_in(
    api: Api, runtime: Runtime
) -> None:
    """A topic's entries are linked per audience key (``graph.topics``), and a filter reads those
    of the reader's keys only. Linked per Bot, a filter on a guessed topic read every entry that
    carries it, Bob's private ones too, each checked and refused: its time grew with how many
    of another audience carry the topic. Sixty of Bob's private entries on it now add no database hit
    to Ann's filter, and neither list shows the other's. A store of version 23 (one Topic per
    topic of a Bot) is linked again by audience key (migration 24)."""
    w = await make_world(api, ("ann", "bob"))
    ann_src = await said(api, w.tokens["ann"], await api.chat(w.tokens["ann"], w.bot), "mine")
    bob_src = await said(api, w.tokens["bob"], await api.chat(w.tokens["bob"], w.bot), "his")
    mine = [
        AddFact(content=f"ann rare {n}", sources=(ItemRef(*ann_src),), topics=("rare",)) for n in range(3)
    ]
    await apply(runtime, w.bot, *mine)
    listed = [c.id for c in reversed(mine)]

    async def hits() -> int:
        return await filter_hits(runtime, w, ("rare",), memory_q.TOPIC_SEEK_MAX, page=False)

    before = await hits()
    his = [
        AddFact(content=f"bob rare {n}", sources=(ItemRef(*bob_src),), topics=("rare",)) for n in range(60)
    ]
    await apply(runtime, w.bot, *his)
    assert await hits() == before
    assert [i for _, i in await _tagged(runtime, w, ["rare"], None)] == listed
    assert set(await visible(api, w.tokens["bob"], w.bot, tags="rare")) == {c.id for c in his}

    await runtime.driver.execute_query(
        """
        MATCH (tp:Topic {botId: $b}) DETACH DELETE tp
        WITH count(*) AS _
        CREATE (old:Topic {key: $b + '|rare', botId: $b, topic: 'rare'})
        WITH old
        MATCH (e:Entry {botId: $b}) WHERE 'rare' IN e.tags
        CREATE (e)-[:HAS_TOPIC]->(old)
        """,
        b=w.bot,
    )
    await runtime.driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 23")
    assert await migrate(runtime.driver) == LATEST
    assert await hits() == before
    assert [i for _, i in await _tagged(runtime, w, ["rare"], None)] == listed
    topics, _, _ = await runtime.driver.execute_query(
        "MATCH (tp:Topic {botId: $b}) RETURN tp.key AS key, COUNT { (tp)<-[:HAS_TOPIC]-() } AS n", b=w.bot
    )
    assert {r["key"]: r["n"] for r in topics} == {
        f"{w.bot}|person:{w.people['ann']}|rare": 3,
        f"{w.bot}|person:{w.people['bob']}|rare": 60,
    }


async def filter_hits(runtime: Runtime, w: World, tags: tuple[str, ...], seek_max: int, page: bool) -> int:
    """Database hits of Ann's GET memory with ``tags`` (one page of 10, or the whole list)."""
    params = {
        "botId": w.bot,
        "personId": w.people["ann"],
        "org": w.org,
        "top": memory_q.TOP_RANK,
        "statuses": ["active"],
        "tags": list(tags),
        "topicSeekMax": seek_max,
        "limit": 10,
        "afterRank": memory_q.TOP_RANK,
        "afterId": "",
    }
    query = memory_q.LOCK_READER_AND_PAGE if page else memory_q.LOCK_READER_AND_LIST
    return await db_hits(runtime, query, params)
