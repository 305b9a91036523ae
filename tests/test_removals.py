"""Removals are announced, and a change feed loses nothing (D9.24, C2, V10, E4).

Every change that hides an entry from someone who saw it — retraction, a Forget exclusion, a
narrowing share, an invalidation and the dependents it hides, purge, relabel — reaches exactly
those readers, as ids, on the live feed and in their log; a subscriber that reconnects with
``after`` gets the same sequence from the log; a lost Redis message or connection is filled in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from arq.connections import ArqRedis

from graph.migrations import _SET_REMOVAL_AT  # pyright: ignore[reportPrivateUsage]
from services import changefeed
from services.changes import Invalidate, Remember
from services.maintenance import relabel_all
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, World, bearer, make_world
from tests.conftest import ApiProcess
from tests.feed_helpers import next_event, subscribed, subscription
from tests.memory_helpers import apply, command, fact, observation, said, visible
from tests.waiting import until

FEED = "subscription($b: ID!) { memoryChanges(botId: $b) { version entries { id status } removed } }"
REPLAY = (
    "subscription($b: ID!, $a: Int) { memoryChanges(botId: $b, after: $a) "
    "{ version entries { id status } removed } }"
)
LOG = "query($b: ID!) { memoryLog(botId: $b) { changes { version actor ids removed } version } }"


async def remember(api: Api, token: str, bot: str, content: str) -> str:
    """A pinned entry only its author sees (a marker: the last event a stream gets)."""
    response = await command(api, token, bot, {"_tag": "Remember", "content": content})
    assert response.status_code == 201, response.text
    return response.json()["entry"]["id"]


async def events_until(ws: Any, marker: str) -> list[dict[str, Any]]:
    """Every event up to the one that carries ``marker`` (which shows everything before it was
    considered for this subscriber), in order."""
    out: list[dict[str, Any]] = []
    while True:
        event = await next_event(ws)
        out.append(event)
        if marker in [e["id"] for e in event["entries"]]:
            return out


def removals(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["version"], i) for e in events for i in e["removed"]]


async def log_removals(api: Api, token: str, bot: str) -> dict[tuple[int, str], str]:
    """(version, id) → actor of every removal in the person's log."""
    log = (await api.gql(LOG, {"b": bot}, token))["memoryLog"]["changes"]
    return {(c["version"], i): c["actor"] for c in log for i in c["removed"]}


def replay(api: Api, token: str, bot: str, after: int) -> Any:
    """``memoryChanges(botId: bot, after: after)``, registered."""
    return subscribed(api, token, REPLAY, {"b": bot, "a": after}, "memoryChanges")


async def version_of(api: Api, token: str, bot: str) -> int:
    return int((await api.gql(LOG, {"b": bot}, token))["memoryLog"]["version"])


@dataclasses.dataclass
class Removed:
    """The entries of the scenario, by how each stops being visible."""

    excluded: str = ""  # Bob forgets a team fact Ann is behind: excluded for Bob only
    retracted: str = ""  # Ann forgets her own private fact: retracted, Ann only
    invalidated: str = ""  # a team fact the memory Bot invalidates: still listed, with its status
    above: str = ""  # the observation resting on it: hidden from Ann and Bob
    narrowed: str = ""  # Ann shares a team fact with herself only: Bob loses it
    purged: str = ""  # Ann purges a private chat: Ann loses its fact
    relabelled: str = ""  # surgery narrows a team fact, `botmemory relabel` applies it: Bob loses it


async def scenario(api: Api, rt: Runtime, w: World) -> Removed:
    """Seven entries Ann sees (and Bob the team ones); :func:`hide_them` hides each from someone."""
    ann = w.tokens["ann"]
    group = await api.chat(ann, w.bot, channel=w.channel)
    team = await said(api, ann, group, "team talk")
    own = await said(api, ann, await api.chat(ann, w.bot), "mine")
    doomed_chat = await api.chat(ann, w.bot)
    doomed = await said(api, ann, doomed_chat, "doomed")
    r = Removed()
    r.excluded = await fact(rt, w.bot, "the team meets on Mondays", team)
    r.retracted = await fact(rt, w.bot, "Ann keeps a diary", own)
    r.invalidated = await fact(rt, w.bot, "the team uses Rust", team)
    r.above = await observation(rt, w.bot, "the team likes systems languages", r.invalidated)
    r.narrowed = await fact(rt, w.bot, "the team budget is small", team)
    r.purged = await fact(rt, w.bot, "Ann will delete this chat", doomed)
    r.relabelled = await fact(rt, w.bot, "the team has a mascot", team)
    return r


