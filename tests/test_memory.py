"""The seed's sentences about who sees what (V1–V13, D9.1–D9.4, D9.13, D9.19)."""

from __future__ import annotations

import pytest

from graph.entries import REFUSALS
from graph.migrations import _SET_CHANGED_VERSION  # pyright: ignore[reportPrivateUsage]
from services.changes import (
    AddFact,
    AddObservation,
    Invalidate,
    ItemRef,
    MemoryChange,
    Remember,
    RenameTopic,
    SetTopics,
    Share,
)
from services.errors import BadInput, Conflict, Forbidden
from services.maintenance import MAX_LEGACY_ENTRIES, MAX_LEGACY_TAGS, LegacyEntry, import_legacy, relabel_all
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, make_world
from tests.memory_helpers import apply, command, fact, observation, said, visible


async def test_private_fact_is_for_its_person_only_even_against_write(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "I prefer trains to planes")
    entry = await fact(runtime, w.bot, "Ann prefers trains", src, topics=("travel",))
    mine = await visible(api, w.tokens["ann"], w.bot)
    assert list(mine) == [entry]
    got = mine[entry]
    assert got["layer"] == "fact" and got["status"] == "active" and got["content"] == "Ann prefers trains"
    assert set(got["tags"]) == {
        f"from:{w.people['ann']}",
        f"for:person:{w.people['ann']}",
        f"org:{w.org}",
        f"chat:{chat}",
        "travel",
    }
    assert got["sources"] == [{"chat": chat, "item": src[1]}]
    # Bob holds WRITE on the Bot and still reads nothing about Ann (V7).
    assert await visible(api, w.tokens["bob"], w.bot) == {}


async def test_group_fact_follows_current_channel_membership(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    entry = await fact(
        runtime, w.bot, "The team ships on Fridays", await said(api, w.tokens["bob"], chat, "we ship fridays")
    )
    assert entry in await visible(api, w.tokens["ann"], w.bot)
    assert entry in await visible(api, w.tokens["bob"], w.bot)
    assert entry not in await visible(api, w.tokens["cat"], w.bot)
    tags = (await visible(api, w.tokens["ann"], w.bot))[entry]["tags"]
    assert (
        f"for:channel:{w.channel}" in tags
        and f"channel:{w.channel}" in tags
        and f"from:{w.people['bob']}" in tags
    )
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": w.channel, "m": [w.people["ann"], w.people["cat"]]},
    )
    assert entry not in await visible(api, w.tokens["bob"], w.bot)
    assert entry in await visible(api, w.tokens["cat"], w.bot)


