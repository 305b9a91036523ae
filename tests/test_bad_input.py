"""Bad input gets a clear error with a stable code and changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets
from graphql.validation import validate
from websockets.typing import Subprotocol

from botmemory import rest
from resolvers.schema import build_schema
from schema.context import ONE_CREDENTIAL
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import ApiProcess
from tests.feed_helpers import ws_url
from tests.memory_helpers import command
from tests.model_server import ModelServer


async def count_nodes(runtime: Runtime, org: str) -> int:
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (o:Organization {id: $o}) OPTIONAL MATCH (o)<-[*1..3]-(n) RETURN count(DISTINCT n) AS n", o=org
    )
    return int(records[0]["n"])


def graphql_socket(api: Api) -> websockets.connect:
    """A graphql-transport-ws connection to the API's /graphql, to open with ``async with``."""
    return websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"])  # type: ignore[list-item]


async def test_malformed_graphql_and_json(api: Api) -> None:
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    assert await api.codes("query { me { id ", token=token) == ["BAD_INPUT"]
    assert await api.codes("query { me { nope } }", token=token) == ["BAD_INPUT"]
    response = await api.http.post(
        "/graphql",
        content=b"{not json",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "BAD_INPUT"  # the REST error body, not plain text
    wrong = await api.http.put(
        "/graphql", json={"query": "{ me { id } }"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "BAD_INPUT"


def escaped(body: dict[str, Any], escape: str) -> bytes:
    """``body`` as JSON, its ``@`` written as the JSON escape ``escape``."""
    return json.dumps(body).replace("@", escape).encode()


async def test_a_lone_surrogate_is_refused_as_malformed_and_saves_nothing(api: Api, runtime: Runtime) -> None:
    """JSON may escape a surrogate alone ("\\ud800"); no UTF-8 text holds one, so nothing could
    encrypt, store or embed it. Python's decoder took it and the operation failed inside: 500
    INTERNAL for a message, a search, a Remember over GraphQL. Refused as input now, on both
    surfaces; a surrogate pair (an emoji escaped) is text like any other."""
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    chat = await api.chat(token, world.bot)
    before = await count_nodes(runtime, world.org)
    start = "mutation($c: ID!, $t: String!) { startTurn(chatId: $c, input: $t) { id } }"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = escaped({"query": start, "variables": {"c": chat, "t": "hi @ there"}}, "\\ud800")
    response = await api.http.post("/graphql", content=body, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "BAD_INPUT"
    search = "query($b: ID!, $q: String!) { search(botId: $b, query: $q, limit: 3) { score } }"
    body = escaped({"query": search, "variables": {"b": world.bot, "q": "@"}}, "\\udc00")
    response = await api.http.post("/graphql", content=body, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "BAD_INPUT"
    remember = escaped({"command": {"_tag": "Remember", "content": "x @", "tags": []}}, "\\ud800")
    response = await api.http.post(f"/v1/bots/{world.bot}/memory", content=remember, headers=headers)
    assert response.status_code == 422 and response.json()["error"]["code"] == "BAD_INPUT"
    assert await count_nodes(runtime, world.org) == before
    # Not as an escape: the bytes of a surrogate (ED A0 80), and bytes that are no UTF-8 at all
    # (a 500 INTERNAL before: Strawberry caught only JSON errors).
    raw = json.dumps({"query": start, "variables": {"c": chat, "t": "hi @"}}).encode()
    raw_rest = json.dumps({"command": {"_tag": "Remember", "content": "x @", "tags": []}}).encode()
    spoilers: list[Callable[[bytes], bytes]] = [
        lambda b: b.replace(b"@", b"\xed\xa0\x80"),
        lambda b: b.replace(b"@", b"\xff"),
        lambda b: b + b"\xc3",
    ]
    for spoil in spoilers:
        response = await api.http.post("/graphql", content=spoil(raw), headers=headers)
        assert response.status_code == 400 and response.json()["error"]["code"] == "BAD_INPUT", response.text
        rest = await api.http.post(f"/v1/bots/{world.bot}/memory", content=spoil(raw_rest), headers=headers)
        assert rest.status_code == 422 and rest.json()["error"]["code"] == "BAD_INPUT", rest.text
    assert await count_nodes(runtime, world.org) == before
    body = escaped({"query": start, "variables": {"c": chat, "t": "hi @"}}, "\\ud83d\\ude00")
    pair = await api.http.post("/graphql", content=body, headers=headers)
    assert pair.status_code == 200 and "errors" not in pair.json()


async def test_wrong_types_unknown_and_invalid_ids(api: Api, runtime: Runtime) -> None:
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    before = await count_nodes(runtime, world.org)
    start = "mutation($c: ID!, $t: String!) { startTurn(chatId: $c, input: $t) { id } }"
    assert await api.codes(start, {"c": "chat_" + "0" * 32, "t": "hi"}, token) == ["NOT_FOUND"]
    assert await api.codes(start, {"c": "../../etc", "t": "hi"}, token) == ["BAD_INPUT"]
    assert await api.codes(start, {"c": {"a": 1}, "t": "hi"}, token) == ["BAD_INPUT"]
    assert await api.codes(start, {"c": "chat_x", "t": 5}, token) == ["BAD_INPUT"]
    assert await api.codes(
        'mutation($b: ID!) { grantBot(botId: $b, personId: "u_x", access: ROOT) { id } }',
        {"b": world.bot},
        api.admin_token,
    ) == ["BAD_INPUT"]
    rest = await api.http.get(
        "/v1/chats/chat_x/messages?limit=abc", headers={"Authorization": f"Bearer {token}"}
    )
    assert rest.status_code == 422
    assert rest.json()["error"]["code"] == "BAD_INPUT"
    assert await count_nodes(runtime, world.org) == before


async def test_oversized_and_empty_text_is_refused_and_saves_nothing(api: Api, runtime: Runtime) -> None:
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    chat = await api.chat(token, world.bot)
    before = await count_nodes(runtime, world.org)
    start = "mutation($c: ID!, $t: String!) { startTurn(chatId: $c, input: $t) { id } }"
    response = await api.raw(start, {"c": chat, "t": "x" * 20_001}, token)
    assert response["errors"][0]["extensions"] == {"code": "BAD_INPUT", "field": "input"}
    assert "20000" in response["errors"][0]["message"]
    assert await api.codes(start, {"c": chat, "t": "   "}, token) == ["BAD_INPUT"]
    huge = await api.http.post(
        "/graphql",
        json={"query": start, "variables": {"c": chat, "t": "y" * 2_000_000}},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "BAD_INPUT"
    assert await count_nodes(runtime, world.org) == before


async def test_a_request_url_or_headers_past_their_bytes_are_refused_before_anything_reads_them(
    api: Api, settings: Settings
) -> None:
    """The server read a URL of any length and GraphQL over GET decoded its variables (JSON of any
    size) before anything looked at the caller; headers were not counted either. A URL past
    max_url_bytes is 414, headers past max_header_bytes are 431 (BAD_INPUT), a WebSocket upgrade
    past either is refused; within them a request goes on."""
    w = await make_world(api, ("ann",))
    auth = {"Authorization": f"Bearer {w.tokens['ann']}"}
    me = "{ me { id } }"  # the variables are read, then ignored: none is declared
    fits = await api.http.get(
        "/graphql", params={"query": me, "variables": json.dumps({"x": "v" * 8_000})}, headers=auth
    )
    assert fits.status_code == 200 and fits.json()["data"]["me"]["id"] == w.people["ann"]
    # The longest search a person may send, in a script of three-byte characters (~18 KB encoded).
    widest = await api.http.get(f"/v1/bots/{w.bot}/memory/search", params={"q": "猫" * 2_000}, headers=auth)
    assert widest.status_code == 200, widest.text
    long = json.dumps({"x": "v" * settings.max_url_bytes})
    for response, status in (
        (await api.http.get("/graphql", params={"query": me, "variables": long}, headers=auth), 414),
        (
            await api.http.get(
                f"/v1/bots/{w.bot}/memory/search", params={"q": "v" * settings.max_url_bytes}, headers=auth
            ),
            414,
        ),
        (
            await api.http.get(
                "/graphql",
                params={"query": me},
                headers={**auth, "X-Padding": "p" * settings.max_header_bytes},
            ),
            431,
        ),
    ):
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == "BAD_INPUT"
    url = ws_url(api) + "?x=" + "v" * settings.max_url_bytes
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url, subprotocols=["graphql-transport-ws"]):  # type: ignore[list-item]
            pass
    # (The WebSocket server refuses a request line past 8 KB itself: 414; past it, the middleware's 403.)
    assert refused.value.response.status_code in (403, 414)


async def _answer_to_a_short_body(url: str, path: str, headers: dict[str, str], trickle: bool) -> bytes:
    """What the API at ``url`` answers a POST that promises 100 bytes of body and sends 10 (and
    then, with ``trickle``, one more now and then), read until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 100\r\n{head}\r\n".encode()
        + b'{"query": '
    )
    await writer.drain()

    async def dribble() -> None:
        while trickle:
            await asyncio.sleep(0.2)
            writer.write(b" ")
            await writer.drain()

    dribbling = asyncio.create_task(dribble())
    try:
        # Bounded far past the setting only so that a request held open fails the test, not the run.
        return await asyncio.wait_for(reader.read(), 60)
    finally:
        dribbling.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await dribbling
        writer.close()


async def test_a_body_that_does_not_arrive_in_time_is_answered_408(api: Api, settings: Settings) -> None:
    """Unbounded, a request whose ``Content-Length`` promises more than it sends is held open for
    as long as its connection stays up, on GraphQL and REST alike, its handler waiting with it. The
    body arrives whole within ``BOTMEMORY_BODY_READ_TIMEOUT_SECONDS`` of the handler's first read
    of it, a body sent a byte at a time too, or the answer is 408 TOO_SLOW in the API's error
    shape, and the connection closes (the rest of the body may still come on it)."""
    w = await make_world(api, ("ann",))
    quick = ApiProcess(
        settings,
        settings.data_dir / "logs" / "pytest-api-body-timeout.log",
        {"BOTMEMORY_BODY_READ_TIMEOUT_SECONDS": "1"},
    )
    try:
        auth = {"Authorization": f"Bearer {w.tokens['ann']}"}
        for path, trickle in (
            ("/graphql", False),
            (f"/v1/bots/{w.bot}/memory", False),
            ("/graphql", True),
        ):
            answer = await _answer_to_a_short_body(quick.url, path, auth, trickle)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), answer
            assert b"\r\nconnection: close" in head.lower(), answer
            assert json.loads(body) == {
                "error": {"code": "TOO_SLOW", "message": "the request body did not arrive within 1 s"}
            }
        # A body that arrives in time is read as ever.
        async with httpx.AsyncClient(base_url=quick.url) as http:
            me = await http.post("/graphql", json={"query": "{ me { id } }"}, headers=auth)
        assert me.json() == {"data": {"me": {"id": w.people["ann"]}}}
    finally:
        quick.stop()


async def test_bad_items_reject_the_whole_call(api: Api, runtime: Runtime) -> None:
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    chat = await api.chat(token, world.bot)
    turn = await api.turn(token, chat, "hello")
    before = await count_nodes(runtime, world.org)
    add = "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }"
    assert await api.codes(
        add,
        {
            "t": turn["id"],
            "i": [{"kind": "BOT_MESSAGE", "text": "ok"}, {"kind": "TOOL_RESULT", "text": "no app"}],
        },
        token,
    ) == ["BAD_INPUT"]
    assert await api.codes(
        add, {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": "x", "app": "calendar"}]}, token
    ) == ["BAD_INPUT"]
    assert await api.codes(add, {"t": turn["id"], "i": []}, token) == ["BAD_INPUT"]
    assert await count_nodes(runtime, world.org) == before
    page = await api.gql("query($c: ID!) { chat(id: $c) { messageCount } }", {"c": chat}, token)
    assert page["chat"]["messageCount"] == 1


async def test_query_limits(api: Api) -> None:
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    aliases = " ".join(f"a{n}: me {{ id }}" for n in range(40))
    assert await api.codes("query { " + aliases + " }", token=token) == ["BAD_INPUT"]
    many_tokens = "query { " + " ".join("me { id name organizationId }" for _ in range(400)) + " }"
    assert "BAD_INPUT" in await api.codes(many_tokens, token=token)


async def test_unknown_rest_route_and_method(api: Api) -> None:
    missing = await api.http.get("/v1/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "NOT_FOUND"
    # A 405 says what the path allows (RFC 9110).
    for path, allowed in (("/graphql", {"GET", "HEAD", "POST"}), ("/healthz", {"GET", "HEAD"})):
        wrong = await api.http.delete(path)
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "BAD_INPUT"
        assert set(wrong.headers["allow"].replace(" ", "").split(",")) == allowed
    # A trailing slash is another path, never a redirect built from the Host header.
    for path in ("/v1/bots/bot_x/memory/", "/healthz/"):
        slashed = await api.http.get(path, headers={"Host": "evil.example"})
        assert slashed.status_code == 404 and "location" not in slashed.headers
        assert slashed.json()["error"]["code"] == "NOT_FOUND"


async def test_every_limit_out_of_range_is_said_in_one_wording(api: Api, settings: Settings) -> None:
    """The same mistake was said four ways: "limit must be at least 1", "limit is between 1 and
    1000", "limit must be at most 100", "limit must be between 1 and 200". Every ``limit``, REST
    and GraphQL, is now "limit is between 1 and N" with BAD_INPUT, below and above its range."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    page, memory, hits, chars = settings.max_page_size, 1000, 100, 100_000
    rest_routes = {
        f"/v1/chats/{chat}/messages?limit=": page,
        f"/v1/bots/{w.bot}/memory?limit=": memory,
        f"/v1/bots/{w.bot}/memory/search?q=figs&limit=": hits,
        f"/v1/bots/{w.bot}/memory/log?limit=": memory,
        f"/v1/chats/{chat}/confessions?limit=": page,
        f"/v1/chats/{chat}/enrichments?limit=": page,
        f"/v1/chats/{chat}/learning?limit=": page,
        "/v1/chats/meta?limit=": page,
        f"/v1/chats/{chat}/memory/context?limit=": chars,
        f"/v1/chats/{chat}/memory/search?q=figs&limit=": hits,
    }
    for url, most in rest_routes.items():
        for wrong in (0, -1, most + 1, 2**64):
            response = await api.http.get(f"{url}{wrong}", headers=bearer(ann))
            assert (response.status_code, response.json()["error"]) == (
                422,
                {"code": "BAD_INPUT", "message": f"limit is between 1 and {most}"},
            ), (url, wrong)
    on_bot, on_chat = "query($l: Int!, $b: ID!) { ", "query($l: Int!, $c: ID!) { "
    fields = {
        on_chat + "chat(id: $c) { messages(limit: $l) { id } } }": page,
        on_bot + "memory(botId: $b, limit: $l) { version } }": memory,
        on_bot + 'search(botId: $b, query: "figs", limit: $l) { score } }': hits,
        on_bot + "memoryLog(botId: $b, limit: $l) { version } }": memory,
        on_chat + "confessions(chatId: $c, limit: $l) { id } }": page,
        on_chat + "enrichments(chatId: $c, limit: $l) { id } }": page,
        on_chat + "learning(chatId: $c, limit: $l) { id } }": page,
        "query($l: Int!) { chatMetas(limit: $l) { total } }": page,
        on_chat + "context(chatId: $c, limit: $l) { text } }": chars,
    }
    for query, most in fields.items():
        for wrong in (0, -1, most + 1):
            named = (
                {"l": wrong}
                | ({"b": w.bot} if "$b" in query else {})
                | ({"c": chat} if "$c:" in query else {})
            )
            body = await api.raw(query, named, ann)
            said = [(e["extensions"]["code"], e["message"]) for e in body["errors"]]
            assert said == [("BAD_INPUT", f"limit is between 1 and {most}")], (query, wrong, body)


async def test_a_rest_405_allows_every_method_of_its_path(api: Api) -> None:
    """Each REST path was a route per operation: ``DELETE /v1/bots/{bot}/memory`` answered 405
    with ``Allow: GET, HEAD`` although POST is valid there. ``Allow`` names every method the
    path takes (a GET's HEAD too), for every REST path, and each of them reaches its handler."""
    methods: dict[str, set[str]] = {}
    for op in rest.operations:
        methods.setdefault(op.path, set()).add(op.method)
    for path, allowed in methods.items():
        url = "/v1" + re.sub(r"{(\w+)}", lambda m: m.group(1).split("_")[0] + "_x", path)
        wrong = await api.http.delete(url)
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "BAD_INPUT", path
        expected = {*allowed, "HEAD"} if "GET" in allowed else allowed
        assert set(wrong.headers["allow"].replace(" ", "").split(",")) == expected, path
        for method in allowed:  # no token: each method's handler refuses it, not the router
            answered = await api.http.request(method, url)
            assert answered.status_code == 401, (method, path, answered.text)


async def test_head_on_graphql_is_answered_as_get_without_its_body(api: Api) -> None:
    """``/graphql`` says ``Allow: GET, HEAD, POST`` on a 405, yet a HEAD was itself a 405, without
    ``Allow``. HEAD is answered as GET is, headers alone (RFC 9110): the same status and headers,
    no body; a wrong method is still 405 with ``Allow``."""
    w = await make_world(api, ("ann",))
    auth = {"Authorization": f"Bearer {w.tokens['ann']}"}
    for params, status in (
        ({"query": "{ me { id } }"}, 200),
        ({"query": "{ me { id } }", "variables": "{"}, 400),
    ):
        got = await api.http.get("/graphql", params=params, headers=auth)
        head = await api.http.head("/graphql", params=params, headers=auth)
        assert (head.status_code, got.status_code) == (status, status), head
        assert head.content == b"" and got.content, got
        for name in ("content-type", "content-length", "cache-control"):
            assert head.headers.get(name) == got.headers.get(name), name
    page = await api.http.head("/graphql", headers={"Accept": "text/html"})  # GraphiQL's
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.content == b""
    wrong = await api.http.put("/graphql", json={"query": "{ me { id } }"}, headers=auth)
    assert wrong.status_code == 405 and "HEAD" in wrong.headers["allow"]


async def test_a_graphql_media_type_is_read_in_any_case(api: Api) -> None:
    """Media types are case-insensitive (RFC 9110): REST takes ``Application/JSON``, and so does
    GraphQL (Strawberry alone matches ``application/json`` as written: 400 "Unsupported content
    type"), its parameters as sent; a media type that is not JSON is still refused."""
    w = await make_world(api, ("ann",))
    for media_type in ("Application/JSON", "APPLICATION/JSON; charset=UTF-8"):
        response = await api.http.post(
            "/graphql",
            content=json.dumps({"query": "{ me { id } }"}).encode(),
            headers={"Authorization": f"Bearer {w.tokens['ann']}", "Content-Type": media_type},
        )
        assert response.json() == {"data": {"me": {"id": w.people["ann"]}}}, (media_type, response.text)
    refused = await api.http.post(
        "/graphql", content=b'{"query": "{ me { id } }"}', headers={"Content-Type": "Text/Plain"}
    )
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "BAD_INPUT"


async def test_graphql_errors_quote_no_value_and_no_long_name(api: Api) -> None:
    """A value graphql-core refused is not repeated in its message (it quoted up to 240
    characters of it: the caller's words, which no error carries); what was expected is said.
    A name it quotes is cut, as REST cuts its own (a field named by 900 kB came back whole,
    to callers with no token too)."""
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    chat = await api.chat(token, world.bot)
    start = "mutation($c: ID!, $t: String!) { startTurn(chatId: $c, input: $t) { id } }"
    words = "my PIN is 4321, tell no one"
    as_variable = await api.raw(start, {"c": chat, "t": {"note": words}}, token)
    [error] = as_variable["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert (
        error["message"] == "Variable '$t' has an invalid value: String cannot represent a non string value."
    )
    meta = "mutation($c: ID!, $m: [MetaEntryInput!]!) { setChatMeta(chatId: $c, summary: $m) { version } }"
    unknown_field = await api.raw(meta, {"c": chat, "m": [{"key": "k", "value": "v", "diary": words}]}, token)
    inline = await api.raw(
        f'mutation {{ startTurn(chatId: "{chat}", input: {{note: "{words}"}}) {{ id }} }}', {}, token
    )
    # Where in the value and why, not the value (an Item's missing kind, at its place in the list).
    add = "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }"
    in_list = await api.raw(add, {"t": "turn_x", "i": [{"text": words}]}, token)
    assert in_list["errors"][0]["message"] == (
        "Variable '$i' has an invalid value at [0]: Expected value of type 'ItemInput' to include required field 'kind'."
    )
    syntax = await api.raw(f'{{ me {{ id }} }} "{words}"', {}, token)
    for body in (unknown_field, inline, in_list, syntax):
        assert {e["extensions"]["code"] for e in body["errors"]} == {"BAD_INPUT"}
        assert "4321" not in json.dumps(body), body
    long_name = "a" * 5000
    for sent in (f"query {{ {long_name} }}", f"query {{ me(x{long_name}: 1) {{ id }} }}"):
        body = await api.raw(sent, {}, None)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"]
        assert all(len(e["message"]) < 400 for e in body["errors"])
    unknown_operation = await api.http.post(
        "/graphql", json={"query": "query A { me { id } }", "operationName": long_name}, headers=bearer(token)
    )
    assert unknown_operation.status_code == 400
    assert len(unknown_operation.json()["error"]["message"]) < 400


async def test_an_enum_value_the_caller_sent_is_not_quoted(api: Api) -> None:
    """graphql-core's refusal of a name an enum lacks quotes it ("Value 'my words' does not exist
    in 'Access' enum."): the caller's words, which no error carries. The message says which enum
    instead, for a variable, an item of a list variable and a literal, over HTTP and WebSocket."""
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    words = "my PIN is 4321, tell no one"
    grant = "mutation($b: ID!, $p: ID!, $a: Access!) { grantBot(botId: $b, personId: $p, access: $a) { id } }"
    as_variable = {"b": world.bot, "p": world.people["ann"], "a": words}
    add = "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }"
    in_list = {"t": "turn_x", "i": [{"kind": "PERSON_MESSAGE", "text": "x"}, {"kind": words, "text": "x"}]}
    literal = (
        f'mutation {{ grantBot(botId: "{world.bot}", personId: "u_x", '
        "access: PIN_4321_TELL_NO_ONE) { id } }"
    )
    expected = [
        "Variable '$a' has an invalid value: Value does not exist in 'Access' enum.",
        "Variable '$i' has an invalid value at [1].kind: Value does not exist in 'ItemKind' enum.",
        "Value does not exist in 'Access' enum.",
    ]
    sent: list[tuple[str, dict[str, Any]]] = [(grant, as_variable), (add, in_list), (literal, {})]
    for (query, variables), message in zip(sent, expected, strict=True):
        body = await api.raw(query, variables, api.admin_token if query != add else token)
        assert [(e["message"], e["extensions"]["code"]) for e in body["errors"]] == [(message, "BAD_INPUT")]
    async with graphql_socket(api) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": {"token": api.admin_token}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        for n, (query, variables) in enumerate(sent):
            payload = {"query": query, "variables": variables}
            await ws.send(json.dumps({"id": str(n), "type": "subscribe", "payload": payload}))
            answer = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert answer["id"] == str(n) and answer["type"] in ("next", "error"), answer
            if answer["type"] == "next":  # refused as it ran (a variable's value): a result, then complete
                errors = answer["payload"]["errors"]
                assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "complete"
            else:  # refused by validation (a literal)
                errors = answer["payload"]
            assert [e["message"] for e in errors] == [expected[n]], answer
            assert "4321" not in json.dumps(answer)


async def test_a_header_that_counts_once_sent_twice_is_refused_and_saves_nothing(
    api: Api, runtime: Runtime
) -> None:
    """Two Idempotency-Key headers (or two Authorization headers) were read as the first alone:
    a retry that sent the second made a second entry."""
    world = await make_world(api, ("ann",))
    token = world.tokens["ann"]
    before = await count_nodes(runtime, world.org)
    for twice in (
        [("Authorization", f"Bearer {token}"), ("Idempotency-Key", "k-a"), ("Idempotency-Key", "k-b")],
        [("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")],
    ):
        sent = await api.http.post(
            f"/v1/bots/{world.bot}/memory",
            json={"command": {"_tag": "Remember", "content": "a fact"}},
            headers=twice,
        )
        assert sent.status_code == 400 and sent.json()["error"]["code"] == "BAD_INPUT"
        assert "once" in sent.json()["error"]["message"]
    graphql = await api.http.post(
        "/graphql",
        json={"query": "{ me { id } }"},
        headers=[("Authorization", f"Bearer {token}"), ("Authorization", "Bearer other")],
    )
    assert graphql.status_code == 400 and graphql.json()["error"]["code"] == "BAD_INPUT"
    assert await count_nodes(runtime, world.org) == before


async def test_depth_limit_is_enforced(settings: Settings) -> None:
    """Our schema is shallow, so the limit is checked on a schema built with a small one."""
    schema = build_schema(settings.model_copy(update={"max_query_depth": 1}))
    result = await schema.execute('query { chat(id: "chat_x") { messages { id } } }')
    assert result.errors is not None
    assert "exceeds maximum operation depth" in result.errors[0].message


async def test_an_operation_asked_again_is_validated_once_and_its_limits_still_hold(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The validation cache hits: the limits' rules are the same on every request (made per
    request, each was a new key and every operation was validated anew)."""
    schema = build_schema(settings.model_copy(update={"max_query_depth": 1}))  # nothing cached for it yet
    validated: list[str] = []

    def counting(schema_: Any, document: Any, rules: Any) -> Any:
        validated.append(document.loc.source.body)
        return validate(schema_, document, rules)

    monkeypatch.setattr("strawberry.schema.schema.validate", counting)  # what validate_document calls
    shallow, deep = "query { __typename }", 'query { chat(id: "chat_x") { messages { id } } }'
    for _ in range(3):
        assert (await schema.execute(shallow)).errors is None
        refused = await schema.execute(deep)
        assert refused.errors is not None and "exceeds maximum operation depth" in refused.errors[0].message
    assert validated == [shallow, deep]


async def test_a_subscription_over_plain_http_says_where_subscriptions_are(api: Api) -> None:
    """Not INTERNAL: BAD_INPUT naming the WebSocket endpoint and the connection_init payload."""
    w = await make_world(api, ("ann",))
    query = f'subscription {{ memoryChanges(botId: "{w.bot}") {{ version }} }}'
    body = await api.raw(query, token=w.tokens["ann"])
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT"
    assert "WebSocket" in error["message"] and "connection_init" in error["message"]
    # A query that only mentions the word is run as usual.
    data = await api.gql("query subscription { me { id } }", token=w.tokens["ann"])
    assert data["me"]["id"] == w.people["ann"]
    # A long document that mentions it is held to the token limit before it is read for its
    # operation (read whole, ~900 KB of tokens held the event loop ~3.7 s, with no token needed).
    many = "subscription { " + " ".join("a" for _ in range(5_000)) + " }"
    body = await api.raw(many)
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT" and "WebSocket" not in error["message"], error


async def test_a_request_that_is_not_a_json_object_is_bad_input(api: Api) -> None:
    """A body of valid JSON that is not an object (a number, a string, null, true): Strawberry
    read the request's fields off it and failed, 500 INTERNAL. Now 400 BAD_INPUT like any
    malformed body."""
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}", "Content-Type": "application/json"}
    for body in (b"5", b'"q"', b"null", b"true"):
        response = await api.http.post("/graphql", content=body, headers=headers)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["code"] == "BAD_INPUT"
    # A query parameter's JSON may be null, as before.
    response = await api.http.get(
        "/graphql",
        params={"query": "{ me { id } }", "variables": "null"},
        headers={"Authorization": headers["Authorization"]},
    )
    assert response.json() == {"data": {"me": {"id": w.people["ann"]}}}, response.text


async def test_a_document_of_several_operations_must_name_the_one_to_run(api: Api, runtime: Runtime) -> None:
    """The GraphQL spec requires operationName when a document holds several operations.
    Strawberry ran the first: a mutation ahead of a query ran unasked for, and a subscription
    ahead of a query failed inside as INTERNAL. Now BAD_INPUT, and nothing runs; named, the
    operation runs as usual."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    before = await count_nodes(runtime, w.org)
    remember = 'mutation A { remember(botId: "%s", content: "Ann likes figs") { entry { id } } } query B { me { id } }'
    body = await api.raw(remember % w.bot, token=token)
    [error] = body["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT" and "operationName" in error["message"], error
    assert await count_nodes(runtime, w.org) == before
    subscribe = (
        f'subscription S {{ memoryChanges(botId: "{w.bot}") {{ version }} }} query Q {{ me {{ id }} }}'
    )
    [error] = (await api.raw(subscribe, token=token))["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT" and "operationName" in error["message"], error
    named = await api.http.post(
        "/graphql",
        json={"query": subscribe, "operationName": "Q"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert named.json() == {"data": {"me": {"id": w.people["ann"]}}}
    named = await api.http.post(
        "/graphql",
        json={"query": subscribe, "operationName": "S"},
        headers={"Authorization": f"Bearer {token}"},
    )
    [error] = named.json()["errors"]
    assert error["extensions"]["code"] == "BAD_INPUT" and "WebSocket" in error["message"]


async def test_a_websocket_message_is_held_to_the_body_limit(api: Api, settings: Settings) -> None:
    """uvicorn took WebSocket messages of up to 16 MiB by default, decoded before anything checked
    the caller (an HTTP body above max_body_bytes is refused at once): now the same limit, and
    the connection closes as too big (1009)."""
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"], max_size=None) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"x": "a" * settings.max_body_bytes}})
        )
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


#: A connection_init with a person's token (TOKEN), acknowledged.
INIT = '{"type": "connection_init", "payload": {"token": "TOKEN"}}'


@pytest.mark.parametrize(
    "messages",
    [
        ["[]"],
        ["null"],
        ['{"type": 5}'],
        ['{"type": "subscribe", "id": [1], "payload": {"query": "{ me { id } }"}}'],
        [INIT, '{"type": "subscribe", "id": "1", "payload": "x"}'],
        [INIT, '{"type": "subscribe", "id": "1", "payload": {"query": 5}}'],
        # An id is repeated in every message of its operation: one of 201 characters is refused.
        [INIT, '{"type": "subscribe", "id": "%s", "payload": {"query": "{ me { id } }"}}' % ("i" * 201)],
        [INIT, '{"type": "complete", "id": "%s"}' % ("i" * 201)],
    ],
)
async def test_a_malformed_websocket_message_closes_the_socket_as_invalid(
    api: Api, settings: Settings, messages: list[str]
) -> None:
    """Strawberry read a message's fields as they came: ``[]``, ``"payload": "x"`` or ``"id": [1]``
    raised a TypeError out of the socket — for any client, before its token was looked at: a
    traceback in the API's log each time and a 1011 (server error) close. Such a message is
    invalid now: 4400, as for a message that lacks a field, and nothing in the log."""
    w = await make_world(api, ("ann",))
    log = settings.data_dir / "logs" / "pytest-api.log"
    before = log.stat().st_size
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        for message in messages:
            await ws.send(message.replace("TOKEN", w.tokens["ann"]))
        received: list[str | bytes] = []
        with pytest.raises(websockets.ConnectionClosed) as closed:  # noqa: PT012 (an ack may come first)
            while True:
                received.append(await asyncio.wait_for(ws.recv(), 10))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400, closed.value
    assert len(received) == messages.count(INIT)  # connection_ack
    with log.open("rb") as written:
        written.seek(before)
        assert b"Traceback" not in written.read()


async def test_a_socket_refuses_variables_or_extensions_that_are_not_objects_as_http_does(api: Api) -> None:
    """Over HTTP ``variables`` and ``extensions`` are an object or null (else 400 BAD_INPUT), and
    so on a socket, where ``"variables": ""`` (or ``0``, ``false``) would run as no variables and
    ``extensions`` would not be looked at: the socket refuses that operation with HTTP's words
    and code, and goes on."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    me = "{ me { id } }"
    refused = [("variables", bad) for bad in ("", 0, False, "x", [1])]
    refused += [("extensions", bad) for bad in ("", 0, "x", [1])]
    async with graphql_socket(api) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": {"token": token}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        for n, (name, bad) in enumerate(refused):
            over_http = await api.http.post("/graphql", json={"query": me, name: bad}, headers=bearer(token))
            assert over_http.status_code == 400, (name, bad, over_http.text)
            said = over_http.json()["error"]
            await ws.send(
                json.dumps({"id": str(n), "type": "subscribe", "payload": {"query": me, name: bad}})
            )
            answer = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert answer["id"] == str(n) and answer["type"] == "error", (name, bad, answer)
            assert [(e["message"], e["extensions"]["code"]) for e in answer["payload"]] == [
                (said["message"], said["code"])
            ], (name, bad)
        payload: dict[str, Any] = {"query": me, "variables": None, "extensions": {}}
        await ws.send(json.dumps({"id": "ok", "type": "subscribe", "payload": payload}))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert answer == {"id": "ok", "type": "next", "payload": {"data": {"me": {"id": w.people["ann"]}}}}


async def test_a_connection_init_with_two_credentials_closes_the_socket(api: Api) -> None:
    """Over HTTP two Authorization headers are 400 (which one would count?); a ``connection_init``
    carrying two credentials — ``token`` and ``Authorization``, one key in two cases, one at the
    top and one under ``headers`` — silently used one. It closes the socket with 4400 now, saying
    to send one; one credential, with nulls beside it, is acknowledged as before."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    ann = f"Bearer {token}"

    async def first(payload: dict[str, Any]) -> Any:
        async with graphql_socket(api) as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
            try:
                return json.loads(await asyncio.wait_for(ws.recv(), 5))
            except websockets.ConnectionClosed as closed:
                return (None, "") if closed.rcvd is None else (closed.rcvd.code, closed.rcvd.reason)

    for two in (
        {"token": token, "Authorization": ann},
        {"Authorization": ann, "authorization": ann},
        {"token": token, "headers": {"Authorization": ann}},
        {"Authorization": ann, "headers": {"authorization": "Bearer someone-else"}},
    ):
        assert await first(two) == (4400, ONE_CREDENTIAL), two
    for one in ({"token": token}, {"headers": {"Authorization": ann}}, {"Authorization": ann, "token": None}):
        assert await first(one) == {"type": "connection_ack"}, one

    async def upgraded(payload: dict[str, Any]) -> Any:
        """The first answer on a socket whose upgrade request carries Ann's Authorization."""
        connect = websockets.connect(
            ws_url(api),
            subprotocols=[Subprotocol("graphql-transport-ws")],
            additional_headers={"Authorization": ann},
        )
        async with connect as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": payload}))
            try:
                return json.loads(await asyncio.wait_for(ws.recv(), 5))
            except websockets.ConnectionClosed as closed:
                return (None, "") if closed.rcvd is None else (closed.rcvd.code, closed.rcvd.reason)

    # The upgrade's header and another credential in the payload: which one would count?
    assert await upgraded({"token": "someone-else"}) == (4400, ONE_CREDENTIAL)
    assert await upgraded({"Authorization": ann}) == {"type": "connection_ack"}  # the same one
    assert await upgraded({}) == {"type": "connection_ack"}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ('{"type": "%s"}' % ("x" * 500), "Unknown message type: xxx"),
        ('{"type": "%s"}' % ("€" * 300), "Unknown message type: €€€"),  # cut within a character
    ],
)
async def test_a_close_that_quotes_the_client_fits_its_frame(
    api: Api, settings: Settings, message: str, reason: str
) -> None:
    """Strawberry closes a socket with text that quotes the client (an unknown message type): past
    the 123 bytes a close frame's reason holds, the close itself raised — a traceback in the log,
    for any client, and a 1006 with no reason. The reason is cut to fit (on a character boundary)
    and the close is a 4400."""
    w = await make_world(api, ("ann",))
    log = settings.data_dir / "logs" / "pytest-api.log"
    before = log.stat().st_size
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
        await ws.send(INIT.replace("TOKEN", w.tokens["ann"]))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "connection_ack"
        await ws.send(message)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    rcvd = closed.value.rcvd
    assert rcvd is not None and rcvd.code == 4400, closed.value
    assert rcvd.reason.startswith(reason) and rcvd.reason.endswith("…"), rcvd.reason
    assert len(rcvd.reason.encode()) <= 123
    with log.open("rb") as written:
        written.seek(before)
        assert b"Traceback" not in written.read()


async def test_a_rest_body_that_names_a_key_twice_is_refused_and_saves_nothing(
    api: Api, runtime: Runtime
) -> None:
    """JSON parsers keep a key's last value: ``{"summary": {"a": "1", "a": "2"}}`` saved "2" and lost
    "1", and a body of two commands ran the second; GraphQL refuses a key named twice. Now REST
    does too (422 BAD_INPUT naming the key), before anything is saved."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    chat = await api.chat(token, w.bot)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    before = await count_nodes(runtime, w.org)
    response = await api.http.post(
        f"/v1/chats/{chat}/meta", content=b'{"summary": {"a": "1", "a": "2"}}', headers=headers
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "BAD_INPUT" and "'a'" in response.json()["error"]["message"]
    forget = '{"_tag": "Forget", "id": "mem_x"}'
    remember = '{"_tag": "Remember", "content": "Ann likes figs", "tags": []}'
    body = f'{{"command": {forget}, "command": {remember}}}'.encode()
    response = await api.http.post(f"/v1/bots/{w.bot}/memory", content=body, headers=headers)
    assert response.status_code == 422 and response.json()["error"]["code"] == "BAD_INPUT", response.text
    assert await count_nodes(runtime, w.org) == before
    # A long key named twice is said in 100 characters (the whole of it was said twice over).
    long = "k" * 100_000
    response = await api.http.post(
        f"/v1/chats/{chat}/meta",
        content=f'{{"summary": {{"{long}": "1", "{long}": "2"}}}}'.encode(),
        headers=headers,
    )
    assert response.status_code == 422 and len(response.text) < 1_000, response.text[:300]
    # Once each, the same keys are read as before.
    response = await api.http.post(
        f"/v1/chats/{chat}/meta", content=b'{"summary": {"a": "1"}}', headers=headers
    )
    assert response.status_code == 201 and response.json()["summary"] == {"a": "1"}, response.text


async def test_a_purge_of_a_malformed_tag_is_refused_and_changes_nothing(api: Api, runtime: Runtime) -> None:
    """A purge tag is one of from:, chat:, org: or channel: and an id. "from:", "chat: x" or a NUL
    after the prefix matched nothing and were answered ``{"removed": 0}`` with a new memory
    version and a change row; now 422 BAD_INPUT and the version stays."""
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    version = "query($b: ID!) { memoryLog(botId: $b) { version } }"
    before = (await api.gql(version, {"b": w.bot}, w.tokens["ann"]))["memoryLog"]["version"]
    for tag in ("from:", "chat: x", "from:\u0000", "org:a,b", "chat:x\n", "channel:" + "x" * 201):
        response = await api.http.post(f"/v1/bots/{w.bot}/memory/purge", json={"tag": tag}, headers=headers)
        assert response.status_code == 422, (tag, response.text)
        assert response.json()["error"]["code"] == "BAD_INPUT"
    assert (await api.gql(version, {"b": w.bot}, w.tokens["ann"]))["memoryLog"]["version"] == before
    chat = await api.chat(w.tokens["ann"], w.bot)
    done = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{chat}"}, headers=headers
    )
    assert done.status_code == 200 and done.json() == {"removed": 0}, done.text
    # Nothing removed, nothing changed: no version, no change row (a purge of none made both).
    log = "query($b: ID!) { memoryLog(botId: $b) { version changes { version } } }"
    after = (await api.gql(log, {"b": w.bot}, w.tokens["ann"]))["memoryLog"]
    assert after == {"version": before, "changes": []}


async def test_the_caller_is_checked_before_the_input(api: Api) -> None:
    """Without a valid token every operation answers UNAUTHENTICATED, whatever its input: two
    mutations read their arguments first and told an anonymous caller BAD_INPUT (the REST routes
    of the same operations answered 401)."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    twice = [{"key": "a", "text": "1"}, {"key": "a", "text": "2"}]
    set_meta = "mutation($c: ID!, $s: [MetaEntryInput!]!) { setChatMeta(chatId: $c, summary: $s) { chatId } }"
    update = "mutation($b: ID!) { updateMemoryBot(botId: $b, expected: -1) { version } }"
    for token in (None, "not-a-token"):
        assert await api.codes(set_meta, {"c": chat, "s": twice}, token) == ["UNAUTHENTICATED"]
        assert await api.codes(update, {"b": w.bot}, token) == ["UNAUTHENTICATED"]
    assert await api.codes(set_meta, {"c": chat, "s": twice}, w.tokens["ann"]) == ["BAD_INPUT"]


async def test_an_operation_reads_at_most_one_unpaged_memory(api: Api) -> None:
    """An unpaged ``memory`` decrypts every entry the caller may see (3.3 s at 100k entries): thirty
    aliases of it, within the alias limit, held the process ~100 s. One per operation; paged
    ones are not counted, and a null ``limit`` variable counts as unpaged."""
    w = await make_world(api, ("ann",))
    whole = "memory(botId: $b) { version }"
    paged = "memory(botId: $b, limit: 5) { version }"
    one = await api.raw(
        f"query($b: ID!) {{ a: {whole} b: {paged} c: {paged} }}", {"b": w.bot}, w.tokens["ann"]
    )
    assert "errors" not in one and one["data"]["a"]["version"] == 0
    two = await api.raw(f"query($b: ID!) {{ a: {whole} b: {whole} }}", {"b": w.bot}, w.tokens["ann"])
    assert [e["extensions"]["code"] for e in two["errors"]] == ["BAD_INPUT"]
    assert "one unpaged memory" in two["errors"][0]["message"]
    nulls = await api.codes(
        "query($b: ID!, $l: Int) { a: memory(botId: $b, limit: $l) { version } "
        "b: memory(botId: $b, limit: $l) { version } }",
        {"b": w.bot, "l": None},
        w.tokens["ann"],
    )
    assert nulls == ["BAD_INPUT"]
    # The count is per operation: the next request reads its own.
    assert "errors" not in await api.raw(f"query($b: ID!) {{ {whole} }}", {"b": w.bot}, w.tokens["ann"])


async def test_a_mutation_operation_selects_one_mutation(api: Api) -> None:
    """Every mutation's payload is non-null, so a mutation field that fails after another has
    committed nulls ``data`` whole, and the caller never learns the written entry's id (a retry
    writes it twice). A mutation operation of more than one root field is BAD_INPUT before
    anything runs, over HTTP and WebSocket alike, whether the fields come aliased or from
    fragments; ``__typename`` beside one mutation, and one field asked twice under one key, run."""
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    remember = 'remember(botId: $b, content: "Ann likes figs") { entry { id } }'
    forget = 'forget(botId: $b, id: "e_missing") { version }'
    memory = "query($b: ID!) { memory(botId: $b) { entries { id } } }"
    for document in (
        f"mutation($b: ID!) {{ a: {remember} b: {forget} }}",
        f"mutation($b: ID!) {{ a: {remember} ...F }} fragment F on Mutation {{ b: {forget} }}",
        f"mutation($b: ID!) {{ a: {remember} ... on Mutation {{ b: {forget} }} }}",
        f"mutation($b: ID!) {{ a: {remember} b: {remember} }}",
    ):
        body = await api.raw(document, {"b": w.bot}, token)
        assert body.get("data") is None and body["errors"], body
        assert {e["extensions"]["code"] for e in body["errors"]} == {"BAD_INPUT"}, body
        assert any("send one mutation per operation" in e["message"] for e in body["errors"]), body
    async with graphql_socket(api) as ws:
        await ws.send(json.dumps({"type": "connection_init", "payload": {"token": token}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        payload = {"query": f"mutation($b: ID!) {{ a: {remember} b: {forget} }}", "variables": {"b": w.bot}}
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": payload}))
        refused = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert refused["id"] == "1" and refused["type"] == "error", refused
    assert [e["extensions"]["code"] for e in refused["payload"]] == ["BAD_INPUT"], refused
    assert "send one mutation per operation" in refused["payload"][0]["message"]
    assert (await api.gql(memory, {"b": w.bot}, token))["memory"]["entries"] == []  # nothing ran
    one = await api.raw(
        f"mutation($b: ID!) {{ __typename a: {remember} a: {remember} }}", {"b": w.bot}, token
    )
    assert "errors" not in one and one["data"]["a"]["entry"]["id"], one
    entries = (await api.gql(memory, {"b": w.bot}, token))["memory"]["entries"]
    assert entries == [{"id": one["data"]["a"]["entry"]["id"]}]  # the field asked twice ran once


async def test_an_operation_costs_at_most_its_limit(api: Api, model_server: ModelServer) -> None:
    """Design §5, "depth/complexity/alias limits": within the depth and alias limits one request
    asked for 30 model calls (aliased ``startTurn``/``sendMessage``, each up to a minute, billed),
    30 searches or 30 memory reads. Each root field costs what it sets going — a model call 50, a
    retrieval 10, anything else 1 — and an operation over 100 is BAD_INPUT before anything runs;
    fragments count, and a field asked twice under one key runs and counts once."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    ann = w.tokens["ann"]
    turn = 'startTurn(chatId: $c, input: "hello") { id }'
    three = await api.raw(f"mutation($c: ID!) {{ a: {turn} b: {turn} c: {turn} }}", {"c": chat}, ann)
    assert {e["extensions"]["code"] for e in three["errors"]} == {"BAD_INPUT"}, three
    assert any("costs 150, more than the limit of 100" in e["message"] for e in three["errors"]), three
    messages = await api.gql("query($c: ID!) { chat(id: $c) { messageCount } }", {"c": chat}, ann)
    assert messages["chat"]["messageCount"] == 0  # nothing ran
    search = 'search(botId: $b, query: "tea") { score }'
    ten = " ".join(f"s{n}: {search}" for n in range(10))
    assert "errors" not in await api.raw(f"query($b: ID!) {{ {ten} __typename }}", {"b": w.bot}, ann)
    eleven = await api.raw(f"query($b: ID!) {{ {ten} s10: {search} }}", {"b": w.bot}, ann)
    assert "costs 110" in eleven["errors"][0]["message"]
    spread = await api.raw(
        f"query($b: ID!) {{ ...F s10: {search} }} fragment F on Query {{ {ten} }}", {"b": w.bot}, ann
    )
    assert "costs 110" in spread["errors"][0]["message"]
    merged = await api.raw(f"query($b: ID!) {{ {ten} {ten} }}", {"b": w.bot}, ann)
    assert "errors" not in merged and len(merged["data"]) == 10
    # A field within a root field that reads on its own counts too: a chat's page of messages (29
    # aliased pages of 200 cost one chat read), an entry's walk of the source graph.
    pages = " ".join(f"p{n}: messages(limit: 200, skip: {200 * n}) {{ id }}" for n in range(10))
    ten_pages = await api.raw(f"query($c: ID!) {{ chat(id: $c) {{ {pages} }} }}", {"c": chat}, ann)
    assert "errors" not in ten_pages, ten_pages  # 10 with the first page, + 9 × 10
    eleven_pages = await api.raw(
        f"query($c: ID!) {{ chat(id: $c) {{ {pages} p10: messages(limit: 200, skip: 2000) {{ id }} }} }}",
        {"c": chat},
        ann,
    )
    assert "costs 110" in eleven_pages["errors"][0]["message"]
    walks = " ".join(f"w{n}: sources(depth: 8) {{ hidden }}" for n in range(10))
    entry = await api.raw(
        f'query($b: ID!) {{ entry(botId: $b, id: "e_x") {{ {walks} why {{ summary }} }} }}', {"b": w.bot}, ann
    )
    assert "costs 110" in entry["errors"][0]["message"]  # 10 with the first walk, + 9 walks + why


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_json_too_deep_or_with_too_long_a_number_is_malformed_on_every_graphql_transport(
    api: Api, settings: Settings
) -> None:
    """Python's JSON parser raises RecursionError past ~1,000 levels and ValueError for an integer of
    over 4,300 digits, neither of them the JSONDecodeError Strawberry answers: a 2 KB body answered
    500 INTERNAL with a traceback in the log, before any token was looked at, and a socket message
    of the same shape closed the socket as a server error. Both are malformed input now: 400
    BAD_INPUT (POST, GET), 4400 on a socket, and no traceback."""
    log = settings.data_dir / "logs" / "pytest-api.log"
    before = log.stat().st_size
    bodies = {
        "deep": '{"query": "{ __typename }", "variables": {"x": ' + _deep(5_000) + "}}",
        "long number": '{"query": "{ __typename }", "variables": {"x": ' + "9" * 5_000 + "}}",
    }
    for name, body in bodies.items():
        response = await api.http.post(
            "/graphql", content=body.encode(), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"]["code"] == "BAD_INPUT", name
    # Within the URL's bytes (max_url_bytes), and past Python's parser's depth.
    got = await api.http.get("/graphql", params={"query": "{ __typename }", "variables": _deep(1_500)})
    assert got.status_code == 400 and got.json()["error"]["code"] == "BAD_INPUT", got.text
    # A GET has no body: what it could not parse is named as the query string's.
    cut = await api.http.get("/graphql", params={"query": "{ __typename }", "variables": '{"x": '})
    assert cut.status_code == 400 and cut.json()["error"]["message"].startswith(
        "Unable to parse the variables or extensions of the query string as JSON: "
    ), cut.text
    for message in ('{"type": "connection_init", "payload": ' + _deep(5_000) + "}", bodies["long number"]):
        async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
            await ws.send(message)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400, closed.value
    with log.open("rb") as written:
        written.seek(before)
        assert b"Traceback" not in written.read()


async def test_a_graphql_body_that_names_a_key_twice_is_refused_and_runs_nothing(
    api: Api, runtime: Runtime
) -> None:
    """A JSON parser keeps a key's last value: a body naming "query" twice ran the second
    operation (a Remember in place of a harmless read), and a variable object naming a field
    twice saved its last value. As for REST bodies: 400 BAD_INPUT naming the key, nothing run."""
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}", "Content-Type": "application/json"}
    before = await count_nodes(runtime, w.org)
    remember = f'mutation {{ remember(botId: \\"{w.bot}\\", content: \\"Ann likes figs\\") {{ version }} }}'
    body = f'{{"query": "{{ me {{ id }} }}", "query": "{remember}"}}'
    response = await api.http.post("/graphql", content=body.encode(), headers=headers)
    assert response.status_code == 400, response.text
    assert (
        response.json()["error"]["code"] == "BAD_INPUT" and "'query'" in response.json()["error"]["message"]
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    before = await count_nodes(runtime, w.org)
    meta = "mutation($c: ID!, $s: [MetaEntryInput!]!) { setChatMeta(chatId: $c, summary: $s, create: true) { chatId } }"
    entry = {"key": "a", "text": "@"}
    body = json.dumps({"query": meta, "variables": {"c": chat, "s": [entry]}}).replace(
        '"@"', '"1", "text": "2"'
    )
    response = await api.http.post("/graphql", content=body.encode(), headers=headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "BAD_INPUT", response.text
    assert await count_nodes(runtime, w.org) == before
    # Once each, the same body is read as before.
    body = json.dumps({"query": meta, "variables": {"c": chat, "s": [{"key": "a", "text": "1"}]}})
    response = await api.http.post("/graphql", content=body.encode(), headers=headers)
    assert response.status_code == 200 and "errors" not in response.json(), response.text


async def test_a_query_parameter_a_route_does_not_take_or_names_twice_is_refused(api: Api) -> None:
    """REST query parameters were read as a dict: one the route does not take was ignored
    (``?limt=10`` read the whole memory unpaged) and one named twice kept its last value
    (``?tags=a&tags=b`` filtered by ``b`` alone, a wider list than asked for). Both are 422
    BAD_INPUT naming the parameter now; the parameters a route takes, once each, read as before."""
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    chat = await api.chat(w.tokens["ann"], w.bot)
    # Each refused with a message naming the parameter (quoted), or in the route's own words
    # (not pydantic's, nor for a context's query the service's name for it, "query").
    refused = {
        f"/v1/bots/{w.bot}/memory?limt=10": "'limt'",
        f"/v1/bots/{w.bot}/memory?tags=a&tags=b": "'tags'",
        f"/v1/bots/{w.bot}/memory/log?befor=5": "'befor'",
        f"/v1/bots/{w.bot}/memory/search?q=figs&q=dates": "'q'",
        f"/v1/chats/{chat}/messages?limit=1&limit=1000": "'limit'",
        # Routes that take none (they let any pass).
        f"/v1/bots/{w.bot}/memory/bot?x=1": "'x'",
        f"/v1/chats/{chat}/context?x=1": "'x'",
        f"/v1/chats/{chat}/meta?x=1": "'x'",
        f"/v1/bots/{w.bot}/memory/search?q={'x' * 2001}": "q is at most 2000 characters",
        f"/v1/chats/{chat}/memory/context?q={'x' * 2001}": "q is at most 2000 characters",
        f"/v1/bots/{w.bot}/memory/search?q=figs&limit={'9' * 5000}": "limit must be a whole number below 2**63",
        f"/v1/bots/{w.bot}/memory?tags=,": "tags holds an empty tag",
        f"/v1/bots/{w.bot}/memory?tags=": "tags holds an empty tag",
    }
    for url, said in refused.items():
        response = await api.http.get(url, headers=headers)
        error = response.json()["error"]
        assert response.status_code == 422 and error["code"] == "BAD_INPUT", (url[:80], error)
        assert said in error["message"], (url[:80], error)
    remember = {"command": {"_tag": "Remember", "content": "figs and dates"}}
    posted = await api.http.post(f"/v1/bots/{w.bot}/memory?x=1", json=remember, headers=headers)
    assert posted.status_code == 422 and "'x'" in posted.json()["error"]["message"]
    # A body said to be something other than JSON is refused, not read as JSON (it was saved).
    as_text = await api.http.post(
        f"/v1/bots/{w.bot}/memory",
        content=json.dumps(remember).encode(),
        headers={**headers, "Content-Type": "text/plain"},
    )
    assert as_text.status_code == 415 and as_text.json()["error"]["code"] == "BAD_INPUT"
    listed = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=headers)
    assert listed.json()["entries"] == []
    for url in (f"/v1/bots/{w.bot}/memory?limit=10&tags=a", f"/v1/chats/{chat}/messages?limit=1&skip=0"):
        assert (await api.http.get(url, headers=headers)).status_code == 200, url


async def test_forget_and_share_tell_a_bad_id_and_an_unknown_bot_apart_from_a_hidden_entry(
    api: Api, runtime: Runtime
) -> None:
    """D9.4 makes every entry id that could be one the same 409 (no existence oracle). An id that
    cannot be one (a path, a space, 101 characters) is BAD_INPUT as for ``entry(id:)``, and an
    unknown Bot is NOT_FOUND as for Remember, GET and search:
    Forget turned both into "this entry is not for you"."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    before = await count_nodes(runtime, w.org)
    for bad in ("../x", "mem x", "m" * 101):
        response = await command(api, ann, w.bot, {"_tag": "Forget", "id": bad})
        assert response.status_code == 422 and response.json()["error"]["code"] == "BAD_INPUT", bad
        share = 'mutation($b: ID!, $e: ID!) { shareEntry(botId: $b, id: $e, audience: ["team"]) { version } }'
        assert await api.codes(share, {"b": w.bot, "e": bad}, ann) == ["BAD_INPUT"], bad
    unknown = "bot_" + "0" * 32
    response = await command(api, ann, unknown, {"_tag": "Forget", "id": "mem_" + "0" * 32})
    assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND", response.text
    forget = "mutation($b: ID!, $e: ID!) { forget(botId: $b, id: $e) { version } }"
    assert await api.codes(forget, {"b": unknown, "e": "mem_" + "0" * 32}, ann) == ["NOT_FOUND"]
    response = await command(api, ann, w.bot, {"_tag": "Forget", "id": "mem_" + "0" * 32})
    assert response.status_code == 409 and response.json()["error"]["code"] == "CONFLICT"
    # A version below 0 is no version: BAD_INPUT, as for every other expected (it was CONFLICT,
    # "the entry changed since you read it").
    share = (
        "mutation($b: ID!, $e: ID!, $x: Long) "
        '{ shareEntry(botId: $b, id: $e, audience: ["team"], expected: $x) { version } }'
    )
    assert await api.codes(share, {"b": w.bot, "e": "mem_" + "0" * 32, "x": -1}, ann) == ["BAD_INPUT"]
    assert await count_nodes(runtime, w.org) == before


async def test_a_nul_in_an_entry_or_a_name_is_refused_and_saves_nothing(api: Api, runtime: Runtime) -> None:
    """No stored text holds a NUL (services.validation.UNSTORABLE): messages, meta and
    instructions refused one, but a Remember's content and the names of organizations, people,
    Bots and channels took it."""
    w = await make_world(api, ("ann",))
    before = await count_nodes(runtime, w.org)
    response = await command(api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "a\u0000b"})
    assert response.status_code == 422 and "NUL" in response.json()["error"]["message"], response.text
    remember = "mutation($b: ID!, $c: String!) { remember(botId: $b, content: $c) { version } }"
    assert await api.codes(remember, {"b": w.bot, "c": "a\u0000b"}, w.tokens["ann"]) == ["BAD_INPUT"]
    person = "mutation($o: ID!, $n: String!) { createPerson(organizationId: $o, name: $n) { person { id } } }"
    assert await api.codes(person, {"o": w.org, "n": "Ann\u0000"}, api.admin_token) == ["BAD_INPUT"]
    assert await count_nodes(runtime, w.org) == before
