"""Bad input on the memory routes: clear errors, stable codes, nothing changed."""

from __future__ import annotations

import asyncio

import pytest

from graph.memory import SHARED_LOCK
from services import commands
from services.domain import Principal
from services.errors import NotFound
from services.runtime import Runtime
from tests.client import Api, bearer, make_world
from tests.learning_helpers import holding_lock, until_a_transaction_waits_for_a_lock
from tests.memory_helpers import fact, said, visible


async def memory_version(runtime: Runtime, bot: str) -> int:
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (m:Memory {id: $b}) RETURN m.version AS v", b=bot
    )
    return int(records[0]["v"])


async def test_bad_commands_change_nothing(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    url = f"/v1/bots/{w.bot}/memory"
    before = await memory_version(runtime, w.bot)
    cases = [
        (b"{oops", 422),
        (b"[]", 422),
        (b'{"command": "Remember"}', 422),
        (b'{"command": {"_tag": "Delete", "id": "x"}}', 422),
        (b'{"command": {"_tag": "Remember"}}', 422),
        (b'{"command": {"_tag": "Remember", "content": 5}}', 422),
        (b'{"command": {"_tag": "Remember", "content": "x", "tags": ["chat:abc"]}}', 422),
        (b'{"command": {"_tag": "Remember", "content": "x", "tags": ["Not A Topic"]}}', 422),
        (b'{"command": {"_tag": "Remember", "content": "   "}}', 422),
        (('{"command": {"_tag": "Remember", "content": "' + "x" * 5000 + '"}}').encode(), 422),
        (b'{"command": {"_tag": "Forget"}}', 422),
    ]
    for body, status in cases:
        response = await api.http.post(
            url, content=body, headers={**headers, "Content-Type": "application/json"}
        )
        assert response.status_code == status, (body[:60], response.text)
        assert response.json()["error"]["code"] == "BAD_INPUT"
    assert await memory_version(runtime, w.bot) == before
    assert await visible(api, w.tokens["ann"], w.bot) == {}


async def test_unknown_foreign_and_invalid_bot_ids(api: Api) -> None:
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    headers = {"Authorization": f"Bearer {w.tokens['ann']}"}
    for bot in ("bot_" + "0" * 32, other.bot):
        response = await api.http.get(f"/v1/bots/{bot}/memory", headers=headers)
        assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"
    bad = await api.http.get("/v1/bots/bot%20x/memory", headers=headers)
    assert bad.status_code == 422
    filtered = await api.http.get(f"/v1/bots/{w.bot}/memory?tags=a,B%20C", headers=headers)
    assert filtered.status_code == 422


async def test_read_needs_a_grant_and_a_person(api: Api) -> None:
    w = await make_world(api, ("ann", "bob"))
    await api.grant(w.bot, w.people["bob"], "NONE")
    bob = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['bob']}"}
    )
    assert bob.status_code == 403
    platform = await api.platform_token(w.org)
    response = await api.http.get(f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {platform}"})
    assert response.status_code == 403  # a platform token cannot read memory (D9.5)
    admin = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {api.admin_token}"}
    )
    assert admin.status_code == 403  # nor can the operator (V7)


async def test_a_change_to_another_organizations_bot_is_refused_before_its_lock(
    api: Api, runtime: Runtime
) -> None:
    """Forget, share, purge and Remember of another organization's Bot were NOT_FOUND after taking that
    Memory's exclusive lock (and unwrapping its key): the time told it from an unknown Bot, and
    each request held the other organization's readers and writers (D9.4, C1). The caller's use
    of the Bot is read first now: refused while a read of that Memory holds its lock."""
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    unopened = await make_world(api, ("yan",))  # made through the API: this process never opened it
    chat = await api.chat(other.tokens["zed"], other.bot)
    theirs = await fact(runtime, other.bot, "Zed's plan", await said(api, other.tokens["zed"], chat, "plan"))
    mine = {"Authorization": f"Bearer {w.tokens['ann']}"}
    async with runtime.driver.session() as session:
        held = await session.begin_transaction()  # a read of their memory, under way
        await (await held.run(SHARED_LOCK, botId=other.bot)).consume()
        try:
            forget = {"command": {"_tag": "Forget", "id": theirs}}
            response = await asyncio.wait_for(
                api.http.post(f"/v1/bots/{other.bot}/memory", json=forget, headers=mine), 20
            )
            assert response.status_code == 404, response.text
            share = "mutation($b: ID!, $i: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $i, audience: $a) { version } }"
            audience = [f"for:person:{w.people['ann']}"]
            shared = await asyncio.wait_for(
                api.raw(share, {"b": other.bot, "i": theirs, "a": audience}, w.tokens["ann"]), 20
            )
            assert [e["extensions"]["code"] for e in shared["errors"]] == ["NOT_FOUND"], shared
            purged = await asyncio.wait_for(
                api.http.post(
                    f"/v1/bots/{other.bot}/memory/purge", json={"tag": f"chat:{chat}"}, headers=mine
                ),
                20,
            )
            assert purged.status_code == 404, purged.text
            remember: dict[str, object] = {"command": {"_tag": "Remember", "content": "Mine now", "tags": []}}
            remembered = await asyncio.wait_for(
                api.http.post(f"/v1/bots/{other.bot}/memory", json=remember, headers=mine), 20
            )
            assert remembered.status_code == 404, remembered.text
            # Without an embedder too, and nothing of the Bot is opened first: not its data key.
            ann = Principal("person", person_id=w.people["ann"], organization_id=w.org)
            for bot in (other.bot, unopened.bot):
                with pytest.raises(NotFound):
                    await asyncio.wait_for(
                        commands.remember(runtime, ann, bot, "Mine now", [], embedder=None), 20
                    )
            assert runtime.keyring.cached(unopened.bot) is None
        finally:
            await held.rollback()
    assert theirs in await visible(api, other.tokens["zed"], other.bot)


