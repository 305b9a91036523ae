"""C1: a read never mixes old access rules with new content, across API processes.

Writers flip an entry's audience and its content in one change (the content names the rule it
was written under); readers on two API processes check every decrypted text against the tags
and the audience they were shown.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import httpx
import pytest

from services import memory, retrieval
from services.changes import Revise, Share
from services.runtime import Runtime
from services.settings import Settings
from services.writepath import apply_changes
from tests.client import Api, make_world
from tests.conftest import ApiProcess
from tests.memory_helpers import fact, said

READS = int(os.environ.get("BOTMEMORY_C1_READS", "10000"))


@pytest.mark.timeout(900)
async def test_reads_never_mix_rules_and_content(api: Api, runtime: Runtime, settings: Settings) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    entry = await fact(runtime, w.bot, "rule=channel v=0", await said(api, w.tokens["ann"], group, "x"))
    narrow, wide = (f"for:person:{w.people['ann']}",), (f"for:channel:{w.channel}",)
    second = ApiProcess(settings, settings.data_dir / "logs" / "pytest-api-c1.log")
    done = asyncio.Event()
    waits: list[float] = []
    counts = {"reads": 0, "bob_saw": 0, "ann_saw": 0, "flips": 0, "context_reads": 0, "context_saw": 0}

    async def writer() -> None:
        version = 0
        while not done.is_set():
            version += 1
            audience, rule = (narrow, "person") if version % 2 else (wide, "channel")
            started = time.perf_counter()
            await apply_changes(
                runtime,
                w.bot,
                [Share(entry, audience), Revise(entry, f"rule={rule} v={version}")],
                "memory_bot",
            )
            waits.append(time.perf_counter() - started)
            counts["flips"] += 1
            await asyncio.sleep(0.05)  # a busy Bot, not a write storm: let reads through between flips

    async def reader(http: httpx.AsyncClient, name: str) -> None:
        headers = {"Authorization": f"Bearer {w.tokens[name]}"}
        while counts["reads"] < READS:
            response = await http.get(f"/v1/bots/{w.bot}/memory", headers=headers)
            assert response.status_code == 200
            counts["reads"] += 1
            for e in response.json()["entries"]:
                if e["id"] != entry:
                    continue
                counts[f"{name}_saw"] += 1
                rule = e["content"].split()[0]
                if f"for:channel:{w.channel}" in e["tags"]:
                    assert rule == "rule=channel", e
                else:
                    assert rule == "rule=person" and narrow[0] in e["tags"], e
                    assert name == "ann", "Bob saw content written for Ann alone"

    async def context_reader() -> None:
        """Enrichment's read (``context``, its lock in its first statement) for Bob, who may see
        the entry only while it is the channel's, and then only its channel text."""
        bob = await memory.person_reader_of(runtime, w.bot, w.people["bob"], w.org)
        assert bob is not None
        while counts["reads"] < READS:
            got = await retrieval.context(runtime, w.bot, bob, 4000)
            counts["context_reads"] += 1
            for entry_id, content in zip(got.ids, got.contents, strict=True):
                if entry_id == entry:
                    counts["context_saw"] += 1
                    assert content.split()[0] == "rule=channel", content

    try:
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as other:
            writers = [asyncio.create_task(writer()) for _ in range(2)]
            readers = [reader(client, name) for client in (api.http, other) for name in ("ann", "bob", "bob")]
            await asyncio.gather(*readers, context_reader())
            done.set()
            await asyncio.gather(*writers)
    finally:
        second.stop()
    assert counts["reads"] >= READS and counts["flips"] > 10
    assert counts["bob_saw"] > 0 and counts["ann_saw"] > 0 and counts["context_saw"] > 0
    waits.sort()
    print(
        f"\nC1: {counts['reads']} reads on 2 API processes and {counts['context_reads']} context reads, "
        f"{counts['flips']} flips; writer wait "
        f"median {statistics.median(waits) * 1000:.1f} ms, p95 {waits[int(len(waits) * 0.95)] * 1000:.1f} ms"
    )
