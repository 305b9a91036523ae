"""Seed sentences the code implements that no other test pinned down: the budget over all
organizations (L6), all-of tag filters, the last 10 messages of a context pack (§6), no default
``botMemoryModel`` (L5), enrichments without an original (D9.19), learning that makes no Chat
(D9.18) and the legacy import logged as ``promotion`` (V9, C2)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from botmemory import cli
from learning.gateway import FIXED_CALM_ANSWER
from services.crypto import Kind
from services.memory import cipher_of
from services.runtime import Runtime
from tests.client import Api, bearer, make_world
from tests.conftest import TEST_MODEL, WorkerProcess
from tests.learning_helpers import (
    add_items,
    complete,
    confide,
    fact_call,
    learn,
    memory_world,
    set_org,
    until_logged,
    wait_executions,
)
from tests.memory_helpers import command, fact, said, visible
from tests.model_server import ModelServer, Reply, ToolCall

pytestmark = pytest.mark.usefixtures("learning_worker")


async def link(api: Api, bot: str, org: str) -> None:
    await api.admin(
        "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }", {"b": bot, "o": org}
    )


# Budget ------------------------------------------------------------------------------------


async def test_the_budget_counts_spending_of_every_organization_of_a_shared_bot(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Seed 000: "A limit on confirmed model cost in a day or a month, in micro-USD, over all
    organizations" (L6): what the guest organization's Chat spent binds the owner's Chats too."""
    w = await memory_world(api, ("ann",))
    guest = await api.organization("guest")
    await set_org(api, guest, model=TEST_MODEL)
    await link(api, w.bot, guest)
    gus, gus_token = await api.person(guest, "gus")
    await api.grant(w.bot, gus, "WRITE")
    # One call of the scripted model costs 20 micro-USD: the day's whole limit.
    budget = {"expected": 0, "budget": {"period": "day", "limitMicros": 20}}
    limited = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot", json=budget, headers=bearer(w.tokens["ann"])
    )
    assert limited.status_code == 200, limited.text
    guest_chat = await api.chat(gus_token, w.bot)
    guest_turn = await api.turn(gus_token, guest_chat, "hi")
    model_server.script("confide", Reply(text="Noted, carry on calmly."))
    assert await confide(api, gus_token, guest_turn["id"]) == "Noted, carry on calmly."
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (s:Spend {botId: $b}) RETURN collect(DISTINCT s.org) AS orgs", b=w.bot
    )
    assert records[0]["orgs"] == [guest]  # spent in the guest organization only
    # The owner's Chat: the budget is spent, so the fixed calm answer without a model call ...
    chat = await api.chat(w.tokens["ann"], w.bot)
    turn = await api.turn(w.tokens["ann"], chat, "I moved to Berlin")
    assert await confide(api, w.tokens["ann"], turn["id"]) == FIXED_CALM_ANSWER
    settings = await api.http.get(f"/v1/bots/{w.bot}/memory/bot", headers=bearer(w.tokens["ann"]))
    assert settings.json()["spent"] == {"micros": 20, "unknownCalls": 0}
    # ... and its learning waits for the next period (not lost, not run).
    model_server.default("learn", learn(fact_call("Ann lives in Berlin", "i-1")))
    await complete(api, w.tokens["ann"], turn["id"])
    [waiting] = await wait_executions(runtime, turn["id"], ("budget",))
    assert waiting["status"] == "budget"
    # (A summary the suite's worker makes meanwhile, of another test's long Chat, is not this Bot's.)
    assert [r.task for r in model_server.requests if r.task != "summary"] == ["confide"]


# Tags -------------------------------------------------------------------------------------


