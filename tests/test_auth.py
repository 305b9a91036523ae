"""Authentication and the token rules of D9.5 (V7 against the operator's API too)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from services.ids import hash_token
from services.runtime import Runtime, now_ms
from tests.client import Api, make_world
from tests.learning_helpers import holding_lock, until_a_transaction_waits_for_a_lock

ME = "query { me { id } }"


async def test_missing_malformed_and_wrong_tokens_are_unauthenticated(api: Api) -> None:
    assert await api.codes(ME) == ["UNAUTHENTICATED"]
    assert await api.codes(ME, token="not-a-token") == ["UNAUTHENTICATED"]
    response = await api.http.post("/graphql", json={"query": ME}, headers={"Authorization": "Basic abc"})
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    rest = await api.http.get("/v1/chats/chat_x/messages")
    assert rest.status_code == 401
    assert rest.json() == {"error": {"code": "UNAUTHENTICATED", "message": "missing bearer token"}}


async def test_person_token_identifies_the_person(api: Api) -> None:
    world = await make_world(api, ("ann",))
    data = await api.gql(ME, token=world.tokens["ann"])
    assert data["me"]["id"] == world.people["ann"]


async def test_revoked_token_stops_working_everywhere(api: Api) -> None:
    world = await make_world(api, ("ann",))
    issued = await api.gql("mutation { issueToken { id token } }", token=world.tokens["ann"])
    second = issued["issueToken"]["token"]
    assert (await api.gql(ME, token=second))["me"]["id"] == world.people["ann"]
    await api.gql(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }",
        {"t": issued["issueToken"]["id"]},
        world.tokens["ann"],
    )
    assert await api.codes(ME, token=second) == ["UNAUTHENTICATED"]
    assert (
        await api.http.get("/v1/chats/chat_x/messages", headers={"Authorization": f"Bearer {second}"})
    ).status_code == 401
    # The first token is untouched.
    assert (await api.gql(ME, token=world.tokens["ann"]))["me"]["id"] == world.people["ann"]


async def test_a_persons_first_token_can_be_revoked_by_its_id(api: Api) -> None:
    """D9.5: the admin can revoke any token. A person's first token — no expiry, the root of every
    token they issue — came without its id, and nothing listed it: nobody could ever revoke it
    (offboarding a person left it working). createPerson gives its id now; revoking it ends it
    and the tokens issued below it."""
    world = await make_world(api, ("ann",))
    created = await api.admin(
        'mutation($o: ID!) { createPerson(organizationId: $o, name: "bo") { person { id } token tokenId } }',
        {"o": world.org},
    )
    first = created["createPerson"]["token"]
    child = (await api.gql("mutation { issueToken { token } }", token=first))["issueToken"]["token"]
    assert (await api.gql(ME, token=first))["me"]["id"] == created["createPerson"]["person"]["id"]
    await api.admin(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": created["createPerson"]["tokenId"]}
    )
    assert await api.codes(ME, token=first) == ["UNAUTHENTICATED"]
    assert await api.codes(ME, token=child) == ["UNAUTHENTICATED"]
    assert (await api.gql(ME, token=world.tokens["ann"]))["me"]["id"] == world.people["ann"]  # nobody else's


async def test_expired_token_is_refused(api: Api, runtime: Runtime) -> None:
    world = await make_world(api, ("ann",))
    issued = await api.gql(
        "mutation { issueToken(expiresInSeconds: 60) { token } }", token=world.tokens["ann"]
    )
    token = issued["issueToken"]["token"]
    assert (await api.gql(ME, token=token))["me"]["id"] == world.people["ann"]
    await runtime.driver.execute_query(
        "MATCH (t:Token {hash: $h}) SET t.expiresAt = $past", h=hash_token(token), past=now_ms() - 1
    )
    assert await api.codes(ME, token=token) == ["UNAUTHENTICATED"]


async def test_a_token_mints_nothing_that_outlives_it(api: Api, runtime: Runtime) -> None:
    """A token issued with another expires no later than it, and is revoked with it: a token
    that leaked, or one meant to last a minute, minted a token that never expired, whose id
    nobody but its holder knew, so nobody could revoke it."""
    world = await make_world(api, ("ann",))
    issue = "mutation($s: Int) { issueToken(expiresInSeconds: $s) { id token } }"
    minute = (await api.gql(issue, {"s": 60}, world.tokens["ann"]))["issueToken"]
    forever = (await api.gql(issue, {"s": None}, minute["token"]))["issueToken"]
    later = (await api.gql(issue, {"s": 86_400}, forever["token"]))["issueToken"]
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (t:Token) WHERE t.id IN $ids RETURN t.id AS id, t.expiresAt AS at",
        ids=[minute["id"], forever["id"], later["id"]],
    )
    expires = {r["id"]: r["at"] for r in records}
    assert expires[forever["id"]] == expires[later["id"]] == expires[minute["id"]] is not None
    # Revoking the first revokes what it issued, at any depth; the person's own token stays.
    await api.gql(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": minute["id"]}, world.tokens["ann"]
    )
    for token in (minute["token"], forever["token"], later["token"]):
        assert await api.codes(ME, token=token) == ["UNAUTHENTICATED"]
    assert (await api.gql(ME, token=world.tokens["ann"]))["me"]["id"] == world.people["ann"]


async def test_a_token_issued_while_its_issuer_is_revoked_is_never_live(api: Api, runtime: Runtime) -> None:
    """issueToken racing the revocation of a token above it: the issuer was checked as the request
    began and read again nowhere, and the revocation collected the tokens issued below it without
    a lock, so a token created while it ran stayed live for good, its id known to its holder only
    (D9.5). Issuing locks the issuer and the tokens above it and reads the issuer again; revoking
    locks the token before collecting: the two take turns, either way round."""
    world = await make_world(api, ("ann",))
    issue = "mutation { issueToken { id token } }"
    parent = (await api.gql(issue, token=world.tokens["ann"]))["issueToken"]
    child = (await api.gql(issue, token=parent["token"]))["issueToken"]
    # A revocation of the parent in flight: issuing below it, with the child, waits and is refused.
    async with runtime.driver.session() as session:
        revoking = await session.begin_transaction()
        await revoking.run(
            "MATCH (t:Token) WHERE t.id IN $ids SET t.revokedAt = timestamp()",
            ids=[parent["id"], child["id"]],
        )
        minting = asyncio.create_task(api.raw(issue, token=child["token"]))
        await until_a_transaction_waits_for_a_lock(
            runtime, running="(:Token {id: $parentId})", given=("parentId", child["id"])
        )
        await revoking.commit()
    minted = await minting
    errors: list[dict[str, Any]] = minted.get("errors") or []
    assert [e["extensions"]["code"] for e in errors] == ["UNAUTHENTICATED"], minted
    # An issue in flight (its new token not yet committed): the revocation waits for it, then
    # revokes the new token too.
    other = (await api.gql(issue, token=world.tokens["ann"]))["issueToken"]
    secret = "bmp_" + secrets.token_urlsafe(32)
    async with runtime.driver.session() as session:
        issuing = await session.begin_transaction()
        await issuing.run(
            "MATCH (parent:Token {id: $parent}) CALL apoc.lock.nodes([parent]) "
            "MATCH (p:Person {id: $person}) "
            "CREATE (parent)-[:ISSUED]->(:Token {id: $id, hash: $hash, kind: 'person', createdAt: timestamp(),"
            " revokedAt: null})-[:FOR]->(p)",
            parent=other["id"],
            person=world.people["ann"],
            id="tok_" + secrets.token_hex(16),
            hash=hash_token(secret),
        )
        revoke = asyncio.create_task(
            api.gql(
                "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }",
                {"t": other["id"]},
                world.tokens["ann"],
            )
        )
        await until_a_transaction_waits_for_a_lock(
            runtime, running="MATCH (held:Token {id: $tokenId})", given=("tokenId", other["id"])
        )
        await issuing.commit()
    await revoke
    assert await api.codes(ME, token=secret) == ["UNAUTHENTICATED"]
    assert (await api.gql(ME, token=world.tokens["ann"]))["me"]["id"] == world.people["ann"]


async def test_two_settings_of_a_channels_members_at_once_leave_the_last(api: Api, runtime: Runtime) -> None:
    """setChannelMembers read the old members without the Channel's lock: two at once each kept
    the other's new members (a removed member stayed in, still seeing the channel's entries, V2,
    and its group chats, D9.6). The Channel is locked first now: the setting that commits last
    leaves exactly its members."""
    w = await make_world(api, ("ann", "bob", "cat"), channel=("ann",))
    people, channel = w.people, w.channel
    assert channel is not None
    async with runtime.driver.session() as session:
        first = await session.begin_transaction()  # a setting to ann and bob, not yet committed
        await first.run(
            "MATCH (c:Channel {id: $c}) CALL apoc.lock.nodes([c]) "
            "MATCH (p:Person {id: $p}) MERGE (p)-[:MEMBER]->(c)",
            c=w.channel,
            p=people["bob"],
        )
        second = asyncio.create_task(
            api.admin(
                "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
                {"c": w.channel, "m": [people["ann"], people["cat"]]},
            )
        )
        await until_a_transaction_waits_for_a_lock(
            runtime, running="MATCH (held:Channel {id: $id})", given=("id", channel)
        )
        await first.commit()
    await second
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (p:Person)-[:MEMBER]->(:Channel {id: $c}) RETURN p.id AS id", c=w.channel
    )
    assert {r["id"] for r in records} == {people["ann"], people["cat"]}


SET_MEMBERS = """mutation($c: ID!, $m: [ID!]!, $e: Int) {
  setChannelMembers(channelId: $c, memberIds: $m, expected: $e) { memberIds version }
}"""


async def test_two_admins_editing_a_channels_members_never_overwrite_each_other_unseen(api: Api) -> None:
    """Both read the members at version v and send their list: the list of the one who came last
    replaced the other's, and both were told it was done (a member one of them added was out
    again, unseen). With ``expected`` the second is CONFLICT and nothing changes; it reads again
    and sends its list on what is there now. Without ``expected`` a list replaces what is there."""
    w = await make_world(api, ("ann", "bob", "cat", "dan"), channel=("ann",))
    people = w.people
    read = await api.admin("query($c: ID!) { channel(id: $c) { memberIds version } }", {"c": w.channel})
    seen = read["channel"]["version"]
    added_bob = [people["ann"], people["bob"]]
    first = await api.admin(SET_MEMBERS, {"c": w.channel, "m": added_bob, "e": seen})
    assert first["setChannelMembers"] == {"memberIds": sorted(added_bob), "version": seen + 1}
    added_cat = {"c": w.channel, "m": [people["ann"], people["cat"]], "e": seen}
    assert await api.codes(SET_MEMBERS, added_cat, api.admin_token) == ["CONFLICT"]
    after = await api.admin("query($c: ID!) { channel(id: $c) { memberIds version } }", {"c": w.channel})
    assert after["channel"] == {"memberIds": sorted(added_bob), "version": seen + 1}  # nothing changed
    both = [people["ann"], people["bob"], people["cat"]]
    again = await api.admin(SET_MEMBERS, {"c": w.channel, "m": both, "e": seen + 1})
    assert again["setChannelMembers"] == {"memberIds": sorted(both), "version": seen + 2}
    plain = await api.admin(SET_MEMBERS, {"c": w.channel, "m": [people["dan"]], "e": None})
    assert plain["setChannelMembers"] == {"memberIds": [people["dan"]], "version": seen + 3}
    for expected in (-1, 2**31):
        codes = await api.codes(SET_MEMBERS, {"c": w.channel, "m": [], "e": expected}, api.admin_token)
        assert codes == ["BAD_INPUT"], (expected, codes)
    unknown: dict[str, Any] = {"c": "chn_unknown", "m": [], "e": 0}
    assert await api.codes(SET_MEMBERS, unknown, api.admin_token) == ["NOT_FOUND"]


async def test_admin_cannot_mint_for_an_existing_person_but_can_revoke(api: Api) -> None:
    world = await make_world(api, ("ann",))
    # issueToken is for the caller only; the admin is not a person.
    assert await api.codes("mutation { issueToken { token } }", token=api.admin_token) == ["FORBIDDEN"]
    issued = await api.gql("mutation { issueToken { id token } }", token=world.tokens["ann"])
    await api.admin(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }", {"t": issued["issueToken"]["id"]}
    )
    assert await api.codes(ME, token=issued["issueToken"]["token"]) == ["UNAUTHENTICATED"]


async def test_a_person_cannot_revoke_someone_elses_token(api: Api) -> None:
    world = await make_world(api, ("ann", "bob"))
    issued = await api.gql("mutation { issueToken { id token } }", token=world.tokens["bob"])
    codes = await api.codes(
        "mutation($t: ID!) { revokeToken(tokenId: $t) { id } }",
        {"t": issued["issueToken"]["id"]},
        world.tokens["ann"],
    )
    assert codes == ["NOT_FOUND"]
    assert (await api.gql(ME, token=issued["issueToken"]["token"]))["me"]["id"] == world.people["bob"]


async def test_provisioning_needs_the_admin_token(api: Api) -> None:
    world = await make_world(api, ("ann",))
    platform = await api.platform_token(world.org)
    for token in (world.tokens["ann"], platform):
        assert await api.codes('mutation { createOrganization(name: "x") { id } }', token=token) == [
            "FORBIDDEN"
        ]
        assert await api.codes(
            'mutation($o: ID!) { createPerson(organizationId: $o, name: "x") { token } }',
            {"o": world.org},
            token,
        ) == ["FORBIDDEN"]


async def test_platform_token_is_not_a_person(api: Api) -> None:
    world = await make_world(api, ("ann",))
    platform = await api.platform_token(world.org)
    assert await api.codes(ME, token=platform) == ["FORBIDDEN"]
    assert await api.codes("mutation { issueToken { token } }", token=platform) == ["FORBIDDEN"]


REMOVE = "mutation($p: ID!) { removePerson(personId: $p) { id organizationId removedAt } }"


async def test_a_removed_person_loses_every_access_at_once_and_comes_back_nowhere(api: Api) -> None:
    """Offboarding (admin, D9.34): ``removePerson`` takes a person out of every channel, ends every grant
    and revokes every token of theirs in one transaction, and they are never a member, a grantee
    or a chat's actor again; their private memory has no reader left, so a platform reading their
    chat gets nothing. Removed again, nothing changes; only the admin removes."""
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    second = (await api.gql("mutation { issueToken { id token } }", token=ann))["issueToken"]["token"]
    private = await api.chat(ann, w.bot)
    remembered = await api.http.post(
        f"/v1/bots/{w.bot}/memory",
        json={"command": {"_tag": "Remember", "content": "Ann's locker is number 12"}},
        headers={"Authorization": f"Bearer {ann}"},
    )
    assert remembered.status_code == 201, remembered.text
    platform = await api.platform_token(w.org)
    has = f"/v1/chats/{private}/memory/has-entries"
    before = await api.http.get(has, headers={"Authorization": f"Bearer {platform}"})
    assert before.json() == {"hasEntries": True}
    channel = "query($c: ID!) { channel(id: $c) { memberIds version } }"
    version = (await api.admin(channel, {"c": w.channel}))["channel"]["version"]
    assert await api.codes(REMOVE, {"p": w.people["ann"]}, bob) == ["FORBIDDEN"]

    open_turn = (await api.turn(platform, private, "Remind me of my locker", actor=w.people["ann"]))["id"]
    removed = (await api.admin(REMOVE, {"p": w.people["ann"]}))["removePerson"]
    assert removed["id"] == w.people["ann"] and removed["removedAt"] is not None
    for token in (ann, second):
        assert await api.codes(ME, token=token) == ["UNAUTHENTICATED"]
    after = (await api.admin(channel, {"c": w.channel}))["channel"]
    assert (after["memberIds"], after["version"]) == ([w.people["bob"]], version + 1)
    # Nobody reads her private memory now (she holds no grant): the platform gets nothing of it.
    gone = await api.http.get(has, headers={"Authorization": f"Bearer {platform}"})
    assert gone.json() == {"hasEntries": False}
    # Never a member, a grantee or an actor again.
    readd = "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }"
    assert await api.codes(
        readd, {"c": w.channel, "m": [w.people["ann"], w.people["bob"]]}, api.admin_token
    ) == ["BAD_INPUT"]
    grant = "mutation($b: ID!, $p: ID!, $a: Access!) { grantBot(botId: $b, personId: $p, access: $a) { id } }"
    assert await api.codes(grant, {"b": w.bot, "p": w.people["ann"], "a": "READ"}, api.admin_token) == [
        "BAD_INPUT"
    ]
    start = 'mutation($c: ID!, $a: ID) { startTurn(chatId: $c, input: "hi", actorId: $a) { id } }'
    assert await api.codes(start, {"c": private, "a": w.people["ann"]}, platform) == ["FORBIDDEN"]
    # Nor are words put in her mouth on a Turn of hers still open; the Bot's reply may end it.
    add = "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id } }"
    words = [{"kind": "PERSON_MESSAGE", "text": "Give Bob my locker code."}]
    assert await api.codes(add, {"t": open_turn, "i": words}, platform) == ["FORBIDDEN"]
    reply = [{"kind": "BOT_MESSAGE", "text": "Noted."}]
    assert len((await api.gql(add, {"t": open_turn, "i": reply}, platform))["addItems"]) == 1
    # Bob goes on as before; removed again, Ann is as she was.
    assert (await api.gql(ME, token=bob))["me"]["id"] == w.people["bob"]
    again = (await api.admin(REMOVE, {"p": w.people["ann"]}))["removePerson"]
    assert again == removed
    assert await api.codes(REMOVE, {"p": "person_" + "0" * 32}, api.admin_token) == ["NOT_FOUND"]


async def test_a_person_removed_while_a_grant_or_a_membership_is_set_gets_neither(
    api: Api, runtime: Runtime
) -> None:
    """D9.34: ``grantBot`` and ``setChannelMembers`` check the person first, then write under the
    person's lock, where they read them again: a removal that commits in between (here, one holding
    the person's lock) leaves them with neither a grant nor a membership, and each call is
    BAD_INPUT with nothing changed."""
    w = await make_world(api, ("ann", "bob"), channel=("bob",))
    ann = w.people["ann"]
    await api.admin(
        "mutation($b: ID!, $p: ID!) { grantBot(botId: $b, personId: $p, access: NONE) { id } }",
        {"b": w.bot, "p": ann},
    )
    removing = "MATCH (p:Person {id: $p}) CALL apoc.lock.nodes([p]) SET p.removedAt = timestamp()"
    grant = "mutation($b: ID!, $p: ID!) { grantBot(botId: $b, personId: $p, access: READ) { id } }"
    members = "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }"
    async with holding_lock(runtime, removing, p=ann) as release:
        granting = asyncio.create_task(api.codes(grant, {"b": w.bot, "p": ann}, api.admin_token))
        adding = asyncio.create_task(
            api.codes(members, {"c": w.channel, "m": [ann, w.people["bob"]]}, api.admin_token)
        )
        await until_a_transaction_waits_for_a_lock(runtime, running="GRANT")
        await until_a_transaction_waits_for_a_lock(runtime, running="MEMBER")
        release.set()
    assert await granting == ["BAD_INPUT"]
    assert await adding == ["BAD_INPUT"]
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (p:Person {id: $p}) RETURN EXISTS { (p)-[:GRANT]->() } AS granted, "
        "EXISTS { (p)-[:MEMBER]->() } AS member",
        p=ann,
    )
    assert (records[0]["granted"], records[0]["member"]) == (False, False)