async def test_observation_needs_every_source_and_an_active_chain(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    a = await fact(
        runtime, w.bot, "Ann is vegetarian", await said(api, w.tokens["ann"], private, "I'm vegetarian")
    )
    g = await fact(
        runtime, w.bot, "Team dinner on Thursday", await said(api, w.tokens["bob"], group, "dinner thursday")
    )
    o = await observation(runtime, w.bot, "Pick a vegetarian place for Thursday", a, g)
    assert o in await visible(api, w.tokens["ann"], w.bot)
    # Bob sees the group source but not Ann's private one: nothing of the combination (V4).
    bob = await visible(api, w.tokens["bob"], w.bot)
    assert g in bob and o not in bob and a not in bob
    ann = await visible(api, w.tokens["ann"], w.bot)
    assert set(ann[o]["tags"]) >= {
        f"for:person:{w.people['ann']}",
        f"for:channel:{w.channel}",
        f"chat:{private}",
        f"chat:{group}",
    }
    assert ann[o]["sources"] == [{"entry": a}, {"entry": g}] or ann[o]["sources"] == [
        {"entry": g},
        {"entry": a},
    ]
    # An invalidated source hides every conclusion above it (V5); the source stays as history.
    await apply(runtime, w.bot, Invalidate(a))
    ann = await visible(api, w.tokens["ann"], w.bot)
    assert o not in ann
    assert ann[a]["status"] == "invalidated" and ann[a]["invalidatedAt"] >= ann[a]["createdAt"]


async def test_one_step_observations_see_the_step_so_far(api: Api, runtime: Runtime) -> None:
    """apply_changes reads the entries observations rest on with the lock (C7) and knows those it
    creates: an observation may rest on a fact of the same step; once the step has changed an
    existing entry, a source is read again (an entry invalidated earlier in the step is refused)."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "I'm vegetarian and I cycle to work")
    new_fact = AddFact(content="Ann is vegetarian", sources=(ItemRef(*src),))
    on_new = AddObservation(
        content="Suggest vegetarian places", source_entry_ids=(new_fact.id,), confidence=0.7
    )
    await apply(runtime, w.bot, new_fact, on_new)
    ann = await visible(api, w.tokens["ann"], w.bot)
    assert on_new.id in ann and ann[on_new.id]["sources"] == [{"entry": new_fact.id}]
    assert f"for:person:{w.people['ann']}" in ann[on_new.id]["tags"]
    # An existing entry invalidated earlier in the same step is no source: nothing is applied.
    cycles = await fact(runtime, w.bot, "Ann cycles to work", src)
    late = AddObservation(content="Ann likes bikes", source_entry_ids=(cycles,), confidence=0.5)
    with pytest.raises(Conflict):
        await apply(runtime, w.bot, Invalidate(cycles), late)
    ann = await visible(api, w.tokens["ann"], w.bot)
    assert ann[cycles]["status"] == "active" and late.id not in ann


async def test_second_level_observation_and_missing_source(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    f1 = await fact(runtime, w.bot, "likes tea", await said(api, w.tokens["ann"], chat, "I like tea"))
    f2 = await fact(
        runtime, w.bot, "likes mornings", await said(api, w.tokens["ann"], chat, "mornings are best")
    )
    o1 = await observation(runtime, w.bot, "tea in the morning", f1, f2)
    o2 = await observation(runtime, w.bot, "schedule calls after tea", o1)
    seen = await visible(api, w.tokens["ann"], w.bot)
    assert {f1, f2, o1, o2} <= set(seen)
    # Delete one source outright (as a broken import would): everything above it is hidden.
    await runtime.driver.execute_query("MATCH (e:Entry {id: $id}) DETACH DELETE e", id=f2)
    await relabel_all(runtime, w.bot)  # surgery outside the write path is followed by a relabel
    seen = await visible(api, w.tokens["ann"], w.bot)
    assert f1 in seen and o1 not in seen and o2 not in seen


async def test_an_entry_without_a_for_tag_is_seen_by_nobody(api: Api, runtime: Runtime) -> None:
    """V1: an entry with no ``for:`` tag is visible to nobody, its own sources' readers included,
    and so is everything that rests on it. Every write path adds one, so only corrupted or
    imported data lacks it: surgery, then a relabel, as such data would be loaded."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    f1 = await fact(runtime, w.bot, "likes tea", await said(api, w.tokens["ann"], chat, "I like tea"))
    f2 = await fact(runtime, w.bot, "likes toast", await said(api, w.tokens["ann"], chat, "I like toast"))
    o1 = await observation(runtime, w.bot, "a breakfast person", f1, f2)
    assert {f1, f2, o1} <= set(await visible(api, w.tokens["ann"], w.bot))
    await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) SET e.tags = [t IN e.tags WHERE NOT t STARTS WITH 'for:']", id=f1
    )
    await relabel_all(runtime, w.bot)
    seen = await visible(api, w.tokens["ann"], w.bot)
    assert f2 in seen and f1 not in seen and o1 not in seen


async def test_loops_and_over_deep_chains_fail_closed(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    base = await fact(runtime, w.bot, "base", await said(api, w.tokens["ann"], chat, "base fact"))
    chain = [base]
    for n in range(9):
        chain.append(await observation(runtime, w.bot, f"level {n + 1}", chain[-1]))
    seen = await visible(api, w.tokens["ann"], w.bot)
    assert chain[7] in seen  # 7 observation hops + the fact's edge = 8 hops down to an Item
    assert chain[8] not in seen and chain[9] not in seen  # deeper than the bound of 8 (D9.2)
    # A loop (only possible through corrupted or imported data) hides everything that reaches it.
    x = await observation(runtime, w.bot, "x", base)
    y = await observation(runtime, w.bot, "y", x)
    assert {x, y} <= set(await visible(api, w.tokens["ann"], w.bot))
    await runtime.driver.execute_query(
        "MATCH (x:Entry {id: $x}), (y:Entry {id: $y}) CREATE (x)-[:SOURCE]->(y) SET x.sourceCount = 2",
        x=x,
        y=y,
    )
    await relabel_all(runtime, w.bot)
    seen = await visible(api, w.tokens["ann"], w.bot)
    assert x not in seen and y not in seen and base in seen


async def test_forget_by_the_only_person_retracts_for_everyone(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    entry = await fact(
        runtime, w.bot, "Ann is moving to Lyon", await said(api, w.tokens["ann"], group, "moving to Lyon")
    )
    assert entry in await visible(api, w.tokens["bob"], w.bot)
    response = await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": entry})
    assert response.status_code == 200 and isinstance(response.json()["version"], int)
    assert entry not in await visible(api, w.tokens["ann"], w.bot)
    assert entry not in await visible(api, w.tokens["bob"], w.bot)
    log = await api.http.get(
        f"/v1/bots/{w.bot}/memory/log", headers={"Authorization": f"Bearer {w.tokens['bob']}"}
    )
    assert all(entry not in c["ids"] for c in log.json()["changes"])
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) RETURN e.status AS s", id=entry
    )
    assert records[0]["s"] == "retracted"


