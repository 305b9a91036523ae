"""Soak: mixed traffic for ten minutes with a worker killed and Redis restarted (issue 17, D9.24).

Run (its own stores: data dir ``.data/soak``, Neo4j 19687, Redis 19379 — Redis is restarted)::

    make soak                      # 10 minutes
    make soak ARGS='--minutes 3'   # shorter, same shape

What runs: a scripted model (``tests.model_server``) that learns every person message starting with
"I " as a fact, a real API process and a real worker (``python -m learning.worker``), and six people
of one organization using one Bot, each with a private chat and all of them in a group chat:

* **Turns** — ``startTurn`` (enriched by the memory Bot), ``completeTurn`` (learning in the worker);
* **reads** — the memory list, ``context(query)`` and ``search``, timed;
* **writes** — Remember, and Forget of one's own pinned entries;
* **subscriptions** — one ``memoryChanges`` per person for the whole run, reconnecting with
  ``after:`` (its last version) whenever the stream ends.

At 30 % of the run the worker is killed with SIGKILL and started again; at 60 % Redis is stopped and
started again (it keeps nothing: the queue and pub/sub start empty). At the end traffic stops, the
run waits for learning to settle and for every stream to catch up, then compares each person's
stream with their change log: **lost** = a log row (changed or removed ids for them) whose version
never arrived; **duplicated** = a version that arrived twice.

Results: a markdown report printed and written to ``bench/soak-results.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets

from bench.measure import pct
from bench.report import machine_state
from services.settings import Settings, load_settings
from tests.client import Api
from tests.model_server import ModelServer, Recorded, Reply, ToolCall
from tools import stores
from tools.processes import ServerProcess, WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "soak-results.md"
PEOPLE = ("ann", "bob", "cat", "dan", "eve", "fay")
FEED = "subscription($b: ID!, $a: Int) { memoryChanges(botId: $b, after: $a) { version entries { id } removed } }"
LOG = (
    "query($b: ID!, $before: Int) { memoryLog(botId: $b, before: $before) "
    "{ changes { version at actor ids removed } next } }"
)
SEARCH = "query($b: ID!, $q: String!) { search(botId: $b, query: $q, limit: 5) { score entry { id } } }"
#: The run's first seconds, left out of a second p95: Neo4j starts with the soak, so the first
#: statement of each kind is planned then (a person's Remember's ~0.5–1 s, six at once ~5 s).
WARM_SECONDS = 60.0
TOPICS = ("tea", "chess", "rain", "trains", "jazz", "maps", "bread", "kites", "owls", "snow")


def learn(recorded: Recorded) -> Reply:
    """A learning step: every new person message starting with "I " becomes a fact citing it."""
    messages: list[Any] = recorded.body.get("messages") or []
    try:
        body = json.loads(str(messages[-1]["content"]))
    except (ValueError, KeyError, IndexError, TypeError):
        return Reply(text="Nothing to add.")
    calls = [
        ToolCall("add_fact", {"content": item["text"], "source_item_ids": [item["id"]], "topics": ["soak"]})
        for item in body.get("newItems", [])
        if item.get("kind") == "person_message" and str(item.get("text", "")).startswith("I ")
    ]
    return Reply(tool_calls=calls) if calls else Reply(text="Nothing to add.")


@dataclass
class Tally:
    """Every request by kind: outcomes, the times of the successful ones (ms) and when each began
    (seconds after ``started``, parallel to ``ms``: the slowest are placed on the timeline)."""

    ok: Counter[str] = field(default_factory=Counter[str])
    failed: Counter[str] = field(default_factory=Counter[str])
    why: Counter[str] = field(default_factory=Counter[str])
    ms: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    at: dict[str, list[float]] = field(default_factory=dict[str, list[float]])
    started: float = field(default_factory=time.perf_counter)

    async def timed(self, kind: str, call: Any) -> Any:
        began = time.perf_counter()
        try:
            result = await call
        except Exception as exc:
            self.failed[kind] += 1
            self.why[f"{kind}: {type(exc).__name__} {str(exc)[:80]}"] += 1
            return None
        self.ok[kind] += 1
        self.ms.setdefault(kind, []).append((time.perf_counter() - began) * 1000)
        self.at.setdefault(kind, []).append(began - self.started)
        return result

    def after(self, kind: str, seconds: float) -> list[float]:
        """The times of the requests of ``kind`` that began ``seconds`` or more into the run."""
        return [
            ms for ms, at in zip(self.ms.get(kind, []), self.at.get(kind, []), strict=True) if at >= seconds
        ]

    def slowest(self, kind: str, n: int) -> str:
        """The ``n`` slowest successful requests of ``kind``: "ms at s", slowest first."""
        pairs = sorted(zip(self.ms.get(kind, []), self.at.get(kind, []), strict=True), reverse=True)[:n]
        return ", ".join(f"{ms:.0f} at {at:.0f} s" for ms, at in pairs)


@dataclass
class Stream:
    """One person's memoryChanges for the whole run: every version received, and its reconnections."""

    person: str
    versions: list[int] = field(default_factory=list[int])
    reconnects: int = 0

    @property
    def last(self) -> int | None:
        return self.versions[-1] if self.versions else None