async def hide_them(api: Api, rt: Runtime, w: World, r: Removed) -> None:
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    assert (await command(api, bob, w.bot, {"_tag": "Forget", "id": r.excluded})).status_code == 200
    assert (await command(api, ann, w.bot, {"_tag": "Forget", "id": r.retracted})).status_code == 200
    await apply(rt, w.bot, Invalidate(r.invalidated))
    shared = await api.gql(
        "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }",
        {"b": w.bot, "id": r.narrowed, "a": [f"for:person:{w.people['ann']}"]},
        ann,
    )
    assert shared["shareEntry"]["version"] > 0
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge",
        json={"tag": f"chat:{(await chat_of(rt, r.purged))}"},
        headers={"Authorization": f"Bearer {ann}"},
    )
    assert purged.status_code == 200 and purged.json() == {"removed": 1}
    # Surgery on the graph (what `botmemory relabel` is for): the entry now also needs Ann.
    await rt.driver.execute_query(
        "MATCH (e:Entry {id: $id}) SET e.tags = e.tags + $tag",
        id=r.relabelled,
        tag=f"for:person:{w.people['ann']}",
    )
    await relabel_all(rt, w.bot)


async def chat_of(rt: Runtime, entry: str) -> str:
    records, _, _ = await rt.driver.execute_query(
        "MATCH (:Entry {id: $id})-[s:SOURCE]->(i:Item) RETURN i.chatId AS chat", id=entry
    )
    return records[0]["chat"]


async def test_removals_reach_exactly_who_saw_the_entry_live_in_the_log_and_on_replay(
    api: Api, runtime: Runtime
) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    ann, bob, cat = w.tokens["ann"], w.tokens["bob"], w.tokens["cat"]
    r = await scenario(api, runtime, w)
    assert set(dataclasses.asdict(r).values()) <= set(await visible(api, ann, w.bot))
    before = await version_of(api, ann, w.bot)
    async with (
        subscription(api, ann, w.bot, FEED, id="ann") as ann_ws,
        subscription(api, bob, w.bot, FEED, id="bob") as bob_ws,
        subscription(api, cat, w.bot, FEED, id="cat") as cat_ws,
    ):
        await hide_them(api, runtime, w, r)
        marks = {p: await remember(api, w.tokens[p], w.bot, f"{p} was here") for p in ("ann", "bob", "cat")}
        got = {
            "ann": await events_until(ann_ws, marks["ann"]),
            "bob": await events_until(bob_ws, marks["bob"]),
            "cat": await events_until(cat_ws, marks["cat"]),
        }
    lost = {p: {i for _, i in removals(events)} for p, events in got.items()}
    assert lost["ann"] == {r.retracted, r.above, r.purged}
    assert lost["bob"] == {r.excluded, r.above, r.narrowed, r.relabelled}
    assert got["cat"] == [got["cat"][-1]] and lost["cat"] == set()  # Cat saw none: only her marker
    # An invalidated entry is still listed (with its status): a change, not a removal.
    seen = {(e["id"], e["status"]) for event in got["ann"] for e in event["entries"]}
    assert (r.invalidated, "invalidated") in seen
    # No event carries an entry it also removes, and every event has something for its reader.
    for events in got.values():
        for event in events:
            assert event["entries"] or event["removed"]
            assert not {e["id"] for e in event["entries"]} & set(event["removed"])

    # The log says the same to each reader: the same (version, id) pairs, with their actors.
    for person in ("ann", "bob", "cat"):
        assert set(await log_removals(api, w.tokens[person], w.bot)) == set(removals(got[person]))
    actors = await log_removals(api, bob, w.bot)
    assert {i: a for (_, i), a in actors.items()} == {
        r.excluded: "person",
        r.above: "memory_bot",
        r.narrowed: "person",
        r.relabelled: "system",
    }
    assert {i: a for (_, i), a in (await log_removals(api, ann, w.bot)).items()}[r.purged] == "person"

    # A subscriber that comes back with `after` gets exactly what the live stream got, in order.
    for person in ("ann", "bob"):
        async with replay(api, w.tokens[person], w.bot, before) as ws:
            replayed = await events_until(ws, marks[person])
        assert [
            (e["version"], sorted(x["id"] for x in e["entries"]), sorted(e["removed"])) for e in replayed
        ] == [
            (e["version"], sorted(x["id"] for x in e["entries"]), sorted(e["removed"])) for e in got[person]
        ]

    # What the log keeps of a removal: ids and access atoms, never content (E4).
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:Removal {botId: $b}) UNWIND keys(x) AS k RETURN collect(DISTINCT k) AS keys", b=w.bot
    )
    assert set(records[0]["keys"]) == {
        "botId",
        "version",
        "entryId",
        "at",
        "beforeRequires",
        "beforeExcluded",
        "afterRequires",
        "afterExcluded",
    }