async def test_forget_by_one_of_two_people_and_by_a_member_not_behind(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob", "cat"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    s1 = await said(api, w.tokens["ann"], group, "let's use Postgres")
    s2 = await said(api, w.tokens["bob"], group, "agreed, Postgres")
    entry = await fact(runtime, w.bot, "The team chose Postgres", s1, s2)
    above = await observation(runtime, w.bot, "Use SQL skills", entry)
    # Bob is one of two people behind it: he stops being one, and it is no longer for him.
    assert (await command(api, w.tokens["bob"], w.bot, {"_tag": "Forget", "id": entry})).status_code == 200
    ann = await visible(api, w.tokens["ann"], w.bot)
    assert ann[entry]["status"] == "active" and f"from:{w.people['bob']}" not in ann[entry]["tags"]
    assert f"from:{w.people['ann']}" in ann[entry]["tags"]
    bob = await visible(api, w.tokens["bob"], w.bot)
    assert entry not in bob and above not in bob  # the exclusion reaches dependents (D9.4)
    # Cat never said it: her Forget is a per-person exclusion, the entry stays for the others.
    assert (await command(api, w.tokens["cat"], w.bot, {"_tag": "Forget", "id": entry})).status_code == 200
    assert entry not in await visible(api, w.tokens["cat"], w.bot)
    assert {entry, above} <= set(await visible(api, w.tokens["ann"], w.bot))


async def test_forget_conflict_has_no_existence_oracle(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    other = await make_world(api, ("zed",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    anns = await fact(runtime, w.bot, "Ann's secret", await said(api, w.tokens["ann"], chat, "secret"))
    zchat = await api.chat(other.tokens["zed"], other.bot)
    foreign = await fact(runtime, other.bot, "Zed's", await said(api, other.tokens["zed"], zchat, "zed"))
    bodies = []
    for entry_id in (anns, foreign, "mem_" + "0" * 32):
        response = await command(api, w.tokens["bob"], w.bot, {"_tag": "Forget", "id": entry_id})
        assert response.status_code == 409
        bodies.append(response.json())
    assert (
        bodies[0]
        == bodies[1]
        == bodies[2]
        == {"error": {"code": "CONFLICT", "message": "this entry is not for you"}}
    )
    assert anns in await visible(api, w.tokens["ann"], w.bot)


async def test_remember_is_pinned_first_and_only_for_you(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    learned = await fact(runtime, w.bot, "learned", await said(api, w.tokens["ann"], chat, "x"))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "Call me Annie", "tags": ["names"]}
    )
    assert response.status_code == 201
    body = response.json()
    pinned = body["entry"]["id"]
    assert (
        pinned.startswith("mem_") and body["entry"]["layer"] == "pinned" and isinstance(body["version"], int)
    )
    mine = await visible(api, w.tokens["ann"], w.bot)
    assert list(mine) == [pinned, learned]  # memory order: pinned first
    assert mine[pinned] == body["entry"]  # the 201 shows the stored entry, times included
    assert pinned not in await visible(api, w.tokens["bob"], w.bot)
    assert list(await visible(api, w.tokens["ann"], w.bot, tags="names")) == [pinned]
    colon = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "x", "tags": ["for:bot"]}
    )
    assert colon.status_code == 422 and colon.json()["error"]["code"] == "BAD_INPUT"
    # Sharing a pinned entry beyond its author breaks its own rule (V9: Remember keeps its rule).
    share = await api.raw(
        'mutation($b: ID!, $id: ID!) { shareEntry(botId: $b, id: $id, audience: ["for:bot"]) { version } }',
        {"b": w.bot, "id": pinned},
        w.tokens["ann"],
    )
    assert share["errors"][0]["extensions"]["code"] == "CONFLICT"
    # Remember needs the caller to use the Bot, read under the lock: without a grant 403 (they
    # know the Bot), from another organization the same 404 as an unknown Bot; nothing is written.
    await api.grant(w.bot, w.people["bob"], "NONE")
    _, stranger = await api.person(await api.organization("elsewhere"), "eve")
    for token, status, code in ((w.tokens["bob"], 403, "FORBIDDEN"), (stranger, 404, "NOT_FOUND")):
        refused = await command(api, token, w.bot, {"_tag": "Remember", "content": "sneaky"})
        assert refused.status_code == status and refused.json()["error"]["code"] == code
    log = await api.http.get(
        f"/v1/bots/{w.bot}/memory/log", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert log.json()["version"] == body["version"]
    # The same guard in a change's explicit transaction (a change that edits as well as adds).
    bob = (w.people["bob"], w.org)
    with pytest.raises(Forbidden):
        await apply_changes(
            runtime, w.bot, [Remember("x", bob[0], w.org), Invalidate(learned)], "person", person=bob
        )
    assert (await visible(api, w.tokens["ann"], w.bot))[learned]["status"] == "active"


async def test_share_must_pass_every_source_rule(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    mine = await fact(runtime, w.bot, "Ann's plan", await said(api, w.tokens["ann"], private, "my plan"))
    team = await fact(runtime, w.bot, "Team plan", await said(api, w.tokens["ann"], group, "our plan"))
    # Neither a reason, a model instruction nor ownership of the Bot widens a private fact (V6).
    for entry, audience in ((mine, f"for:channel:{w.channel}"), (mine, "for:bot")):
        refused = await api.raw(
            "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }",
            {"b": w.bot, "id": entry, "a": [audience]},
            w.tokens["ann"],
        )
        assert refused["errors"][0]["extensions"]["code"] == "CONFLICT"
    with pytest.raises(Conflict):
        await apply(runtime, w.bot, Share(mine, ("for:bot",)))
    assert mine not in await visible(api, w.tokens["bob"], w.bot)
    # Narrowing a group fact to one member of the channel is within its rule.
    done = await api.gql(
        "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }",
        {"b": w.bot, "id": team, "a": [f"for:person:{w.people['ann']}"]},
        w.tokens["ann"],
    )
    assert done["shareEntry"]["version"] > 0
    assert team not in await visible(api, w.tokens["bob"], w.bot)
    # Oversized audiences are bad input, as the model's share's are.
    share = "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }"
    for audience in ([], [f"for:person:{w.people['ann']}"] * 101, ["for:person:" + "u" * 200]):
        codes = await api.codes(share, {"b": w.bot, "id": team, "a": audience}, w.tokens["ann"])
        assert codes == ["BAD_INPUT"], len(audience)


async def test_a_share_that_admits_nobody_who_uses_the_bot_is_refused(api: Api, runtime: Runtime) -> None:
    """An audience that admits nobody who uses the Bot (a mistyped or unknown channel, another
    organization's, tags nobody meets at once, a person whose grant went) is within every rule, so
    it was accepted: the entry was seen by nobody any more, its sharer included, and nobody was
    left who could share it back or forget it. Now CONFLICT (BAD_INPUT for an id of the wrong
    shape), from a person and from the memory Bot alike, and the entry stays as it was."""
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    other = await make_world(api, ("gus",), channel=("gus",))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    team = await fact(runtime, w.bot, "Team plan", await said(api, w.tokens["ann"], group, "our plan"))
    share = "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }"
    await api.grant(w.bot, w.people["bob"], "NONE")
    for audience, code in (
        (["for:channel:chan_doesnotexist"], "CONFLICT"),
        ([f"for:channel:{other.channel}"], "CONFLICT"),
        ([f"for:channel:{w.channel}", f"for:person:{w.people['cat']}"], "CONFLICT"),
        ([f"for:person:{w.people['bob']}"], "CONFLICT"),  # within the rule, but his grant went
        (["for:channel:"], "BAD_INPUT"),
        (["for:person:ann\x00"], "BAD_INPUT"),
    ):
        codes = await api.codes(share, {"b": w.bot, "id": team, "a": audience}, w.tokens["ann"])
        assert codes == [code], audience
    # An unknown channel and another organization's channel with members are told alike: the
    # second was "not within every source's rule", which told that it exists (D9.4).
    told = [
        (await api.raw(share, {"b": w.bot, "id": team, "a": [channel]}, w.tokens["ann"]))["errors"][0][
            "message"
        ]
        for channel in ("for:channel:chan_doesnotexist", f"for:channel:{other.channel}")
    ]
    assert told[0] == told[1] == "the new audience admits nobody who uses the Bot", told
    with pytest.raises(Conflict):
        await apply(runtime, w.bot, Share(team, ("for:channel:chan_doesnotexist",)))
    assert team in await visible(api, w.tokens["ann"], w.bot)
    # Narrowed to one who uses the Bot, it is theirs; the sharer may leave herself out.
    await api.grant(w.bot, w.people["bob"], "READ")
    to_bob = {"b": w.bot, "id": team, "a": [f"for:person:{w.people['bob']}"]}
    assert (await api.gql(share, to_bob, w.tokens["ann"]))["shareEntry"]["version"] > 0
    assert team in await visible(api, w.tokens["bob"], w.bot)
    assert team not in await visible(api, w.tokens["ann"], w.bot)


async def test_purge_cascades_to_observations_and_needs_unlinked_write(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"))
    guest = await make_world(api, ("gus",))
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": w.bot, "o": guest.org},
    )
    await api.grant(w.bot, guest.people["gus"], "WRITE")
    c1 = await api.chat(w.tokens["ann"], w.bot)
    c2 = await api.chat(w.tokens["ann"], w.bot)
    f1 = await fact(runtime, w.bot, "from chat one", await said(api, w.tokens["ann"], c1, "one"))
    f2 = await fact(runtime, w.bot, "from chat two", await said(api, w.tokens["ann"], c2, "two"))
    o = await observation(runtime, w.bot, "across both", f1, f2)
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    # READ only, a linked organization's WRITE, and a platform cannot purge (D9.13).
    await api.grant(w.bot, w.people["bob"], "READ")
    for token in (w.tokens["bob"], guest.tokens["gus"]):
        denied = await api.http.post(
            f"/v1/bots/{w.bot}/memory/purge",
            json={"tag": f"chat:{c1}"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert denied.status_code == 403
    # A platform token is refused alike for this Bot and for none (403 for an existing Bot and 404
    # for an unknown one told it which ids exist).
    platform = await api.platform_token(guest.org)
    for bot in (w.bot, "bot_" + "0" * 32):
        refused = await api.http.post(
            f"/v1/bots/{bot}/memory/purge",
            json={"tag": f"chat:{c1}"},
            headers={"Authorization": f"Bearer {platform}"},
        )
        assert refused.status_code == 403, refused.text
    bad = await api.http.post(f"/v1/bots/{w.bot}/memory/purge", json={"tag": "travel"}, headers=headers)
    assert bad.status_code == 422
    response = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{c1}"}, headers=headers
    )
    assert response.status_code == 200 and response.json() == {"removed": 2}
    assert set(await visible(api, w.tokens["ann"], w.bot)) == {f2}
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change {botId: $b}) "
        "RETURN count(CASE WHEN any(i IN c.entryIds WHERE i IN $ids) THEN 1 END) AS embedding, "
        "count(CASE WHEN c.payload IS NULL AND c.actor = 'memory_bot' THEN 1 END) AS stripped",
        b=w.bot,
        ids=[f1, o],
    )
    # The log rows that created f1 and o lost their encrypted payload and those ids (D9.20).
    assert (records[0]["embedding"], records[0]["stripped"]) == (0, 2)
    log = await api.http.get(f"/v1/bots/{w.bot}/memory/log", headers=headers)
    assert all(set(c["ids"]) <= {f2} for c in log.json()["changes"])


async def test_linked_bot_is_scoped_by_organization(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",), channel=("ann",))
    guest = await make_world(api, ("gus",))
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": w.bot, "o": guest.org},
    )
    await api.grant(w.bot, guest.people["gus"], "READ")
    home = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    team = await fact(runtime, w.bot, "home team fact", await said(api, w.tokens["ann"], home, "home"))
    await apply(runtime, w.bot, Share(team, ("for:bot",)))
    assert team not in await visible(api, guest.tokens["gus"], w.bot)
    away = await api.chat(guest.tokens["gus"], w.bot)
    gus_fact = await fact(runtime, w.bot, "guest fact", await said(api, guest.tokens["gus"], away, "guest"))
    assert list(await visible(api, guest.tokens["gus"], w.bot)) == [gus_fact]
    assert gus_fact not in await visible(api, w.tokens["ann"], w.bot)
    o = await observation(runtime, w.bot, "drawn across two organizations", team, gus_fact)
    assert o not in await visible(api, guest.tokens["gus"], w.bot)
    assert o not in await visible(api, w.tokens["ann"], w.bot)


async def test_a_linked_organization_sees_only_itself_among_a_bots_links(api: Api) -> None:
    """Which other organizations share a Bot is its owner's business: a person or platform token of
    a linked organization sees only their own organization among ``linkedOrganizationIds``
    (through ``bot`` and ``bots``; REST shows no Bot's links); the owner and the admin see every link."""
    w = await make_world(api, ("ann",))
    guest = await make_world(api, ("gus",))
    other = await make_world(api, ("oli",))
    for org in (guest.org, other.org):
        await api.admin(
            "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
            {"b": w.bot, "o": org},
        )
    await api.grant(w.bot, guest.people["gus"], "READ")
    await api.grant(w.bot, w.people["ann"], "READ")
    everyone = sorted([guest.org, other.org])
    query = "query($b: ID!) { bot(id: $b) { linkedOrganizationIds } bots { id linkedOrganizationIds } }"
    for token, expected in (
        (guest.tokens["gus"], [guest.org]),
        (await api.platform_token(guest.org), [guest.org]),
        (w.tokens["ann"], everyone),
        (await api.platform_token(w.org), everyone),
    ):
        seen = await api.gql(query, {"b": w.bot}, token)
        assert sorted(seen["bot"]["linkedOrganizationIds"]) == expected
        listed = [b for b in seen["bots"] if b["id"] == w.bot]
        assert [sorted(b["linkedOrganizationIds"]) for b in listed] == [expected]
    admin = await api.admin(query, {"b": w.bot})
    assert sorted(admin["bot"]["linkedOrganizationIds"]) == everyone


async def test_legacy_entries_stay_hidden_and_are_never_widened(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    legacy = LegacyEntry(
        content="old memory", tags=(f"for:person:{w.people['ann']}", f"org:{w.org}", "for:bot")
    )
    # One import is one change in one transaction: at most MAX_LEGACY_ENTRIES, refused before work.
    memory_version = "MATCH (m:Memory {id: $b}) RETURN m.version AS v"
    version = (await runtime.driver.execute_query(memory_version, b=w.bot)).records[0]["v"]
    too_many = [LegacyEntry(content=f"old {n}", tags=("for:bot",)) for n in range(MAX_LEGACY_ENTRIES + 1)]
    with pytest.raises(BadInput):
        await import_legacy(runtime, w.bot, too_many)
    tagged = LegacyEntry(content="old", tags=tuple(f"t{n}" for n in range(MAX_LEGACY_TAGS + 1)))
    with pytest.raises(BadInput):
        await import_legacy(runtime, w.bot, [tagged])
    # A layer of no such name is refused (it was stored as a fact).
    with pytest.raises(BadInput, match="layer is fact, observation or pinned"):
        await import_legacy(runtime, w.bot, [LegacyEntry(content="old", tags=(), layer="banana")])
    assert (await runtime.driver.execute_query(memory_version, b=w.bot)).records[0]["v"] == version
    applied = await import_legacy(runtime, w.bot, [legacy])
    assert legacy.id not in await visible(api, w.tokens["ann"], w.bot)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change {version: $v, botId: $b}) RETURN c.actor AS a", v=applied.version, b=w.bot
    )
    assert records[0]["a"] == "promotion"
    with pytest.raises(Conflict):
        await apply(runtime, w.bot, Share(legacy.id, (f"for:person:{w.people['ann']}",)))
    with pytest.raises(Conflict):
        await observation(runtime, w.bot, "built on legacy", legacy.id)


async def test_deleting_history_keeps_memory_and_purge_chat_removes_it(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    entry = await fact(
        runtime, w.bot, "kept after history deletion", await said(api, w.tokens["ann"], chat, "x")
    )
    deleted = await api.gql(
        "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
    )
    assert deleted["deleteChatHistory"]["items"] == 1
    page = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { id text } } }", {"c": chat}, w.tokens["ann"]
    )
    assert page["chat"]["messages"] == [{"id": "i-1", "text": None}]
    assert entry in await visible(api, w.tokens["ann"], w.bot)
    purged = await api.gql(
        "mutation($b: ID!, $t: String!) { purge(botId: $b, tag: $t) { removed } }",
        {"b": w.bot, "t": f"chat:{chat}"},
        w.tokens["ann"],
    )
    assert purged["purge"]["removed"] == 1
    assert await visible(api, w.tokens["ann"], w.bot) == {}


