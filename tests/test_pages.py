"""The browser pages on the real stack: GraphiQL at /graphql and the explorer at /explore load only
vendored /static assets (no other host), subscriptions authenticate from connection_init, and the
explorer shows what the token may see — hidden neighbours only as a count (D9.7), why (D9.28)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
import websockets

from services.changes import Remember
from services.runtime import Runtime
from tests.browser import Page, browser_page
from tests.client import Api, make_world
from tests.feed_helpers import opened, until_opened, ws_url
from tests.memory_helpers import apply, fact, observation, said

EXTERNAL = re.compile(r"(?:https?:)?//(?!localhost|127\.0\.0\.1)[a-z0-9.-]+\.[a-z]{2,}", re.IGNORECASE)


async def test_pages_and_vendor_files_are_served_from_this_origin(api: Api) -> None:
    # Every page carries the policy: the rendered ones, their files under /static and /docs
    # (the last two had none: a page of this origin that any site could frame).
    pages: tuple[tuple[str, dict[str, str]], ...] = (
        ("/graphql", {"Accept": "text/html"}),
        ("/explore", {}),
        ("/docs", {}),
    )
    for path, headers in pages:
        page = await api.http.get(path, headers=headers)
        assert page.status_code == 200, page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        # Sockets of this origin only: ``ws: wss:`` let an injected script send the token anywhere.
        assert "connect-src 'self';" in policy and "ws:" not in policy, policy
        assert (
            page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
        )
        assert not EXTERNAL.findall(page.text), EXTERNAL.findall(page.text)
        scripts = re.findall(r'src="([^"]+)"', page.text)
        assert scripts and all(s.startswith("/static/") for s in scripts)
        for src in scripts:
            asset = await api.http.get(src)
            assert asset.status_code == 200, src
            cache = asset.headers["cache-control"]
            assert ("immutable" in cache) == src.startswith("/static/vendor/"), (src, cache)
    # A page's HTML only rendered: raw, its assets' ``?v=__V__`` never changed between releases.
    for raw in ("/static/explore.html", "/static/graphiql.html", "/static/docs.html"):
        assert (await api.http.get(raw)).status_code == 404, raw
    swagger = await api.http.get("/static/vendor/swagger-ui/swagger-ui-bundle.js")
    assert (
        swagger.status_code == 200
        and (await api.http.get("/static/vendor/swagger-ui/swagger-ui.css")).status_code == 200
    )


async def test_every_answer_is_unsniffed_unframed_and_the_apis_are_never_stored(api: Api) -> None:
    """Every HTTP answer says nosniff, no Referer and never framed; the API's answers, which carry
    decrypted memory and messages, are ``no-store`` (a browser on a shared machine, or a proxy,
    kept them on disk), errors and GraphQL over GET included; the pages keep their own caching."""
    w = await make_world(api, ("ann",))
    ann = {"Authorization": f"Bearer {w.tokens['ann']}"}
    query = "query($b: ID!) { memory(botId: $b) { entries { id } } }"
    answers = {
        "REST": await api.http.get(f"/v1/bots/{w.bot}/memory", headers=ann),
        "REST error": await api.http.get("/v1/bots/bot_unknown/memory", headers=ann),
        "GraphQL": await api.http.post(
            "/graphql", json={"query": query, "variables": {"b": w.bot}}, headers=ann
        ),
        "GraphQL over GET": await api.http.get(
            "/graphql", params={"query": query, "variables": json.dumps({"b": w.bot})}, headers=ann
        ),
    }
    for name, answer in answers.items():
        assert answer.status_code in (200, 404), (name, answer.text)
        assert answer.headers["cache-control"] == "no-store", name
    answers["page"] = await api.http.get("/explore")
    answers["health"] = await api.http.get("/healthz")
    for name, answer in answers.items():
        assert answer.headers["x-content-type-options"] == "nosniff", name
        assert answer.headers["referrer-policy"] == "no-referrer", name
        assert answer.headers["x-frame-options"] == "DENY", name
    assert answers["page"].headers["cache-control"] == "no-cache"


@pytest.mark.parametrize(
    "payload",
    [
        '{"Authorization": "Bearer TOKEN"}',
        '{"authorization": "Bearer TOKEN"}',
        '{"token": "TOKEN"}',
        '{"headers": {"Authorization": "Bearer TOKEN"}}',
    ],
    ids=["Authorization", "authorization", "token", "headers"],
)
async def test_connection_init_accepts_each_token_spelling(api: Api, payload: str) -> None:
    w = await make_world(api, ("ann",))
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps(
                {"type": "connection_init", "payload": json.loads(payload.replace("TOKEN", w.tokens["ann"]))}
            )
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"


@pytest.mark.parametrize(
    "payload",
    [{"auth": "Bearer x"}, {}, {"token": 7}, {"Authorization": "Basic x"}],
    ids=["wrong-key", "empty", "not-a-string", "not-bearer"],
)
async def test_a_wrong_connection_init_closes_with_the_expected_shape(api: Api, payload: Any) -> None:
    """A payload without a bearer token is told the shapes; a wrong token of the right shape is
    told it is invalid (tests/test_subscriptions.py)."""
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    assert '{"Authorization": "Bearer <token>"}' in closed.value.rcvd.reason


#: The CodeMirror 5 editors of GraphiQL, found by what they hold.
_EDITOR = "[...document.querySelectorAll('.CodeMirror')].map(e => e.CodeMirror)"


async def _graphiql_run(page: Page, query: str) -> None:
    """Replace the query and run it once GraphiQL has parsed it (it decides HTTP or WebSocket from
    the parsed document, which it updates shortly after an edit)."""
    editor = f"{_EDITOR}.find(c => 'documentAST' in c)"
    await page.js(f"{editor}.setValue({json.dumps(query)})")
    await page.wait_for(f"{editor}.documentAST?.loc?.source?.body === {json.dumps(query)}")
    await page.js("document.querySelector('.graphiql-execute-button').click()")


async def test_graphiql_runs_a_query_and_a_subscription_offline(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    src = await said(api, w.tokens["ann"], chat, "I like tea")
    base = str(api.http.base_url).rstrip("/")
    async with browser_page() as page:
        await page.goto(f"{base}/graphql")
        await page.wait_for("document.querySelector('.graphiql-container .CodeMirror') !== null")
        headers = await page.wait_for(
            f"{_EDITOR}.map(c => c.getValue()).find(v => v.includes('Authorization'))"
        )
        assert json.loads(headers) == {"Authorization": "Bearer "}
        assert "Bearer <token>" in await page.js("document.getElementById('token-hint').innerText")
        await page.js(
            f"{_EDITOR}.find(c => c.getValue().includes('Authorization'))"
            f".setValue({json.dumps(json.dumps({'Authorization': 'Bearer ' + w.tokens['ann']}))})"
        )
        await _graphiql_run(page, "{ me { id name } }")
        result = await page.wait_for(f"{_EDITOR}.map(c => c.getValue()).find(v => v.includes('\"data\"'))")
        assert json.loads(result)["data"]["me"]["id"] == w.people["ann"]
        await page.screenshot("graphiql.png")
        # The run is in GraphiQL's history with its headers: in this tab's sessionStorage, never
        # in localStorage (which outlives the tab: the next person in this browser read it there).
        stored = "s => JSON.stringify(Object.keys(s).map(k => s.getItem(k)))"
        assert w.tokens["ann"] in await page.js(f"({stored})(window.sessionStorage)")
        assert w.tokens["ann"] not in await page.js(f"({stored})(window.localStorage)")

        # A subscription over graphql-transport-ws with the header editor's token.
        before = await opened(api, "memoryChanges")
        await _graphiql_run(
            page, f'subscription {{ memoryChanges(botId: "{w.bot}") {{ version entries {{ id }} }} }}'
        )
        await until_opened(api, "memoryChanges", before + 1)
        learned = await fact(runtime, w.bot, "ann likes tea", src)
        event = await page.wait_for(
            f"{_EDITOR}.map(c => c.getValue()).find(v => v.includes({json.dumps(learned)}))"
        )
        assert json.loads(event)["data"]["memoryChanges"]["entries"][0]["id"] == learned
        await page.screenshot("graphiql-subscription.png")
        assert page.hosts <= {"127.0.0.1", "localhost", ""}, page.hosts
        assert not page.errors, page.errors


async def _explore(page: Page, base: str, token: str, bot: str, query: str = "", entry: str = "") -> None:
    await page.goto(f"{base}/explore#{entry}")
    await page.wait_for("typeof cytoscape === 'function' && document.getElementById('go') !== null")
    await page.js("for (const i of document.querySelectorAll('header input')) i.value = ''")
    await page.type_into("#token", token)
    await page.type_into("#bot", bot)
    if query:
        await page.type_into("#query", query)
    await page.js("document.getElementById('status').textContent = ''")
    await page.js("document.getElementById('go').click()")
    await page.wait_for("document.getElementById('status').textContent !== ''")


async def _open(page: Page, entry: str) -> None:
    await page.js(f"document.querySelector('#entries li[data-id={json.dumps(entry)}]').click()")
    await page.wait_for(f"document.getElementById('status').textContent.includes({json.dumps(entry)})")


def _nodes(page_nodes: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [n for n in page_nodes if n["kind"] == kind]


_GRAPH = "window.exploreGraph.nodes().map(n => ({id: n.id(), kind: n.data('kind'), label: n.data('label')}))"


async def test_explorer_draws_the_source_graph_and_why(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    private = await api.chat(w.tokens["ann"], w.bot)
    g_src = await said(api, w.tokens["bob"], group, "we ship on fridays")
    p_src = await said(api, w.tokens["ann"], private, "I like tea")
    team = await fact(runtime, w.bot, "the team ships on fridays", g_src)
    mine = await fact(runtime, w.bot, "ann likes tea", p_src)
    top = await observation(runtime, w.bot, "ann drinks tea at the friday release", team, mine)
    base = str(api.http.base_url).rstrip("/")

    async with browser_page() as page:
        await _explore(page, base, w.tokens["ann"], w.bot)
        # The Bot field offers the Bots Ann can use (the `bots` query).
        await page.wait_for("document.querySelectorAll('#bots option').length > 0")
        assert await page.js("[...document.querySelectorAll('#bots option')].map(o => o.value)") == [w.bot]
        listed = await page.js("[...document.querySelectorAll('#entries li')].map(li => li.dataset.id)")
        assert set(listed) == {top, team, mine}
        await _open(page, top)
        nodes = await page.js(_GRAPH)
        assert {n["id"] for n in nodes if n["kind"] in ("root", "source")} == {top, team, mine}
        assert {n["id"] for n in _nodes(nodes, "item")} == {
            f"item:{g_src[0]}/{g_src[1]}",
            f"item:{p_src[0]}/{p_src[1]}",
        }
        assert not _nodes(nodes, "hidden")
        assert await page.js("window.exploreGraph.edges().length") == 4
        steps = await page.js("[...document.querySelectorAll('#steps li')].map(li => li.innerText)")
        assert any("member of channel 'team'" in s for s in steps)
        assert any(s.startswith("PERSON") for s in steps) and any(s.startswith("ORGANIZATION") for s in steps)
        assert "every one of its 4 sources" in await page.js("document.getElementById('summary').innerText")
        await page.screenshot("explore.png")

        # Bob sees the team fact; the observation above it rests on Ann's private fact: a count.
        await _explore(page, base, w.tokens["bob"], w.bot)
        assert await page.js("[...document.querySelectorAll('#entries li')].map(li => li.dataset.id)") == [
            team
        ]
        await _open(page, team)
        nodes = await page.js(_GRAPH)
        assert [n["label"] for n in _nodes(nodes, "hidden")] == ["1 hidden"]
        assert {n["id"] for n in nodes if n["kind"] in ("root", "source", "dependent")} == {team}
        assert top not in json.dumps(nodes) and mine not in json.dumps(nodes)
        steps_text = await page.js("document.getElementById('why').innerText")
        assert w.people["ann"] not in steps_text
        await page.screenshot("explore-hidden.png")

        # Cat uses the Bot but is in neither chat: nothing to list, the entry is NOT_FOUND.
        await _explore(page, base, w.tokens["cat"], w.bot)
        assert await page.js("document.querySelectorAll('#entries li').length") == 0
        assert await page.js("document.getElementById('status').textContent") == "No entries you may see."
        # Opening it by its id (a link /explore#<id>) gives NOT_FOUND and draws nothing.
        await _explore(page, base, w.tokens["cat"], w.bot, entry=top)
        await page.wait_for("document.getElementById('status').textContent.startsWith('NOT_FOUND')")
        assert await page.js("window.exploreGraph === null")
        assert "cannot see" in await page.js("document.getElementById('summary').innerText")
        assert page.hosts <= {"127.0.0.1", "localhost", ""}, page.hosts
        assert not page.errors, page.errors
        await page.screenshot("explore-outsider.png")


async def test_docs_render_the_openapi_of_every_rest_route_offline(api: Api) -> None:
    """/docs (issue 18 item 4): Swagger UI from the vendored files draws every /v1 operation."""
    spec = (await api.http.get("/openapi.json")).json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    base = str(api.http.base_url).rstrip("/")
    async with browser_page() as page:
        await page.goto(f"{base}/docs")
        await page.wait_for(f"document.querySelectorAll('.opblock').length === {operations}")
        assert "/v1/bots/{bot_id}/memory/search" in await page.js("document.body.innerText")
        await page.screenshot("docs.png")
        assert page.hosts <= {"127.0.0.1", "localhost", ""}, page.hosts
        assert not page.errors, page.errors


async def test_the_explorer_says_when_it_lists_the_first_100_only(api: Api, runtime: Runtime) -> None:
    """The list holds the first 100 entries (the graph stays readable); with more, its status line
    said "100 entries you may see" as if that were all."""
    w = await make_world(api, ("ann",))
    ann = w.people["ann"]
    await apply(runtime, w.bot, *(Remember(f"note {n}", ann, w.org, ("bulk",)) for n in range(101)))
    base = str(api.http.base_url).rstrip("/")
    async with browser_page() as page:
        await _explore(page, base, w.tokens["ann"], w.bot)
        assert await page.js("document.querySelectorAll('#entries li').length") == 100
        said_now = await page.js("document.getElementById('status').textContent")
        assert said_now.startswith("The first 100 entries you may see"), said_now
        assert not page.errors, page.errors


_COUNTING_FETCHES = """
window.sent = 0; window.pending = 0;
const fetched = window.fetch;
window.fetch = (...args) => { window.sent++; window.pending++; return fetched(...args); };
const read = Response.prototype.json;
Response.prototype.json = async function () {
  try { return await read.call(this); } finally { setTimeout(() => window.pending--, 0); }
};
"""


async def test_the_explorer_says_a_refusal_before_graphql_and_lists_once_on_two_clicks(
    api: Api, runtime: Runtime
) -> None:
    """A request refused before GraphQL read it (here a body past the size limit) answers in the
    REST shape, which the explorer read as GraphQL: its status said "Cannot read properties of
    undefined" and lost the code. And two quick clicks each appended the list after one clear: every
    entry twice. Only the latest answer draws now."""
    w = await make_world(api, ("ann",))
    await apply(runtime, w.bot, Remember("ann likes tea", w.people["ann"], w.org, ()))
    base = str(api.http.base_url).rstrip("/")
    async with browser_page() as page:
        await _explore(page, base, w.tokens["ann"], w.bot)
        assert await page.js("document.querySelectorAll('#entries li').length") == 1
        # Requests in flight, counted down once each answer's handling ran (a task after its body).
        await page.js(_COUNTING_FETCHES)
        await page.js("document.getElementById('go').click(); document.getElementById('go').click()")
        await page.wait_for("window.sent === 2 && window.pending === 0")
        assert await page.js("document.getElementById('status').textContent") == "1 entries you may see."
        assert await page.js("document.querySelectorAll('#entries li').length") == 1
        await page.js("document.getElementById('query').value = 'tea '.repeat(300000)")
        await page.js("document.getElementById('status').textContent = ''")
        await page.js("document.getElementById('go').click()")
        await page.wait_for("document.getElementById('status').textContent !== ''")
        said = await page.js("document.getElementById('status').textContent")
        assert said.startswith("BAD_INPUT: "), said
        # The browser logs the refused request itself; nothing else went wrong on the page.
        assert [e for e in page.errors if "status of 413" not in e] == [], page.errors
