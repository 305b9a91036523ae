"""Deleting a Chat's history removes its people's words everywhere they are kept (V13, D9.23):
Items, the summary, input rewrites and their originals, the rewrite cache's digests, confessions
and their answers, and the saved requests and results of the model calls made for the Chat. A scan
of every property of every node of the Bot and the Chat — decrypting every ciphertext it can with
the Bot's key — finds the chat's words before, and nowhere after (what was learned stays)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
import threading
import time
from typing import Any, cast

import pytest
from pydantic import SecretStr

from graph import conversation as conversation_q
from graph.driver import read
from learning import enrichment, summary
from learning.gateway import Gateway
from services.crypto import Cipher, DecryptionError, Kind
from services.domain import Turn
from services.memory import cipher_of
from services.runtime import Runtime
from tests.client import Api, World, bearer
from tests.learning_helpers import (
    complete,
    confide,
    fact_call,
    learn,
    long_turn,
    memory_world,
    until_a_transaction_waits_for_a_lock,
    wait_executions,
    wait_summary,
)
from tests.memory_helpers import fact, said, visible
from tests.model_server import ModelServer, Reply, ToolCall
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("learning_worker")


def _opened(cipher: Cipher, value: str, ids: set[str]) -> list[str]:
    """The plaintexts of ``value`` if it is a ciphertext of this Bot under any kind and record id."""
    try:
        blob = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return []
    if blob[:1] != b"\x01" or len(blob) < 29:
        return []
    for kind in Kind:
        for record in ids:
            try:
                return [cipher.decrypt_bytes(kind, record, value).decode(errors="replace")]
            except DecryptionError:
                continue
    return []


async def _where(runtime: Runtime, cipher: Cipher, bot: str, chat: str, word: str) -> tuple[list[str], int]:
    """Where ``word`` is (label.property), in the clear or in a ciphertext opened with the Bot's
    key, over every node of the Bot and the Chat; and how many ciphertexts were opened."""
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (n) WHERE n.botId = $b OR n.chatId = $c RETURN labels(n)[0] AS label, n {.*} AS props",
        b=bot,
        c=chat,
    )
    found: list[str] = []
    opened = 0
    for record in records:
        props: dict[str, Any] = dict(record["props"])
        ids = {str(props[k]) for k in ("id", "uid", "chatId") if props.get(k) is not None}
        for key, value in props.items():
            for v in cast(list[Any], value) if isinstance(value, list) else [value]:
                if not isinstance(v, str):
                    continue
                texts = _opened(cipher, v, ids)
                opened += len(texts)
                if any(word in t for t in [v, *texts]):
                    found.append(f"{record['label']}.{key}")
    return sorted(set(found)), opened


async def test_deleting_a_chats_history_removes_its_words_everywhere(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    w = await memory_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    canary = "zq" + secrets.token_hex(5)
    turn = await api.turn(w.tokens["ann"], chat, f"I keep my bike at {canary} street")
    model_server.script("learn", learn(fact_call("Ann keeps a bike in town", "i-1")))
    await confide(api, w.tokens["ann"], turn["id"], f"the person said {canary} street")
    await complete(api, w.tokens["ann"], turn["id"])
    [x] = await wait_executions(runtime, turn["id"])
    assert x["status"] == "done"
    [bike] = list(await visible(api, w.tokens["ann"], w.bot))
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[ToolCall("rewrite_input", {"text": f"Bike at {canary}?", "used_entry_ids": [bike]})]
        ),
    )
    again = await api.turn(w.tokens["ann"], chat, f"where is my bike near {canary}")
    assert again["enrichedInput"] == f"Bike at {canary}?"
    cipher = await cipher_of(runtime, w.bot)

    before, _ = await _where(runtime, cipher, w.bot, chat, canary)
    # The scan sees the words where they are kept (a positive control for each place).
    for place in (
        "Item.text",
        "Enrichment.text",
        "Enrichment.original",
        "Confession.text",
        "ModelCall.request",
    ):
        assert place in before, (place, before)

    deleted = await api.gql(
        "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, w.tokens["ann"]
    )
    assert deleted["deleteChatHistory"]["items"] >= 2
    after, opened = await _where(runtime, cipher, w.bot, chat, canary)
    assert after == []
    assert opened > 0  # the learned entry and the change log still open: they stay (V13)
    # The owner still lists the Chat's confessions: their text is gone (null), not an error.
    listed = await api.http.get(
        f"/v1/chats/{chat}/confessions", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert listed.status_code == 200, listed.text
    assert [c["text"] for c in listed.json()["confessions"]] == [None]
    assert [e["content"] for e in (await visible(api, w.tokens["ann"], w.bot)).values()] == [
        "Ann keeps a bike in town"
    ]
    # The rewrite cache no longer finds the input: the same words are rewritten anew.
    model_server.script(
        "rewrite",
        Reply(
            tool_calls=[ToolCall("rewrite_input", {"text": "Where is the bike?", "used_entry_ids": [bike]})]
        ),
    )
    anew = await api.turn(w.tokens["ann"], chat, f"where is my bike near {canary}")
    assert anew["enrichedInput"] == "Where is the bike?"


async def trains_world(api: Api, runtime: Runtime) -> tuple[World, str, str, str]:
    """Ann, a fact of hers from another chat ("Ann likes trains": the rewrite has memory to use),
    a fresh chat of hers and a canary word."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    other = await api.chat(ann, w.bot)
    trains = await fact(runtime, w.bot, "Ann likes trains", await said(api, ann, other, "trains"))
    return w, trains, await api.chat(ann, w.bot), "zq" + secrets.token_hex(5)


