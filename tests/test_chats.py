"""Chats, Turns, Items: ingestion, ordering, paging and who may read or write (D9.5, D9.6, V3)."""

from __future__ import annotations

import asyncio
from typing import Any

from graph.chats import CHAT_PAGES, CHAT_TAILS
from services.runtime import Runtime
from tests.client import Api, make_world
from tests.learning_helpers import add_items, holding_lock, until_a_transaction_waits_for_a_lock
from tests.memory_helpers import db_hits

MESSAGES = "query($c: ID!, $l: Int!, $s: Int!) { chat(id: $c) { id messageCount messages(limit: $l, skip: $s) { id kind text app speakerId turnId } } }"
ADD = "mutation($t: ID!, $i: [ItemInput!]!) { addItems(turnId: $t, items: $i) { id kind } }"


async def messages(api: Api, token: str, chat: str, limit: int = 50, skip: int = 0) -> dict[str, Any] | None:
    return (await api.gql(MESSAGES, {"c": chat, "l": limit, "s": skip}, token))["chat"]


async def test_private_chat_turn_items_in_order_with_paging(api: Api) -> None:
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    assert chat.startswith("chat_")
    turn = await api.turn(ann, chat, "Please book the train")
    assert turn["input"] == "Please book the train"
    assert turn["enrichedInput"] == "Please book the train"
    assert (turn["actorKind"], turn["actorId"], turn["status"]) == ("person", world.people["ann"], "open")
    items = [
        {"kind": "BOT_MESSAGE", "text": "Which day?"},
        {"kind": "TOOL_CALL", "text": "calendar.lookup()"},
        {"kind": "TOOL_RESULT", "text": "free on Friday", "app": "calendar"},
        {"kind": "NOTICE", "text": "the chat was shared"},
    ]
    created = (await api.gql(ADD, {"t": turn["id"], "i": items}, ann))["addItems"]
    assert [c["id"] for c in created] == ["i-2", "i-3", "i-4", "i-5"]
    done = await api.gql(
        "mutation($t: ID!) { completeTurn(turnId: $t) { status completedAt } }", {"t": turn["id"]}, ann
    )
    assert done["completeTurn"]["status"] == "completed"
    second = await api.turn(ann, chat, "Friday works")

    page = await messages(api, ann, chat)
    assert page is not None
    assert page["messageCount"] == 6
    assert [m["id"] for m in page["messages"]] == ["i-1", "i-2", "i-3", "i-4", "i-5", "i-6"]
    assert [m["kind"] for m in page["messages"]] == [
        "PERSON_MESSAGE",
        "BOT_MESSAGE",
        "TOOL_CALL",
        "TOOL_RESULT",
        "NOTICE",
        "PERSON_MESSAGE",
    ]
    assert page["messages"][0]["speakerId"] == world.people["ann"]
    assert page["messages"][3]["app"] == "calendar"
    assert page["messages"][5]["turnId"] == second["id"]
    assert page["messages"][5]["text"] == "Friday works"

    middle = await messages(api, ann, chat, limit=2, skip=2)
    assert middle is not None
    assert [m["id"] for m in middle["messages"]] == ["i-3", "i-4"]
    rest = await api.http.get(
        f"/v1/chats/{chat}/messages?limit=2&skip=4", headers={"Authorization": f"Bearer {ann}"}
    )
    assert rest.status_code == 200
    assert [m["id"] for m in rest.json()["messages"]] == ["i-5", "i-6"]
    assert rest.json()["total"] == 6


