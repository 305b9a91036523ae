"""The access proof ``why`` (D9.28): only the caller's own atoms, never beyond visibility (V2–V4, D9.7)."""

from __future__ import annotations

import json
from typing import Any

from graph import sourcegraph as sourcegraph_q
from services import memory
from services.runtime import Runtime
from tests.client import Api, make_world
from tests.memory_helpers import db_hits, fact, observation, said

WHY = """
query($b: ID!, $id: ID!) {
  entry(botId: $b, id: $id) {
    why { summary steps { entry chat item rule admittedBy reason } }
  }
}
"""


def steps_of(data: dict[str, Any]) -> set[tuple[str, tuple[str, str] | None, str, str]]:
    """(entry, (chat, item) or None, rule, admittedBy) of every step."""
    return {
        (s["entry"], None if s["item"] is None else (s["chat"], s["item"]), s["rule"], s["admittedBy"])
        for s in data["entry"]["why"]["steps"]
    }


async def test_why_names_the_callers_atoms_per_source(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    assert w.channel is not None
    ann, org, ch = w.people["ann"], w.org, w.channel
    group = await api.chat(w.tokens["ann"], w.bot, channel=ch)
    private = await api.chat(w.tokens["ann"], w.bot)
    g_src = await said(api, w.tokens["bob"], group, "we ship on fridays")
    p_src = await said(api, w.tokens["ann"], private, "I like tea")
    team = await fact(runtime, w.bot, "the team ships on fridays", g_src)
    mine = await fact(runtime, w.bot, "ann likes tea", p_src)
    top = await observation(runtime, w.bot, "ann drinks tea at the friday release", team, mine)

    data = await api.gql(WHY, {"b": w.bot, "id": top}, w.tokens["ann"])
    steps = steps_of(data)
    # The group fact's evidence admits Ann by her channel, the private fact's by her person id;
    # both Item edges are in her organization.
    assert (team, g_src, "CHANNEL", f"channel:{ch}") in steps
    assert (team, g_src, "ORGANIZATION", f"org:{org}") in steps
    assert (mine, p_src, "PERSON", f"person:{ann}") in steps
    assert (mine, p_src, "ORGANIZATION", f"org:{org}") in steps
    # Each entry's own for: tags: the group fact is for the channel, the private one for Ann.
    assert (team, None, "CHANNEL", f"channel:{ch}") in steps
    assert (mine, None, "PERSON", f"person:{ann}") in steps
    # The observation carries its sources' audience (V12), each met by Ann's atoms.
    assert {(r, a) for e, _, r, a in steps if e == top} >= {
        ("CHANNEL", f"channel:{ch}"),
        ("PERSON", f"person:{ann}"),
    }
    # Every atom is Ann's own: no other person, channel or organization is named.
    assert {a for *_, a in steps} <= {f"person:{ann}", f"channel:{ch}", "bot", f"org:{org}"}
    assert {e for e, *_ in steps} == {top, team, mine}
    assert {i for _, i, _, _ in steps if i is not None} == {g_src, p_src}
    channel_steps = [s for s in data["entry"]["why"]["steps"] if s["rule"] == "CHANNEL"]
    assert all("member of channel 'team'" in s["reason"] for s in channel_steps)
    assert "every one of its 4 sources" in data["entry"]["why"]["summary"]
    text = json.dumps(data)
    assert w.people["bob"] not in text and w.people["cat"] not in text

    # Cat uses the Bot but is in neither chat: the entry does not exist for her.
    outsider = await api.codes(WHY, {"b": w.bot, "id": top}, w.tokens["cat"])
    assert outsider == ["NOT_FOUND"]
    # Bob sees the team fact: his own channel atom, never Ann's private rule.
    bob = await api.gql(WHY, {"b": w.bot, "id": team}, w.tokens["bob"])
    assert {a for *_, a in steps_of(bob)} <= {f"channel:{ch}", f"org:{org}", "bot"}

    # Ann leaves the channel: the proof does not outlive visibility.
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": ch, "m": [w.people["bob"]]},
    )
    assert await api.codes(WHY, {"b": w.bot, "id": top}, w.tokens["ann"]) == ["NOT_FOUND"]
    assert await api.codes(WHY, {"b": w.bot, "id": team}, w.tokens["ann"]) == ["NOT_FOUND"]