async def test_a_reader_is_told_of_no_removal_made_before_they_joined(api: Api, runtime: Runtime) -> None:
    """The log, a replay and the live feed tell a reader of the removals made while they could
    have seen the entry (``graph.access.REMOVED_FOR``). Cat, who joins Ann and Bob's channel after
    a team fact was retracted, and Dan, a member granted the Bot only after it, were told its id
    (from their memberships now) of an entry they never saw; Bob, there throughout, is told (his
    grant's time kept from WRITE to READ). A purge that records the earlier removals again keeps
    their times: it told Cat and Dan the old id once more."""
    w = await make_world(api, ("ann", "bob", "dan"), channel=("ann", "bob", "dan"))
    ann, bob, dan = w.tokens["ann"], w.tokens["bob"], w.tokens["dan"]
    await api.grant(w.bot, w.people["dan"], "NONE")
    cat_id, cat = await api.person(w.org, "cat")
    await api.grant(w.bot, cat_id)
    group = await api.chat(ann, w.bot, channel=w.channel)
    start = await version_of(api, ann, w.bot)
    early = await fact(runtime, w.bot, "the team meets on Mondays", await said(api, ann, group, "Mondays"))
    assert (await command(api, ann, w.bot, {"_tag": "Forget", "id": early})).status_code == 200  # retracted
    await api.grant(w.bot, w.people["bob"], "READ")  # still a reader since the start
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": w.channel, "m": [w.people[p] for p in ("ann", "bob", "dan")] + [cat_id]},
    )
    await api.grant(w.bot, w.people["dan"])
    late = await fact(runtime, w.bot, "the team drinks tea", await said(api, ann, group, "tea"))
    # A replay from before both: the early removal read from the log, the late one live.
    async with replay(api, cat, w.bot, start) as cat_ws, replay(api, dan, w.bot, start) as dan_ws:
        assert (await command(api, ann, w.bot, {"_tag": "Forget", "id": late})).status_code == 200
        marker = await fact(runtime, w.bot, "the team is here", await said(api, ann, group, "here"))
        told = {"cat": await events_until(cat_ws, marker), "dan": await events_until(dan_ws, marker)}
    assert {i for _, i in await log_removals(api, bob, w.bot)} == {early, late}
    for person, token in (("cat", cat), ("dan", dan)):
        assert {i for _, i in removals(told[person])} == {late}, person
        assert {i for _, i in await log_removals(api, token, w.bot)} == {late}, person
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{group}"}, headers=bearer(ann)
    )
    assert purged.status_code == 200, purged.text
    assert {i for _, i in await log_removals(api, bob, w.bot)} == {early, late, marker}
    for token in (cat, dan):
        assert {i for _, i in await log_removals(api, token, w.bot)} == {late, marker}


async def test_a_removal_written_without_its_time_gets_its_changes(api: Api, runtime: Runtime) -> None:
    """Version 28's data step (``_SET_REMOVAL_AT``): a Removal written before it (or by an older
    process during a rolling upgrade) has no ``at``; it is judged by its change's time meanwhile,
    and the step gives it that time. A purge that records it again before the step keeps that
    time too."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    group = await api.chat(ann, w.bot, channel=w.channel)
    team = await fact(runtime, w.bot, "the team meets on Mondays", await said(api, ann, group, "Mondays"))
    assert (await command(api, ann, w.bot, {"_tag": "Forget", "id": team})).status_code == 200
    assert {i for _, i in await log_removals(api, bob, w.bot)} == {team}
    await runtime.driver.execute_query("MATCH (r:Removal {botId: $b}) REMOVE r.at", b=w.bot)
    assert {i for _, i in await log_removals(api, bob, w.bot)} == {team}
    async with runtime.driver.session() as session:  # CALL … IN TRANSACTIONS: auto-commit
        await (await session.run(_SET_REMOVAL_AT)).consume()
    assert {i for _, i in await log_removals(api, bob, w.bot)} == {team}
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change)-[:REMOVED]->(r:Removal {botId: $b}) RETURN collect(r.at = c.at) AS same", b=w.bot
    )
    assert records[0]["same"] == [True]
    at_of = "MATCH (c:Change)-[:REMOVED]->(r:Removal {botId: $b}) RETURN c.at AS change, r.at AS at"
    forgotten = (await runtime.driver.execute_query(at_of, b=w.bot))[0][0]["change"]
    await runtime.driver.execute_query("MATCH (r:Removal {botId: $b}) REMOVE r.at", b=w.bot)
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{group}"}, headers=bearer(ann)
    )
    assert purged.status_code == 200, purged.text
    records, _, _ = await runtime.driver.execute_query(at_of, b=w.bot)
    assert [(r["at"], r["change"] > forgotten) for r in records] == [(forgotten, True)]  # the purge's row


async def test_a_lost_change_message_is_filled_in_from_the_log_before_the_next_event(
    api: Api, runtime: Runtime
) -> None:
    """A writer that cannot publish (Redis away for it) still commits; the API process notices the
    gap at the Bot's next event and delivers the missed change first, in version order."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    unannounced = dataclasses.replace(runtime, redis=ArqRedis(host="127.0.0.1", port=1))
    async with subscription(api, ann, w.bot, FEED) as ws:
        quiet = Remember(content="said while Redis was away", person_id=w.people["ann"], org=w.org)
        applied = await apply_changes(unannounced, w.bot, [quiet], "person")
        loud = await remember(api, ann, w.bot, "said after")
        first, second = await next_event(ws), await next_event(ws)
    assert (first["version"], [e["id"] for e in first["entries"]]) == (applied.version, [quiet.id])
    assert [e["id"] for e in second["entries"]] == [loud] and second["version"] > first["version"]