async def test_a_filter_by_tags_lists_only_entries_with_all_of_them(api: Api) -> None:
    """Seed 000: "Add tags with a list separated by commas to see only entries with all of them."
    (GET /memory?tags=a,b and GraphQL ``memory(tags:)``, listed and paged)."""
    w = await make_world(api, ("ann",))
    ann = w.tokens["ann"]
    made: dict[str, str] = {}
    for name, tags in (
        ("both", ["travel", "work"]),
        ("travel", ["travel"]),
        ("work", ["work"]),
        ("more", ["travel", "work", "berlin"]),
        ("none", []),
    ):
        response = await command(api, ann, w.bot, {"_tag": "Remember", "content": name, "tags": tags})
        assert response.status_code == 201, response.text
        made[name] = response.json()["entry"]["id"]
    want = {made["both"], made["more"]}
    assert set(await visible(api, ann, w.bot, tags="travel,work")) == want
    assert set(await visible(api, ann, w.bot, tags="work,travel")) == want
    assert set(await visible(api, ann, w.bot, tags="travel")) == {made["both"], made["travel"], made["more"]}
    assert list(await visible(api, ann, w.bot, tags="travel,work,berlin")) == [made["more"]]
    assert await visible(api, ann, w.bot, tags="travel,sailing") == {}
    data = await api.gql(
        "query($b: ID!, $t: [String!]) { memory(botId: $b, tags: $t) { entries { id } } }",
        {"b": w.bot, "t": ["travel", "work"]},
        ann,
    )
    assert {e["id"] for e in data["memory"]["entries"]} == want
    paged: list[str] = []
    after: str | None = None
    while True:
        data = await api.gql(
            "query($b: ID!, $t: [String!], $a: String) {"
            " memory(botId: $b, tags: $t, limit: 1, after: $a) { entries { id } next } }",
            {"b": w.bot, "t": ["travel", "work"], "a": after},
            ann,
        )
        paged += [e["id"] for e in data["memory"]["entries"]]
        after = data["memory"]["next"]
        if after is None:
            break
    assert sorted(paged) == sorted(want)


# Context pack -----------------------------------------------------------------------------


async def test_the_context_pack_holds_the_10_latest_messages_in_order(api: Api) -> None:
    """Seed 004: the context pack returns "up to 10 `last_messages`"; DESIGN §6: "last 10
    messages" — with 13 Items, exactly the 10 latest, oldest of them first."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    turn = await api.turn(ann, chat, "m1")
    kinds = ("BOT_MESSAGE", "PERSON_MESSAGE")
    ids = ["i-1", *await add_items(api, ann, turn["id"], *((kinds[n % 2], f"m{n}") for n in range(2, 14)))]
    assert ids == [f"i-{n}" for n in range(1, 14)]
    latest = [(f"i-{n}", f"m{n}") for n in range(4, 14)]
    pack = await api.http.get(f"/v1/chats/{chat}/context", headers=bearer(ann))
    assert pack.status_code == 200, pack.text
    assert [(m["id"], m["text"]) for m in pack.json()["lastMessages"]] == latest
    data = await api.gql(
        "query($c: ID!) { contextPack(chatId: $c) { lastMessages { id text } } }", {"c": chat}, ann
    )
    assert [(m["id"], m["text"]) for m in data["contextPack"]["lastMessages"]] == latest


# No default model -------------------------------------------------------------------------


async def test_a_new_organization_has_no_memory_bot_model_and_runs_none(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    """Seed 000: "The memory Bot uses botMemoryModel from the organization settings. It has no
    default. When it is null, the memory Bot gives the fixed calm answer, and it adds and learns
    nothing." (L5) — for an organization whose model was never set."""
    w = await make_world(api, ("ann",))  # never updateOrganization(botMemoryModel: …)
    query = "query($o: ID!) { organization(id: $o) { botMemory botMemoryModel } }"
    assert (await api.admin(query, {"o": w.org}))["organization"] == {
        "botMemory": True,
        "botMemoryModel": None,
    }
    # An update that does not name botMemoryModel leaves it unset: still no default.
    await api.admin("mutation($o: ID!) { updateOrganization(id: $o, botMemory: true) { id } }", {"o": w.org})
    assert (await api.admin(query, {"o": w.org}))["organization"]["botMemoryModel"] is None
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, ann, chat, "tea"))
    model_server.default("confide", Reply(text="A model answered."))
    model_server.default(
        "rewrite", Reply(tool_calls=[ToolCall("rewrite_input", {"text": "Tea?", "used_entry_ids": [tea]})])
    )
    model_server.default("learn", learn(fact_call("Ann wants a drink", "i-2")))
    model_server.default("summary", Reply(text="A model summarised."))
    turn = await api.turn(ann, chat, "Make me a drink " + "d" * 10_500)
    assert turn["enrichedInput"] == turn["input"]  # no rewrite although an entry is visible
    assert await confide(api, ann, turn["id"]) == FIXED_CALM_ANSWER
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (x:LearningExecution {turnId: $t}) RETURN count(x) AS n", t=turn["id"]
    )
    assert records[0]["n"] == 0  # confide records no learning without a model
    await complete(api, ann, turn["id"])
    long_turn = await api.turn(ann, chat, "e" * 10_500)
    await complete(api, ann, long_turn["id"])
    # The summary was due; the worker considered it and found no model.
    await until_logged(learning_worker.log_path, f"summary of {chat}: no_model")
    assert model_server.requests == []
    assert [e["content"] for e in (await visible(api, ann, w.bot)).values()] == ["Ann likes tea"]


