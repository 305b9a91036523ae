"""The OpenAPI 3.1 document of ``/v1`` (botmemory.openapi) and the pydantic bodies it describes
(botmemory.rest_input, botmemory.rest_models; DESIGN §5): every route is in it and nothing else,
real responses match their declared schemas, ``/docs`` needs nothing from outside, and a refused
body is a 422 ``BAD_INPUT`` naming the field, with nothing changed."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from openapi_spec_validator import validate

from botmemory import rest
from botmemory.openapi import SUMMARY_MAX
from botmemory.vendor import VENDOR_DIR
from services.runtime import Runtime
from tests.client import Api, bearer, make_world
from tests.learning_helpers import memory_world
from tests.memory_helpers import command, fact, observation, said


async def spec_of(api: Api) -> dict[str, Any]:
    response = await api.http.get("/openapi.json")
    assert response.status_code == 200, response.text
    return response.json()


def check(spec: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    """``body`` matches the schema the document declares for this answer."""
    declared = spec["paths"][path][method]["responses"][str(status)]["content"]["application/json"]
    schema = {**declared["schema"], "components": spec["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


async def test_every_route_is_in_the_document_and_nothing_else(api: Api) -> None:
    spec = await spec_of(api)
    validate(spec)  # a valid OpenAPI 3.1 document
    assert spec["openapi"].startswith("3.1")
    served = {
        (method.lower(), "/v1" + route.path)
        for route in rest.routes
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(method, path) for path, item in spec["paths"].items() for method in item}
    assert served == documented
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            where = f"{method} {path}"
            assert operation["summary"], where
            answers = {int(s): r for s, r in operation["responses"].items()}
            assert any(200 <= s < 300 for s in answers), where
            for status, answer in answers.items():
                assert "$ref" in answer["content"]["application/json"]["schema"], (where, status)
                if status >= 400:
                    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
            assert {401, 422} <= set(answers), where
            named = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert named == set(re.findall(r"{(\w+)}", path)), where


async def test_summaries_are_one_plain_sentence_and_descriptions_markdown(api: Api) -> None:
    """Swagger UI shows a summary as plain text: it was a docstring's first line, cut mid-sentence
    ("Save a message in the chat (seed 004's ``POST …``, over Turns): a user"), with the
    docstrings' reStructuredText code marks shown as they are (114 of them in the document)."""
    spec = await spec_of(api)
    text = json.dumps(spec)
    assert "``" not in text
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            summary = operation["summary"]
            assert summary.endswith((".", "?")) and "\n" not in summary and "`" not in summary, (method, path)
            assert "D9." not in summary and "seed" not in summary, (method, path)
            assert len(summary) <= SUMMARY_MAX or ": " not in summary, (method, path)


async def test_query_parameters_are_documented_as_the_routes_check_them(api: Api) -> None:
    """A client generated from the document sends what the routes take: ``q`` of search was
    documented as optional (default "") and every ``limit`` from 0, then refused."""
    spec = await spec_of(api)

    def parameter(path: str, name: str) -> dict[str, Any]:
        [found] = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == name]
        return found

    for path in ("/v1/bots/{bot_id}/memory/search", "/v1/chats/{chat_id}/memory/search"):
        q, limit = parameter(path, "q"), parameter(path, "limit")
        assert q["required"] is True and q["schema"]["minLength"] == 1, q
        assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 100), limit
    for path, name in (("/v1/bots/{bot_id}/memory", "limit"), ("/v1/chats/{chat_id}/confessions", "limit")):
        schema = parameter(path, name)["schema"]
        bounds = [s.get("minimum") for s in schema.get("anyOf", [schema])]
        assert 1 in bounds and 0 not in bounds, (path, schema)