async def test_tag_and_status_changes_keep_ciphertext_and_log_every_change(
    api: Api, runtime: Runtime
) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    entry = await fact(runtime, w.bot, "stable bytes", await said(api, w.tokens["ann"], chat, "x"))

    async def stored() -> tuple[str, int]:
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (e:Entry {id: $id})-[:IN_MEMORY]->(m:Memory) RETURN e.content AS c, m.version AS v",
            id=entry,
        )
        return str(records[0]["c"]), int(records[0]["v"])

    before, v0 = await stored()
    await apply(runtime, w.bot, SetTopics(entry, ("bytes",)))
    await apply(runtime, w.bot, Invalidate(entry))
    after, v2 = await stored()
    assert after == before and v2 == v0 + 2  # E3, C2
    log = await api.gql(
        "query($b: ID!) { memoryLog(botId: $b) { version changes { version actor ids } } }",
        {"b": w.bot},
        w.tokens["ann"],
    )
    versions = [c["version"] for c in log["memoryLog"]["changes"]]
    assert versions[:3] == [v2, v2 - 1, v2 - 2] and log["memoryLog"]["version"] == v2
    assert {c["actor"] for c in log["memoryLog"]["changes"]} == {"memory_bot"}


async def test_topics_are_set_and_a_rename_covers_every_matching_entry(api: Api, runtime: Runtime) -> None:
    """L4: a topic rename covers every matching entry valid in its organization, far beyond
    learningContext's 300 (test_learning: no other organization's, nor one no longer valid); V8:
    only topics, never colon tags; E3: the ciphertext stays; C2: one version, one log row."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "trips")
    trips = [AddFact(content=f"trip {n}", sources=(ItemRef(*src),), topics=("trip",)) for n in range(340)]
    both = AddFact(content="trip and travel", sources=(ItemRef(*src),), topics=("trip", "travel"))
    other = AddFact(content="not a trip", sources=(ItemRef(*src),), topics=("work",))
    await apply_changes(runtime, w.bot, [*trips, both, other], "memory_bot")
    renamed = {c.id for c in trips} | {both.id}

    async def stored() -> tuple[dict[str, tuple[str, list[str]]], int]:
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (m:Memory {id: $b})<-[:IN_MEMORY]-(e:Entry) RETURN m.version AS v, e.id AS id, e.content AS c, e.tags AS t",
            b=w.bot,
        )
        return {r["id"]: (str(r["c"]), list(r["t"])) for r in records}, int(records[0]["v"])

    before, v0 = await stored()
    # Bad topics are refused before anything is written (V8).
    for bad in (
        RenameTopic("trip", "for:bot", w.org),
        RenameTopic("trip", "Not A Topic", w.org),
        SetTopics(other.id, ("org:x",)),
    ):
        with pytest.raises(BadInput):
            await apply(runtime, w.bot, bad)
    assert await stored() == (before, v0)

    applied = await apply(runtime, w.bot, RenameTopic("trip", "travel", w.org))
    after, v1 = await stored()
    assert set(applied.entry_ids) == renamed and v1 == v0 + 1 == applied.version
    for entry_id, (blob, tags) in after.items():
        assert blob == before[entry_id][0]  # E3: byte-identical
        colon = [t for t in before[entry_id][1] if ":" in t]
        assert [t for t in tags if ":" in t] == colon  # who sees it is untouched
        topics = [t for t in tags if ":" not in t]
        assert topics == (["travel"] if entry_id in renamed else ["work"]), (entry_id, tags)
    listed = await visible(api, w.tokens["ann"], w.bot, tags="travel")
    assert set(listed) == renamed and await visible(api, w.tokens["ann"], w.bot, tags="trip") == {}
    log = await api.http.get(
        f"/v1/bots/{w.bot}/memory/log", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    newest = log.json()["changes"][0]
    assert newest["version"] == v1 and set(newest["ids"]) == renamed

    # set_topics replaces an entry's topics and keeps its colon tags.
    await apply(runtime, w.bot, SetTopics(other.id, ("work", "plans")))
    tags = (await visible(api, w.tokens["ann"], w.bot))[other.id]["tags"]
    assert [t for t in tags if ":" not in t] == ["work", "plans"]
    assert [t for t in tags if ":" in t] == [t for t in before[other.id][1] if ":" in t]


async def test_a_refused_new_entry_writes_nothing_of_its_change(api: Api, runtime: Runtime) -> None:
    """Each way a new entry's sources can refuse it (C7, L3, D9.16, V5, V9, V13) ends the whole
    change with its 409 and writes nothing: no entry, no version, no log row. Checked for a change
    of new entries only (one auto-commit statement) and for one that also edits an entry (an
    explicit transaction), with the good entries before the refused one."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    chat = await api.chat(token, w.bot)
    message = await said(api, token, chat, "book us a table")
    turn = await api.turn(token, chat, "and a taxi")
    added = await api.gql(
        "mutation($t: ID!) { addItems(turnId: $t, items: ["
        '{kind: BOT_MESSAGE, text: "sure"}, {kind: TOOL_RESULT, text: "booked", app: "restaurants"}'
        "]) { id } }",
        {"t": turn["id"]},
        token,
    )
    bot_said, tool = (ItemRef(chat, i["id"]) for i in added["addItems"])
    review = await api.chat(token, w.bot, review=True)
    in_review = ItemRef(*await said(api, token, review, "between us"))
    gone_chat = await api.chat(token, w.bot)
    gone = ItemRef(*await said(api, token, gone_chat, "forget this chat"))
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": gone_chat}, token)
    other = await make_world(api, ("bob",))
    foreign = ItemRef(
        *await said(api, other.tokens["bob"], await api.chat(other.tokens["bob"], other.bot), "x")
    )
    base = await fact(runtime, w.bot, "Ann books tables", message)
    old = await fact(runtime, w.bot, "Ann booked before", message)
    await apply(runtime, w.bot, Invalidate(old))
    legacy = (await import_legacy(runtime, w.bot, [LegacyEntry("from before", ("for:bot",))])).entry_ids[0]
    later = AddFact("comes later", (ItemRef(*message),))

    refused: list[tuple[str, list[MemoryChange]]] = [
        ("item_missing", [AddFact("no such item", (ItemRef(chat, "i-99"),))]),
        ("item_missing", [AddFact("another Bot's item", (foreign,))]),
        ("review_chat", [AddFact("from a review", (in_review,))]),
        ("history_deleted", [AddFact("from deleted history", (gone,))]),
        ("not_evidence", [AddFact("the bot said so", (ItemRef(*message), bot_said))]),
        ("app_only", [AddFact("the app said so", (tool,))]),
        ("entry_missing", [AddObservation("on nothing", ("mem_missing",), 0.5)]),
        ("entry_missing", [AddObservation("before its source", (later.id,), 0.5), later]),
        ("entry_inactive", [AddObservation("on history", (old,), 0.5)]),
        ("entry_inactive", [AddObservation("on legacy", (legacy,), 0.5)]),
    ]

    async def state() -> tuple[int, int, int]:
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (m:Memory {id: $b}) RETURN m.version AS v, COUNT { (:Entry)-[:IN_MEMORY]->(m) } AS e,"
            " COUNT { (:Change)-[:OF]->(m) } AS c",
            b=w.bot,
        )
        return records[0]["v"], records[0]["e"], records[0]["c"]

    for code, bad in refused:
        good: list[MemoryChange] = [
            AddFact("a good fact first", (ItemRef(*message), tool)),
            Remember("a pinned note", w.people["ann"], w.org),
        ]
        for edit in ([], [SetTopics(base, ("edited",))]):
            before = await state()
            with pytest.raises(Conflict) as refusal:
                await apply(runtime, w.bot, *edit, *good, *bad)
            assert refusal.value.message == REFUSALS[code], (code, edit)
            assert await state() == before, (code, edit)
    assert "edited" not in (await visible(api, token, w.bot))[base]["tags"]
    # The same entries without the refused one are applied, tags derived from the sources.
    good_fact = AddFact("a good fact", (ItemRef(*message), tool))
    on_it = AddObservation("on the good fact", (good_fact.id, base), 0.6, ("plans",))
    await apply(runtime, w.bot, good_fact, on_it)
    seen = await visible(api, token, w.bot)
    ann = w.people["ann"]
    assert seen[good_fact.id]["tags"] == [
        f"from:{ann}",
        f"for:person:{ann}",
        f"org:{w.org}",
        f"chat:{chat}",
        "app:restaurants",
    ]
    assert seen[on_it.id]["tags"] == [
        f"from:{ann}",
        f"for:person:{ann}",
        f"org:{w.org}",
        f"chat:{chat}",
        "plans",
    ]


