"""Server callers (D9.26, N4, N5): a platform token of the Chat's organization asks for context,
hasEntries, validateReferences and search on behalf of every reader of an answer in that Chat —
over GraphQL and REST, never for anyone else, never with a person's or another platform's token."""

from __future__ import annotations

from typing import Any

import pytest

from bench.channel_bench import ADD_MEMBERS
from graph import access
from services import chatmemory, memory
from services.domain import Principal
from services.errors import NotFound
from services.runtime import Runtime
from tests.client import Api, make_world
from tests.memory_helpers import checked_readers, command, db_hits, fact, said

CONTEXT = "query($c: ID!, $l: Int!, $q: String) { context(chatId: $c, limit: $l, query: $q) { text ids } }"
HAS = "query($c: ID!) { hasEntries(chatId: $c) }"
VALID = "query($c: ID!, $i: [ID!]!) { validateReferences(chatId: $c, ids: $i) }"
SEARCH = "query($b: ID!, $c: ID, $q: String!) { search(botId: $b, chatId: $c, query: $q) { entry { id } } }"


async def rest(api: Api, token: str, method: str, path: str, **kwargs: Any) -> Any:
    return await api.http.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kwargs)


async def test_server_callers_read_for_the_chats_readers_only(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    platform = await api.platform_token(w.org)
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    private = await api.chat(w.tokens["ann"], w.bot)
    bobs = await api.chat(w.tokens["bob"], w.bot)
    shared = await fact(
        runtime,
        w.bot,
        "The team meets on Tuesdays",
        await said(api, w.tokens["bob"], group, "we meet on tuesdays"),
    )
    secret = await fact(
        runtime,
        w.bot,
        "Ann is planning a surprise party",
        await said(api, w.tokens["ann"], private, "I plan a surprise party"),
    )

    in_group = (await api.gql(CONTEXT, {"c": group, "l": 4000, "q": "when do we meet?"}, platform))["context"]
    assert in_group["ids"] == [shared] and "Tuesdays" in in_group["text"]
    for_ann = (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": None}, platform))["context"]
    assert set(for_ann["ids"]) == {shared, secret}
    for_bob = (await api.gql(CONTEXT, {"c": bobs, "l": 4000, "q": "party"}, platform))["context"]
    assert secret not in for_bob["ids"]  # V7: Bob's chat never offers Ann's words

    assert (await api.gql(HAS, {"c": group}, platform))["hasEntries"] is True
    assert (await api.gql(VALID, {"c": group, "i": [shared]}, platform))["validateReferences"] is True
    assert (await api.gql(VALID, {"c": group, "i": [shared, secret]}, platform))[
        "validateReferences"
    ] is False
    found = await api.gql(SEARCH, {"b": w.bot, "c": group, "q": "surprise party tuesdays"}, platform)
    assert [h["entry"]["id"] for h in found["search"]] == [shared]

    # REST, the same answers.
    ctx = await rest(api, platform, "GET", f"/v1/chats/{group}/memory/context", params={"q": "meeting day"})
    assert ctx.status_code == 200 and ctx.json()["ids"] == [shared]
    has = await rest(api, platform, "GET", f"/v1/chats/{bobs}/memory/has-entries")
    assert has.json() == {"hasEntries": True}
    valid = await rest(
        api, platform, "POST", f"/v1/chats/{private}/memory/validate-references", json={"ids": [secret]}
    )
    assert valid.json() == {"valid": True}
    hits = await rest(api, platform, "GET", f"/v1/chats/{bobs}/memory/search", params={"q": "party"})
    assert secret not in [r["entry"]["id"] for r in hits.json()["results"]]

    # A source taken back: references to it no longer validate (N4), and it leaves the context.
    await api.http.post(
        f"/v1/bots/{w.bot}/memory",
        json={"command": {"_tag": "Forget", "id": secret}},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert (await api.gql(VALID, {"c": private, "i": [secret]}, platform))["validateReferences"] is False
    assert (
        secret
        not in (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": "party"}, platform))["context"]["ids"]
    )


async def test_only_a_platform_of_the_chats_organization_may_ask(api: Api) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    other = await make_world(api, ("zed",))
    foreign = await api.platform_token(other.org)
    platform = await api.platform_token(w.org)
    assert await api.codes(HAS, {"c": chat}, w.tokens["ann"]) == ["FORBIDDEN"]
    assert await api.codes(HAS, {"c": chat}, foreign) == ["NOT_FOUND"]
    assert await api.codes(HAS, {"c": "chat_" + "0" * 32}, platform) == ["NOT_FOUND"]
    assert await api.codes(HAS, {"c": chat}, None) == ["UNAUTHENTICATED"]
    assert await api.codes(CONTEXT, {"c": chat, "l": 0, "q": None}, platform) == ["BAD_INPUT"]
    assert await api.codes(VALID, {"c": chat, "i": ["not an id"]}, platform) == ["BAD_INPUT"]
    assert await api.codes(SEARCH, {"b": other.bot, "c": chat, "q": "x"}, platform) == ["NOT_FOUND"]
    forbidden = await rest(api, w.tokens["ann"], "GET", f"/v1/chats/{chat}/memory/context")
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "FORBIDDEN"
    bad = await rest(api, platform, "POST", f"/v1/chats/{chat}/memory/validate-references", content=b"{")
    assert bad.status_code == 422
    review = await api.chat(w.tokens["ann"], w.bot, review=True)
    empty = await rest(api, platform, "GET", f"/v1/chats/{review}/memory/context")
    assert empty.json() == {"text": "", "ids": []}  # review chats get no memory (D9.16)


async def test_another_organizations_platform_never_opens_the_chats_key(api: Api, runtime: Runtime) -> None:
    """A platform token of another organization is NOT_FOUND before the Chat's Bot's data key is
    unwrapped: it was unwrapped (and kept among this process's keys, pushing others out) before
    the organizations were compared (D9.4). The platform of the Chat's organization opens it."""
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    other = await make_world(api, ("zed",))
    assert runtime.keyring.cached(w.bot) is None  # made through the API process, not this one
    foreign = Principal("platform", organization_id=other.org)
    for call in (
        chatmemory.has_entries(runtime, foreign, chat),
        chatmemory.context(runtime, None, foreign, chat, 100, None),
        chatmemory.validate_references(runtime, foreign, chat, []),
    ):
        with pytest.raises(NotFound):
            await call
    assert runtime.keyring.cached(w.bot) is None
    own = Principal("platform", organization_id=w.org)
    assert not await chatmemory.has_entries(runtime, own, chat)
    assert runtime.keyring.cached(w.bot) is not None


async def test_a_group_chat_offers_only_entries_for_the_group_or_for_everyone(
    api: Api, runtime: Runtime
) -> None:
    """D9.22, the seed literally: in a group chat, answers draw only on entries for the group or for
    everyone — not on a member's personal entries, also when the member is the channel's only one.
    The same entries stay offered in that member's private chat."""
    w = await make_world(api, ("ann",), channel=("ann",))
    platform = await api.platform_token(w.org)
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    private = await api.chat(w.tokens["ann"], w.bot)
    ours = await fact(
        runtime, w.bot, "The band rehearses on Sundays", await said(api, w.tokens["ann"], group, "sundays")
    )
    mine = await fact(
        runtime, w.bot, "Ann's door code is 4711", await said(api, w.tokens["ann"], private, "4711")
    )
    in_group = (await api.gql(CONTEXT, {"c": group, "l": 4000, "q": None}, platform))["context"]
    assert in_group["ids"] == [ours] and "4711" not in in_group["text"]
    assert (await api.gql(VALID, {"c": group, "i": [mine]}, platform))["validateReferences"] is False
    found = await api.gql(SEARCH, {"b": w.bot, "c": group, "q": "door code"}, platform)
    assert mine not in [h["entry"]["id"] for h in found["search"]]
    pack = await rest(api, w.tokens["ann"], "GET", f"/v1/chats/{group}/context")
    assert pack.status_code == 200 and "4711" not in pack.text
    in_private = (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": None}, platform))["context"]
    assert mine in in_private["ids"]


async def test_a_grant_set_to_none_ends_the_owners_memory_in_the_chats_they_have(
    api: Api, runtime: Runtime
) -> None:
    """Seed 000: reading the memory needs read on the Bot (D9.1). The direct reads refused Ann once
    her grant was NONE, but the chat she had kept her memory flowing: a platform's context of
    it, its search and hasEntries, her rewrites. Every check now needs each reader to use the
    Bot; a grant again brings it back."""
    w = await make_world(api, ("ann",))
    platform = await api.platform_token(w.org)
    private = await api.chat(w.tokens["ann"], w.bot)
    secret = await fact(
        runtime,
        w.bot,
        "Ann is planning a surprise party",
        await said(api, w.tokens["ann"], private, "a party"),
    )
    assert (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": None}, platform))["context"]["ids"] == [
        secret
    ]
    await api.grant(w.bot, w.people["ann"], "NONE")
    assert (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": None}, platform))["context"]["ids"] == []
    assert (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": "party"}, platform))["context"]["ids"] == []
    assert (await api.gql(HAS, {"c": private}, platform))["hasEntries"] is False
    assert (await api.gql(VALID, {"c": private, "i": [secret]}, platform))["validateReferences"] is False
    found = await api.gql(SEARCH, {"b": w.bot, "c": private, "q": "surprise party"}, platform)
    assert found["search"] == []
    await api.grant(w.bot, w.people["ann"], "READ")
    assert (await api.gql(CONTEXT, {"c": private, "l": 4000, "q": "party"}, platform))["context"]["ids"] == [
        secret
    ]


async def test_a_group_chat_reads_as_one_reader_whatever_its_channels_size(
    api: Api, runtime: Runtime
) -> None:
    """D9.15, D9.22: an answer in a group chat passes the group and every current member of its
    channel — checked as one reader (GROUP_READER), which uses the Bot when every member does; a
    member's Forget exclusion is read from the channel. Each member was a reader of its own, so each
    candidate cost as much as the channel had members: at 1,000 members a context took ~130 ms,
    at 5,000 Neo4j failed the statement (TransientError: INTERNAL)."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    platform = await api.platform_token(w.org)
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    bobs = await api.chat(w.tokens["bob"], w.bot)
    shared = await fact(
        runtime, w.bot, "The team ships on Fridays", await said(api, w.tokens["bob"], group, "fridays")
    )
    await runtime.driver.execute_query(
        ADD_MEMBERS, org=w.org, channel=w.channel, bot=w.bot, first=1, last=500
    )

    async def offered() -> list[str]:
        context = await api.gql(CONTEXT, {"c": group, "l": 4000, "q": "when do we ship?"}, platform)
        return context["context"]["ids"]

    member = f"{w.channel}-member-250"
    reader = await memory.chat_reader(runtime, group)
    assert reader is not None
    [one] = await checked_readers(runtime, w.bot, reader)
    assert one["usesBot"] and one["atoms"] == [f"channel:{w.channel}", "bot"]
    assert await offered() == [shared]
    # One member who does not use the Bot: the group sees nothing (D9.1, every member must).
    grant = "MATCH (:Person {id: $p})-[g:GRANT]->(:Bot {id: $bot}) DELETE g"
    await runtime.driver.execute_query(grant, p=member, bot=w.bot)
    assert await offered() == []
    await runtime.driver.execute_query(
        "MATCH (p:Person {id: $p}), (b:Bot {id: $bot}) CREATE (p)-[:GRANT {access: 'READ'}]->(b)",
        p=member,
        bot=w.bot,
    )
    assert await offered() == [shared]
    # Ann, a member, forgets it: hidden from the group (V11), still Bob's in his private chat.
    assert (await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": shared})).status_code == 200
    assert await offered() == []
    for_bob = (await api.gql(CONTEXT, {"c": bobs, "l": 4000, "q": None}, platform))["context"]
    assert for_bob["ids"] == [shared]


async def test_naming_a_group_chats_reader_does_not_read_its_members(api: Api, runtime: Runtime) -> None:
    """The readers a statement is given only name a group chat's channel (GROUP_SEEK): the
    statement that checks reads the members under the lock (readers_now), so the statement that
    names them costs the same at 2 members as at 502 (it read every member and grant: ~50 ms at
    20,000, once more per request)."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, w.channel)
    small = await db_hits(runtime, access.CHAT_READERS, {"chatId": group})
    await runtime.driver.execute_query(
        ADD_MEMBERS, org=w.org, channel=w.channel, bot=w.bot, first=1, last=500
    )
    # One hit more at most: past 50 relationships the channel is a dense node (its degrees kept).
    # Reading the members was two hits and more for each: over 1,000 here.
    assert await db_hits(runtime, access.CHAT_READERS, {"chatId": group}) <= small + 1
    reader = await memory.chat_reader(runtime, group)
    assert reader is not None
    [whole] = await checked_readers(runtime, w.bot, reader)
    assert whole["usesBot"]
