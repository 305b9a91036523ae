"""Source-graph exploration (D9.7): only what the caller may see; hidden neighbours only as a count."""

from __future__ import annotations

import json

from services.runtime import Runtime
from tests.client import Api, make_world
from tests.memory_helpers import fact, observation, said

EXPLORE = """
query($b: ID!, $id: ID!, $d: Int!) {
  entry(botId: $b, id: $id) {
    entry { id layer }
    sources(depth: $d) { entries { entry { id } distance } items { chat item distance } hidden }
    dependents(depth: $d) { entries { entry { id } distance } hidden }
  }
}
"""


async def test_sources_and_dependents_with_hidden_counts(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    g_src = await said(api, w.tokens["bob"], group, "team decision")
    team = await fact(runtime, w.bot, "team decision", g_src)
    mine = await fact(runtime, w.bot, "ann's own", await said(api, w.tokens["ann"], private, "mine"))
    shared = await observation(runtime, w.bot, "over both", team, mine)
    top = await observation(runtime, w.bot, "over the observation", shared)

    ann = await api.gql(EXPLORE, {"b": w.bot, "id": top, "d": 3}, w.tokens["ann"])
    sources = ann["entry"]["sources"]
    assert {(e["entry"]["id"], e["distance"]) for e in sources["entries"]} == {
        (shared, 1),
        (team, 2),
        (mine, 2),
    }
    assert len(sources["items"]) == 2 and sources["hidden"] == 0
    one_hop = await api.gql(EXPLORE, {"b": w.bot, "id": top, "d": 1}, w.tokens["ann"])
    assert [e["entry"]["id"] for e in one_hop["entry"]["sources"]["entries"]] == [shared]
    # A node reached by paths of several lengths is listed once, at the nearest; the team fact's
    # dependents within one hop are only those that cite it.
    diamond = await observation(runtime, w.bot, "over the observation and the team", shared, team)
    near = await api.gql(EXPLORE, {"b": w.bot, "id": diamond, "d": 2}, w.tokens["ann"])
    assert sorted((e["entry"]["id"], e["distance"]) for e in near["entry"]["sources"]["entries"]) == sorted(
        [(shared, 1), (team, 1), (mine, 2)]
    )
    cited = await api.gql(EXPLORE, {"b": w.bot, "id": team, "d": 1}, w.tokens["ann"])
    assert sorted(e["entry"]["id"] for e in cited["entry"]["dependents"]["entries"]) == sorted(
        [shared, diamond]
    )
    deeper = await api.gql(EXPLORE, {"b": w.bot, "id": team, "d": 2}, w.tokens["ann"])
    assert sorted(
        (e["entry"]["id"], e["distance"]) for e in deeper["entry"]["dependents"]["entries"]
    ) == sorted([(shared, 1), (diamond, 1), (top, 2)])

    # Bob sees the team fact, but its dependents rest on Ann's private fact: only a count (of
    # the three within two hops).
    bob = await api.gql(EXPLORE, {"b": w.bot, "id": team, "d": 2}, w.tokens["bob"])
    assert bob["entry"]["dependents"] == {"entries": [], "hidden": 3}
    # Counted to the walk's bound whatever the depth: asked hop by hop, the counts drew the
    # hidden graph's shape (two at one hop, one at two).
    for d in (1, 8):
        near_bob = await api.gql(EXPLORE, {"b": w.bot, "id": team, "d": d}, w.tokens["bob"])
        assert near_bob["entry"]["dependents"] == {"entries": [], "hidden": 3}
    assert bob["entry"]["sources"]["items"] == [{"chat": g_src[0], "item": g_src[1], "distance": 1}]
    text = json.dumps(bob)
    assert shared not in text and top not in text and "rule" not in text and "person:" not in text
    # An entry Bob may not see does not exist for him.
    hidden = await api.raw(EXPLORE, {"b": w.bot, "id": shared, "d": 1}, w.tokens["bob"])
    assert hidden["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    too_deep = await api.raw(EXPLORE, {"b": w.bot, "id": team, "d": 9}, w.tokens["ann"])
    assert too_deep["errors"][0]["extensions"]["code"] == "BAD_INPUT"

    # A retracted entry is no one's neighbour: not counted.
    await runtime.driver.execute_query("MATCH (e:Entry {id: $id}) SET e.status = 'retracted'", id=top)
    gone = await api.gql(EXPLORE, {"b": w.bot, "id": team, "d": 2}, w.tokens["bob"])
    assert gone["entry"]["dependents"] == {"entries": [], "hidden": 2}