SHARE_EXPECTED = (
    "mutation($b: ID!, $id: ID!, $a: [String!]!, $x: Long) {"
    " shareEntry(botId: $b, id: $id, audience: $a, expected: $x) { version } }"
)
CHANGED = "query($b: ID!) { memory(botId: $b) { entries { id changedVersion } } }"


async def changed_versions(api: Api, token: str, bot: str) -> dict[str, int]:
    data = await api.gql(CHANGED, {"b": bot}, token)
    return {e["id"]: e["changedVersion"] for e in data["memory"]["entries"]}


async def test_a_share_with_the_version_it_read_is_refused_once_the_entry_changed(
    api: Api, runtime: Runtime
) -> None:
    """Ann and Bob both stand behind a group fact and narrow it at once: each read its
    ``changedVersion``; the first share moves it, so the second — made on what it read before —
    is CONFLICT instead of replacing her audience with his unseen. A change that names the entry
    (Bob's forget of his part) moves it too; one that does not (another entry's) leaves it."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    entry = await fact(
        runtime,
        w.bot,
        "The team meets on Mondays",
        await said(api, w.tokens["ann"], group, "we meet mondays"),
        await said(api, w.tokens["bob"], group, "mondays it is"),
    )
    read = (await changed_versions(api, w.tokens["ann"], w.bot))[entry]
    assert read > 0
    other = await fact(runtime, w.bot, "The team likes tea", await said(api, w.tokens["bob"], group, "tea"))
    assert (await changed_versions(api, w.tokens["ann"], w.bot))[entry] == read  # another entry's change
    channel = [f"for:channel:{w.channel}"]
    ann = await api.gql(SHARE_EXPECTED, {"b": w.bot, "id": entry, "a": channel, "x": read}, w.tokens["ann"])
    moved = (await changed_versions(api, w.tokens["ann"], w.bot))[entry]
    assert moved == ann["shareEntry"]["version"] > read
    late = await api.raw(
        SHARE_EXPECTED,
        {"b": w.bot, "id": entry, "a": [f"for:person:{w.people['bob']}"], "x": read},
        w.tokens["bob"],
    )
    assert late["errors"][0]["extensions"]["code"] == "CONFLICT", late
    assert f"at version {moved}" in late["errors"][0]["message"]
    assert entry in await visible(api, w.tokens["ann"], w.bot)  # Bob's share replaced nothing
    # Bob's forget of his part names the entry: it moves on again.
    assert (await command(api, w.tokens["bob"], w.bot, {"_tag": "Forget", "id": entry})).status_code == 200
    assert (await changed_versions(api, w.tokens["ann"], w.bot))[entry] > moved
    assert other in await changed_versions(api, w.tokens["ann"], w.bot)


async def test_the_migration_gives_each_entry_its_last_logged_version(api: Api, runtime: Runtime) -> None:
    """Version 27 sets ``changedVersion`` from the change log for entries written before it was
    kept: the version of the last change row that names each (a later one set since is kept)."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    first = await fact(runtime, w.bot, "Ann rows", await said(api, w.tokens["ann"], chat, "I row"))
    second = await fact(runtime, w.bot, "Ann runs", await said(api, w.tokens["ann"], chat, "I run"))
    await apply(runtime, w.bot, Invalidate(first))
    kept = await changed_versions(api, w.tokens["ann"], w.bot)  # `first` is invalidated: not listed
    logged, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change {botId: $b}) UNWIND c.entryIds AS id RETURN id, max(c.version) AS v", b=w.bot
    )
    last = {r["id"]: r["v"] for r in logged}
    assert kept[second] == last[second] and last[first] > last[second]
    # A later version set since (a change committed while the migration ran) is kept.
    await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) SET e.changedVersion = CASE e.id WHEN $kept THEN 999 END",
        b=w.bot,
        kept=second,
    )
    async with runtime.driver.session() as session:
        await (await session.run(_SET_CHANGED_VERSION)).consume()
    found, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN e.id AS id, e.changedVersion AS v", b=w.bot
    )
    assert {r["id"]: r["v"] for r in found} == {first: last[first], second: 999}