async def until_logged_times(path: Path, text: bytes, times: int, within: float = 30) -> None:
    """Until the process's log holds ``text`` ``times`` times."""

    async def logged() -> bool:
        return (await asyncio.to_thread(path.read_bytes)).count(text) >= times

    await until(logged, f"{text!r} logged fewer than {times} times in {path}", within=within)


async def test_a_redis_blip_mid_stream_loses_and_repeats_nothing(
    api: Api, api_process: ApiProcess, runtime: Runtime
) -> None:
    """The API process's Redis connection is cut (Redis refuses its channels, so it cannot come
    back at once) while changes are written — their messages are lost for good. When Redis lets
    it back, the process catches up from the log: the subscriber gets every change once, in order."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    log_path, lost = api_process.log_path, b"botmemory:changes:* interrupted"
    async with subscription(api, ann, w.bot, FEED) as ws:
        first = await remember(api, ann, w.bot, "before the blip")
        assert [e["id"] for e in (await next_event(ws))["entries"]] == [first]
        cut = log_path.read_bytes().count(lost)
        await runtime.redis.execute_command("ACL", "SETUSER", "default", "resetchannels")
        try:
            await until_logged_times(log_path, lost, cut + 1)
            during = [await remember(api, ann, w.bot, f"during the blip {n}") for n in range(3)]
        finally:
            await runtime.redis.execute_command("ACL", "SETUSER", "default", "allchannels")
        after = await remember(api, ann, w.bot, "after the blip")
        got = [await next_event(ws) for _ in range(4)]
    assert [[e["id"] for e in event["entries"]] for event in got] == [[i] for i in [*during, after]]
    versions = [event["version"] for event in got]
    assert versions == sorted(set(versions))


async def test_after_must_be_a_version(api: Api) -> None:
    w = await make_world(api, ("ann",))
    async with subscribed(
        api, w.tokens["ann"], REPLAY, {"b": w.bot, "a": -1}, "memoryChanges", wait=False
    ) as ws:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
    errors = message["payload"] if message["type"] == "error" else message["payload"]["errors"]
    assert errors[0]["extensions"]["code"] == "BAD_INPUT", message


async def test_a_catch_up_longer_than_a_page_delivers_every_row(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub reads what it missed a page at a time (pages of 2 here): every row, in order."""
    monkeypatch.setattr(changefeed, "LOG_PAGE", 2)
    w = await make_world(api, ("ann",))
    issued = (await api.gql("mutation { issueToken { id token } }", token=w.tokens["ann"]))["issueToken"]
    unannounced = dataclasses.replace(runtime, redis=ArqRedis(host="127.0.0.1", port=1))
    hub = changefeed.ChangeHub(runtime)
    async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
        missed = [Remember(content=f"missed {n}", person_id=w.people["ann"], org=w.org) for n in range(5)]
        for change in missed:
            await apply_changes(unannounced, w.bot, [change], "person")
        await hub.catch_up(w.bot)
        got = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [[e.id for e in event.entries] for event in got if event is not None] == [[c.id] for c in missed]