async def checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RuntimeError(f"HTTP {response.status_code} {response.text[:80]}")
    return response.json()


class Soak:
    #: The memory version the streams start after (a new Bot: 0).
    first_version: int = 0

    def __init__(self, settings: Settings, api: Api, args: argparse.Namespace) -> None:
        self.settings, self.api, self.args = settings, api, args
        self.tally = Tally()
        self.streams: dict[str, Stream] = {}
        self.stop = asyncio.Event()
        self.events: list[str] = []
        self.started = time.monotonic()
        self.wall_start = time.time()
        self.tokens: dict[str, str] = {}
        self.chats: dict[str, str] = {}
        self.bot = self.org = self.group = ""
        self.pinned: dict[str, list[str]] = {p: [] for p in PEOPLE}

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.started:6.1f} s  {text}"
        self.events.append(line)
        print(line, flush=True)

    async def provision(self) -> None:
        self.org = await self.api.organization(f"soak-{random.randrange(16**6):06x}")
        self.bot = await self.api.bot(self.org)
        ids: dict[str, str] = {}
        for name in PEOPLE:
            ids[name], self.tokens[name] = await self.api.person(self.org, name)
            await self.api.grant(self.bot, ids[name])
        await self.api.admin(
            "mutation($o: ID!, $m: String, $b: Boolean) { updateOrganization(id: $o, botMemoryModel: $m, botMemory: $b) { id } }",
            {"o": self.org, "m": "soak-model", "b": True},
        )
        channel = await self.api.channel(self.org, list(ids.values()))
        self.group = await self.api.chat(self.tokens["ann"], self.bot, channel=channel)
        for name in PEOPLE:
            self.chats[name] = await self.api.chat(self.tokens[name], self.bot)

    def headers(self, person: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[person]}"}

    async def turns(self, person: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            chat = self.group if n % 4 == 0 and person == "ann" else self.chats[person]
            text = f"I like {random.choice(TOPICS)} number {n} ({person})"
            turn = await self.tally.timed("startTurn", self.api.turn(self.tokens[person], chat, text))
            if turn is not None:
                await self.tally.timed(
                    "confide",
                    self.api.gql(
                        "mutation($t: ID!, $x: String!) { confide(turnId: $t, text: $x) { answer } }",
                        {"t": turn["id"], "x": "Noted."},
                        self.tokens[person],
                    ),
                )
                await self.tally.timed(
                    "completeTurn",
                    self.api.gql(
                        "mutation($t: ID!) { completeTurn(turnId: $t) { id } }",
                        {"t": turn["id"]},
                        self.tokens[person],
                    ),
                )
            await self.pause(self.args.turn_every)

    async def get(self, person: str, path: str) -> dict[str, Any]:
        return await checked(await self.api.http.get(path, headers=self.headers(person)))

    async def post(self, person: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await checked(await self.api.http.post(path, json=body, headers=self.headers(person)))

    async def reads(self, person: str) -> None:
        memory = f"/v1/bots/{self.bot}/memory"
        while not self.stop.is_set():
            q = random.choice(TOPICS)
            await self.tally.timed("list (REST)", self.get(person, f"{memory}?limit=100"))
            await self.tally.timed("search (REST)", self.get(person, f"{memory}/search?q={q}&limit=10"))
            await self.tally.timed(
                "search (GraphQL)",
                self.api.gql(SEARCH, {"b": self.bot, "q": f"what about {q}?"}, self.tokens[person]),
            )
            await self.tally.timed("log (REST)", self.get(person, f"{memory}/log?limit=20"))
            await self.pause(self.args.read_every)

    async def writes(self, person: str) -> None:
        memory = f"/v1/bots/{self.bot}/memory"
        while not self.stop.is_set():
            if len(self.pinned[person]) > 2:
                entry = self.pinned[person].pop(0)
                body = {"command": {"_tag": "Forget", "id": entry}}
                await self.tally.timed("forget", self.post(person, memory, body))
            else:
                body = {"command": {"_tag": "Remember", "content": f"{person} notes {random.choice(TOPICS)}"}}
                made = await self.tally.timed("remember", self.post(person, memory, body))
                if made is not None:
                    self.pinned[person].append(made["entry"]["id"])
            await self.pause(self.args.write_every)

    async def subscribe(self, person: str) -> None:
        stream = self.streams[person] = Stream(person)
        url = str(self.api.http.base_url).replace("http://", "ws://").rstrip("/") + "/graphql"
        while True:
            try:
                async with websockets.connect(url, subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
                    init = {
                        "type": "connection_init",
                        "payload": {"Authorization": f"Bearer {self.tokens[person]}"},
                    }
                    await ws.send(json.dumps(init))
                    await ws.recv()
                    variables = {
                        "b": self.bot,
                        "a": stream.last if stream.last is not None else self.first_version,
                    }
                    await ws.send(
                        json.dumps(
                            {
                                "id": "1",
                                "type": "subscribe",
                                "payload": {"query": FEED, "variables": variables},
                            }
                        )
                    )
                    async for raw in ws:
                        message = json.loads(raw)
                        if message["type"] != "next" or message["payload"].get("errors"):
                            break
                        stream.versions.append(int(message["payload"]["data"]["memoryChanges"]["version"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.note(f"{person}'s stream ended ({type(exc).__name__}); reconnecting with after")
            stream.reconnects += 1
            await asyncio.sleep(0.5)

    async def pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds * random.uniform(0.5, 1.5))

    async def log_of(self, person: str) -> dict[int, dict[str, Any]]:
        rows: dict[int, dict[str, Any]] = {}
        before: int | None = None
        while True:
            page = (await self.api.gql(LOG, {"b": self.bot, "before": before}, self.tokens[person]))[
                "memoryLog"
            ]
            for c in page["changes"]:
                rows[int(c["version"])] = c
            if page["next"] is None:
                return rows
            before = page["next"]


async def execution_statuses(api: Api, soak: Soak) -> Counter[str]:
    """The run's learning executions by status (each chat owner's view)."""
    found: Counter[str] = Counter()
    for person, chat in [*soak.chats.items(), ("ann", soak.group)]:
        response = await api.http.get(f"/v1/chats/{chat}/learning", headers=soak.headers(person))
        response.raise_for_status()
        found.update(x["status"] for x in response.json()["executions"])
    return found


async def executions_pending(api: Api, soak: Soak) -> int:
    """Learning executions of the run's Bot not ended yet."""
    statuses = await execution_statuses(api, soak)
    return sum(n for status, n in statuses.items() if status not in ("done", "failed", "skipped"))


async def settle(count: Callable[[], Awaitable[int]], within: float) -> int:
    """Until ``count()`` is 0 or ``within`` seconds passed; returns the last count."""
    deadline = time.monotonic() + within
    while True:
        left = await count()
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def restart_redis(settings: Settings, soak: Soak) -> None:
    redis = stores.procs(settings)["redis"]
    stores.stop(redis)
    soak.note("redis stopped")
    await asyncio.to_thread(stores.ensure_redis, settings)
    soak.note("redis started again (empty)")


async def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    assert settings.admin_token is not None
    logs = settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = ModelServer().start()
    server.respond("learn", learn)
    server.default("rewrite", Reply(text="Nothing to add."))
    server.default("confide", Reply(text="Thank you for telling me."))
    server.default("summary", Reply(text="A conversation."))
    env = {
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "sk-soak",
        "BOTMEMORY_DATA_DIR": str(settings.data_dir.resolve()),
        "BOTMEMORY_LEASE_SECONDS": "10",
        "BOTMEMORY_REQUEUE_AFTER_SECONDS": "10",
    }
    api_process = await asyncio.to_thread(ServerProcess, logs / "soak-api.log", env, ROOT)
    worker = WorkerProcess(logs / "soak-worker.log", env, cwd=ROOT)
    await asyncio.to_thread(worker.wait_ready, 60)
    commit = await asyncio.to_thread(
        subprocess.run, ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    header = (
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} · `python -m bench.soak {' '.join(sys.argv[1:])}` · "
        f"commit {commit.stdout.strip() or '?'} · machine before: {machine_state()}"
    )
    seconds = args.minutes * 60
    try:
        async with httpx.AsyncClient(base_url=api_process.url, timeout=30) as http:
            api = Api(http, settings.admin_token.get_secret_value())
            soak = Soak(settings, api, args)
            await soak.provision()
            soak.started, soak.wall_start = time.monotonic(), time.time()
            soak.tally.started = time.perf_counter()
            subscribers = [asyncio.create_task(soak.subscribe(p)) for p in PEOPLE]
            traffic = [
                asyncio.create_task(job(p)) for p in PEOPLE for job in (soak.turns, soak.reads, soak.writes)
            ]
            soak.note(f"traffic started: {len(PEOPLE)} people, {seconds:.0f} s")
            await asyncio.sleep(seconds * 0.3)
            await asyncio.to_thread(worker.kill)
            soak.note("worker killed (SIGKILL)")
            await asyncio.to_thread(worker.restart)
            await asyncio.to_thread(worker.wait_ready, 60)
            soak.note("worker started again")
            await asyncio.sleep(seconds * 0.3)
            await restart_redis(settings, soak)
            await asyncio.sleep(max(seconds - (time.monotonic() - soak.started), 0))
            soak.stop.set()
            await asyncio.gather(*traffic)
            soak.note("traffic stopped; waiting for learning to settle")
            pending = await settle(lambda: executions_pending(api, soak), args.settle)
            soak.note(f"learning executions still pending: {pending}")
            logs_of = {p: await soak.log_of(p) for p in PEOPLE}

            async def missing() -> int:
                return sum(len(set(logs_of[p]) - set(soak.streams[p].versions)) for p in PEOPLE)

            soak.note(f"log rows not (yet) in their streams after 60 s: {await settle(missing, 60)}")
            for task in subscribers:
                task.cancel()
            await asyncio.gather(*subscribers, return_exceptions=True)
            soak.note(f"learning executions by status: {dict(await execution_statuses(api, soak))}")
            report = render(soak, logs_of, pending, header, seconds)
    finally:
        await asyncio.to_thread(worker.stop)
        await asyncio.to_thread(api_process.stop)
        server.stop()
    print(report)
    RESULTS.write_text(report)
    return 0


def render(
    soak: Soak,
    logs_of: dict[str, dict[int, dict[str, Any]]],
    pending: int,
    header: str,
    seconds: float,
) -> str:
    t = soak.tally
    total_ok, total_failed = sum(t.ok.values()), sum(t.failed.values())
    total = total_ok + total_failed
    lost = {p: sorted(set(logs_of[p]) - set(soak.streams[p].versions)) for p in PEOPLE}
    dup = {p: sorted(v for v, n in Counter(soak.streams[p].versions).items() if n > 1) for p in PEOPLE}
    rows = [
        f"| {kind} | {t.ok[kind] + t.failed[kind]} | {t.failed[kind]} | "
        f"{pct(t.ms.get(kind, []), 0.5):.1f} | {pct(t.ms.get(kind, []), 0.95):.1f} | "
        f"{pct(t.after(kind, WARM_SECONDS), 0.95):.1f} | {t.slowest(kind, 3)} |"
        for kind in sorted(set(t.ok) | set(t.failed))
    ]
    reads = [ms for kind in t.ms if "(" in kind for ms in t.ms[kind]]
    lines = [
        "# Soak",
        "",
        header,
        "",
        f"{seconds / 60:.0f} minutes, {len(PEOPLE)} people; worker SIGKILL at 30 %, Redis restart at 60 %.",
        "",
        f"- requests: {total}, failed: {total_failed} (**{100 * total_failed / max(total, 1):.2f} %**, target < 0.5 %)",
        f"- read p95 (list, search, log together): **{pct(reads, 0.95):.1f} ms** (p50 {pct(reads, 0.5):.1f} ms)",
        f"- changes lost: **{sum(len(v) for v in lost.values())}**, duplicated: **{sum(len(v) for v in dup.values())}** "
        f"(target 0) over {sum(len(logs_of[p]) for p in PEOPLE)} log rows of {len(PEOPLE)} streams; "
        f"stream reconnections: {sum(s.reconnects for s in soak.streams.values())}",
        f"- learning executions not ended when the wait for them stopped: {pending}",
        "",
        f"| request | count | failed | p50 ms | p95 ms | p95 ms after {WARM_SECONDS:.0f} s | slowest: ms at s into the run |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *[
            f"- lost by {p}: version {v} ({logs_of[p][v]['actor']}, "
            f"{(int(logs_of[p][v]['at']) / 1000 - soak.wall_start):.1f} s into the run, "
            f"{len(logs_of[p][v]['ids'])} changed, {len(logs_of[p][v]['removed'])} removed)"
            for p in PEOPLE
            for v in lost[p][:5]
        ],
        "",
        "Failures by cause:" if t.why else "No failures.",
        *[f"- {n} × {why}" for why, n in t.why.most_common(10)],
        "",
        "Timeline:",
        "",
        "```",
        *soak.events,
        "```",
        "",
        f"Machine after: {machine_state()}",
        "",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Soak: mixed traffic with a worker killed and Redis restarted")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--turn-every", type=float, default=4.0, help="seconds between one person's Turns")
    p.add_argument("--read-every", type=float, default=1.0, help="seconds between one person's reads")
    p.add_argument("--write-every", type=float, default=6.0, help="seconds between one person's writes")
    p.add_argument("--settle", type=float, default=120.0, help="seconds to wait for learning at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