async def test_a_read_of_another_organizations_bot_is_refused_before_its_lock(
    api: Api, runtime: Runtime
) -> None:
    """A person's read of a Bot their organization neither owns nor is linked to is NOT_FOUND
    without its Memory's shared lock: locked, the refusal waited behind that organization's
    writers and took a second statement, which told it from an unknown Bot (D9.4). Refused at
    once while a change of that Memory holds its exclusive lock; its own people's read waits."""
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    mine = {"Authorization": f"Bearer {w.tokens['ann']}"}
    theirs = {"Authorization": f"Bearer {other.tokens['zed']}"}
    exclusive = "MATCH (m:Memory {id: $b}) CALL apoc.lock.nodes([m]) RETURN m.id"
    async with holding_lock(runtime, exclusive, b=other.bot) as release:
        for path in ("memory", "memory/search?q=plan", "memory/log"):
            refused = await asyncio.wait_for(api.http.get(f"/v1/bots/{other.bot}/{path}", headers=mine), 20)
            assert refused.status_code == 404, (path, refused.text)
        own = asyncio.create_task(api.http.get(f"/v1/bots/{other.bot}/memory", headers=theirs))
        await until_a_transaction_waits_for_a_lock(
            runtime, running="apoc.lock.read.nodes", given=("botId", other.bot)
        )
        release.set()
        assert (await own).status_code == 200


async def test_a_bot_known_without_a_grant_is_forbidden_to_read_and_to_change(
    api: Api, runtime: Runtime
) -> None:
    """A person of the Bot's organization with no grant knows the Bot, so every read and change
    of its memory tells them FORBIDDEN (``services.memory._unless_used``): Remember, Forget and share
    said NOT_FOUND where GET memory and search said FORBIDDEN. A person of another organization
    gets NOT_FOUND from each (D9.4), and neither changes the memory."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    entry = await fact(runtime, w.bot, "Ann's plan", await said(api, w.tokens["ann"], chat, "plan"))
    _, kim = await api.person(w.org, "kim")  # of Ann's organization, with no grant on its Bot
    zed = (await make_world(api, ("zed",))).tokens["zed"]
    memory = f"/v1/bots/{w.bot}/memory"
    remember: dict[str, object] = {"command": {"_tag": "Remember", "content": "Mine now", "tags": []}}
    share = "mutation($b: ID!, $i: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $i, audience: $a) { version } }"
    for token, status, code in ((kim, 403, "FORBIDDEN"), (zed, 404, "NOT_FOUND")):
        headers = bearer(token)
        answers = [
            await api.http.get(memory, headers=headers),
            await api.http.get(f"{memory}/search", params={"q": "plan"}, headers=headers),
            await api.http.post(memory, json=remember, headers=headers),
            await api.http.post(memory, json={"command": {"_tag": "Forget", "id": entry}}, headers=headers),
        ]
        assert [(a.status_code, a.json()["error"]["code"]) for a in answers] == [(status, code)] * 4, [
            a.text for a in answers
        ]
        mutations = [
            ('mutation($b: ID!) { remember(botId: $b, content: "Mine now") { version } }', {"b": w.bot}),
            (
                "mutation($b: ID!, $e: ID!) { forget(botId: $b, id: $e) { version } }",
                {"b": w.bot, "e": entry},
            ),
            (share, {"b": w.bot, "i": entry, "a": ["team"]}),
            ('query($b: ID!) { search(botId: $b, query: "plan", limit: 5) { score } }', {"b": w.bot}),
        ]
        assert [await api.codes(q, v, token) for q, v in mutations] == [[code]] * 4
    assert list(await visible(api, w.tokens["ann"], w.bot)) == [entry]
