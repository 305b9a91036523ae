"""Input additions at Turn start (N1–N5, D9.15, D9.16, D9.6): what the model is sent, what comes
back, what is saved and who reads it — asserted on the scripted model's recorded requests."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from services.changes import Invalidate
from services.runtime import Runtime
from tests.client import Api
from tests.conftest import WorkerProcess
from tests.learning_helpers import memory_world, set_org
from tests.memory_helpers import apply, command, fact, said, sealed
from tests.model_server import ModelServer, Recorded, Reply, ToolCall
from tests.waiting import until


@pytest.fixture(autouse=True)
def _fresh(model_server: ModelServer) -> None:
    model_server.reset()


def rewrite(text: str, *ids: str) -> Reply:
    return Reply(tool_calls=[ToolCall("rewrite_input", {"text": text, "used_entry_ids": list(ids)})])


def notes_sent(request: Recorded) -> dict[str, str]:
    body = json.loads(request.body["messages"][1]["content"])
    return {n["id"]: n["text"] for n in body["notes"]}


MEMORY_DATES = "query($b: ID!) { memory(botId: $b) { entries { id saidAt } } }"


async def enrichments(api: Api, token: str, chat: str) -> Any:
    return await api.http.get(f"/v1/chats/{chat}/enrichments", headers={"Authorization": f"Bearer {token}"})


async def test_private_chat_rewrite_with_what_the_person_may_see(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob"))
    chat = await api.chat(w.tokens["ann"], w.bot)
    trains = await fact(
        runtime, w.bot, "Ann prefers trains to planes", await said(api, w.tokens["ann"], chat, "trains")
    )
    bobs = await api.chat(w.tokens["bob"], w.bot)
    await fact(runtime, w.bot, "Bob is afraid of flying", await said(api, w.tokens["bob"], bobs, "flying"))
    model_server.script("rewrite", rewrite("Book me a trip to Paris (I prefer trains to planes).", trains))
    turn = await api.turn(w.tokens["ann"], chat, "Book me a trip to Paris.")
    assert turn["input"] == "Book me a trip to Paris."
    assert turn["enrichedInput"] == "Book me a trip to Paris (I prefer trains to planes)."
    [request] = model_server.requests_for("rewrite")
    assert notes_sent(request) == {trains: "Ann prefers trains to planes"}
    assert "afraid of flying" not in json.dumps(request.body)
    # The history keeps the person's words (N2); enrichedInput never shows up there (D9.16).
    data = await api.gql(
        "query($c: ID!) { chat(id: $c) { messages { text } } }", {"c": chat}, w.tokens["ann"]
    )
    assert data["chat"]["messages"][-1]["text"] == "Book me a trip to Paris."
    assert "prefer trains" not in json.dumps(data)
    # The owner's enrichments route (encrypted record: new text, original, entries used).
    [record] = (await enrichments(api, w.tokens["ann"], chat)).json()["enrichments"]
    assert record["turnId"] == turn["id"]
    assert record["text"] == "Book me a trip to Paris (I prefer trains to planes)."
    assert record["original"] == "Book me a trip to Paris."
    assert record["entryIds"] == [trains]
    assert (await enrichments(api, w.tokens["bob"], chat)).status_code == 404
    rows, _, _ = await runtime.driver.execute_query(
        "MATCH (n:Enrichment {chatId: $c}) RETURN n.text AS text, n.original AS original", c=chat
    )
    assert b"Paris" not in sealed(rows[0]["text"]) and b"Paris" not in sealed(rows[0]["original"])
    # Forget revokes the source: the record shows only the original words (D9.6).
    assert (await command(api, w.tokens["ann"], w.bot, {"_tag": "Forget", "id": trains})).status_code == 200
    [record] = (await enrichments(api, w.tokens["ann"], chat)).json()["enrichments"]
    assert (record["text"], record["original"], record["entryIds"]) == (None, "Book me a trip to Paris.", [])


async def test_group_chat_sends_only_what_every_member_may_see(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob", "cat"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    secret = await fact(
        runtime, w.bot, "Ann is job hunting", await said(api, w.tokens["ann"], private, "job")
    )
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    team = await fact(
        runtime, w.bot, "The team ships on Fridays", await said(api, w.tokens["bob"], group, "fridays")
    )
    forgotten = await fact(
        runtime, w.bot, "The team uses tabs", await said(api, w.tokens["ann"], group, "tabs")
    )
    # Bob forgets his part of a group entry: it stops being for Bob, so a group with Bob gets nothing of it.
    assert (
        await command(api, w.tokens["bob"], w.bot, {"_tag": "Forget", "id": forgotten})
    ).status_code == 200
    model_server.reset()  # setting up spoke in the chats, which asked for rewrites too
    model_server.script("rewrite", rewrite("When do we ship? (we ship on Fridays)", team))
    turn = await api.turn(w.tokens["ann"], group, "When do we ship?")
    [request] = model_server.requests_for("rewrite")
    assert notes_sent(request) == {team: "The team ships on Fridays"}
    body = json.dumps(request.body)
    assert secret not in body and "job hunting" not in body and "tabs" not in body
    assert turn["enrichedInput"] == "When do we ship? (we ship on Fridays)"
    # In Ann's private chat everything Ann may see is sent: hers, and her channel's (V2).
    model_server.reset()
    await api.turn(w.tokens["ann"], private, "What do I do?")
    [request] = model_server.requests_for("rewrite")
    assert set(notes_sent(request)) == {secret, forgotten, team}


async def test_a_rewrite_citing_an_entry_that_was_not_sent_is_refused(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann", "bob"), channel=("ann", "bob"))
    private = await api.chat(w.tokens["ann"], w.bot)
    secret = await fact(
        runtime, w.bot, "Ann is job hunting", await said(api, w.tokens["ann"], private, "job")
    )
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    team = await fact(
        runtime, w.bot, "The team ships on Fridays", await said(api, w.tokens["bob"], group, "fridays")
    )
    for reply in (
        rewrite("When do we ship? Ann is job hunting.", team, secret),
        rewrite("When do we ship?", "mem_unknown"),
        rewrite("When do we ship? My memory says Fridays.", team),  # memory words (D9.16)
        Reply(tool_calls=[ToolCall("rewrite_input", '{"text": "broken')]),
        Reply(text="When do we ship? Fridays."),  # no tool call = keep the input
    ):
        model_server.script("rewrite", reply)
        turn = await api.turn(w.tokens["ann"], group, "When do we ship?")
        assert turn["enrichedInput"] == "When do we ship?"
    assert (await enrichments(api, w.tokens["ann"], group)).json()["enrichments"] == []


@pytest.mark.parametrize("case", ["notice", "nothing_visible", "review", "off", "no_model", "budget"])
async def test_the_input_stays_as_it_is(
    api: Api, runtime: Runtime, model_server: ModelServer, case: str
) -> None:
    w = await memory_world(api, ("ann",), model=None if case == "no_model" else "test-model")
    chat = await api.chat(w.tokens["ann"], w.bot, review=case == "review")
    cited: list[str] = []
    if case != "nothing_visible":
        other = await api.chat(w.tokens["ann"], w.bot)
        cited.append(
            await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], other, "tea"))
        )
    if case == "off":
        await set_org(api, w.org, bot_memory=False)
    if case == "budget":
        await api.http.patch(
            f"/v1/bots/{w.bot}/memory/bot",
            json={"expected": 0, "budget": {"period": "day", "limitMicros": 0}},
            headers={"Authorization": f"Bearer {w.tokens['ann']}"},
        )
    # A rewrite that is taken if the model is asked: it cites the one entry it would be sent, so
    # the input as it is shows that nobody asked. Where nothing is visible no rewrite can be
    # taken (it must cite an entry it was sent): there the record of requests alone shows it.
    model_server.default("rewrite", rewrite("Make me a drink (I like tea).", *cited))
    if case == "notice":
        platform = await api.platform_token(w.org)
        turn = await api.turn(platform, chat, "Make me a drink", notice=True)
    else:
        turn = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert turn["enrichedInput"] == "Make me a drink"
    assert model_server.requests_for("rewrite") == []


async def test_no_answer_within_the_deadline_keeps_the_input(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], chat, "tea"))
    model_server.default(
        "rewrite",
        Reply(tool_calls=[ToolCall("rewrite_input", {"text": "x", "used_entry_ids": [tea]})], delay=10),
    )
    turn = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    # Every attempt is answered "x" only after 10 s: the input as it is shows that the deadline
    # (3 s in the suite, D9.11) ended the wait, not an answer.
    assert turn["enrichedInput"] == "Make me a drink"
    assert model_server.requests_for("rewrite")


async def test_a_saved_rewrite_is_reused_while_its_references_hold(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], chat, "tea"))
    model_server.default("rewrite", rewrite("Make me a drink (tea, as I like it).", tea))
    first = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    second = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert first["enrichedInput"] == second["enrichedInput"] == "Make me a drink (tea, as I like it)."
    assert len(model_server.requests_for("rewrite")) == 1
    assert len((await enrichments(api, w.tokens["ann"], chat)).json()["enrichments"]) == 2
    # New entries never invalidate it (N4); an invalidated source does.
    await fact(runtime, w.bot, "Ann dislikes coffee", await said(api, w.tokens["ann"], chat, "coffee"))
    model_server.reset()
    model_server.default("rewrite", rewrite("Make me a drink (tea, as I like it).", tea))
    again = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert again["enrichedInput"] == "Make me a drink (tea, as I like it)."
    assert model_server.requests_for("rewrite") == []
    await apply(runtime, w.bot, Invalidate(tea))
    third = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert third["enrichedInput"] == "Make me a drink"  # the model cited tea, which is no longer sent
    assert len(model_server.requests_for("rewrite")) == 1


async def test_a_saved_rewrite_is_reused_only_while_every_entry_it_was_sent_holds(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.15, D9.6: a rewrite may draw on any entry it was sent, whatever it says it used (the seed:
    declared sources prove nothing of what shaped an answer). Reuse and the owner's view checked
    only the entries it declared: with one it drew on invalidated since, an equal input got the
    saved text back with that entry's words, and the owner still read them."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, ann, chat, "tea"))
    doctor = await fact(runtime, w.bot, "Ann's doctor says no sugar", await said(api, ann, chat, "sugar"))
    asked = len(model_server.requests_for("rewrite"))  # the Turns that said the facts' words
    model_server.script("rewrite", rewrite("Make me a drink (tea, no sugar: doctor's orders).", tea))
    first = await api.turn(ann, chat, "Make me a drink")
    assert first["enrichedInput"] == "Make me a drink (tea, no sugar: doctor's orders)."
    assert set(notes_sent(model_server.requests_for("rewrite")[-1])) == {tea, doctor}
    await apply(runtime, w.bot, Invalidate(doctor))
    model_server.script("rewrite", rewrite("Make me a drink (tea, as I like it).", tea))
    again = await api.turn(ann, chat, "Make me a drink")
    assert again["enrichedInput"] == "Make me a drink (tea, as I like it)."  # before: the saved text
    assert len(model_server.requests_for("rewrite")) == asked + 2
    listed = (await enrichments(api, ann, chat)).json()["enrichments"][-2:]
    assert [e.get("text") for e in listed] == [None, "Make me a drink (tea, as I like it)."]
    # A rewrite saved before the entries it was sent were recorded is not reused: what it drew on
    # beyond those it declared is unknown.
    await runtime.driver.execute_query("MATCH (n:Enrichment {chatId: $c}) REMOVE n.sentEntryIds", c=chat)
    model_server.script("rewrite", rewrite("Make me a drink (tea, please).", tea))
    older = await api.turn(ann, chat, "Make me a drink")
    assert older["enrichedInput"] == "Make me a drink (tea, please)."
    assert len(model_server.requests_for("rewrite")) == asked + 3


async def test_a_spent_budget_keeps_the_input_even_when_a_rewrite_is_saved(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Seed 000: "When the budget is spent … the input stays as it is" — a saved rewrite (no model
    call) is not returned either; it was, before the budget was looked at."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], chat, "tea"))
    model_server.default("rewrite", rewrite("Make me a drink (tea, as I like it).", tea))
    first = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert first["enrichedInput"] == "Make me a drink (tea, as I like it)."
    spent = await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "budget": {"period": "day", "limitMicros": 0}},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert spent.status_code == 200, spent.text
    again = await api.turn(w.tokens["ann"], chat, "Make me a drink")
    assert again["enrichedInput"] == "Make me a drink"
    assert len(model_server.requests_for("rewrite")) == 1


async def test_instructions_reach_the_rewrite_request(
    api: Api, runtime: Runtime, model_server: ModelServer, worker_process: WorkerProcess
) -> None:
    w = await memory_world(api, ("ann",))
    await api.http.patch(
        f"/v1/bots/{w.bot}/memory/bot",
        json={"expected": 0, "instructions": "Use British spelling. Marker-5521."},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    chat = await api.chat(w.tokens["ann"], w.bot)
    await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], chat, "tea"))
    await api.turn(w.tokens["ann"], chat, "Make me a drink")
    [request] = model_server.requests_for("rewrite")
    assert "Marker-5521" in request.body["messages"][0]["content"]


async def test_each_note_carries_the_day_it_was_said(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.31: the rewrite's notes each carry the UTC day their newest source was said, so "when
    did …?" can be answered from them; a history imported with its times dates them by those."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    june_16 = 1_686_923_760_000  # 16 June 2023, 13:56 UTC
    hike = await fact(
        runtime,
        w.bot,
        "Ann hiked up Ben Nevis",
        await said(api, w.tokens["ann"], chat, "I hiked Ben Nevis today", said_at=june_16),
    )
    today = await fact(
        runtime, w.bot, "Ann hikes every weekend", await said(api, w.tokens["ann"], chat, "hiking")
    )
    await api.turn(w.tokens["ann"], chat, "When did I hike Ben Nevis?")
    request = model_server.requests_for("rewrite")[-1]
    notes = {n["id"]: n for n in json.loads(request.body["messages"][1]["content"])["notes"]}
    assert notes[hike]["said"] == "2023-06-16"
    created = (await api.gql(MEMORY_DATES, {"b": w.bot}, w.tokens["ann"]))["memory"]["entries"]
    [now] = [e["saidAt"] for e in created if e["id"] == today]
    assert notes[today]["said"] == datetime.fromtimestamp(now / 1000, UTC).date().isoformat()


async def test_the_rewrite_reads_days_as_the_person_lives_them(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.32: a person's input is read in the time zone it was said in (their own, or the one
    the platform gives startTurn): their "yesterday" is their local yesterday, so two inputs said
    on one local day that falls on two UTC days are the same input (the saved rewrite is reused,
    N2), and two said on two local days of one UTC day are not; words said in another zone are
    another input; each note carries its day as the person lives it."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    await api.gql('mutation { setTimeZone(timeZone: "America/Los_Angeles") { id } }', None, ann)
    chat = await api.chat(ann, w.bot)
    evening = 1_686_970_800_000  # 17 June 2023, 03:00 UTC: 16 June, 20:00 in Los Angeles (UTC-7)
    paella = await fact(
        runtime, w.bot, "Ann cooked paella", await said(api, ann, chat, "I cooked paella", said_at=evening)
    )
    model_server.default("rewrite", rewrite("What did I do yesterday? (paella)", paella))
    hour, asked = 3_600_000, "What did I do yesterday?"

    def notes() -> dict[str, Any]:
        request = model_server.requests_for("rewrite")[-1]
        return {n["id"]: n for n in json.loads(request.body["messages"][1]["content"])["notes"]}

    # 17 June 09:00 and 18 June 05:00 UTC: both on 17 June in Los Angeles (02:00 and 22:00).
    for said_at in (evening + 6 * hour, evening + 26 * hour):
        await api.turn(ann, chat, asked, said_at=said_at)
    assert len(model_server.requests_for("rewrite")) == 1
    assert notes()[paella]["said"] == "2023-06-16"  # her day; in UTC it was the 17th
    # 18 June 09:00 UTC, the UTC day of the last: 18 June, 02:00 in Los Angeles, another yesterday.
    await api.turn(ann, chat, asked, said_at=evening + 30 * hour)
    assert len(model_server.requests_for("rewrite")) == 2
    # 18 June 05:00 UTC said in Tokyo (14:00 there): another zone, another input.
    await api.turn(ann, chat, asked, said_at=evening + 26 * hour, time_zone="Asia/Tokyo")
    assert len(model_server.requests_for("rewrite")) == 3
    assert notes()[paella]["said"] == "2023-06-17"  # in Tokyo it was the 17th, 12:00


async def test_yesterday_is_counted_from_when_the_input_was_said(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """D9.31, N2: "yesterday" is the day before the Turn's input was said (a history imported
    gives that time), so the same words said on another day are another input — never the
    rewrite saved for the first; words naming a fixed day still reuse theirs, and so do words
    said in UTC by any of its names."""
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    tea = await fact(runtime, w.bot, "Ann likes tea", await said(api, w.tokens["ann"], chat, "tea"))
    model_server.default("rewrite", rewrite("What did I do yesterday? (tea)", tea))
    june_16, day = 1_686_923_760_000, 86_400_000
    for said_at in (june_16, june_16 + 60_000, june_16 + day):
        await api.turn(w.tokens["ann"], chat, "What did I do yesterday?", said_at=said_at)
    assert len(model_server.requests_for("rewrite")) == 2  # the same day reused, the next asked
    for said_at in (june_16, june_16 + day):
        await api.turn(w.tokens["ann"], chat, "What did I do on 3 March 2023?", said_at=said_at)
    assert len(model_server.requests_for("rewrite")) == 3
    # Said "in UTC" (any of its names) is said in no zone: the same input (D9.32), reused.
    for zone in ("UTC", "Etc/Zulu"):
        await api.turn(w.tokens["ann"], chat, "What did I do yesterday?", said_at=june_16, time_zone=zone)
    assert len(model_server.requests_for("rewrite")) == 3


@pytest.mark.parametrize("taken_back", [None, "cited", "sent"])
async def test_a_rewrite_whose_sources_are_taken_back_while_the_model_writes_it_is_not_given(
    api: Api, runtime: Runtime, model_server: ModelServer, taken_back: str | None
) -> None:
    """D9.15: the entries a rewrite was sent are checked again when the model's answer comes back,
    every one of them (the text may draw on any, cited or not). Ann forgets one of her facts while
    the model writes: the rewrite is not given, the input stays as it was said and no enrichment
    is recorded. With both facts still there the same rewrite is given."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    source = await api.chat(ann, w.bot)
    evidence = [await said(api, ann, source, word) for word in ("trains", "window")]
    trains = await fact(runtime, w.bot, "Ann prefers trains", evidence[0])
    window = await fact(runtime, w.bot, "Ann likes a window seat", evidence[1])
    chat = await api.chat(ann, w.bot)
    model_server.reset()
    written = "Book me a trip to Paris (by train)."
    gate = threading.Event()
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[ToolCall("rewrite_input", {"text": written, "used_entry_ids": [trains]})], hold=gate
        ),
    )
    turning = asyncio.create_task(api.turn(ann, chat, "Book me a trip to Paris."))
    try:

        async def asked() -> bool:
            return bool(model_server.requests_for("rewrite"))

        await until(asked, "the rewrite was never asked")
        assert set(notes_sent(model_server.requests_for("rewrite")[0])) == {trains, window}
        if taken_back is not None:
            forgotten = {"cited": trains, "sent": window}[taken_back]
            done = await command(api, ann, w.bot, {"_tag": "Forget", "id": forgotten})
            assert done.status_code == 200, done.text
    finally:
        gate.set()
    turn = await turning
    kept = taken_back is not None
    assert turn["enrichedInput"] == ("Book me a trip to Paris." if kept else written)
    recorded = (await enrichments(api, ann, chat)).json()["enrichments"]
    assert [r["entryIds"] for r in recorded] == ([] if kept else [[trains]])