async def test_replays_read_so_many_pages_at_once_and_each_gets_every_change(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memoryChanges(after: 0)`` replays the whole log, and a token may hold thousands of
    subscriptions: replays read REPLAY_READS pages at once in a process, REPLAY_READS_PER_READER
    of them one person's, the others waiting their turn a page at a time (never refused: a client
    that saw nothing for long is far behind through no doing of its own). Twelve replays of three
    pages (pages of one row here), six each of two people's, each get every change; and a third
    person's one replay, started after the first's six, ends before most of those do — it waited
    behind a few of their pages, not all of them."""
    monkeypatch.setattr(changefeed, "LOG_PAGE", 1)
    w = await make_world(api, ("ann", "bob", "cat"))
    made = [Remember(content=f"note {n}", person_id=w.people["ann"], org=w.org) for n in range(3)]
    unannounced = dataclasses.replace(runtime, redis=ArqRedis(host="127.0.0.1", port=1))
    for change in made:
        await apply_changes(unannounced, w.bot, [change], "person")
    hub = changefeed.ChangeHub(runtime)
    reading: dict[str, int] = {}
    most: dict[str, int] = {}
    from_log = hub._from_log  # pyright: ignore[reportPrivateUsage]

    async def counted(bot_id: str, local: list[changefeed.Subscriber], after: int) -> Any:
        person = local[0].person_id
        for key in (person, "all"):
            reading[key] = reading.get(key, 0) + 1
            most[key] = max(most.get(key, 0), reading[key])
        try:
            return await from_log(bot_id, local, after)
        finally:
            for key in (person, "all"):
                reading[key] -= 1

    monkeypatch.setattr(hub, "_from_log", counted)
    page_turn = hub._replay_page  # pyright: ignore[reportPrivateUsage]
    asked, all_asked = 0, asyncio.Event()

    def asking(sub: changefeed.Subscriber) -> Any:
        nonlocal asked
        asked += 1
        if asked == 12:
            all_asked.set()
        return page_turn(sub)

    monkeypatch.setattr(hub, "_replay_page", asking)
    tokens = {
        name: (await api.gql("mutation { issueToken { id } }", token=w.tokens[name]))["issueToken"]["id"]
        for name in ("ann", "bob", "cat")
    }
    ended: list[str] = []

    async def replayed(name: str) -> int:
        async with hub.subscribe(w.bot, w.people[name], w.org, tokens[name]) as sub:
            got = 0
            async for event in hub.replay(sub, 0):
                if isinstance(event, changefeed.CaughtUp):
                    break
                got += 1
        ended.append(name)
        return got

    anns = [asyncio.create_task(replayed("ann")) for _ in range(6)]
    bobs = [asyncio.create_task(replayed("bob")) for _ in range(6)]
    await all_asked.wait()  # the twelve asked for their first page
    cats = asyncio.create_task(replayed("cat"))
    every = await asyncio.gather(*anns, *bobs, cats)
    assert every == [3] * 6 + [0] * 7  # Ann's own notes, every change of them; nothing of them for the others
    assert most["all"] == changefeed.REPLAY_READS
    assert ended.index("cat") < 6, ended
    assert (
        most[w.people["ann"]] == most[w.people["bob"]] == changefeed.REPLAY_READS_PER_READER
    )  # before half of the others' twelve


async def test_a_purge_announces_what_it_removes_to_readers_not_yet_told_of_an_earlier_hiding(
    api: Api, runtime: Runtime
) -> None:
    """D9.24: a purge deleted the earlier removals of the entries it purges and announced only
    those someone could see at the purge. A team fact Ann retracted (Forget, the only person
    behind it) and then purged with its chat: Bob, reading from before the retraction, was never
    told it was removed — his client kept showing words Ann took back. The purge's row now names
    it for everyone who saw it before any of the removals it erases."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    group = await api.chat(ann, w.bot, w.channel)
    team = await fact(runtime, w.bot, "Ann's team plan is secret", await said(api, ann, group, "our plan"))
    assert team in await visible(api, bob, w.bot)
    before = await version_of(api, bob, w.bot)
    assert (await command(api, ann, w.bot, {"_tag": "Forget", "id": team})).status_code == 200
    assert [i for (_, i) in await log_removals(api, bob, w.bot)] == [team]  # told at the retraction
    purged = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge",
        json={"tag": f"chat:{group}"},
        headers={"Authorization": f"Bearer {ann}"},
    )
    assert purged.status_code == 200, purged.text
    assert [i for (_, i) in await log_removals(api, bob, w.bot)] == [team]  # before: [] (erased with it)
    async with replay(api, bob, w.bot, before) as ws:
        marker = await remember(api, bob, w.bot, "Bob's marker")
        events = await events_until(ws, marker)
    assert [i for (_, i) in removals(events)] == [team]