async def test_why_of_a_forgotten_share_names_no_one_else(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    from_ann = await said(api, w.tokens["ann"], group, "the demo is on monday")
    from_bob = await said(api, w.tokens["bob"], group, "yes, monday at ten")
    both = await fact(runtime, w.bot, "the demo is monday at ten", from_ann, from_bob)
    before = steps_of(await api.gql(WHY, {"b": w.bot, "id": both}, w.tokens["ann"]))
    assert not any(r == "NOT_EXCLUDED" for _, _, r, _ in before)

    await api.gql(
        "mutation($b: ID!, $id: ID!) { forget(botId: $b, id: $id) { version } }",
        {"b": w.bot, "id": both},
        w.tokens["bob"],
    )
    data = await api.gql(WHY, {"b": w.bot, "id": both}, w.tokens["ann"])
    after = steps_of(data)
    assert after - before == {(both, None, "NOT_EXCLUDED", f"person:{w.people['ann']}")}
    assert w.people["bob"] not in json.dumps(data["entry"]["why"])
    assert await api.codes(WHY, {"b": w.bot, "id": both}, w.tokens["bob"]) == ["NOT_FOUND"]


async def test_why_of_a_pinned_entry_is_its_own_rules(api: Api) -> None:
    w = await make_world(api, ("ann", "bob"))
    pinned = await api.gql(
        'mutation($b: ID!) { remember(botId: $b, content: "call me Annie") { entry { id } } }',
        {"b": w.bot},
        w.tokens["ann"],
    )
    pid = pinned["remember"]["entry"]["id"]
    data = await api.gql(WHY, {"b": w.bot, "id": pid}, w.tokens["ann"])
    assert {(e, r) for e, _, r, _ in steps_of(data)} >= {(pid, "PERSON")}
    assert {e for e, *_ in steps_of(data)} == {pid}
    assert "pinned" in data["entry"]["why"]["summary"]
    assert await api.codes(WHY, {"b": w.bot, "id": pid}, w.tokens["bob"]) == ["NOT_FOUND"]


async def test_bots_lists_what_each_caller_can_use(api: Api) -> None:
    """`bots`: a person's granted Bots of their organization; a platform token's organization's."""
    w = await make_world(api, ("ann", "bob"))
    other = await api.bot(w.org, "other")  # in Ann's organization, not granted to her
    query = "{ bots { id name organizationId } }"
    assert [b["id"] for b in (await api.gql(query, token=w.tokens["ann"]))["bots"]] == [w.bot]
    await api.grant(w.bot, w.people["bob"], "NONE")
    assert (await api.gql(query, token=w.tokens["bob"]))["bots"] == []
    platform = await api.platform_token(w.org)
    assert {b["id"] for b in (await api.gql(query, token=platform))["bots"]} == {w.bot, other}
    outsider_org = await api.organization("elsewhere")
    _, outsider = await api.person(outsider_org, "eve")
    assert (await api.gql(query, token=outsider))["bots"] == []


async def test_why_walks_each_entry_once_however_many_paths_lead_to_it(api: Api, runtime: Runtime) -> None:
    """``why`` costs as many entries and edges as its closure holds, never as many paths: paths
    multiply where observations share sources (a lattice three wide, each observation resting on
    the three below it: 3^d paths from a top d levels up). WHY_STEPS keeps each entry's nearest
    depth only, which Neo4j walks breadth-first (a pruning expand): six levels cost less than
    three times three (290 and 500 db hits here), where enumerating the paths cost 27 times.
    Every entry of the closure is listed once."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    src = await said(api, token, await api.chat(token, w.bot), "many small things")
    levels = [[await fact(runtime, w.bot, f"fact {i}", src) for i in range(3)]]
    for depth in range(1, 7):
        levels.append(
            [await observation(runtime, w.bot, f"level {depth} #{i}", *levels[-1]) for i in range(3)]
        )
    reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
    assert reader is not None
    params = {"botId": w.bot, "statuses": ["active", "invalidated"], **reader.params}
    low = await db_hits(runtime, sourcegraph_q.WHY_STEPS, {**params, "id": levels[3][0]})
    high = await db_hits(runtime, sourcegraph_q.WHY_STEPS, {**params, "id": levels[6][0]})
    assert high < 3 * low, (low, high)
    data = await api.gql(WHY, {"b": w.bot, "id": levels[6][0]}, token)
    listed = [
        s["entry"] for s in data["entry"]["why"]["steps"] if s["rule"] == "PERSON" and s["item"] is None
    ]
    below = {e for level in levels[:6] for e in level}
    assert len(listed) == len(set(listed)) == 1 + len(below) and set(listed) == below | {levels[6][0]}