# Enrichments without an original ----------------------------------------------------------


async def test_an_older_enrichment_without_an_original_reads_original_null(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Seed 000: "GET /v1/chats/:chatId/enrichments lists … the new text, the words of the
    person in original, and the entries that it used. Older records have no original." (D9.19:
    ``original`` is nullable.)"""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, ann, chat, "tea"))
    model_server.script(
        "rewrite",
        Reply(tool_calls=[ToolCall("rewrite_input", {"text": "Make me tea.", "used_entry_ids": [tea]})]),
    )
    turn = await api.turn(ann, chat, "Make me a drink")
    assert turn["enrichedInput"] == "Make me tea."
    # The shape of a record from before originals were kept.
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (n:Enrichment {chatId: $c}) REMOVE n.original RETURN count(n) AS n", c=chat
    )
    assert records[0]["n"] == 1
    listed = await api.http.get(f"/v1/chats/{chat}/enrichments", headers=bearer(ann))
    assert listed.status_code == 200, listed.text
    [record] = listed.json()["enrichments"]
    assert (record["turnId"], record["text"], record["original"], record["entryIds"]) == (
        turn["id"],
        "Make me tea.",
        None,
        [tea],
    )
    data = await api.gql(
        "query($c: ID!) { enrichments(chatId: $c) { text original entryIds } }", {"c": chat}, ann
    )
    assert data["enrichments"] == [{"text": "Make me tea.", "original": None, "entryIds": [tea]}]


# Learning is not a Chat -------------------------------------------------------------------


async def chats_turns_items(runtime: Runtime, bot: str, org: str) -> dict[str, Any]:
    """The Chats of the Bot or the organization, with the Turns and Items in them."""
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (ch:Chat) WHERE ch.botId = $b OR ch.organizationId = $o"
        " OR EXISTS { (ch)-[:WITH_BOT]->(:Bot {id: $b}) } OR EXISTS { (ch)-[:IN_ORG]->(:Organization {id: $o}) }"
        " WITH collect(ch.id) AS chats"
        " RETURN chats,"
        " COUNT { MATCH (t:Turn) WHERE t.chatId IN chats OR EXISTS { (t)-[:IN_CHAT]->(:Chat {botId: $b}) } }"
        " AS turns,"
        " COUNT { MATCH (i:Item) WHERE i.chatId IN chats } AS items",
        b=bot,
        o=org,
    )
    return dict(records[0])


async def test_learning_and_the_summary_make_no_chat_turn_or_item(
    api: Api, runtime: Runtime, model_server: ModelServer, learning_worker: WorkerProcess
) -> None:
    """Seed 000: the memory Bot's "learning work does not appear as a Chat" (D9.18: learning and
    model calls create no Chat, Turn or Item) — a learning step and a summary, counted."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    assert await chats_turns_items(runtime, w.bot, w.org) == {"chats": [chat], "turns": 0, "items": 0}
    turn = await api.turn(ann, chat, "I moved to Berlin. " + "a" * 10_500)
    model_server.script("learn", learn(fact_call("Ann lives in Berlin", "i-1")))
    model_server.default("summary", Reply(text="Ann moved to Berlin and wrote two long letters."))
    await confide(api, ann, turn["id"])
    await complete(api, ann, turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert (x["status"], x["learned"]) == ("done", 1)
    second = await api.turn(ann, chat, "b" * 10_500)
    await complete(api, ann, second["id"])
    await until_logged(learning_worker.log_path, f"summary of {chat}: saved")
    # Every kind of memory-Bot model call ran: the rewrite at the second Turn's start too.
    assert {r.task for r in model_server.requests} == {"confide", "learn", "rewrite", "summary"}
    # Only what the test made: one Chat, two Turns, their two Items.
    assert await chats_turns_items(runtime, w.bot, w.org) == {"chats": [chat], "turns": 2, "items": 2}
    page = await api.gql(
        "query($c: ID!) { chat(id: $c) { messageCount messages { id kind } } }", {"c": chat}, ann
    )
    assert page["chat"]["messageCount"] == 2
    assert [(m["id"], m["kind"]) for m in page["chat"]["messages"]] == [
        ("i-1", "PERSON_MESSAGE"),
        ("i-2", "PERSON_MESSAGE"),
    ]


# Legacy import ----------------------------------------------------------------------------


async def test_import_legacy_loads_hidden_entries_logged_as_promotion(
    api: Api, runtime: Runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 000: "Changes from older versions of OpenBot can also say promotion." DESIGN §5:
    import (CLI) "loads legacy entries without access proof: hidden (V9), logged with actor
    `promotion`" — ``botmemory import-legacy`` run in process against the test stack. Seed 000:
    "A private pinned entry made with Remember keeps its own access rule": an old one is its
    author's, as Remember makes it (it was hidden with the rest before), so its author sees it and
    the log's ``promotion`` row; one for the Bot's people is not private, and stays hidden."""
    w = await make_world(api, ("ann", "bob"))
    ann = w.tokens["ann"]
    person = w.people["ann"]
    remembered = [f"for:person:{person}", f"from:{person}", f"org:{w.org}", "locker"]
    lines = [
        {"content": "Ann used to live in Oslo", "tags": [f"for:person:{person}", f"org:{w.org}", "home"]},
        {"content": "Ann seems to like the north", "tags": [f"for:person:{person}"], "layer": "observation"},
        {"content": "A session note"},
        {"content": "Ann's locker code is 4711", "tags": remembered, "layer": "pinned"},
        {"content": "The team's door code", "tags": ["for:bot", f"org:{w.org}"], "layer": "pinned"},
        # Not from her (Remember writes from: its author): someone else's note about her stays hidden.
        {"content": "Ann is late a lot", "tags": [f"for:person:{person}", f"org:{w.org}"], "layer": "pinned"},
    ]
    legacy = tmp_path / "legacy.jsonl"
    legacy.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    announced = runtime.redis.pubsub()
    await announced.subscribe(f"botmemory:changes:{w.bot}")
    try:
        status = await asyncio.to_thread(cli.main, ["import-legacy", w.bot, str(legacy)])
        out = capsys.readouterr()
        assert status == 0, out.err
        # Announced to every API process like any change: ids only, no content (E4).
        data: bytes | None = None
        for _ in range(100):
            message = cast(
                dict[str, Any] | None,
                await announced.get_message(ignore_subscribe_messages=True, timeout=0.1),
            )
            if message is not None:
                data = message["data"]
                break
    finally:
        await announced.aclose()  # type: ignore[no-untyped-call]
    assert data is not None, "the import was not announced"
    sent = json.loads(data)
    assert out.out.startswith("imported 6 legacy entries")
    # One change of the memory, logged with the actor promotion and every imported id (C2).
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (c:Change {botId: $b}) RETURN c {.id, .version, .actor, .entryIds, .payload} AS c", b=w.bot
    )
    [change] = [dict(r["c"]) for r in records]
    assert (change["version"], change["actor"]) == (1, "promotion")
    cipher = await cipher_of(runtime, w.bot)
    assert json.loads(cipher.decrypt(Kind.CHANGE, change["id"], change["payload"])) == {
        "kind": "import",
        "count": 6,
    }
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN e {.id, .layer, .tags, .status, .legacy, .content, .vecModel} AS e",
        b=w.bot,
    )
    stored = {r["e"]["id"]: dict(r["e"]) for r in records}
    assert sorted(stored) == sorted(change["entryIds"])
    # Each line's new id is printed (rebuild-legacy names entries by them).
    printed = printed_ids(out.out)
    assert sorted(printed) == list(range(1, 7)) and sorted(printed.values()) == sorted(stored)
    assert [
        cipher.decrypt(Kind.ENTRY, printed[n], stored[printed[n]]["content"]) for n in sorted(printed)
    ] == [line["content"] for line in lines]
    assert (sent["botId"], sent["version"], sorted(sent["ids"])) == (w.bot, 1, sorted(stored))
    assert b"Oslo" not in data
    imported = sorted(
        (cipher.decrypt(Kind.ENTRY, e["id"], e["content"]), e["layer"], e["tags"], e["status"], e["legacy"])
        for e in stored.values()
    )
    assert imported == [
        ("A session note", "fact", [], "active", True),
        ("Ann is late a lot", "pinned", [f"for:person:{person}", f"org:{w.org}"], "active", True),
        ("Ann seems to like the north", "observation", [f"for:person:{person}"], "active", True),
        (
            "Ann used to live in Oslo",
            "fact",
            [f"for:person:{person}", f"org:{w.org}", "home"],
            "active",
            True,
        ),
        (
            "Ann's locker code is 4711",
            "pinned",
            [f"from:{person}", f"for:person:{person}", f"org:{w.org}", "locker"],
            "active",
            False,
        ),
        ("The team's door code", "pinned", ["for:bot", f"org:{w.org}"], "active", True),
    ]
    [kept] = [e["id"] for e in stored.values() if not e["legacy"]]
    # Embedded as it loads, as Remember's entries are (it waited for the backfill's next sweep).
    assert stored[kept]["vecModel"] is not None
    # The others are hidden (V9) from the people they name; the log's row shows Ann only her own
    # entry (V10), and Bob nothing: only the version shows that memory changed.
    memory = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))
    assert [(e["id"], e["content"], e["layer"]) for e in memory.json()["entries"]] == [
        (kept, "Ann's locker code is 4711", "pinned")
    ]
    log = await api.http.get(f"/v1/bots/{w.bot}/memory/log", headers=bearer(ann))
    assert [(c["actor"], c["ids"]) for c in log.json()["changes"]] == [("promotion", [kept])]
    # Searchable from the import's commit, by its keywords and by meaning.
    found = await api.http.get(f"/v1/bots/{w.bot}/memory/search?q=locker", headers=bearer(ann))
    assert [r["entry"]["id"] for r in found.json()["results"]] == [kept], found.text
    found = await api.http.get(f"/v1/bots/{w.bot}/memory/search?q=the+number+to+open+it", headers=bearer(ann))
    assert [r["entry"]["id"] for r in found.json()["results"]] == [kept], found.text
    bob = w.tokens["bob"]
    assert (await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(bob))).json() == {
        "entries": [],
        "version": 1,
    }
    log = await api.http.get(f"/v1/bots/{w.bot}/memory/log", headers=bearer(bob))
    assert (log.json()["changes"], log.json()["version"]) == ([], 1)


def printed_ids(out: str) -> dict[int, str]:
    """The entry id ``import-legacy`` printed for each line number (``  line 3 -> mem_…``)."""
    found: dict[int, str] = {}
    for said_line in out.splitlines():
        if said_line.startswith("  line "):
            number, _, entry_id = said_line.removeprefix("  line ").partition(" -> ")
            found[int(number)] = entry_id
    return found


async def test_one_legacy_line_is_one_entry_said_so(
    api: Api, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``imported 1 legacy entries`` read wrong; one is "entry"."""
    w = await make_world(api, ("ann",))
    legacy_file = tmp_path / "legacy.jsonl"
    legacy_file.write_text("\n" + json.dumps({"content": "An old note"}) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["import-legacy", w.bot, str(legacy_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("imported 1 legacy entry (hidden until rebuilt"), out
    assert list(printed_ids(out)) == [2]


async def test_legacy_entries_are_rebuilt_from_sources_whose_access_can_be_checked(
    api: Api, runtime: Runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 000: "The entry can become visible only after it is rebuilt from sources whose access
    can be checked." ``botmemory rebuild-legacy`` makes each named legacy entry a new entry resting
    on the Items (a fact) or entries (an observation) given, tagged from those sources as the
    memory Bot's are — never wider than they prove (V9) — and invalidates the legacy one, in one
    change logged as ``promotion`` (C2). A source that does not prove it refuses the whole file,
    and a legacy entry is rebuilt once."""
    w = await make_world(api, ("ann", "bob"))
    ann, person = w.tokens["ann"], w.people["ann"]
    chat = await api.chat(ann, w.bot)
    _, item = await said(api, ann, chat, "I moved to Bergen last spring.")
    lines = [
        {"content": "Ann lives in Bergen", "tags": ["for:bot", f"org:{w.org}", "home", "Old Topic"]},
        {"content": "Ann likes the coast", "tags": ["for:bot"], "layer": "observation"},
        {"content": "Bob's salary is 90k", "tags": [f"for:person:{w.people['bob']}"]},
    ]
    legacy_file = tmp_path / "legacy.jsonl"
    legacy_file.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["import-legacy", w.bot, str(legacy_file)]) == 0
    # The rebuild file is written from what the import printed: each line's new entry id.
    printed = printed_ids(capsys.readouterr().out)
    fact_id, note_id, bobs_id = printed[1], printed[2], printed[3]
    cipher = await cipher_of(runtime, w.bot)

    async def stored() -> dict[str, dict[str, Any]]:
        records, _, _ = await runtime.driver.execute_query(
            "MATCH (e:Entry {botId: $b}) RETURN e {.id, .content, .status, .legacy, .tags} AS e", b=w.bot
        )
        return {cipher.decrypt(Kind.ENTRY, r["e"]["id"], r["e"]["content"]): dict(r["e"]) for r in records}

    legacy = await stored()
    assert (fact_id, note_id, bobs_id) == tuple(
        legacy[content]["id"]
        for content in ("Ann lives in Bergen", "Ann likes the coast", "Bob's salary is 90k")
    )

    async def rebuild(*rows: dict[str, Any]) -> tuple[int, str, str]:
        path = tmp_path / "rebuild.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
        status = await asyncio.to_thread(cli.main, ["rebuild-legacy", w.bot, str(path)])
        out = capsys.readouterr()
        return status, out.out, out.err

    # A source that does not prove it (no such Item) refuses the file; nothing changes.
    version = (await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))).json()["version"]
    status, _, err = await rebuild(
        {"id": fact_id, "sources": [{"chat": chat, "item": item}]},
        {"id": note_id, "sources": [{"chat": chat, "item": "i-99"}]},
    )
    assert status == 1 and err.startswith("botmemory: CONFLICT"), err
    assert await stored() == legacy
    assert (await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(ann))).json()["version"] == version
    status, _, err = await rebuild({"id": fact_id, "sources": "i-1"})
    assert status == 2 and err.startswith("botmemory: BAD_INPUT: line 1:"), err
    # Never a wider audience for old memory (seed 000): Bob's entry rebuilt on Ann's words would be
    # Ann's to see.
    status, _, err = await rebuild({"id": bobs_id, "sources": [{"chat": chat, "item": item}]})
    assert status == 1 and err.startswith("botmemory: CONFLICT"), err
    assert f"for:person:{w.people['bob']}" in err and "90k" not in err
    assert await stored() == legacy

    status, out, err = await rebuild({"id": fact_id, "sources": [{"chat": chat, "item": item}]})
    assert status == 0, err
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) WHERE NOT e.id IN $old RETURN e {.id, .content, .tags, .legacy} AS e",
        b=w.bot,
        old=[fact_id, note_id, bobs_id],
    )
    [rebuilt] = [dict(r["e"]) for r in records]
    assert cipher.decrypt(Kind.ENTRY, rebuilt["id"], rebuilt["content"]) == "Ann lives in Bergen"
    assert f"{fact_id} -> {rebuilt['id']}" in out
    # Tagged from its Item, as the memory Bot's facts are: Ann's private chat makes it Ann's alone
    # (the legacy "for:bot" is not kept), with the legacy topics that are topics.
    assert set(rebuilt["tags"]) == {
        f"from:{person}",
        f"for:person:{person}",
        f"org:{w.org}",
        f"chat:{chat}",
        "home",
    }
    assert not rebuilt.get("legacy")
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) RETURN e.status AS status", id=fact_id
    )
    assert records[0]["status"] == "invalidated"
    mine = await visible(api, ann, w.bot)
    assert [(e["content"], e["sources"]) for e in mine.values()] == [
        ("Ann lives in Bergen", [{"chat": chat, "item": item}])
    ]
    assert await visible(api, w.tokens["bob"], w.bot) == {}
    log = await api.http.get(f"/v1/bots/{w.bot}/memory/log", headers=bearer(ann))
    assert log.json()["changes"][-1]["actor"] == "promotion"
    assert rebuilt["id"] in log.json()["changes"][-1]["ids"]
    # Rebuilt once; an observation rests on the rebuilt fact and sees no wider than it.
    status, _, err = await rebuild({"id": fact_id, "sources": [{"chat": chat, "item": item}]})
    assert status == 1 and err.startswith("botmemory: CONFLICT"), err
    status, out, err = await rebuild({"id": note_id, "sourceEntries": [rebuilt["id"]], "confidence": 0.7})
    assert status == 0, err
    assert out.startswith("rebuilt 1 legacy entry (version "), out
    mine = await visible(api, ann, w.bot)
    assert sorted(e["content"] for e in mine.values()) == ["Ann likes the coast", "Ann lives in Bergen"]
    assert await visible(api, w.tokens["bob"], w.bot) == {}