async def test_real_responses_match_their_declared_schemas(api: Api, runtime: Runtime) -> None:
    spec = await spec_of(api)
    w = await memory_world(api, ("ann",))
    ann = bearer(w.tokens["ann"])
    chat = await api.chat(w.tokens["ann"], w.bot)
    _, item = await said(api, w.tokens["ann"], chat, "I keep bees on the roof")
    learned = await fact(runtime, w.bot, "Ann keeps bees", (chat, item), topics=("hobbies",))
    await observation(runtime, w.bot, "Ann likes nature", learned)
    remembered = await command(api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "Call me Annie"})
    assert remembered.status_code == 201, remembered.text
    check(spec, "post", "/v1/bots/{bot_id}/memory", 201, remembered.json())
    budget = {"expected": 0, "budget": {"period": "day", "limitMicros": 500}}
    patched = await api.http.patch(f"/v1/bots/{w.bot}/memory/bot", json=budget, headers=ann)
    assert patched.status_code == 200, patched.text

    bot, chats = f"/v1/bots/{w.bot}", f"/v1/chats/{chat}"
    samples: list[tuple[str, str, dict[str, str]]] = [
        ("/v1/bots/{bot_id}/memory", f"{bot}/memory", {}),
        ("/v1/bots/{bot_id}/memory", f"{bot}/memory", {"limit": "2"}),
        ("/v1/bots/{bot_id}/memory/search", f"{bot}/memory/search", {"q": "bees"}),
        ("/v1/bots/{bot_id}/memory/log", f"{bot}/memory/log", {}),
        ("/v1/bots/{bot_id}/memory/bot", f"{bot}/memory/bot", {}),
        ("/v1/chats/{chat_id}/messages", f"{chats}/messages", {}),
        ("/v1/chats/{chat_id}/context", f"{chats}/context", {}),
        ("/v1/chats/{chat_id}/confessions", f"{chats}/confessions", {}),
    ]
    bodies: dict[str, Any] = {}
    for template, url, params in samples:
        response = await api.http.get(url, params=params, headers=ann)
        assert response.status_code == 200, (url, response.text)
        check(spec, "get", template, 200, response.json())
        bodies.setdefault(template, response.json())
    entries = bodies["/v1/bots/{bot_id}/memory"]["entries"]
    assert "next" not in bodies["/v1/bots/{bot_id}/memory"]  # only a page has a cursor
    assert {"confidence"} <= set(next(e for e in entries if e["layer"] == "observation"))
    assert all("invalidatedAt" not in e for e in entries)  # left out, not null
    assert {"chat": chat, "item": item} in next(e for e in entries if e["id"] == learned)["sources"]
    assert bodies["/v1/bots/{bot_id}/memory/bot"]["spent"] == {"micros": 0, "unknownCalls": 0}
    assert bodies["/v1/chats/{chat_id}/messages"]["messages"][0]["kind"] == "PERSON_MESSAGE"

    refused = await api.http.get(f"{bot}/memory", params={"limit": "ten"}, headers=ann)
    check(spec, "get", "/v1/bots/{bot_id}/memory", 422, refused.json())
    assert refused.json()["error"] == {"code": "BAD_INPUT", "message": "limit must be a whole number"}


async def test_docs_page_uses_only_local_assets(api: Api) -> None:
    response = await api.http.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "/static/vendor/swagger-ui/swagger-ui-bundle.js" in page
    assert "/static/vendor/swagger-ui/swagger-ui.css" in page
    stamp = (VENDOR_DIR / ".stamp").read_text().strip()[:12]  # vendor files are cached for a year
    assert re.findall(r"(?:src|href)=\"([^\"]+)\"", page) == [
        "data:,",  # no favicon request
        f"/static/vendor/swagger-ui/swagger-ui.css?v={stamp}",
        f"/static/vendor/swagger-ui/swagger-ui-bundle.js?v={stamp}",
        f"/static/docs-page.js?v={stamp}",  # the init: a file, as the policy allows this origin's scripts only
    ]
    assert "//" not in page  # no URL of another host
    assert "script-src 'self'" in response.headers["content-security-policy"]
    init = (await api.http.get("/static/docs-page.js")).text
    assert '"/openapi.json"' in init and "validatorUrl: null" in init and "http" not in init


async def memory_version(runtime: Runtime, bot: str) -> int:
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (m:Memory {id: $b}) RETURN m.version AS v", b=bot
    )
    return int(records[0]["v"])


