"""What retrieval stores (design §10, E1): vectors only sealed, keywords only as blind tokens —
nowhere in Neo4j's files, Redis or the logs in the clear; and the backfill that gives older
entries keywords and vectors (``botmemory reindex``), resumable after a kill -9."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client import REGISTRY

from graph import backfill as backfill_q
from learning import backfill, worker
from learning.embedders import LocalMiniLM, OpenAIEmbedder
from services import jobs, memory, search
from services.bootstrap import open_runtime
from services.changes import Remember, Revise
from services.crypto import DecryptionError
from services.embedding import EmbedderUnavailable, QueryVectors, embed_each, encode_vector
from services.errors import NotFound
from services.keywords import SCHEME, tokens
from services.maintenance import LegacyEntry, import_legacy
from services.runtime import Runtime
from services.settings import Settings
from services.vectorindex import VectorIndexes
from services.writepath import apply_changes
from tests.client import Api, make_world
from tests.conftest import ROOT, ApiProcess, WorkerProcess
from tests.memory_helpers import command
from tests.test_encryption import files_containing
from tests.test_search import Counting
from tests.unit.test_keywords import scheme_1_tokens


async def entry_row(runtime: Runtime, entry_id: str) -> dict[str, Any]:
    rows, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) RETURN e.vec AS vec, e.vecModel AS model, e.kwBlind AS kw, e.vecSeq AS seq",
        id=entry_id,
    )
    return dict(rows[0])


async def test_vectors_and_keywords_are_nowhere_in_the_clear(
    api: Api, runtime: Runtime, settings: Settings, api_process: ApiProcess, worker_process: WorkerProcess
) -> None:
    canary = "zqcanary" + secrets.token_hex(4)
    # Made-up words only: Neo4j's own logs hold ordinary words ("Number of tree nodes").
    place, thing = ("zq" + secrets.token_hex(3) + suffix for suffix in ("ville", "stone"))
    content = f"Ann hides the {canary} under the {thing} in {place}"
    w = await make_world(api, ("ann",))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": content, "tags": []}
    )
    assert response.status_code == 201
    entry_id = response.json()["entry"]["id"]
    found = await api.http.get(
        f"/v1/bots/{w.bot}/memory/search",
        params={"q": canary},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert [r["entry"]["id"] for r in found.json()["results"]] == [entry_id]

    row = await entry_row(runtime, entry_id)
    assert row["model"] == "local:all-MiniLM-L6-v2-int8" and row["seq"] is not None
    embedder = LocalMiniLM()
    try:
        plain = encode_vector((await embedder.embed([content]))[0])
    finally:
        await embedder.aclose()
    neo4j_dir = settings.data_dir / "neo4j"
    # Positive controls: the scan sees the sealed vector and the blind tokens where Neo4j keeps them.
    assert files_containing(neo4j_dir, str(row["vec"])[-32:].encode())
    assert files_containing(neo4j_dir, row["kw"].split()[0].encode())
    words = {canary, place, thing, *(t for t in tokens(content) if t.startswith("zq"))}
    for word in words:
        assert files_containing(neo4j_dir, f" {word} ".encode()) == [], word
    assert files_containing(neo4j_dir, canary.encode()) == []
    for start in range(4, len(plain) - 24, 96):  # windows of the plaintext vector (scale, values)
        assert files_containing(neo4j_dir, plain[start : start + 24]) == []

    for key in await runtime.redis.keys("*"):
        dumped = await runtime.redis.dump(key)
        assert dumped is None or (canary.encode() not in dumped and plain[4:28] not in dumped)
    logs = settings.data_dir / "logs"
    assert files_containing(logs, canary.encode()) == []


def reindex(settings: Settings, bot: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "botmemory.cli", "reindex", bot],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_reindex_backfills_keywords_and_vectors_and_resumes_after_a_kill(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    # Written without an embedder (keywords only), then made to look older still: no keywords.
    changes = [
        Remember(content=f"note {i} about the harbour lighthouse {i}", person_id=person, org=org)
        for i in range(300)
    ]
    await apply_changes(runtime, w.bot, list(changes), "person")
    await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) REMOVE e.kwBlind, e.vec, e.vecModel, e.vecSeq", b=w.bot
    )
    reader = await memory.person_reader_of(runtime, w.bot, person, org)
    assert reader is not None
    missing = await api.http.get(
        f"/v1/bots/{w.bot}/memory/search",
        params={"q": "lighthouse"},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert missing.json()["results"] == []  # no keywords, no vectors: nothing to find them by

    first = reindex(settings, w.bot)
    assert first.stderr is not None
    for line in first.stderr:  # wait until the vectors phase has written a batch, then kill -9
        if line.startswith("vectors") and " 0/" not in line:
            break
    first.kill()
    first.communicate(timeout=30)  # reaps it and closes its pipes
    row = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN count(e.kwBlind) AS kw, count(e.vec) AS vec", b=w.bot
    )
    kw, vec = row.records[0]["kw"], row.records[0]["vec"]
    assert kw == 300 and 0 < vec < 300  # keywords first for all; the kill left vectors half done

    # Keywords alone already find them while the vectors are missing.
    found = await api.http.get(
        f"/v1/bots/{w.bot}/memory/search",
        params={"q": "lighthouse", "limit": 100},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert len(found.json()["results"]) == 100

    second = reindex(settings, w.bot)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert f"{vec}/300" in err  # it resumed where the killed run stopped
    assert "300/300 entries have a vector of local:all-MiniLM-L6-v2-int8" in out
    done = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN count(e.vec) AS vec, collect(DISTINCT e.vecModel) AS models",
        b=w.bot,
    )
    assert done.records[0]["vec"] == 300 and done.records[0]["models"] == ["local:all-MiniLM-L6-v2-int8"]
    # And the vectors are found by meaning now: the query shares no keyword with any entry, so
    # without vectors it would find nothing.
    meaning = await api.http.get(
        f"/v1/bots/{w.bot}/memory/search",
        params={"q": "beacon on the coast", "limit": 5},
        headers={"Authorization": f"Bearer {w.tokens['ann']}"},
    )
    assert len(meaning.json()["results"]) == 5


async def test_the_backfill_keywords_again_what_an_older_tokenisation_missed(
    api: Api, runtime: Runtime
) -> None:
    """Entries keyworded by scheme 1 (``[a-z0-9]`` runs: no token for a Cyrillic word, "jos" for
    "José"; stored in the text's order) are keyworded again by the backfill the worker's sweep
    starts after the upgrade, stored sorted; only those whose tokens change are stamped, so a
    running process's index catches up with them and re-reads nothing else (text of ASCII alone
    tokenises as before)."""
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    contents = [
        "Ann met José at the Café Müller",
        "Собаку Анны зовут Шарик",
        "Ann walked along the old harbour wall past seven painted fishing boats",
    ]
    changes = [Remember(content=c, person_id=person, org=org) for c in contents]
    await apply_changes(runtime, w.bot, list(changes), "person")
    cipher = await memory.cipher_of(runtime, w.bot)
    old = {c.id: " ".join(cipher.blind(t) for t in scheme_1_tokens(c.content)) for c in changes}
    for change in changes:  # as scheme 1 wrote them: its tokens, in the text's order
        await runtime.driver.execute_query(
            "MATCH (e:Entry {id: $id}) SET e.kwBlind = $kw REMOVE e.kwScheme", id=change.id, kw=old[change.id]
        )
    ann = await memory.person_reader_of(runtime, w.bot, person, org)
    assert ann is not None

    async def found(query: str) -> list[str]:
        return [h.entry.id for h in await search.search(runtime, None, w.bot, ann, query, 5)]

    assert await found("Шарик") == [] and await found("jose") == []  # scheme 1 has no such token
    assert await found("harbour") == [changes[2].id]
    before = await backfill.progress(runtime, w.bot, "-")
    assert (before.keyworded, before.total) == (0, 3)
    seqs = {c.id: (await entry_row(runtime, c.id))["seq"] for c in changes}

    assert await backfill.run(runtime, w.bot, None)
    after = await backfill.progress(runtime, w.bot, "-")
    assert (after.keyworded, after.total) == (3, 3)
    rows = {c.id: await entry_row(runtime, c.id) for c in changes}
    # ASCII: the same tokens, now stored sorted (no word order at rest), and not stamped.
    assert rows[changes[2].id]["seq"] == seqs[changes[2].id]
    assert (
        rows[changes[2].id]["kw"].split() == sorted(old[changes[2].id].split()) != old[changes[2].id].split()
    )
    assert all(rows[c.id]["seq"] > seqs[c.id] for c in changes[:2])
    schemes, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {botId: $b}) RETURN collect(DISTINCT e.kwScheme) AS s", b=w.bot
    )
    assert schemes[0]["s"] == [SCHEME]
    # This process's index, loaded before, caught up with the two that changed.
    assert await found("Шарик") == [changes[1].id]
    assert await found("jose") == [changes[0].id]


async def test_the_sweep_reads_what_each_memory_records_and_finds_what_a_write_left_lacking(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """The worker's sweep (``backfill.bots_to_backfill``, every 10 minutes) reads one node per Bot,
    never the entries: a Memory records the tokenisation and the embedder a backfill that went
    through all its entries left them with, and every write that leaves an entry without keywords
    or a vector marks it due (a write without an embedder, as this test's runtime has none; a
    revision; a legacy import). A Bot is found while anything is due, and only then: for
    keywords without an embedder, for vectors too with one; again when the embedder or the
    tokenisation changes."""
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    minilm = LocalMiniLM()
    other = OpenAIEmbedder(  # never asked: its id names vectors of another embedder
        settings.model_copy(
            update={
                "embedding_model": "other-model",
                "embedding_dimensions": 384,
                "embedding_base_url": "http://127.0.0.1:9/v1",
            }
        )
    )

    async def due() -> tuple[bool, bool]:
        """Whether the sweep finds the Bot without an embedder, and with MiniLM."""
        without = await backfill.bots_to_backfill(runtime, None)
        found = await backfill.bots_to_backfill(runtime, minilm)
        assert REGISTRY.get_sample_value("botmemory_backfill_due_bots") == len(found)  # for operators
        return w.bot in without, w.bot in found

    def written(phase: str) -> float:
        return REGISTRY.get_sample_value("botmemory_backfill_entries_total", {"phase": phase}) or 0.0

    try:
        first = [
            Remember(content=f"Ann keeps bees behind barn {i}", person_id=person, org=org) for i in range(2)
        ]
        await apply_changes(runtime, w.bot, list(first), "person")
        assert await due() == (True, True)  # never backfilled
        assert await backfill.run(runtime, w.bot, None)
        assert await due() == (False, True)  # keywords complete; the writes left no vector
        before = written("vectors")
        assert await backfill.run(runtime, w.bot, minilm)
        assert written("vectors") == before + 2
        assert await due() == (False, False)
        assert w.bot in await backfill.bots_to_backfill(runtime, other)  # another embedder's vectors

        await apply_changes(
            runtime, w.bot, [Remember(content="Ann sells honey", person_id=person, org=org)], "person"
        )
        assert await due() == (False, True)  # written with keywords, without a vector
        assert await backfill.run(runtime, w.bot, minilm)
        assert await due() == (False, False)
        await apply_changes(
            runtime, w.bot, [Revise(first[0].id, "Ann keeps bees behind the old barn")], "person"
        )
        assert await due() == (False, True)
        assert await backfill.run(runtime, w.bot, minilm)
        assert await due() == (False, False)
        vectors = await runtime.driver.execute_query(
            "MATCH (e:Entry {botId: $b}) RETURN count(e) AS n, count(CASE WHEN e.vecModel = $m THEN 1 END) AS v",
            b=w.bot,
            m=minilm.id,
        )
        assert (vectors.records[0]["n"], vectors.records[0]["v"]) == (3, 3)

        await import_legacy(runtime, w.bot, [LegacyEntry("Ann once kept goats", ("topic:farm",))])
        assert await due() == (True, True)  # no keywords yet
        assert await backfill.run(runtime, w.bot, minilm)
        assert await due() == (False, False)

        await runtime.driver.execute_query(  # as a newer tokenisation finds it after an upgrade
            "MATCH (m:Memory {id: $b}) SET m.kwScheme = $old", b=w.bot, old=SCHEME - 1
        )
        assert await due() == (True, True)
        assert await backfill.run(runtime, w.bot, minilm)
        assert await due() == (False, False)

        # A backfill that began before a change records nothing: the change may have left an
        # entry it did not go through.
        held = await runtime.driver.execute_query(
            "MATCH (m:Memory {id: $b}) RETURN m.version AS v, coalesce(m.vecWriterChanges, 0) AS c", b=w.bot
        )
        version, changes = held.records[0]["v"], held.records[0]["c"]
        await apply_changes(
            runtime, w.bot, [Remember(content="Ann rents a stall", person_id=person, org=org)], "person"
        )
        await runtime.driver.execute_query(
            "MATCH (m:Memory {id: $b}) SET m.vecDue = false", b=w.bot
        )  # as if that write had not marked it either
        marked = await runtime.driver.execute_query(
            backfill_q.MARK_DONE,
            botId=w.bot,
            version=version,
            writerChanges=changes,
            model=minilm.id,
            scheme=SCHEME,
        )
        assert marked.records[0]["n"] == 0
    finally:
        await minilm.aclose()
        await other.aclose()


async def test_a_write_with_another_embedders_vector_after_a_backfill_makes_the_bot_due_again(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """During an embedder swap a process not yet swapped may write after the worker re-embedded
    everything and recorded the new embedder on the Memory: its entry's vector is of the old
    one. The write marks the Memory due, so the next sweep re-embeds that entry (it was found by
    keywords alone for good: the sweep reads only the Memory, and that said done)."""
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    minilm = LocalMiniLM()
    try:
        async with _endpoint(settings, _Embeddings, "old-model") as old:
            await apply_changes(
                runtime, w.bot, [Remember(content="Ann keeps bees", person_id=person, org=org)], "person"
            )
            assert await backfill.run(runtime, w.bot, minilm)
            assert w.bot not in await backfill.bots_to_backfill(runtime, minilm)
            late = Remember(content="Ann sells honey at the market", person_id=person, org=org)
            await apply_changes(runtime, w.bot, [late], "person", embedder=old)
            assert w.bot in await backfill.bots_to_backfill(runtime, minilm)
            revised = Revise(late.id, "Ann sells honey and wax at the market")
            assert await backfill.run(runtime, w.bot, minilm)
            assert w.bot not in await backfill.bots_to_backfill(runtime, minilm)
            await apply_changes(runtime, w.bot, [revised], "person", embedder=old)  # a revision alike
            assert w.bot in await backfill.bots_to_backfill(runtime, minilm)
            assert await backfill.run(runtime, w.bot, minilm)
            # The same embedder's writes leave it done.
            await apply_changes(
                runtime,
                w.bot,
                [Remember(content="Ann rents a stall", person_id=person, org=org)],
                "person",
                embedder=minilm,
            )
            assert w.bot not in await backfill.bots_to_backfill(runtime, minilm)
        models = await runtime.driver.execute_query(
            "MATCH (e:Entry {botId: $b}) RETURN collect(DISTINCT e.vecModel) AS m", b=w.bot
        )
        assert models.records[0]["m"] == [minilm.id]
    finally:
        await minilm.aclose()


class _Meddled(Counting):
    """The real embedder, except that before its second batch ``meddle`` runs: another worker's
    backfill going through the Bot while this one does."""

    def __init__(self, inner: LocalMiniLM, meddle: Callable[[], Awaitable[object]]) -> None:
        super().__init__(inner)
        self.meddle = meddle

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if len(self.asked) == 1:
            await self.meddle()
        return await super().embed(texts)


async def test_a_backfill_meddled_with_by_another_embedders_worker_leaves_the_bot_due(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """During an embedder swap a worker not yet swapped (the old embedder) goes through the Bot
    while the new one does, and re-embeds with the old embedder what the new one already wrote.
    A backfill's writes move no memory version, so the new one's pass was recorded done on the
    Memory: the Bot was never due again, and those entries had no vector of the new embedder
    for good. Now a pass records done only when every vector since it began was its embedder's;
    the next pass, alone, re-embeds them and records it."""
    w = await make_world(api, ("ann",))
    notes = [Remember(content=f"Ann keeps hive {n}", person_id=w.people["ann"], org=w.org) for n in range(70)]
    await apply_changes(runtime, w.bot, list(notes), "person")
    minilm = LocalMiniLM()
    try:
        async with _endpoint(settings, _Embeddings, "old-model") as old:
            assert await backfill.run(runtime, w.bot, old)  # before the swap: all of the old one
            assert w.bot in await backfill.bots_to_backfill(runtime, minilm)
            meddled = _Meddled(minilm, lambda: backfill.run(runtime, w.bot, old))
            await backfill.run(runtime, w.bot, meddled)  # 70 entries: two batches of vectors

            async def old_ones() -> int:
                found = await runtime.driver.execute_query(
                    "MATCH (e:Entry {botId: $b}) WHERE e.vecModel <> $m RETURN count(e) AS n",
                    b=w.bot,
                    m=minilm.id,
                )
                return int(found.records[0]["n"])

            assert await old_ones() > 0  # the first batch, re-embedded by the old one meanwhile
            assert w.bot in await backfill.bots_to_backfill(runtime, minilm)
            assert await backfill.run(runtime, w.bot, minilm)
            assert await old_ones() == 0
            assert w.bot not in await backfill.bots_to_backfill(runtime, minilm)
            # A swap with no other worker meddling is recorded done by its one pass.
            assert await backfill.run(runtime, w.bot, old)
            assert w.bot not in await backfill.bots_to_backfill(runtime, old)
    finally:
        await minilm.aclose()


async def _two_bots_with_a_note(api: Api, runtime: Runtime) -> list[str]:
    """Two new Bots (in id order), each with one pinned entry written without an embedder."""
    worlds = [await make_world(api, ("ann",)) for _ in range(2)]
    for w in worlds:
        note = Remember(content="Ann keeps bees", person_id=w.people["ann"], org=w.org)
        await apply_changes(runtime, w.bot, [note], "person")
    return sorted(w.bot for w in worlds)


def _due_among(bots: list[str]) -> Callable[[Runtime, Any], Awaitable[list[str]]]:
    """``backfill.bots_to_backfill`` limited to ``bots`` (the test store holds every test's Bots)."""
    every = backfill.bots_to_backfill

    async def due(rt: Runtime, embedder: Any, *, gauge: bool = True) -> list[str]:
        return [b for b in await every(rt, embedder, gauge=gauge) if b in bots]

    return due


async def test_a_backfill_that_fails_hands_its_lane_on_to_the_bots_after_it(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Bot whose backfill fails every time (here an entry whose content cannot be decrypted)
    kept its lane: with one lane the Bots after it were never backfilled. Its job now hands the
    lane on, as a finished one does — to the due Bots after it in id order, so that two such
    Bots never hand it to each other without end (they did, when the lane went to the first Bot
    due: the queue filled with their jobs and learning waited behind them)."""
    failing = await _two_bots_with_a_note(api, runtime)
    await runtime.driver.execute_query(
        "MATCH (e:Entry) WHERE e.botId IN $bots SET e.content = $garbage REMOVE e.kwBlind",
        bots=failing,
        garbage=base64.b64encode(bytes(64)).decode(),
    )
    due = _due_among(failing)
    handed: list[tuple[str | None, list[str]]] = []

    async def start_backfills(rt: Runtime, found: list[str], *, finishing: str | None = None) -> int:
        handed.append((finishing, found))
        return 0

    monkeypatch.setattr(backfill, "bots_to_backfill", due)
    monkeypatch.setattr(jobs, "start_backfills", start_backfills)
    ctx: dict[str, Any] = {"runtime": runtime, "gateway": SimpleNamespace(embedder=None)}
    try:
        assert await due(runtime, None) == failing
        for bot in failing:
            with pytest.raises(DecryptionError):  # the premise: this Bot's run fails, every time
                await backfill.run(runtime, bot, None)
            await worker.backfill_bot(ctx, bot, 0)
        first, second = failing
        assert handed == [(first, [second]), (second, [])]
    finally:  # no undecryptable entry is left for the suite's worker to sweep
        await runtime.driver.execute_query(
            "MATCH (e:Entry) WHERE e.botId IN $bots DETACH DELETE e", bots=failing
        )


def _down_embedder_env() -> dict[str, str]:
    """Settings of an OpenAI-compatible embedder at a port nobody listens on."""
    with socket.socket() as free:  # nobody listens once it is closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    return {
        "BOTMEMORY_EMBEDDER": "openai",
        "BOTMEMORY_EMBEDDING_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "BOTMEMORY_EMBEDDING_MODEL": "down-model",
        "BOTMEMORY_EMBEDDING_DIMENSIONS": "384",
    }


async def test_a_backfill_whose_embedder_fails_waits_for_the_next_sweep(
    api: Api, runtime: Runtime, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's backfill job whose embedder fails keeps the keywords it wrote and queues no next
    part (the next sweep tries again; a part queued at once would call a provider that is down
    over and over), where one whose time ran out does; ``botmemory reindex`` says so in one line."""
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    changes = [Remember(content=f"Ann paints fence {i}", person_id=person, org=org) for i in range(3)]
    await apply_changes(runtime, w.bot, list(changes), "person")
    await runtime.driver.execute_query("MATCH (e:Entry {botId: $b}) REMOVE e.kwBlind", b=w.bot)
    env = _down_embedder_env()
    down = OpenAIEmbedder(
        settings.model_copy(
            update={
                "embedding_base_url": env["BOTMEMORY_EMBEDDING_BASE_URL"],
                "embedding_model": "down-model",
                "embedding_dimensions": 384,
            }
        )
    )
    queued: list[tuple[str, int]] = []

    async def enqueue(rt: Runtime, bot_id: str, *, part: int = 0) -> None:
        queued.append((bot_id, part))

    monkeypatch.setattr(jobs, "enqueue_backfill", enqueue)
    ctx: dict[str, Any] = {"runtime": runtime, "gateway": SimpleNamespace(embedder=down)}
    try:
        await worker.backfill_bot(ctx, w.bot, 0)
        assert queued == []
        progress = await backfill.progress(runtime, w.bot, down.id)
        assert (progress.keyworded, progress.embedded, progress.total) == (3, 0, 3)
        monkeypatch.setattr(worker, "BACKFILL_SECONDS", -1.0)  # its time is up at once
        await worker.backfill_bot(ctx, w.bot, 0)
        assert queued == [(w.bot, 1)]
    finally:
        await down.aclose()

    failed = reindex(settings, w.bot, env)
    out, err = failed.communicate(timeout=120)
    assert failed.returncode == 1
    assert out == ""
    assert err.startswith("botmemory: UNAVAILABLE: the embedder failed (") and err.count("\n") == 1, err


class _Embeddings(BaseHTTPRequestHandler):
    """A real OpenAI-compatible ``/v1/embeddings`` provider (the one test double allowed: a model
    provider) whose vectors are MiniLM's, under another model name."""

    embedder = LocalMiniLM()
    texts: list[str] = []  # every text asked, in order

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).texts.extend(body["input"])
        self.answer(body)

    def answer(self, body: dict[str, Any]) -> None:
        vectors = asyncio.run(self.embedder.embed(list(body["input"])))
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        self.send_json(200, {"object": "list", "model": body["model"], "data": data, "usage": usage})

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


async def test_an_embedder_swap_reembeds_and_search_works_throughout(
    api: Api, runtime: Runtime, settings: Settings, service_env: dict[str, str]
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    swapped = {
        "BOTMEMORY_EMBEDDER": "openai",
        "BOTMEMORY_EMBEDDING_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
        "BOTMEMORY_EMBEDDING_MODEL": "swap-model",
        "BOTMEMORY_EMBEDDING_DIMENSIONS": "384",
    }
    w = await make_world(api, ("ann",))
    notes = ["Ann's cat is called Miso", "Ann grows tomatoes on her balcony", "Ann drives an old red van"]
    for note in notes:
        assert (
            await command(api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": note, "tags": []})
        ).status_code == 201
    other = ApiProcess(
        settings, settings.data_dir / "logs" / "pytest-api-swapped.log", {**service_env, **swapped}
    )
    try:
        async with httpx.AsyncClient(base_url=other.url, timeout=30) as http:

            async def found(q: str) -> list[str]:
                response = await http.get(
                    f"/v1/bots/{w.bot}/memory/search",
                    params={"q": q, "limit": 1},
                    headers={"Authorization": f"Bearer {w.tokens['ann']}"},
                )
                assert response.status_code == 200, response.text
                return [r["entry"]["content"] for r in response.json()["results"]]

            # Before the re-embedding: no vector of the new embedder, keywords still find.
            assert await found("tomatoes") == ["Ann grows tomatoes on her balcony"]
            assert await found("which pet does she have?") == []
            done = reindex(settings, w.bot, swapped)
            out, err = done.communicate(timeout=300)
            assert done.returncode == 0, err
            assert "3/3 entries have a vector of openai:swap-model:384" in out
            assert await found("which pet does she have?") == ["Ann's cat is called Miso"]
            assert await found("what vehicle?") == ["Ann drives an old red van"]
    finally:
        other.stop()
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.asynccontextmanager
async def _endpoint(
    settings: Settings, handler: type[BaseHTTPRequestHandler], model: str, **update: Any
) -> AsyncGenerator[OpenAIEmbedder]:
    """A real OpenAI-compatible embeddings endpoint served by ``handler`` on a free port, and the
    real ``openai`` client of it (``model``, 384 dimensions; ``update``: more settings)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    settings = settings.model_copy(
        update={"embedding_base_url": url, "embedding_model": model, "embedding_dimensions": 384, **update}
    )
    embedder = OpenAIEmbedder(settings)
    try:
        yield embedder
    finally:
        await embedder.aclose()
        server.shutdown()
        server.server_close()
        thread.join()


class _Hanging(BaseHTTPRequestHandler):
    """An embeddings endpoint that takes each request and answers nothing until released."""

    release = threading.Event()
    received = 0

    def do_POST(self) -> None:
        type(self).received += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.release.wait(300)
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


async def test_an_embedder_that_hangs_holds_neither_a_change_nor_a_search(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """An embeddings endpoint that takes requests and never answers (its client would wait 300 s
    here) holds a change only ``embedding_timeout_seconds`` — the entry is written with its
    keywords, the Memory due for the backfill — and a search (so an enrichment) only
    ``query_embedding_timeout_seconds``: it searches by keywords alone, counted under
    ``timeout``. Both return while the endpoint still holds their requests."""
    quick = dataclasses.replace(
        runtime,
        settings=runtime.settings.model_copy(
            update={"query_embedding_timeout_seconds": 0.3, "embedding_timeout_seconds": 0.3}
        ),
    )
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    timeouts = (
        REGISTRY.get_sample_value("botmemory_query_embedding_failures_total", {"code": "timeout"}) or 0.0
    )
    async with _endpoint(settings, _Hanging, "hanging-model", model_attempt_timeout_seconds=300.0) as hanging:
        try:
            oboe = Remember(content="Ann plays the oboe on Sundays", person_id=person, org=org)
            await asyncio.wait_for(apply_changes(quick, w.bot, [oboe], "person", embedder=hanging), 60)
            assert _Hanging.received >= 1 and not _Hanging.release.is_set()
            row = await entry_row(runtime, oboe.id)
            assert row["vec"] is None and row["model"] is None and row["kw"]
            assert w.bot in await backfill.bots_to_backfill(runtime, hanging)

            ann = await memory.person_reader_of(runtime, w.bot, person, org)
            assert ann is not None
            asked = _Hanging.received
            hits = await asyncio.wait_for(search.search(quick, hanging, w.bot, ann, "oboe", 5), 60)
            assert _Hanging.received > asked and not _Hanging.release.is_set()
            assert [h.entry.id for h in hits] == [oboe.id]
            after = REGISTRY.get_sample_value("botmemory_query_embedding_failures_total", {"code": "timeout"})
            assert after == timeouts + 1
        finally:
            _Hanging.release.set()  # before the server closes: it waits for its handlers


async def test_a_query_asked_again_is_not_embedded_again(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """A process keeps the vectors of the queries it embedded lately (``QueryVectors``, by Bot and
    reader, embedder and a digest of the text): the same question asked again — by ``search``,
    then by ``context(query)`` as ``contextPack`` asks for the message a Turn's enrichment asked
    for — costs the embeddings endpoint nothing; another question is embedded. So is the same
    question asked by someone else: kept for everyone, the time of a search told whether anyone
    on the process had lately asked exactly that."""
    w = await make_world(api, ("ann", "bob"))
    person, org = w.people["ann"], w.org
    async with _endpoint(settings, _Embeddings, "kept-model") as endpoint:
        note = Remember(content="Ann's cat is called Miso", person_id=person, org=org)
        await apply_changes(runtime, w.bot, [note], "person", embedder=endpoint)
        ann = await memory.person_reader_of(runtime, w.bot, person, org)
        assert ann is not None
        fresh = dataclasses.replace(runtime, vectors=VectorIndexes(), query_vectors=QueryVectors())
        asked = len(_Embeddings.texts)
        first = await search.search(fresh, endpoint, w.bot, ann, "which pet does she have?", 5)
        again = await search.search(fresh, endpoint, w.bot, ann, "which pet does she have?", 5)
        context = await search.context(fresh, endpoint, w.bot, ann, 4000, "which pet does she have?")
        assert [h.entry.id for h in first] == [h.entry.id for h in again] == [note.id] == list(context.ids)
        assert _Embeddings.texts[asked:] == ["which pet does she have?"]  # embedded once
        await search.search(fresh, endpoint, w.bot, ann, "what is the cat called?", 5)
        assert _Embeddings.texts[asked:] == ["which pet does she have?", "what is the cat called?"]
        bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], org)
        assert bob is not None
        await search.search(fresh, endpoint, w.bot, bob, "which pet does she have?", 5)
        assert _Embeddings.texts[asked:] == [
            "which pet does she have?", "what is the cat called?", "which pet does she have?"
        ]  # fmt: skip


async def test_a_remember_on_a_bot_the_person_does_not_use_embeds_nothing(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """D9.4: Remember on another organization's Bot answered the same NOT_FOUND as on an unknown
    one, but only after embedding the text (an external call, with a provider configured): its
    time told an existing Bot from an unknown one. The person's use of the Bot is read first."""
    w = await make_world(api, ("ann",))
    other = await make_world(api, ("gus",))
    person, org = w.people["ann"], w.org
    async with _endpoint(settings, _Embeddings, "checked-model") as endpoint:
        asked = len(_Embeddings.texts)
        for bot in (other.bot, "bot_" + "0" * 32):
            note = Remember(content="Ann's bike lock code is 1234", person_id=person, org=org)
            with pytest.raises(NotFound):
                await apply_changes(runtime, bot, [note], "person", person=(person, org), embedder=endpoint)
        assert _Embeddings.texts[asked:] == []
        mine = Remember(content="Ann's bike lock code is 1234", person_id=person, org=org)
        await apply_changes(runtime, w.bot, [mine], "person", person=(person, org), embedder=endpoint)
        assert _Embeddings.texts[asked:] == ["Ann's bike lock code is 1234"]


async def test_backfills_take_a_few_lanes_so_learning_never_queues_behind_them(settings: Settings) -> None:
    """A sweep after an upgrade or an embedder change finds every Bot due: it queued a job for
    each at once, and learning steps waited behind thousands of them (``make eval`` against a
    store of ~18,000 test Bots: no learning answer for 180 s). Backfills now take
    ``backfill_lanes`` lanes (one by default; two here); a Bot keeps its lane from part to part
    and hands it on when done. (Redis database 9: no worker takes these jobs.)"""
    base = settings.redis_url.rsplit("/", 1)[0]
    two = settings.model_copy(update={"redis_url": f"{base}/9", "backfill_lanes": 2})
    async with open_runtime(two) as rt:
        await rt.redis.flushdb()
        due = [f"bot_{n:032x}" for n in range(5)]
        try:
            assert await jobs.start_backfills(rt, due) == 2
            assert await jobs.start_backfills(rt, due) == 0  # both lanes taken
            assert await jobs.backfills_in_flight(rt) == set(due[:2])
            # The first Bot's part 0 runs and queues part 1: it keeps its lane.
            await rt.redis.delete(f"arq:job:backfill:{due[0]}:0")
            await rt.redis.set(f"arq:in-progress:backfill:{due[0]}:0", b"1")
            await jobs.enqueue_backfill(rt, due[0], part=1)
            assert await jobs.start_backfills(rt, due) == 0
            # Its last part ends: the lane goes to the next Bot due that is not in flight.
            await rt.redis.delete(f"arq:in-progress:backfill:{due[0]}:0", f"arq:job:backfill:{due[0]}:1")
            await rt.redis.set(f"arq:in-progress:backfill:{due[0]}:1", b"1")
            assert await jobs.start_backfills(rt, due[1:], finishing=due[0]) == 1
            assert await jobs.backfills_in_flight(rt) - {due[0]} == {due[1], due[2]}
        finally:
            await rt.redis.flushdb()


class _Refusing(_Embeddings):
    """MiniLM's vectors, but a request holding a text with "POISON" in it is answered 400, as a
    self-hosted endpoint answers a text over its model's limit; for the model "refuse-all", every
    request (as for a model or size it does not serve)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] == "refuse-all" or any("POISON" in t for t in body["input"]):
            self.send_json(400, {"error": {"message": "input too long", "type": "invalid_request_error"}})
            return
        self.answer(body)


async def test_one_keyword_pass_runs_at_a_time(settings: Settings) -> None:
    """A sweep queues the keyword pass (part 0) only while none is queued or running: a pass
    queues its own next parts, and a second chain would go over the same Bots. (Redis database
    9: no worker takes these jobs.)"""
    base = settings.redis_url.rsplit("/", 1)[0]
    async with open_runtime(settings.model_copy(update={"redis_url": f"{base}/9"})) as rt:
        await rt.redis.flushdb()
        try:
            assert await jobs.start_keyword_pass(rt)
            assert not await jobs.start_keyword_pass(rt)  # part 0 queued
            await rt.redis.delete("arq:job:keywords:0")
            await rt.redis.set("arq:in-progress:keywords:0", b"1")
            assert not await jobs.start_keyword_pass(rt)  # running
            assert await jobs.start_keyword_pass(rt, part=1)  # its own next part
            await rt.redis.delete("arq:in-progress:keywords:0")
            assert not await jobs.start_keyword_pass(rt)  # part 1 queued
            await rt.redis.delete("arq:job:keywords:1")
            assert await jobs.start_keyword_pass(rt)  # the chain ended
            assert await jobs.backfills_in_flight(rt) == set()  # not a Bot's backfill
        finally:
            await rt.redis.flushdb()


async def test_a_text_the_embedder_refuses_costs_only_its_own_vector(
    api: Api, runtime: Runtime, settings: Settings
) -> None:
    """An endpoint that refuses a request for one of its texts (400) cost a whole change its
    vectors, and stopped a Bot's backfill at that batch for good (every run asked for the same
    batch first). The batch is now halved until the refused text stands alone: it alone has no
    vector (found by keywords), the others have theirs, the backfill finishes and the Bot is no
    longer due. An endpoint that refuses every text (a wrong model) still fails the run."""
    w = await make_world(api, ("ann",))
    person, org = w.people["ann"], w.org
    notes = ["Ann keeps bees", "POISON Ann's very long note", "Ann sells honey", "Ann rents a stall"]
    refused = REGISTRY.get_sample_value("botmemory_embeddings_refused_total") or 0.0
    async with _endpoint(settings, _Refusing, "refusing-model") as endpoint:
        written = [Remember(content=n, person_id=person, org=org) for n in notes]
        await apply_changes(runtime, w.bot, list(written), "person", embedder=endpoint)

        async def vectors() -> dict[str, bool]:
            found = await runtime.driver.execute_query(
                "MATCH (e:Entry {botId: $b}) RETURN e.id AS id, e.vecModel = $m AS v", b=w.bot, m=endpoint.id
            )
            return {r["id"]: bool(r["v"]) for r in found.records}

        assert await vectors() == {c.id: "POISON" not in n for c, n in zip(written, notes, strict=True)}
        assert REGISTRY.get_sample_value("botmemory_embeddings_refused_total") == refused + 1
        # The backfill goes past it and finishes: the Bot is not due again.
        assert w.bot in await backfill.bots_to_backfill(runtime, endpoint)
        assert await backfill.run(runtime, w.bot, endpoint)
        assert w.bot not in await backfill.bots_to_backfill(runtime, endpoint)
        assert sum((await vectors()).values()) == 3
    async with _endpoint(settings, _Refusing, "refusing-model") as endpoint:
        # Every text of a batch refused, the endpoint still answering: the texts' fault.
        assert await embed_each(endpoint, ["POISON one", "POISON two"]) == [None, None]
    async with _endpoint(settings, _Refusing, "refuse-all") as endpoint:
        # An endpoint that refuses every request (a wrong model or size) is not a text's fault:
        # the probe is refused too, and it fails as an endpoint that is down does.
        for texts in (["one"], ["one", "two"]):
            with pytest.raises(EmbedderUnavailable) as failed:
                await embed_each(endpoint, texts)
            assert failed.value.code == "refused"


async def test_the_keyword_pass_gives_every_due_bot_its_keywords_without_waiting_for_a_lane(
    api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a store's first upgrade every Bot is due. In the lanes alone a Bot's keywords waited
    behind the vectors of every Bot before it, its ``search`` empty meanwhile. A sweep with an
    embedder now also queues one keyword pass, which gives every Bot due for keywords its
    keywords, one after another, calling no model, and queues its next part when its time runs
    out."""
    bots = await _two_bots_with_a_note(api, runtime)
    await runtime.driver.execute_query(
        "MATCH (e:Entry) WHERE e.botId IN $bots REMOVE e.kwBlind WITH DISTINCT e.botId AS b "
        "MATCH (m:Memory {id: b}) SET m.kwDue = true",
        bots=bots,
    )
    due = _due_among(bots)

    passes: list[int] = []
    lanes: list[list[str]] = []

    async def start_keyword_pass(rt: Runtime, *, part: int = 0) -> bool:
        passes.append(part)
        return True

    async def start_backfills(rt: Runtime, found: list[str], *, finishing: str | None = None) -> int:
        lanes.append(sorted(found))
        return 0

    monkeypatch.setattr(backfill, "bots_to_backfill", due)
    monkeypatch.setattr(jobs, "start_keyword_pass", start_keyword_pass)
    monkeypatch.setattr(jobs, "start_backfills", start_backfills)
    minilm = LocalMiniLM()
    ctx: dict[str, Any] = {"runtime": runtime, "gateway": SimpleNamespace(embedder=minilm)}
    try:
        await worker.backfill_sweep(ctx)
        assert (passes, lanes) == ([0], [sorted(bots)])  # the pass, and the lanes for the vectors
        monkeypatch.setattr(worker, "BACKFILL_SECONDS", -1.0)  # its time is up at once
        await worker.backfill_keywords(ctx, 0)
        assert passes == [0, 1]  # the next part is queued
        monkeypatch.setattr(worker, "BACKFILL_SECONDS", math.inf)
        await worker.backfill_keywords(ctx, 1)
        assert passes == [0, 1]  # done: no further part
        held = await runtime.driver.execute_query(
            "MATCH (e:Entry) WHERE e.botId IN $bots RETURN e.botId AS b, e.kwBlind IS NOT NULL AS k, e.vec AS v",
            bots=bots,
        )
        assert sorted((r["b"], r["k"], r["v"]) for r in held.records) == sorted((b, True, None) for b in bots)
        assert await due(runtime, None) == []  # no Bot due for keywords; the vectors are the lanes' work
        assert sorted(await due(runtime, minilm)) == sorted(bots)
    finally:
        await minilm.aclose()