async def test_work_that_began_before_a_deletion_keeps_none_of_the_words(
    api: Api, patient_api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """A rewrite and a confide answer the model is still giving when the owner deletes the Chat's
    history are saved after the deletion: the rewrite, the answer and their model calls' requests
    and results kept the words the deletion had just removed (D9.23). The deletion moves the
    Chat's history on, and what began before it saves none of them. The model answers each once
    the deletion has committed (an API that waits for it as long as that takes)."""
    w, trains, chat, canary = await trains_world(api, runtime)
    ann = w.tokens["ann"]
    cipher = await cipher_of(runtime, w.bot)
    delete = "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }"

    async def asked(task: str) -> bool | None:
        return bool(model_server.requests_for(task)) or None

    rewritten = ToolCall("rewrite_input", {"text": f"Trains to {canary}?", "used_entry_ids": [trains]})
    deleted = threading.Event()
    model_server.script("rewrite", Reply(tool_calls=[rewritten], hold=deleted))
    starting = asyncio.create_task(patient_api.turn(ann, chat, f"book me a trip to {canary}"))
    try:
        await until(lambda: asked("rewrite"), "the rewrite was never asked")
        await api.gql(delete, {"c": chat}, ann)
    finally:
        deleted.set()
    turn = await starting
    assert turn["enrichedInput"] == f"Trains to {canary}?"  # asked before: the Bot still gets it

    deleted_again = threading.Event()
    model_server.script("confide", Reply(text=f"You will find {canary} again.", hold=deleted_again))
    confiding = asyncio.create_task(confide(patient_api, ann, turn["id"], f"I could not book {canary}"))
    try:
        await until(lambda: asked("confide"), "the confide answer was never asked")
        await api.gql(delete, {"c": chat}, ann)
    finally:
        deleted_again.set()
    assert await confiding == f"You will find {canary} again."

    found, _ = await _where(runtime, cipher, w.bot, chat, canary)
    assert found == []


async def test_a_rewrite_that_reads_its_route_after_the_deletion_keeps_none_of_the_words(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """The rewrite read the Chat's history epoch after the Turn's words were saved: a deletion that
    committed in between was already counted in it, so the rewrite, its saved request and the
    input it kept (the owner's enrichments show it) held the deleted words (D9.23). A Turn keeps
    the epoch it began in; a rewrite that finds the history deleted since keeps the input as it
    is and saves nothing. Here the rewrite runs in this process after the deletion, as the
    interleaving has it."""
    w, trains, chat, canary = await trains_world(api, runtime)
    ann = w.tokens["ann"]
    words = f"book me a trip to {canary}"
    started = await api.turn(ann, chat, words)
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (t:Turn {id: $t}) RETURN t {.*} AS turn", t=started["id"]
    )
    turn = Turn.of(records[0]["turn"], input=words, enriched_input=words)
    rewritten = ToolCall("rewrite_input", {"text": f"Trains to {canary}?", "used_entry_ids": [trains]})
    model_server.script("rewrite", Reply(tool_calls=[rewritten]))
    asks = len(model_server.requests_for("rewrite"))
    gateway = Gateway(
        runtime.settings.model_copy(
            update={"openai_base_url": model_server.base_url, "openai_api_key": SecretStr("sk-test")}
        )
    )
    try:
        kept, used = await enrichment.rewrite(runtime, gateway, turn, time.monotonic() + 10, gateway.embedder)
    finally:
        await gateway.close()
    assert (kept, used) == (words, ())
    assert len(model_server.requests_for("rewrite")) == asks  # nothing made of the words at all
    found, _ = await _where(runtime, await cipher_of(runtime, w.bot), w.bot, chat, canary)
    assert found == []


async def test_a_confide_during_a_deletion_keeps_its_answer_with_its_words(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """confide read the Chat's history epoch without the Chat's lock: with a deletion committing
    meanwhile, the confession was written against the old epoch and its answer, saved after,
    against the new one: the answer was dropped and the text stayed (D9.23 says the words go, or
    both stay as words said after it). The epoch is read under the Chat's lock now: a confide
    that waited for the deletion is a confession after it, answer and all. The deletion is held
    open here (its lock and its new epoch) until confide waits for it."""
    w, _, chat, canary = await trains_world(api, runtime)
    ann = w.tokens["ann"]
    turn = await api.turn(ann, chat, "book me a train")
    model_server.script("confide", Reply(text=f"Calmly: {canary} is fine."))
    async with runtime.driver.session() as session:
        deleting = await session.begin_transaction()
        await deleting.run(
            "MATCH (ch:Chat {id: $c}) CALL apoc.lock.nodes([ch]) "
            "SET ch.historyEpoch = coalesce(ch.historyEpoch, 0) + 1",
            c=chat,
        )
        answering = asyncio.create_task(confide(api, ann, turn["id"], f"I booked {canary}"))
        await until_a_transaction_waits_for_a_lock(
            runtime, running="apoc.lock.nodes([ch])", given=("chatId", chat)
        )
        await deleting.commit()
    assert await answering == f"Calmly: {canary} is fine."
    confessions = await api.http.get(f"/v1/chats/{chat}/confessions", headers=bearer(ann))
    assert [(c["text"], c["answer"]) for c in confessions.json()["confessions"]] == [
        (f"I booked {canary}", f"Calmly: {canary} is fine.")
    ]


async def test_a_deleted_history_counts_for_nothing_towards_a_summary(
    api: Api, runtime: Runtime, model_server: ModelServer
) -> None:
    """Deleted Items keep their length (V13 keeps ids and rules), and the deletion removes the
    summary: the deleted characters counted towards the next one, so a greeting after deleting a
    long history was summarised at once — or, past 500 deleted Items, a summary of nothing. Only
    Items that still have their text count, and only they are sent."""
    w = await memory_world(api, ("ann",))
    ann = w.tokens["ann"]
    chat = await api.chat(ann, w.bot)
    model_server.default("summary", Reply(text="Ann sent two long letters."))
    await long_turn(api, ann, chat, "A")
    await long_turn(api, ann, chat, "B")
    assert await wait_summary(api, ann, chat) == "Ann sent two long letters."
    await long_turn(api, ann, chat, "C")  # after the summary: not yet due again
    await api.gql("mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": chat}, ann)
    turn = await api.turn(ann, chat, "hi")
    await complete(api, ann, turn["id"])
    after, chars = await read(runtime.driver, lambda tx: conversation_q.unsummarized(tx, chat_id=chat))
    assert (after, chars) == (0, len("hi"))
    gateway = Gateway(runtime.settings)
    try:
        assert await summary.summarize(runtime, gateway, chat) == "not_due"
    finally:
        await gateway.close()
    assert len(model_server.requests_for("summary")) == 1  # the one before the deletion