async def test_refused_bodies_name_the_field_and_change_nothing(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    headers = {**bearer(w.tokens["ann"]), "Content-Type": "application/json"}
    memory, purge, settings = (
        f"/v1/bots/{w.bot}/memory",
        f"/v1/bots/{w.bot}/memory/purge",
        f"/v1/bots/{w.bot}/memory/bot",
    )
    before = await memory_version(runtime, w.bot)
    cases = [
        ("POST", memory, b"{oops", "the body is not valid JSON"),
        ("POST", memory, b"", "the body is not valid JSON"),
        ("POST", memory, b"[1, 2]", "the body must be a JSON object"),
        ("POST", memory, b'"Remember"', "the body must be a JSON object"),
        ("POST", memory, b'{"command": "Remember"}', "command must be an object"),
        ("POST", memory, b'{"command": {}}', "command._tag is required"),
        (
            "POST",
            memory,
            b'{"command": {"_tag": "Delete"}}',
            "command._tag must be one of 'Remember', 'Forget'",
        ),
        ("POST", memory, b'{"command": {"_tag": "Remember"}}', "command.content is required"),
        (
            "POST",
            memory,
            b'{"command": {"_tag": "Remember", "content": 5}}',
            "command.content must be a string",
        ),
        (
            "POST",
            memory,
            b'{"command": {"_tag": "Remember", "content": "x", "tags": ["a", 3]}}',
            "command.tags[1] must be a string",
        ),
        (
            "POST",
            memory,
            b'{"command": {"_tag": "Forget", "id": "x", "why": 1}}',
            "unknown field command.why",
        ),
        ("POST", memory, b'{"command": {"_tag": "Forget", "id": "x"}, "also": 1}', "unknown field also"),
        ("POST", purge, b'{"tag": 5}', "tag must be a string"),
        ("POST", purge, b"{}", "tag is required"),
        ("PATCH", settings, b'{"expected": "0"}', "expected must be a whole number"),
        ("PATCH", settings, b'{"expected": 0, "concurrency": 0}', "concurrency must be at least 1"),
        ("PATCH", settings, b'{"expected": 0, "colour": "red"}', "unknown field colour"),
        (
            "PATCH",
            settings,
            b'{"expected": 0, "budget": {"period": "week", "limitMicros": 1}}',
            "budget.period must be 'day' or 'month'",
        ),
    ]
    for method, url, body, message in cases:
        response = await api.http.request(method, url, content=body, headers=headers)
        assert response.status_code == 422, (body, response.text)
        assert response.json() == {"error": {"code": "BAD_INPUT", "message": message}}, body
    refs = f"/v1/chats/chat_{'0' * 32}/memory/validate-references"
    wrong = await api.http.post(refs, content=b'{"ids": "e1"}', headers=headers)
    assert wrong.json() == {"error": {"code": "BAD_INPUT", "message": "ids must be a list"}}
    assert await memory_version(runtime, w.bot) == before
    got = await api.http.get(settings, headers=headers)
    assert got.json()["version"] == 0 and got.json()["concurrency"] is None
    unauthenticated = await api.http.post(memory, content=b"{oops")
    assert unauthenticated.status_code == 401  # who asks is checked before what is asked


async def test_a_stale_meta_replacement_is_a_declared_409(api: Api) -> None:
    """D9.30: PUT of a chat's meta with an ``expected`` version that moved answers 409 CONFLICT,
    and the document says so (it listed 409 for POST only: a generated client had no type for
    the answer)."""
    spec = await spec_of(api)
    w = await make_world(api, ("ann",))
    ann = bearer(w.tokens["ann"])
    chat = await api.chat(w.tokens["ann"], w.bot)
    created = await api.http.post(f"/v1/chats/{chat}/meta", json={"summary": {"plan": "Lyon"}}, headers=ann)
    assert created.status_code == 201, created.text
    moved = {"summary": {"plan": "Paris"}, "expected": 0}
    stale = await api.http.put(f"/v1/chats/{chat}/meta", json=moved, headers=ann)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "CONFLICT", stale.text
    check(spec, "put", "/v1/chats/{chat_id}/meta", 409, stale.json())
