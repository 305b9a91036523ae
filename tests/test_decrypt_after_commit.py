"""Decrypt after commit (design invariant 8, C1): no read decrypts while its transaction still
holds the Bot's Memory lock, so writers never wait on AES-GCM and nothing decrypted ever meets an
open read of the graph.

Each decryption is watched by a probe that takes the Memory lock exclusively, as a writer's first
statement does (``graph.memory.BUMP_VERSION``), from a connection of its own, in a transaction that
is rolled back: granted at once unless a transaction holding the lock is still open — then the
probe waits until its own transaction times out. The probe blocks the caller meanwhile (the event
loop or the decrypting thread), so a read that decrypted before its commit cannot commit until the
probe has given up."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from typing import Any, Final, LiteralString

import neo4j
import pytest
from arq.connections import ArqRedis

from graph.memory import SHARED_LOCK
from learning.embedders import LocalMiniLM
from services import changefeed, chats, conversation, memory, retrieval, search, sourcegraph
from services.changes import AddFact, AddObservation, ItemRef, Remember
from services.crypto import Cipher
from services.domain import Principal
from services.runtime import Runtime
from services.settings import Settings
from services.writepath import apply_changes
from tests.client import Api, make_world
from tests.memory_helpers import said

#: How long the probe waits for the lock before it counts it held: far past a granted lock's
#: wait on a busy machine, and paid only when the rule is broken.
PROBE_SECONDS: Final = 5.0
LOCK: Final[LiteralString] = "MATCH (m:Memory {id: $botId}) CALL apoc.lock.nodes([m]) RETURN count(m) AS n"
#: Neo4j's answers to a transaction that waited for a lock past its timeout.
TIMED_OUT: Final = (
    "Neo.ClientError.Transaction.LockClientStopped",
    "Neo.ClientError.Transaction.TransactionTimedOutClientConfiguration",
)

DECRYPTING: Final = ("decrypt", "decrypt_all", "decrypt_bytes", "decrypt_bytes_all")


class LockProbe:
    """Whether a Bot's Memory lock is held by an open transaction right now."""

    def __init__(self, settings: Settings, bot: str) -> None:
        password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
        self._driver = neo4j.GraphDatabase.driver(settings.neo4j_uri, auth=(settings.neo4j_user, password))
        self._bot = bot

    def held(self) -> bool:
        with self._driver.session() as session:
            tx = session.begin_transaction(timeout=PROBE_SECONDS)
            try:
                assert tx.run(LOCK, botId=self._bot).single(strict=True)["n"] == 1
                return False
            except neo4j.exceptions.Neo4jError as exc:
                if exc.code not in TIMED_OUT:
                    raise
                return True
            finally:
                tx.close()

    def close(self) -> None:
        self._driver.close()


@contextmanager
def watched(probe: LockProbe, monkeypatch: pytest.MonkeyPatch) -> Generator[list[tuple[str, bool]]]:
    """Every decryption meanwhile, as (the method, whether the lock was held as it began)."""
    seen: list[tuple[str, bool]] = []
    for name in DECRYPTING:
        original = getattr(Cipher, name)

        def spy(self: Cipher, *args: Any, _name: str = name, _original: Any = original) -> Any:
            seen.append((_name, probe.held()))
            return _original(self, *args)

        monkeypatch.setattr(Cipher, name, spy)
    yield seen
    monkeypatch.undo()


async def test_no_read_decrypts_while_its_transaction_holds_the_memory_lock(
    api: Api, runtime: Runtime, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = await make_world(api, ("ann",))
    token = w.tokens["ann"]
    chat = await api.chat(token, w.bot)
    source = await said(api, token, chat, "Rex is my dog and he loves the beach")
    embedder = LocalMiniLM()
    probe = LockProbe(settings, w.bot)
    try:
        changes = [
            AddFact(content=c, sources=(ItemRef(*source),))
            for c in ("Ann has a dog called Rex", "Rex loves the beach", "Ann lives in Lisbon")
        ]
        await apply_changes(runtime, w.bot, list(changes), "memory_bot", embedder=embedder)
        rex = changes[0].id
        seen_together = AddObservation(
            content="Ann takes Rex to the beach", source_entry_ids=(rex, changes[1].id), confidence=0.8
        )
        await apply_changes(runtime, w.bot, [seen_together], "memory_bot", embedder=embedder)
        ann = Principal("person", person_id=w.people["ann"], organization_id=w.org)
        reader = await memory.person_reader_of(runtime, w.bot, w.people["ann"], w.org)
        assert reader is not None

        # The probe sees a read's shared lock while its transaction is open, and a free lock after.
        async with runtime.driver.session() as session:
            tx = await session.begin_transaction()
            await (await tx.run(SHARED_LOCK, botId=w.bot)).consume()
            assert await asyncio.to_thread(probe.held)
            await tx.rollback()
        assert not await asyncio.to_thread(probe.held)

        reads: dict[str, Callable[[], Awaitable[object]]] = {
            "GET memory": lambda: memory.list_entries(runtime, ann, w.bot, []),
            "GET memory, a page": lambda: memory.list_page(runtime, ann, w.bot, [], 2, None),
            "context": lambda: retrieval.context(runtime, w.bot, reader, 4000),
            # The first search of the Bot in this process loads its index: vectors decrypted.
            "search": lambda: search.person_search(runtime, embedder, ann, w.bot, "Who is Rex?", 5),
            "context(query)": lambda: search.context(runtime, embedder, w.bot, reader, 4000, "the dog"),
            "entry": lambda: sourcegraph.entry(runtime, ann, w.bot, rex),
            "dependents": lambda: sourcegraph.neighbourhood(runtime, ann, w.bot, rex, "dependents", 2),
            "contextPack": lambda: conversation.context_pack(runtime, ann, chat, embedder),
            "messages": lambda: chats.messages(runtime, ann, chat, limit=10, skip=0),
        }
        for name, read in reads.items():
            with watched(probe, monkeypatch) as seen:
                await read()
            assert seen, f"{name} decrypted nothing: the probe proves nothing of it"
            under_lock = [method for method, held in seen if held]
            assert not under_lock, f"{name} decrypted under the Memory lock: {under_lock}"

        # The change feed: one batched check for a Bot's subscribers, then the entries decrypted
        # once for all of them (a change made unannounced, then caught up with).
        issued = (await api.gql("mutation { issueToken { id } }", token=token))["issueToken"]
        unannounced = dataclasses.replace(runtime, redis=ArqRedis(host="127.0.0.1", port=1))
        hub = changefeed.ChangeHub(runtime)
        async with hub.subscribe(w.bot, w.people["ann"], w.org, issued["id"]) as sub:
            new = Remember(content="Rex is nine years old", person_id=w.people["ann"], org=w.org)
            await apply_changes(unannounced, w.bot, [new], "person")
            with watched(probe, monkeypatch) as seen:
                await hub.catch_up(w.bot)
            event = sub.queue.get_nowait()
        assert event is not None and [e.id for e in event.entries] == [new.id]
        assert seen and not [method for method, held in seen if held], seen
    finally:
        probe.close()
        await embedder.aclose()