async def test_completed_turn_takes_no_more_items(api: Api) -> None:
    world = await make_world(api, ("ann",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    turn = await api.turn(world.tokens["ann"], chat, "hi")
    await api.gql(
        "mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, world.tokens["ann"]
    )
    codes = await api.codes(
        ADD, {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": "late"}]}, world.tokens["ann"]
    )
    assert codes == ["CONFLICT"]


async def test_items_added_while_the_turn_completes_are_refused_once_it_has(
    api: Api, runtime: Runtime
) -> None:
    """addItems racing completeTurn: the Turn's status was read without its lock, so an addItems
    that read "open" while a completion was being committed appended to the completed Turn
    (whether learning saw those Items depended on timing). It reads the status under the Turn's
    lock now: it waits for the completion and is refused. The completion is held open here, with
    the lock completeTurn takes, until addItems waits for it."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    turn = await api.turn(ann, chat, "hi")
    async with runtime.driver.session() as session:
        completing = await session.begin_transaction()
        await completing.run(
            "MATCH (t:Turn {id: $t}) CALL apoc.lock.nodes([t]) "
            "SET t.status = 'completed', t.completedAt = timestamp()",
            t=turn["id"],
        )
        add = asyncio.create_task(
            api.codes(ADD, {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": "late"}]}, ann)
        )
        await until_a_transaction_waits_for_a_lock(
            runtime, running="MATCH (held:Turn {id: $turnId})", given=("turnId", turn["id"])
        )
        await completing.commit()
    assert await add == ["CONFLICT"]
    page = await messages(api, ann, chat)
    assert page is not None and [m["id"] for m in page["messages"]] == ["i-1"]


async def test_private_chat_is_readable_by_its_owner_only(api: Api) -> None:
    world = await make_world(api, ("ann", "bob"))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "secret plans")
    assert await messages(api, world.tokens["bob"], chat) is None
    rest = await api.http.get(
        f"/v1/chats/{chat}/messages", headers={"Authorization": f"Bearer {world.tokens['bob']}"}
    )
    assert rest.status_code == 404
    assert rest.json()["error"]["code"] == "NOT_FOUND"
    # Bob cannot write into Ann's chat either.
    assert await api.codes(
        'mutation($c: ID!) { startTurn(chatId: $c, input: "x") { id } }', {"c": chat}, world.tokens["bob"]
    ) == ["NOT_FOUND"]


async def test_group_chat_is_readable_by_current_channel_members(api: Api) -> None:
    world = await make_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    chat = await api.chat(world.tokens["ann"], world.bot, channel=world.channel)
    await api.turn(world.tokens["ann"], chat, "team news")
    bob_turn = await api.turn(world.tokens["bob"], chat, "bob here")
    assert bob_turn["actorId"] == world.people["bob"]
    page = await messages(api, world.tokens["bob"], chat)
    assert page is not None
    assert [m["text"] for m in page["messages"]] == ["team news", "bob here"]
    assert await messages(api, world.tokens["cat"], chat) is None
    # Membership is evaluated at read time: Bob leaves, Cat joins.
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": world.channel, "m": [world.people["ann"], world.people["cat"]]},
    )
    assert await messages(api, world.tokens["bob"], chat) is None
    assert await messages(api, world.tokens["cat"], chat) is not None
    # Its owner too: out of the channel, out of its chats — messages, contextPack (the channel's
    # memory for the chat's people) and new Turns; deleting its history stays the owner's (D9.23).
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": world.channel, "m": [world.people["cat"]]},
    )
    ann = world.tokens["ann"]
    assert await messages(api, ann, chat) is None
    pack = "query($c: ID!) { contextPack(chatId: $c) { memory { ids } } }"
    assert await api.codes(pack, {"c": chat}, ann) == ["NOT_FOUND"]
    start = 'mutation($c: ID!) { startTurn(chatId: $c, input: "hi") { id } }'
    assert await api.codes(start, {"c": chat}, ann) == ["NOT_FOUND"]
    deleted = await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    assert deleted["deleteChatHistory"]["items"] == 2


async def test_a_context_pack_whose_reader_left_the_channel_while_it_was_built_is_not_given(
    api: Api, runtime: Runtime
) -> None:
    """D9.6, D9.17: contextPack checks that the caller is one of the Chat's people, then reads the
    summary, the meta's messages and the channel's memory in later statements. A caller removed
    from the channel while the pack waited for the Bot's memory (held by a change) got the pack
    built after the removal; the caller's access is checked again once everything is read."""
    world = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot, channel=world.channel)
    await api.turn(ann, chat, "team news")
    pack = "query($c: ID!) { contextPack(chatId: $c) { memory { ids } } }"
    async with runtime.driver.session() as session:
        changing = await session.begin_transaction()  # a memory change: the Memory held
        try:
            await changing.run("MATCH (m:Memory {id: $b}) SET m.version = m.version", b=world.bot)
            packing = asyncio.create_task(api.codes(pack, {"c": chat}, ann))
            await until_a_transaction_waits_for_a_lock(runtime, running="Preference")
            await api.admin(
                "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
                {"c": world.channel, "m": [world.people["bob"]]},
            )
        finally:
            await changing.rollback()
    assert await packing == ["NOT_FOUND"]


async def test_a_person_adds_items_only_to_their_own_turns(api: Api) -> None:
    """In a group chat every member may write, but a person message is its Turn's actor's words
    (V3): Bob cannot add Items to Ann's open Turn (they were saved as Ann's, and facts learnt from
    them said ``from:`` Ann). The platform still adds the Bot's Items to anyone's Turn."""
    world = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    chat = await api.chat(world.tokens["ann"], world.bot, channel=world.channel)
    turn = await api.turn(world.tokens["ann"], chat, "what shall we eat?")
    for kind in ("PERSON_MESSAGE", "BOT_MESSAGE"):
        codes = await api.codes(
            ADD, {"t": turn["id"], "i": [{"kind": kind, "text": "I'm allergic to fish"}]}, world.tokens["bob"]
        )
        assert codes == ["FORBIDDEN"]
    own = await api.gql(
        ADD, {"t": turn["id"], "i": [{"kind": "PERSON_MESSAGE", "text": "pizza?"}]}, world.tokens["ann"]
    )
    assert [i["kind"] for i in own["addItems"]] == ["PERSON_MESSAGE"]
    platform = await api.platform_token(world.org)
    bot = await api.gql(
        ADD, {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": "Pizza it is."}]}, platform
    )
    assert [i["kind"] for i in bot["addItems"]] == ["BOT_MESSAGE"]
    page = await messages(api, world.tokens["bob"], chat)
    assert page is not None and [m["text"] for m in page["messages"]] == [
        "what shall we eat?",
        "pizza?",
        "Pizza it is.",
    ]


async def test_a_person_completes_and_confides_only_on_their_own_turns(api: Api) -> None:
    """As with addItems (V3): in a group chat Bob completed Ann's open Turn — the Bot's reply to
    her then met CONFLICT and learning ran on her half-said words — or confided on it, starting
    a learning execution over her words. Both are refused now; Ann and the platform go on."""
    world = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    chat = await api.chat(world.tokens["ann"], world.bot, channel=world.channel)
    turn = await api.turn(world.tokens["ann"], chat, "what shall we eat?")
    complete = "mutation($t: ID!) { completeTurn(turnId: $t) { status } }"
    confide = 'mutation($t: ID!) { confide(turnId: $t, text: "I am unsure") { answer } }'
    assert await api.codes(complete, {"t": turn["id"]}, world.tokens["bob"]) == ["FORBIDDEN"]
    assert await api.codes(confide, {"t": turn["id"]}, world.tokens["bob"]) == ["FORBIDDEN"]
    platform = await api.platform_token(world.org)
    bot = await api.gql(ADD, {"t": turn["id"], "i": [{"kind": "BOT_MESSAGE", "text": "Pizza?"}]}, platform)
    assert [i["kind"] for i in bot["addItems"]] == ["BOT_MESSAGE"]  # still open for the reply
    done = await api.gql(complete, {"t": turn["id"]}, world.tokens["ann"])
    assert done["completeTurn"]["status"] == "completed"


async def test_a_refused_add_or_confide_never_waits_for_the_turns_lock(api: Api, runtime: Runtime) -> None:
    """addItems and confide are refused before the Turn's lock: they locked it first, so another
    organization's or another member's refusal waited behind whatever held the Turn (a
    completion, learning being recorded) — telling a busy Turn from an unknown id — and held the
    Turn's own writers meanwhile (D9.4). Refused at once while another transaction holds the
    lock; the Turn's own actor waits for it."""
    world = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    stranger = await make_world(api, ("zed",))
    chat = await api.chat(world.tokens["ann"], world.bot, channel=world.channel)
    turn = (await api.turn(world.tokens["ann"], chat, "what shall we eat?"))["id"]
    confide = 'mutation($t: ID!) { confide(turnId: $t, text: "I am unsure") { answer } }'
    item = {"t": turn, "i": [{"kind": "PERSON_MESSAGE", "text": "pizza?"}]}
    async with holding_lock(
        runtime, "MATCH (t:Turn {id: $t}) CALL apoc.lock.nodes([t]) RETURN t.id", t=turn
    ) as release:
        for token, expected in (
            (stranger.tokens["zed"], ["NOT_FOUND"]),
            (world.tokens["bob"], ["FORBIDDEN"]),
        ):
            assert await asyncio.wait_for(api.codes(ADD, item, token), 20) == expected
            assert await asyncio.wait_for(api.codes(confide, {"t": turn}, token), 20) == expected
        own = asyncio.create_task(api.gql(ADD, item, world.tokens["ann"]))
        await until_a_transaction_waits_for_a_lock(
            runtime, running="apoc.lock.nodes([held])", given=("turnId", turn)
        )
        release.set()
        assert [i["kind"] for i in (await own)["addItems"]] == ["PERSON_MESSAGE"]


async def test_other_organization_sees_nothing(api: Api) -> None:
    world = await make_world(api, ("ann",))
    other = await make_world(api, ("zed",))
    chat = await api.chat(world.tokens["ann"], world.bot)
    await api.turn(world.tokens["ann"], chat, "ours")
    assert await messages(api, other.tokens["zed"], chat) is None
    other_platform = await api.platform_token(other.org)
    assert await api.codes(
        'mutation($c: ID!, $a: ID!) { startTurn(chatId: $c, input: "x", actorId: $a) { id } }',
        {"c": chat, "a": world.people["ann"]},
        other_platform,
    ) == ["NOT_FOUND"]
    # A Bot of another organization cannot be used.
    assert await api.codes(
        "mutation($b: ID!) { createChat(botId: $b) { id } }", {"b": world.bot}, other.tokens["zed"]
    ) == ["NOT_FOUND"]


async def test_platform_acts_for_people_of_the_chat_only(api: Api) -> None:
    world = await make_world(api, ("ann", "bob"))
    platform = await api.platform_token(world.org)
    created = await api.gql(
        "mutation($b: ID!, $o: ID!) { createChat(botId: $b, ownerId: $o) { id ownerId } }",
        {"b": world.bot, "o": world.people["ann"]},
        platform,
    )
    chat = created["createChat"]["id"]
    assert created["createChat"]["ownerId"] == world.people["ann"]
    turn = await api.turn(platform, chat, "as ann", actor=world.people["ann"])
    assert (turn["actorKind"], turn["actorId"]) == ("person", world.people["ann"])
    # Bob is in the organization but not a person of Ann's private chat.
    assert await api.codes(
        'mutation($c: ID!, $a: ID!) { startTurn(chatId: $c, input: "x", actorId: $a) { id } }',
        {"c": chat, "a": world.people["bob"]},
        platform,
    ) == ["FORBIDDEN"]
    notice = await api.turn(platform, chat, "reminder: meeting", notice=True)
    assert (notice["actorKind"], notice["actorId"]) == ("notice", None)
    # A platform cannot read the chat (D9.6; it is told what it may call) and a person cannot act
    # as someone else.
    assert await api.codes(MESSAGES, {"c": chat, "l": 5, "s": 0}, platform) == ["FORBIDDEN"]
    assert await api.codes(
        'mutation($c: ID!, $a: ID!) { startTurn(chatId: $c, input: "x", actorId: $a) { id } }',
        {"c": chat, "a": world.people["bob"]},
        world.tokens["ann"],
    ) == ["FORBIDDEN"]
    page = await messages(api, world.tokens["ann"], chat)
    assert page is not None
    assert [(m["kind"], m["speakerId"]) for m in page["messages"]] == [
        ("PERSON_MESSAGE", world.people["ann"]),
        ("NOTICE", None),
    ]


async def test_chat_needs_a_grant_and_a_channel_the_owner_is_in(api: Api) -> None:
    world = await make_world(api, ("ann", "bob"), channel=("bob",))
    await api.grant(world.bot, world.people["ann"], "NONE")
    assert await api.codes(
        "mutation($b: ID!) { createChat(botId: $b) { id } }", {"b": world.bot}, world.tokens["ann"]
    ) == ["FORBIDDEN"]
    await api.grant(world.bot, world.people["ann"], "READ")
    assert await api.codes(
        "mutation($b: ID!, $c: ID!) { createChat(botId: $b, channelId: $c) { id } }",
        {"b": world.bot, "c": world.channel},
        world.tokens["ann"],
    ) == ["FORBIDDEN"]
    review = await api.gql(
        "mutation($b: ID!) { createChat(botId: $b, review: true) { id review channelId } }",
        {"b": world.bot},
        world.tokens["ann"],
    )
    assert review["createChat"]["review"] is True


async def test_shared_bot_chat_belongs_to_the_callers_organization(api: Api) -> None:
    world = await make_world(api, ("ann",))
    guest = await make_world(api, ("gus",))
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
        {"b": world.bot, "o": guest.org},
    )
    await api.grant(world.bot, guest.people["gus"], "READ")
    data = await api.gql(
        "mutation($b: ID!) { createChat(botId: $b) { id organizationId botId } }",
        {"b": world.bot},
        guest.tokens["gus"],
    )
    assert data["createChat"]["organizationId"] == guest.org
    assert data["createChat"]["botId"] == world.bot


async def test_a_page_of_a_long_chat_costs_what_a_page_of_a_short_one_costs(
    api: Api, runtime: Runtime
) -> None:
    """Items are numbered 1, 2, … without a gap: a page starts at the seek ``seq > skip``, and
    pages and the last Items are read in the index's order. Ordered by ``seq`` alone, every page
    and the last Items (a context pack's, the runner's history) read the whole Chat; with SKIP,
    a page read the Items before it. The db hits of a page and of the last Items are the same at
    6 Items and at 300, at any depth; pages after a deleted history keep their numbers."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    turn = await api.turn(ann, chat, "m-1")
    page = {"chatIds": [chat], "personId": world.people["ann"], "limit": 5, "skip": 0}
    tail = {"chatIds": [chat], "personId": world.people["ann"], "last": 5}
    await add_items(api, ann, turn["id"], *[("PERSON_MESSAGE", f"m-{2 + k}") for k in range(5)])
    short_page, short_tail = (
        await db_hits(runtime, CHAT_PAGES, page),
        await db_hits(runtime, CHAT_TAILS, tail),
    )
    for part in range(3):
        await add_items(
            api, ann, turn["id"], *[("PERSON_MESSAGE", f"m-{7 + 98 * part + k}") for k in range(98)]
        )
    deep = await messages(api, ann, chat, limit=5, skip=290)
    assert deep is not None and [m["text"] for m in deep["messages"]] == [f"m-{n}" for n in range(291, 296)]
    assert [m["id"] for m in deep["messages"]] == [f"i-{n}" for n in range(291, 296)]
    assert await db_hits(runtime, CHAT_PAGES, page) == short_page
    assert await db_hits(runtime, CHAT_PAGES, {**page, "skip": 290}) == short_page
    assert await db_hits(runtime, CHAT_TAILS, tail) == short_tail
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    await api.turn(ann, chat, "after")
    after = await messages(api, ann, chat, limit=5, skip=299)
    assert after is not None
    assert [(m["id"], m["text"]) for m in after["messages"]] == [("i-300", None), ("i-301", "after")]


#: 16 June 2023, 13:56 UTC: a message of a history imported by a platform.
JUNE_16 = 1_686_923_760_000
DATED = "query($c: ID!) { chat(id: $c) { messages(limit: 10, skip: 0) { id createdAt saidAt } } }"


async def test_items_of_history_imported_keep_when_they_were_said(api: Api) -> None:
    """D9.31: a platform importing a history gives each Item the time it was said (``saidAt`` on
    startTurn and on each ItemInput); an Item given none was said when it was saved. Both
    surfaces show it."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    platform = await api.platform_token(world.org)
    chat = await api.chat(ann, world.bot)
    turn = await api.turn(platform, chat, "we met at the lake", actor=world.people["ann"], said_at=JUNE_16)
    added = await api.gql(
        ADD,
        {
            "t": turn["id"],
            "i": [
                {"kind": "BOT_MESSAGE", "text": "lovely", "saidAt": JUNE_16 + 60_000},
                {"kind": "BOT_MESSAGE", "text": "said now"},
            ],
        },
        platform,
    )
    assert [i["id"] for i in added["addItems"]] == ["i-2", "i-3"]
    await api.turn(ann, chat, "and today?")
    found = (await api.gql(DATED, {"c": chat}, ann))["chat"]["messages"]
    assert [m["saidAt"] for m in found[:2]] == [JUNE_16, JUNE_16 + 60_000]
    assert all(m["createdAt"] > JUNE_16 + 60_000 for m in found)  # saved now, said then
    assert [m["saidAt"] == m["createdAt"] for m in found[2:]] == [True, True]
    rest = await api.http.get(f"/v1/chats/{chat}/messages", headers={"Authorization": f"Bearer {ann}"})
    assert [m["saidAt"] for m in rest.json()["messages"]] == [m["saidAt"] for m in found]


ZONED = "query($c: ID!) { chat(id: $c) { messages(limit: 20, skip: 0) { id speakerId timeZone } } }"
ME_ZONE = "{ me { id timeZone } }"
SET_ZONE = "mutation($z: String) { setTimeZone(timeZone: $z) { id timeZone } }"


async def test_an_item_keeps_the_time_zone_it_was_said_in(api: Api, runtime: Runtime) -> None:
    """D9.32: a person sets the time zone they speak in (an admin may give one at creation);
    each Item they say keeps the zone it was said in — the one startTurn or its ItemInput gives
    (a platform importing history), else its speaker's as set when it is saved; an Item no person
    said, or said by someone without a zone, has none (UTC). Changing one's zone leaves the Items
    said before as they were. Both surfaces show it."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    created = await api.admin(
        'mutation($o: ID!) { createPerson(organizationId: $o, name: "Kai", timeZone: "Asia/Tokyo")'
        " { person { id timeZone } token } }",
        {"o": world.org},
    )
    assert created["createPerson"]["person"]["timeZone"] == "Asia/Tokyo"
    kai = created["createPerson"]["token"]
    assert (await api.gql(ME_ZONE, None, kai))["me"]["timeZone"] == "Asia/Tokyo"
    assert (await api.gql(ME_ZONE, None, ann))["me"]["timeZone"] is None
    await api.grant(world.bot, created["createPerson"]["person"]["id"])
    kais = await api.chat(kai, world.bot)
    await api.turn(kai, kais, "konnichiwa")
    chat = await api.chat(ann, world.bot)
    await api.turn(ann, chat, "before")  # i-1: no zone yet
    assert (await api.gql(SET_ZONE, {"z": "America/Los_Angeles"}, ann))["setTimeZone"]["timeZone"] == (
        "America/Los_Angeles"
    )
    turn = await api.turn(ann, chat, "after")  # i-2: hers now
    await api.gql(
        ADD,
        {
            "t": turn["id"],
            "i": [
                {"kind": "BOT_MESSAGE", "text": "noted"},  # i-3: no person said it
                {"kind": "PERSON_MESSAGE", "text": "from Berlin", "timeZone": "Europe/Berlin"},  # i-4
            ],
        },
        ann,
    )
    platform = await api.platform_token(world.org)
    imported = await api.turn(
        platform, chat, "imported", actor=world.people["ann"], time_zone="Asia/Kolkata"
    )  # i-5
    await api.gql(
        ADD,
        {
            "t": imported["id"],
            "i": [
                {"kind": "PERSON_MESSAGE", "text": "and more"},  # i-6: said where the Turn was
                {"kind": "BOT_MESSAGE", "text": "ok"},  # i-7
            ],
        },
        platform,
    )
    complete = "mutation($t: ID!) { completeTurn(turnId: $t) { timeZone } }"
    assert (await api.gql(complete, {"t": imported["id"]}, platform))["completeTurn"][
        "timeZone"
    ] == "Asia/Kolkata"
    assert (await api.gql(complete, {"t": turn["id"]}, ann))["completeTurn"]["timeZone"] is None  # none given
    assert (await api.gql("mutation { setTimeZone { id timeZone } }", None, ann))["setTimeZone"][
        "timeZone"
    ] is None
    await api.turn(ann, chat, "back in UTC")  # i-8
    found = (await api.gql(ZONED, {"c": chat}, ann))["chat"]["messages"]
    assert [m["timeZone"] for m in found] == [
        None,
        "America/Los_Angeles",
        None,
        "Europe/Berlin",
        "Asia/Kolkata",
        "Asia/Kolkata",
        None,
        None,
    ]
    assert [m["timeZone"] for m in (await api.gql(ZONED, {"c": kais}, kai))["chat"]["messages"]] == [
        "Asia/Tokyo"
    ]
    rest = await api.http.get(f"/v1/chats/{chat}/messages", headers={"Authorization": f"Bearer {ann}"})
    assert [m["timeZone"] for m in rest.json()["messages"]] == [m["timeZone"] for m in found]
    # Deleting the history takes where each word was said with the words (D9.23).
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    assert {m["timeZone"] for m in (await api.gql(ZONED, {"c": chat}, ann))["chat"]["messages"]} == {None}
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (t:Turn {chatId: $c}) WHERE t.timeZone IS NOT NULL RETURN count(t) AS n", c=chat
    )
    assert records[0]["n"] == 0


async def test_a_time_zone_the_iana_database_does_not_name_is_refused_and_changes_nothing(api: Api) -> None:
    """D9.32, bad input: a time zone must be a name of the IANA database ("Europe/Berlin"); an
    offset, an abbreviation, a wrong case, an empty or a huge string, or not a string is
    BAD_INPUT (the field's, or the scalar's), and nothing of the call is saved or changed. Only a
    person sets their own zone: a platform token is FORBIDDEN."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    await api.gql(SET_ZONE, {"z": "Europe/Paris"}, ann)
    chat = await api.chat(ann, world.bot)
    turn = await api.turn(ann, chat, "hi")
    start = 'mutation($c: ID!, $z: String) { startTurn(chatId: $c, input: "later", timeZone: $z) { id } }'
    person = 'mutation($o: ID!, $z: String) { createPerson(organizationId: $o, name: "Z", timeZone: $z) { token } }'
    bads = (
        "+02:00",
        "CEST",
        "europe/paris",
        "",
        "localtime",
        "Factory",
        "Mars/Olympus",
        "Europe/" + "x" * 10_000,
    )
    for bad in (*bads, 2, True):
        body = await api.raw(SET_ZONE, {"z": bad}, ann)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"], (bad, body)
        body = await api.raw(start, {"c": chat, "z": bad}, ann)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"], (bad, body)
        if isinstance(bad, str):
            assert body["errors"][0]["extensions"]["field"] == "timeZone"
            assert bad[:20] not in body["errors"][0]["message"] or not bad  # the input is not echoed
        items = [
            {"kind": "BOT_MESSAGE", "text": "fine"},
            {"kind": "PERSON_MESSAGE", "text": "x", "timeZone": bad},
        ]
        body = await api.raw(ADD, {"t": turn["id"], "i": items}, ann)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"], (bad, body)
        if isinstance(bad, str):
            assert body["errors"][0]["extensions"]["field"] == "items[1].timeZone"
        body = await api.raw(person, {"o": world.org, "z": bad}, api.admin_token)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"], (bad, body)
    # Only a person's words are said in a zone: not a notice, the Bot's words or an App result.
    platform = await api.platform_token(world.org)
    notice = 'mutation($c: ID!) { startTurn(chatId: $c, input: "n", notice: true, timeZone: "UTC") { id } }'
    assert await api.codes(notice, {"c": chat}, platform) == ["BAD_INPUT"]
    for kind in ("BOT_MESSAGE", "NOTICE"):
        body = await api.raw(
            ADD, {"t": turn["id"], "i": [{"kind": kind, "text": "x", "timeZone": "UTC"}]}, ann
        )
        assert [e["extensions"]["field"] for e in body["errors"]] == ["items[0].timeZone"], body
    assert (await api.gql(ME_ZONE, None, ann))["me"]["timeZone"] == "Europe/Paris"
    found = (await api.gql(ZONED, {"c": chat}, ann))["chat"]["messages"]
    assert [(m["id"], m["timeZone"]) for m in found] == [("i-1", "Europe/Paris")]
    assert await api.codes(SET_ZONE, {"z": "UTC"}, platform) == ["FORBIDDEN"]
    assert await api.codes(SET_ZONE, {"z": "UTC"}, api.admin_token) == ["FORBIDDEN"]
    assert (await api.gql(ME_ZONE, None, ann))["me"]["timeZone"] == "Europe/Paris"


async def test_a_time_not_yet_come_or_not_a_time_is_refused_and_saves_nothing(api: Api) -> None:
    """D9.31, bad input: ``saidAt`` in the future (beyond a few minutes of clock drift), in
    seconds rather than milliseconds, negative, or not a whole number is BAD_INPUT (the scalar's
    or the field's), and nothing of the call is saved."""
    world = await make_world(api, ("ann",))
    ann = world.tokens["ann"]
    chat = await api.chat(ann, world.bot)
    turn = await api.turn(ann, chat, "hi")
    start = 'mutation($c: ID!, $s: Long) { startTurn(chatId: $c, input: "later", saidAt: $s) { id } }'
    tomorrow = (await api.gql(DATED, {"c": chat}, ann))["chat"]["messages"][0]["createdAt"] + 86_400_000
    for bad in (tomorrow, 1_686_923_760, -1, 1.5, True, "yesterday"):
        body = await api.raw(start, {"c": chat, "s": bad}, ann)
        assert [e["extensions"]["code"] for e in body["errors"]] == ["BAD_INPUT"], (bad, body)
        if isinstance(bad, int) and not isinstance(bad, bool):
            assert body["errors"][0]["extensions"]["field"] == "saidAt"
        items = [{"kind": "BOT_MESSAGE", "text": "fine"}, {"kind": "BOT_MESSAGE", "text": "x", "saidAt": bad}]
        assert await api.codes(ADD, {"t": turn["id"], "i": items}, ann) == ["BAD_INPUT"]
    found = (await api.gql(DATED, {"c": chat}, ann))["chat"]["messages"]
    assert [m["id"] for m in found] == ["i-1"]
