"""Learning benchmark: the overhead of learning without model time (the scripted model answers at once),
against the real Neo4j and Redis of the current settings and real worker processes.

Run (test-profile stack, see bench/README.md)::

    python -m bench.learning_bench                 # 60 latency samples, 3+3 throughput runs of 200
    python -m bench.learning_bench --quick         # 20 latency samples, 3+3 runs of 40 (~1 minute)

What is measured:

* **Latency** — one execution at a time with one worker: the time from ``completeTurn`` (taken just
  before the call) to the committed memory change, i.e. the arrival of the ``botmemory:changes:<bot>``
  pub/sub message that ``apply_changes`` publishes right after its commit; with a breakdown from the
  execution's and the model call's timestamps (queue pickup, step preparation, model call, commit).
* **Throughput** — N prepared executions (one chat each, waiting on an open Turn with a confide) whose
  Turns are all completed at once; executions per second until every change is published, with one
  worker and with two, alternating the order across runs (1, 2, 2, 1, 1, 2, …).

The bench process serves the scripted model (``tests.model_server``) and starts its own workers
(``python -m learning.worker``) on a separate Redis database (``--redis-db``, default 5), so a test
suite running on the same stack (and its workers on database 0) never takes its jobs. Its workers run
without the sweeper (``BOTMEMORY_SWEEP_INTERVAL_SECONDS`` set to a day): the sweeper works on every
execution in Neo4j and would otherwise run the test suite's re-queued executions against this
process's model. Every run gets its own Organization, person and Bots (fresh ids; organization names
start with ``botmemory-learnbench-``), deleted at the end unless ``--keep`` is given.

Results: a markdown table printed and written to ``bench/learning-results.md`` (and into the marked
section of ``bench/README.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString, TypedDict, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from neo4j import AsyncManagedTransaction

from bench.memory_bench import ServerVersion, delete_bot_data, fmt_ms, log, machine, pct, verdict
from bench.report import machine_state, run_header, write_results
from graph.access import IdsRow
from graph.driver import read, rows, single, write
from graph.entries import CountRow
from graph.learning import ENDS
from learning.confide import confide
from learning.gateway import Gateway
from services import chats, provisioning
from services.bootstrap import open_runtime
from services.domain import Access, Principal
from services.runtime import Runtime
from services.settings import Settings, load_settings
from services.turns import complete_turn, start_turn
from tests.model_server import ModelServer, Reply, ToolCall
from tools.processes import WorkerProcess

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
ORG_PREFIX = "botmemory-learnbench-"
ADMIN = Principal("admin")
MODEL = "bench-model"
CHANGES_PATTERN = "botmemory:changes:*"

#: Target from the issue: completeTurn → committed memory change, median (ms).
T_LATENCY_MEDIAN = 100.0

#: Every learning step adds one fact resting on the person's first message of its chat (``i-1``).
LEARN_REPLY = Reply(
    tool_calls=[
        ToolCall(
            "add_fact",
            {
                "content": "The person prefers short benchmark reports.",
                "source_item_ids": ["i-1"],
                "topics": ["bench"],
            },
        )
    ]
)
CONFIDE_REPLY = Reply(text="ok")
MESSAGE = "I prefer short benchmark reports, please keep them brief."
CONFESSION = "I told the bot about my preferences for reports."

T = TypeVar("T")


def with_db(url: str, db: int) -> str:
    """The Redis URL with its database number replaced."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


async def bounded(limit: int, jobs: list[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run the jobs with at most ``limit`` at once; results in order."""
    sem = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await job()

    return await asyncio.gather(*(run(j) for j in jobs))


# --- workers -------------------------------------------------------------------------------------


class Workers:
    """The bench's worker processes; ``ensure(n)`` starts or stops workers until n run."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.running: list[WorkerProcess] = []
        self.started = 0

    async def ensure(self, n: int) -> None:
        while len(self.running) > n:
            w = self.running.pop()
            w.stop()
            log(f"  stopped worker pid {w.proc.pid}")
        fresh: list[WorkerProcess] = []
        while len(self.running) + len(fresh) < n:
            self.started += 1
            log_path = self.log_dir / f"learning-bench-worker-{self.started}.log"
            w = WorkerProcess(log_path, self.env, cwd=ROOT)
            fresh.append(w)
            self.running.append(w)  # stopped by stop_all even if it never becomes ready
        for w in fresh:
            deadline = time.monotonic() + 60
            while not w.ready():  # polled without blocking the bench's event loop
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not become ready; see {w.log_path}")
                await asyncio.sleep(0.1)
            log(f"  worker pid {w.proc.pid} ready (log {w.log_path})")

    def ids(self) -> set[str]:
        return {w.worker_id for w in self.running}

    def stop_all(self) -> None:
        while self.running:
            self.running.pop().stop()


# --- commit notifications (Redis pub/sub) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """One ``botmemory:changes:<bot>`` message as it arrived in this process."""

    perf: float  # time.perf_counter()
    wall_ms: float  # epoch milliseconds (comparable with the service's timestamps)
    version: int
    ids: tuple[str, ...]


class ChangeListener:
    """Timestamps every change message of the bench's Bots as soon as it arrives."""

    def __init__(self, url: str) -> None:
        self.client = aioredis.Redis.from_url(url)
        self.pubsub = self.client.pubsub()
        self.queues: dict[str, asyncio.Queue[Arrival]] = {}
        self.subscribed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.pubsub.psubscribe(CHANGES_PATTERN)
        self.task = asyncio.create_task(self._loop())
        await asyncio.wait_for(self.subscribed.wait(), 10)

    def watch(self, bot_id: str) -> asyncio.Queue[Arrival]:
        return self.queues.setdefault(bot_id, asyncio.Queue())

    async def _loop(self) -> None:
        messages = cast("AsyncIterator[dict[str, Any]]", self.pubsub.listen())
        async for msg in messages:
            kind = msg.get("type")
            if kind == "psubscribe":
                self.subscribed.set()
                continue
            if kind != "pmessage":
                continue
            perf, wall = time.perf_counter(), time.time() * 1000
            channel = msg["channel"]
            bot = (channel.decode() if isinstance(channel, bytes) else str(channel)).rsplit(":", 1)[-1]
            queue = self.queues.get(bot)
            if queue is None:
                continue  # not one of ours (e.g. a test suite on the same Redis)
            try:
                data: dict[str, Any] = json.loads(msg["data"])
            except (TypeError, ValueError):
                continue
            queue.put_nowait(Arrival(perf, wall, int(data.get("version", 0)), tuple(data.get("ids", ()))))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        with contextlib.suppress(Exception):
            await self.pubsub.punsubscribe()
            await self.pubsub.aclose()
        await self.client.aclose()


def drain(queue: asyncio.Queue[Arrival]) -> int:
    n = 0
    while not queue.empty():
        queue.get_nowait()
        n += 1
    return n


# --- the bench's world ---------------------------------------------------------------------------------


@dataclass
class World:
    """An Organization with a model, one person with WRITE on the Bots the bench creates."""

    gateway: Gateway
    org: str = ""
    person: str = ""
    bots: list[str] = field(default_factory=list[str])

    @property
    def principal(self) -> Principal:
        return Principal("person", person_id=self.person, organization_id=self.org)


async def make_world(rt: Runtime, gateway: Gateway, tag: str) -> World:
    world = World(gateway)
    org = await provisioning.create_organization(rt, ADMIN, f"{ORG_PREFIX}{tag}")
    world.org = org.id
    await provisioning.update_organization(
        rt, ADMIN, org.id, bot_memory=True, set_model=True, bot_memory_model=MODEL
    )
    person, _, _token = await provisioning.create_person(rt, ADMIN, org.id, "bench-person")
    world.person = person.id
    return world


async def new_bot(rt: Runtime, world: World, name: str) -> str:
    bot = await provisioning.create_bot(rt, ADMIN, world.org, name, None)
    await provisioning.grant_bot(rt, ADMIN, bot.id, world.person, Access.WRITE)
    world.bots.append(bot.id)
    return bot.id


@dataclass(frozen=True, slots=True)
class Prepared:
    bot: str
    chat: str
    turn: str


async def prepare(rt: Runtime, world: World, bot: str) -> Prepared:
    """A new chat with an open Turn (its first Item is ``i-1``) and a confide: one waiting execution."""
    principal = world.principal
    chat = await chats.create_chat(rt, principal, bot, channel_id=None, review=False, owner_id=None)
    turn = await start_turn(rt, principal, chat.id, MESSAGE, actor_id=None, notice=False)
    await confide(rt, world.gateway, principal, turn.id, CONFESSION)
    return Prepared(bot, chat.id, turn.id)


EXECUTIONS = """
MATCH (x:LearningExecution) WHERE x.turnId IN $turns
OPTIONAL MATCH (t:Turn {id: x.turnId})
OPTIONAL MATCH (c:ModelCall) WHERE c.executionId = x.id AND c.task = 'learn'
WITH x, t, c ORDER BY c.at
WITH x, t, collect(c)[0] AS c
RETURN x.turnId AS turn, x.status AS status, x.error AS error, x.epoch AS epoch, x.worker AS worker,
       x.queuedAt AS queuedAt, x.startedAt AS startedAt, x.endedAt AS endedAt, t.completedAt AS completedAt,
       c.at AS modelAt, c.attemptLog AS attemptLog
"""
#: ``at`` of a Change is taken when ``apply_changes`` starts, before its transaction.
CHANGES_AT = """
MATCH (c:Change) WHERE c.botId = $botId AND c.version IN $versions
RETURN c.version AS version, c.at AS at
"""
ENDED = """
MATCH (x:LearningExecution) WHERE x.turnId IN $turns AND x.status IN $ends
RETURN x.status AS status, count(*) AS n
"""


class ExecutionTimes(TypedDict):
    """EXECUTIONS: what is not set yet is None (``worker`` until claimed, ``modelAt`` and
    ``attemptLog`` without a learning call)."""

    turn: str
    status: str
    error: str | None
    epoch: int
    worker: str | None
    queuedAt: int | None
    startedAt: int | None
    endedAt: int | None
    completedAt: int | None
    modelAt: int | None
    attemptLog: list[str] | None


class _ChangeAt(TypedDict):
    version: int
    at: int


class _Ended(TypedDict):
    status: str
    n: int


async def executions(rt: Runtime, turns: list[str]) -> dict[str, ExecutionTimes]:
    found = await read(rt.driver, lambda tx: rows(tx, EXECUTIONS, ExecutionTimes, turns=turns))
    return {r["turn"]: r for r in found}


def model_ms(attempt_log: list[str] | None) -> float | None:
    """The duration of the successful attempt of a model call (``ok:<ms>ms``)."""
    for entry in attempt_log or []:
        m = re.fullmatch(r"ok:(\d+)ms", entry)
        if m:
            return float(m.group(1))
    return None


# --- latency -----------------------------------------------------------------------------------------------

SEGMENTS = (
    ("total", "completeTurn → change message (total)"),
    ("complete", "completeTurn call (tx: complete, queue the execution; enqueue on arq)"),
    ("pickup", "completeTurn returned → worker starts the job (arq poll every 50 ms, job start)"),
    ("prepare", "job start → model request (claim tx, route, read position, evidence, learningContext)"),
    ("model", "model call (scripted, answers at once: HTTP + openai client)"),
    ("save", "model answered → apply_changes starts (save the ModelCall + Spend tx, validate)"),
    ("lock", "apply_changes starts → step CAS (begin tx, bump version = lock the Memory)"),
    ("apply", "step CAS → change message (CAS, write the fact + change log, commit, publish, delivery)"),
)


@dataclass
class LatencySample:
    total: float
    complete: float
    t0_wall: float
    returned_wall: float
    arrival_wall: float
    turn: str
    version: int


async def measure_latency(
    rt: Runtime,
    world: World,
    listener: ChangeListener,
    samples: int,
    warmup: int,
    settle: float,
    notes: list[str],
) -> dict[str, list[float]]:
    """One execution at a time (one worker running): completeTurn → pub/sub message, with a breakdown."""
    bot = await new_bot(rt, world, "latency-bot")
    queue = listener.watch(bot)
    taken: list[LatencySample] = []
    missing = 0
    for k in range(warmup + samples):
        p = await prepare(rt, world, bot)
        drain(queue)
        await asyncio.sleep(settle)  # let the preparation's work (Neo4j, the worker's logging) settle
        t0_wall = time.time() * 1000
        t0 = time.perf_counter()
        await complete_turn(rt, world.principal, p.turn)
        returned = time.perf_counter()
        returned_wall = time.time() * 1000
        try:
            arrival = await asyncio.wait_for(queue.get(), 15)
        except TimeoutError:
            missing += 1
            log(f"  latency sample {k}: no change message within 15 s")
            continue
        if k < warmup:
            continue
        taken.append(
            LatencySample(
                (arrival.perf - t0) * 1000,
                (returned - t0) * 1000,
                t0_wall,
                returned_wall,
                arrival.wall_ms,
                p.turn,
                arrival.version,
            )
        )
    if missing:
        notes.append(f"latency: {missing} execution(s) published no change within 15 s")
    found = await executions(rt, [s.turn for s in taken])
    versions = [s.version for s in taken]
    change_rows = await read(
        rt.driver, lambda tx: rows(tx, CHANGES_AT, _ChangeAt, botId=bot, versions=versions)
    )
    change_at = {int(r["version"]): float(r["at"]) for r in change_rows}
    seg: dict[str, list[float]] = {name: [] for name, _ in SEGMENTS}
    not_done = 0
    for s in taken:
        seg["total"].append(s.total)
        seg["complete"].append(s.complete)
        x = found.get(s.turn)
        if x is None or x["status"] != "done" or x["startedAt"] is None or x["endedAt"] is None:
            not_done += 1
            continue
        started, ended = float(x["startedAt"]), float(x["endedAt"])
        seg["pickup"].append(started - s.returned_wall)
        seg["apply"].append(s.arrival_wall - ended)
        applying = change_at.get(s.version)
        if applying is not None:
            seg["lock"].append(ended - applying)
        mm = model_ms(x["attemptLog"])
        if x["modelAt"] is not None and mm is not None:
            model_end = float(x["modelAt"])
            seg["prepare"].append(model_end - mm - started)
            seg["model"].append(mm)
            if applying is not None:
                seg["save"].append(applying - model_end)
    if not_done:
        notes.append(f"latency: {not_done} sampled execution(s) did not end `done`")
    return seg


# --- CPU accounting ----------------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far; 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, /proc/stat)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


def pid_of(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class CpuProbe:
    """CPU seconds of the workers, Neo4j, Redis, this process and the machine over a window."""

    pids: dict[str, list[int]]
    start: dict[str, float] = field(default_factory=dict[str, float])

    def snapshot(self) -> dict[str, float]:
        snap = {name: sum(proc_cpu(p) for p in pids) for name, pids in self.pids.items()}
        snap["bench"] = time.process_time()
        snap["machine"] = machine_busy()
        return snap

    def begin(self) -> None:
        self.start = self.snapshot()

    def end(self) -> dict[str, float]:
        now = self.snapshot()
        used = {k: now[k] - self.start.get(k, now[k]) for k in now}
        used["other"] = max(0.0, used["machine"] - sum(v for k, v in used.items() if k != "machine"))
        return used


CPU_PARTS = ("workers", "neo4j", "redis", "bench", "other")


# --- throughput ------------------------------------------------------------------------------------------


@dataclass
class ThroughputRun:
    index: int
    workers: int
    executions: int
    bots: int
    elapsed: float = 0.0  # seconds from the first completeTurn to the last change message
    completes: float = 0.0  # seconds until every completeTurn returned
    prep: float = 0.0
    published: int = 0
    statuses: dict[str, int] = field(default_factory=dict[str, int])
    queue_wait: list[float] = field(default_factory=list[float])  # queuedAt → startedAt (ms)
    run_time: list[float] = field(default_factory=list[float])  # startedAt → endedAt (ms)
    by_worker: list[int] = field(default_factory=list[int])
    foreign: int = 0  # executions claimed by a worker not started by the bench, or re-queued (epoch > 0)
    cpu: dict[str, float] = field(default_factory=dict[str, float])  # CPU seconds over the window
    window: float = 0.0  # seconds the CPU was measured over (≈ elapsed)
    attempt: int = 1

    @property
    def rate(self) -> float:
        return self.published / self.elapsed if self.elapsed else 0.0

    @property
    def clean(self) -> bool:
        """Every execution ran on the bench's workers in its first epoch and published its change."""
        return self.foreign == 0 and self.published == self.executions

    def share(self, part: str) -> float:
        """A part's CPU as a share of the machine's capacity over the window (0..1)."""
        if not self.cpu or not self.window:
            return math.nan
        return self.cpu[part] / (self.window * (os.cpu_count() or 1))


async def measure_throughput(
    rt: Runtime,
    world: World,
    listener: ChangeListener,
    workers: Workers,
    run: ThroughputRun,
    args: argparse.Namespace,
    run_dir: Path,
) -> None:
    """Complete N prepared Turns at once; executions/s until every change message arrived."""
    bots = [await new_bot(rt, world, f"tp-bot-{run.index}-{b}") for b in range(run.bots)]
    queues = [listener.watch(b) for b in bots]
    t = time.perf_counter()
    prepared = await bounded(
        args.prep_concurrency,
        [lambda i=i: prepare(rt, world, bots[i % len(bots)]) for i in range(run.executions)],
    )
    run.prep = time.perf_counter() - t
    turns = [p.turn for p in prepared]
    for q in queues:
        drain(q)
    await asyncio.sleep(0.2)
    probe = CpuProbe(
        {
            "workers": [w.proc.pid for w in workers.running],
            "neo4j": [p for p in (pid_of(run_dir / "neo4j.pid"),) if p is not None],
            "redis": [p for p in (pid_of(run_dir / "redis.pid"),) if p is not None],
        }
    )
    probe.begin()
    started = time.perf_counter()
    sem = asyncio.Semaphore(args.concurrency)

    async def complete(turn: str) -> None:
        async with sem:
            await complete_turn(rt, world.principal, turn)

    completing = asyncio.gather(*(complete(turn) for turn in turns))
    last = started

    def collect() -> None:
        nonlocal last
        for q in queues:
            while not q.empty():
                last = q.get_nowait().perf
                run.published += 1

    next_check = started + 0.5
    deadline = started + max(60.0, run.executions * 0.5)
    while run.published < run.executions:
        collect()
        now = time.perf_counter()
        if completing.done() and not run.completes:
            completing.result()
            run.completes = now - started
        if now >= next_check and run.published < run.executions:
            # Executions that fail, or that another worker ran, publish nothing: stop when all ended.
            next_check = now + 0.5
            ended = await read(rt.driver, lambda tx: rows(tx, ENDED, _Ended, turns=turns, ends=list(ENDS)))
            if sum(int(r["n"]) for r in ended) >= run.executions:
                await asyncio.sleep(0.05)
                collect()
                break
        if now > deadline:
            log(f"  run {run.index}: gave up after {now - started:.0f} s ({run.published} published)")
            break
        await asyncio.sleep(0.005)
    run.cpu = probe.end()
    run.window = time.perf_counter() - started
    await completing
    if not run.completes:
        run.completes = time.perf_counter() - started
    run.elapsed = last - started
    mine = workers.ids()
    found = await executions(rt, turns)
    per_worker: dict[str, int] = {}
    for x in found.values():
        status = str(x["status"])
        run.statuses[status] = run.statuses.get(status, 0) + 1
        if x["worker"] not in mine or int(x["epoch"] or 0) > 0:
            run.foreign += 1
        if x["worker"] is not None:
            per_worker[str(x["worker"])] = per_worker.get(str(x["worker"]), 0) + 1
        if x["startedAt"] is not None and x["queuedAt"] is not None:
            run.queue_wait.append(float(x["startedAt"]) - float(x["queuedAt"]))
        if x["startedAt"] is not None and x["endedAt"] is not None:
            run.run_time.append(float(x["endedAt"]) - float(x["startedAt"]))
    run.by_worker = sorted(per_worker.values(), reverse=True)


# --- cleanup --------------------------------------------------------------------------------------------

DELETE_BATCH = 5000
LEARNING_NODES = (
    "MATCH (x:LearningExecution) WHERE x.botId = $bot WITH x LIMIT $batch DETACH DELETE x RETURN count(*) AS n",
    "MATCH (c:Confession {botId: $bot}) WITH c LIMIT $batch DETACH DELETE c RETURN count(*) AS n",
    "MATCH (c:ModelCall {botId: $bot}) WITH c LIMIT $batch DETACH DELETE c RETURN count(*) AS n",
    "MATCH (s:Spend) WHERE s.botId = $bot WITH s LIMIT $batch DETACH DELETE s RETURN count(*) AS n",
    "MATCH (p:ReadPosition) WHERE p.botId = $bot WITH p LIMIT $batch DETACH DELETE p RETURN count(*) AS n",
)


async def delete_world(rt: Runtime, org_id: str) -> None:
    """Delete the learning nodes of the Organization's Bots, then everything else (as memory_bench)."""
    q_bots = "MATCH (b:Bot)-[:OWNED_BY]->(:Organization {id: $org}) RETURN collect(b.id) AS ids"
    record = await read(rt.driver, lambda tx: single(tx, q_bots, IdsRow, org=org_id))
    bots: list[str] = [] if record is None else list(record["ids"])
    for bot in bots:
        for query in LEARNING_NODES:
            while True:

                async def work(
                    tx: AsyncManagedTransaction, query: LiteralString = query, bot: str = bot
                ) -> int:
                    r = await single(tx, query, CountRow, bot=bot, batch=DELETE_BATCH)
                    return 0 if r is None else int(r["n"])

                if await write(rt.driver, work) < DELETE_BATCH:
                    break
    await delete_bot_data(rt, org_id)


async def purge_leftovers(rt: Runtime) -> int:
    q = "MATCH (o:Organization) WHERE o.name STARTS WITH $prefix RETURN collect(o.id) AS ids"
    record = await read(rt.driver, lambda tx: single(tx, q, IdsRow, prefix=ORG_PREFIX))
    orgs: list[str] = [] if record is None else list(record["ids"])
    for org in orgs:
        await delete_world(rt, org)
    return len(orgs)


# --- report ------------------------------------------------------------------------------------------------


def fmt_rate(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def share(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:.0f}%"


def busy_of(r: ThroughputRun) -> str:
    return share(r.share("machine"))


def report(
    seg: dict[str, list[float]],
    runs: list[ThroughputRun],
    info: dict[str, str],
    args: argparse.Namespace,
    elapsed: float,
    extra: dict[str, Any],
) -> str:
    lines: list[str] = []
    add = lines.append
    add(
        run_header(
            "bench.learning_bench",
            info,
            f"Neo4j {extra.get('neo4j', '?')}, Redis {extra.get('redis', '?')}",
            args.label,
            extra,
            elapsed,
        )
    )

    total = seg.get("total", [])
    add("### Target")
    add("")
    add("| target | measured | result |")
    add("|---|---|---|")
    if total:
        add(
            f"| completeTurn → committed memory change, median ≤ {T_LATENCY_MEDIAN:g} ms | "
            f"{fmt_ms(pct(total, 0.5))} ms (p95 {fmt_ms(pct(total, 0.95))} ms, n={len(total)}) | "
            f"{verdict(pct(total, 0.5) <= T_LATENCY_MEDIAN)} |"
        )
    else:
        add(f"| completeTurn → committed memory change, median ≤ {T_LATENCY_MEDIAN:g} ms | not run | n/a |")
    add("")

    if total:
        add(f"### Latency (ms): one execution at a time, 1 worker, n={len(total)}")
        add("")
        add(
            "Each sample prepares a chat (Turn + confide), waits "
            f"{1000 * args.settle:g} ms, then times its execution. Total = from just before `completeTurn` to the arrival of the `botmemory:changes:<bot>` message "
            "that `apply_changes` publishes right after its commit. The parts come from service timestamps "
            "(whole ms, the same machine's clock): the execution's `startedAt` (job start, before the claim) "
            "and `endedAt` (the step's compare-and-set inside `apply_changes`' transaction), the learning "
            "`ModelCall` (`at`, and its attempt's duration), the `Change` (`at`: when `apply_changes` "
            "starts); and from this process's clock. Each part's median is taken on its own, so the "
            "medians need not add up to the total's. "
            f"{sum(1 for v in total if v <= T_LATENCY_MEDIAN)} of {len(total)} samples ≤ {T_LATENCY_MEDIAN:g} ms."
        )
        add("")
        add("| part | n | median | p95 | p99 | min | max |")
        add("|---|---:|---:|---:|---:|---:|---:|")
        for name, label in SEGMENTS:
            v = seg.get(name, [])
            if not v:
                continue
            add(
                f"| {label} | {len(v)} | {fmt_ms(pct(v, 0.5))} | {fmt_ms(pct(v, 0.95))} | "
                f"{fmt_ms(pct(v, 0.99))} | {fmt_ms(min(v))} | {fmt_ms(max(v))} |"
            )
        add("")

    if runs:
        add("### Throughput: executions per second")
        add("")
        add(
            f"Each run prepares {runs[0].executions} executions (one chat each: a Turn, a confide; "
            f"spread over {runs[0].bots} fresh Bot(s)), then completes all Turns at once "
            f"({args.concurrency} `completeTurn` calls in flight) and counts until every change message "
            "arrived. Runs alternate 1 and 2 workers (1, 2, 2, 1, …); each worker runs up to 10 jobs at "
            "once (arq `max_jobs`). Queue wait = `queuedAt` → `startedAt`; run = `startedAt` → `endedAt`. "
            "Medians over the clean runs (every execution ran on the bench's workers in its first epoch "
            "and published its change; a run that is not clean is repeated up to "
            f"{args.retries} time(s) and, if still not clean, left out)."
        )
        add("")
        add(
            "| workers | clean runs | median executions/s | min | max | median elapsed (s) | "
            "median queue wait (ms) | median run (ms) |"
        )
        add("|---:|---:|---:|---:|---:|---:|---:|---:|")
        medians: dict[int, float] = {}
        for k in sorted({r.workers for r in runs}):
            rs = [r for r in runs if r.workers == k and r.clean]
            if not rs:
                add(f"| {k} | 0 | – | – | – | – | – | – |")
                continue
            rates = [r.rate for r in rs]
            medians[k] = pct(rates, 0.5)
            waits = [v for r in rs for v in r.queue_wait]
            runs_ms = [v for r in rs for v in r.run_time]
            add(
                f"| {k} | {len(rs)} | **{fmt_rate(medians[k])}** | {fmt_rate(min(rates))} | "
                f"{fmt_rate(max(rates))} | {pct([r.elapsed for r in rs], 0.5):.2f} | "
                f"{fmt_ms(pct(waits, 0.5))} | {fmt_ms(pct(runs_ms, 0.5))} |"
            )
        add("")
        if 1 in medians and 2 in medians and medians[1] > 0:
            add(f"2 workers / 1 worker: **{medians[2] / medians[1]:.2f}×**.")
            add("")
        cores = os.cpu_count() or 1
        add(
            f"CPU over each run (from `/proc`; the machine has {cores} cores): busy = the whole machine's "
            "busy time / (run time × cores); per execution = CPU ms of each part / executions (`other` = "
            "every other process, e.g. a test suite; `bench` = this process: the `completeTurn` calls, the "
            "scripted model, the listener). Medians over the clean runs."
        )
        add("")
        add(
            "| workers | machine busy | other processes | CPU ms / execution: workers | Neo4j | Redis | "
            "bench | other | total |"
        )
        add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in sorted({r.workers for r in runs}):
            rs = [r for r in runs if r.workers == k and r.clean and r.cpu]
            if not rs:
                continue
            per = {part: pct([1000 * r.cpu[part] / r.published for r in rs], 0.5) for part in CPU_PARTS}
            total_ms = pct([1000 * r.cpu["machine"] / r.published for r in rs], 0.5)
            add(
                f"| {k} | {share(pct([r.share('machine') for r in rs], 0.5))} | "
                f"{share(pct([r.share('other') for r in rs], 0.5))} | "
                + " | ".join(fmt_ms(per[part]) for part in CPU_PARTS)
                + f" | {fmt_ms(total_ms)} |"
            )
        add("")
        add(
            "| run | workers | executions | prepare (s) | all completeTurn returned (s) | elapsed (s) | "
            "executions/s | queue wait median / p95 (ms) | run median / p95 (ms) | machine busy | other "
            "processes | per worker | statuses | clean |"
        )
        add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
        for r in runs:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items()))
            add(
                f"| {r.index}{'' if r.attempt == 1 else f' (try {r.attempt})'} | {r.workers} | {r.executions} | "
                f"{r.prep:.1f} | {r.completes:.2f} | {r.elapsed:.2f} | {fmt_rate(r.rate)} | "
                f"{fmt_ms(pct(r.queue_wait, 0.5))} / {fmt_ms(pct(r.queue_wait, 0.95))} | "
                f"{fmt_ms(pct(r.run_time, 0.5))} / {fmt_ms(pct(r.run_time, 0.95))} | {busy_of(r)} | "
                f"{share(r.share('other'))} | {' + '.join(str(n) for n in r.by_worker)} | {statuses} | "
                f"{'yes' if r.clean else f'no ({r.foreign} foreign)'} |"
            )
        add("")
    notes: list[str] = list(extra.get("notes", []))
    quiet: list[str] = list(extra.get("quiet", []))
    loud = [q for q in quiet if ": not quiet" in q]
    waited = [q for q in quiet if "after" in q and ": quiet" in q]
    if quiet:
        notes.append(
            f"before each measurement the bench waited (up to {args.wait_quiet:g} s) for no other live worker "
            f"and a machine below {100 * QUIET_BUSY:.0f}% busy: {len(quiet) - len(loud)} of {len(quiet)} "
            f"quiet ({len(waited)} after waiting)" + ("; " + "; ".join(loud) if loud else "")
        )
    foreign = sum(r.foreign for r in runs)
    if foreign:
        notes.append(
            f"throughput: {foreign} execution(s) were claimed by another worker or re-queued by a sweeper "
            "(a test suite's sweeper queues executions of Turns idle for 4 s and re-queues executions "
            "queued for 3 s, on every Bot); their runs are not clean"
        )
    if notes:
        add("Notes:")
        for n in notes:
            add(f"- {n}")
        add("")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------------------


def worker_env(settings: Settings, server: ModelServer) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OPENAI_BASE_URL=server.base_url,
        OPENAI_API_KEY="sk-bench",
        BOTMEMORY_REDIS_URL=settings.redis_url,
        BOTMEMORY_SWEEP_INTERVAL_SECONDS="86400",  # no sweeper: it would act on other suites' executions
    )
    return env


def run_order(runs: int) -> list[int]:
    """1, 2, 2, 1, 1, 2, …: each pair of runs side by side, alternating which goes first."""
    order: list[int] = []
    for r in range(runs):
        order += [1, 2] if r % 2 == 0 else [2, 1]
    return order


async def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    base_url = os.environ.get("BOTMEMORY_REDIS_URL", "redis://127.0.0.1:6379/0")
    os.environ["BOTMEMORY_REDIS_URL"] = with_db(base_url, args.redis_db)
    server = ModelServer().start()
    server.default("learn", LEARN_REPLY)
    server.default("confide", CONFIDE_REPLY)
    os.environ["OPENAI_BASE_URL"] = server.base_url
    os.environ["OPENAI_API_KEY"] = "sk-bench"
    settings = load_settings()
    info = machine()
    extra: dict[str, Any] = {
        "load_before": machine_state(),
        "notes": [],
        "quiet": [],
    }
    workers = Workers(worker_env(settings, server), settings.data_dir / "logs")
    run_dir = settings.data_dir / "run"
    listener = ChangeListener(settings.redis_url)
    seg: dict[str, list[float]] = {}
    runs: list[ThroughputRun] = []
    worlds: list[World] = []
    try:
        async with open_runtime(settings) as rt, Gateway(settings) as gateway:
            comp = await read(
                rt.driver,
                lambda tx: single(
                    tx, "CALL dbms.components() YIELD versions RETURN versions[0] AS v", ServerVersion
                ),
            )
            extra["neo4j"] = "?" if comp is None else comp["v"]
            server_info: dict[str, Any] = await rt.redis.info("server")
            extra["redis"] = str(server_info.get("redis_version", "?"))
            queued = int(await rt.redis.zcard("arq:queue"))
            if queued:
                extra["notes"].append(
                    f"{queued} job(s) were left in the queue of db {args.redis_db} at the start"
                )
            log(
                f"Neo4j {extra['neo4j']} at {settings.neo4j_uri}; Redis {settings.redis_url}; "
                f"model server {server.base_url}"
            )
            if args.purge_leftovers:
                n = await purge_leftovers(rt)
                log(f"deleted the data of {n} earlier learning-bench organization(s)")
            await listener.start()
            tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            world = await make_world(rt, gateway, tag)
            worlds.append(world)
            try:
                if args.latency_samples > 0:
                    log(f"latency: {args.latency_samples} executions one at a time, 1 worker")
                    await workers.ensure(1)
                    quiet = await wait_quiet(settings.redis_url, args)
                    extra["quiet"].append(f"latency: {quiet}")
                    probe = CpuProbe(
                        {
                            "workers": [w.proc.pid for w in workers.running],
                            "neo4j": [p for p in (pid_of(run_dir / "neo4j.pid"),) if p is not None],
                            "redis": [p for p in (pid_of(run_dir / "redis.pid"),) if p is not None],
                        }
                    )
                    probe.begin()
                    t_lat = time.perf_counter()
                    seg = await measure_latency(
                        rt, world, listener, args.latency_samples, args.warmup, args.settle, extra["notes"]
                    )
                    cpu = probe.end()
                    window = (time.perf_counter() - t_lat) * (os.cpu_count() or 1)
                    extra["notes"].append(
                        "latency phase CPU (incl. preparing each chat): machine busy "
                        f"{100 * cpu['machine'] / window:.0f}%, of which other processes "
                        f"{100 * cpu['other'] / window:.0f}%"
                    )
                    total = seg["total"]
                    log(
                        f"  median {fmt_ms(pct(total, 0.5))} ms, p95 {fmt_ms(pct(total, 0.95))} ms, "
                        f"p99 {fmt_ms(pct(total, 0.99))} ms"
                    )
                if args.runs > 0 and args.executions > 0:
                    order = run_order(args.runs)
                    log(f"throughput: {len(order)} runs of {args.executions} executions, workers {order}")
                    for i, k in enumerate(order, 1):
                        await workers.ensure(k)
                        for attempt in range(1, args.retries + 2):
                            quiet = await wait_quiet(settings.redis_url, args)
                            extra["quiet"].append(f"run {i} try {attempt}: {quiet}")
                            tp = ThroughputRun(i, k, args.executions, args.bots, attempt=attempt)
                            await measure_throughput(rt, world, listener, workers, tp, args, run_dir)
                            runs.append(tp)
                            log(
                                f"  run {i} try {attempt}: {k} worker(s): {tp.published}/{tp.executions} in "
                                f"{tp.elapsed:.2f} s = {fmt_rate(tp.rate)}/s (prepare {tp.prep:.1f} s, completes "
                                f"{tp.completes:.2f} s, per worker {tp.by_worker}, foreign {tp.foreign}, "
                                f"machine busy {busy_of(tp)}, other processes {share(tp.share('other'))})"
                            )
                            if tp.clean:
                                break
            finally:
                workers.stop_all()
                await listener.close()
                for w in worlds:
                    if args.keep:
                        log(f"kept organization {w.org} (bots {', '.join(w.bots)})")
                    else:
                        t = time.perf_counter()
                        await delete_world(rt, w.org)
                        log(f"deleted organization {w.org} in {time.perf_counter() - t:.1f} s")
    finally:
        workers.stop_all()
        server.stop()
    extra["load_after"] = machine_state()
    elapsed = time.perf_counter() - started
    table = report(seg, runs, info, args, elapsed, extra)
    out = Path(args.out)
    write_results(
        table,
        out,
        title="Learning benchmark results",
        section="learning-bench",
        update_readme=not args.no_readme,
    )
    print(table)
    log(f"done in {elapsed / 60:.1f} min; results in {out}")
    return 0


HEARTBEAT_KEY = "botmemory:worker:heartbeat"
QUIET_BUSY = 0.25  # the machine counts as quiet below this share of its CPU capacity


async def live_workers(url: str, own_db: int) -> list[int]:
    """Redis databases other than the bench's where a worker wrote its heartbeat in the last 40 s
    (workers write it every 30 s; e.g. a test suite's workers on database 0)."""
    client = aioredis.Redis.from_url(with_db(url, own_db))
    try:
        keyspace: dict[str, Any] = await client.info("keyspace")
    finally:
        await client.aclose()
    alive: list[int] = []
    for name in keyspace:
        if not name.startswith("db") or not name[2:].isdigit() or int(name[2:]) == own_db:
            continue
        other = aioredis.Redis.from_url(with_db(url, int(name[2:])))
        try:
            beat = await other.get(HEARTBEAT_KEY)
        finally:
            await other.aclose()
        with contextlib.suppress(TypeError, ValueError):
            if beat is not None and time.time() - int(beat) / 1000 <= 40:
                alive.append(int(name[2:]))
    return alive


async def wait_quiet(url: str, args: argparse.Namespace) -> str:
    """Wait up to ``--wait-quiet`` seconds until no other worker is alive (their sweepers would take
    the bench's executions) and the machine is mostly idle; returns how it went."""
    t0 = time.monotonic()
    told = False
    while True:
        before = machine_busy()
        await asyncio.sleep(1.0)
        busy = (machine_busy() - before) / (os.cpu_count() or 1)
        alive = await live_workers(url, args.redis_db)
        waited = time.monotonic() - t0
        if not alive and busy < QUIET_BUSY:
            return f"quiet after {waited:.0f} s of waiting" if told else "quiet"
        state = f"workers alive on Redis db {alive}, " if alive else ""
        state += f"machine {100 * busy:.0f}% busy"
        if waited >= args.wait_quiet:
            return f"not quiet after {waited:.0f} s ({state})"
        if not told:
            log(f"  waiting for the stack to be quiet ({state}; up to {args.wait_quiet:.0f} s)")
            told = True


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.learning_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--latency-samples", type=int, default=60, help="timed single executions (1 worker)")
    p.add_argument("--warmup", type=int, default=5, help="untimed executions before the latency samples")
    p.add_argument(
        "--settle", type=float, default=0.1, help="seconds between preparing a latency sample and timing it"
    )
    p.add_argument("--executions", type=int, default=200, help="executions per throughput run")
    p.add_argument("--runs", type=int, default=3, help="throughput runs per worker count (1 and 2)")
    p.add_argument(
        "--bots", type=int, default=1, help="fresh Bots each throughput run spreads its chats over"
    )
    p.add_argument("--concurrency", type=int, default=20, help="completeTurn calls in flight")
    p.add_argument("--prep-concurrency", type=int, default=8, help="chats prepared at once")
    p.add_argument("--redis-db", type=int, default=5, help="Redis database of the bench's queue and workers")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=300,
        help="seconds to wait before each measurement for no other live worker and an idle machine",
    )
    p.add_argument("--retries", type=int, default=2, help="repeats of a throughput run that is not clean")
    p.add_argument("--label", default="", help="what code is measured (shown instead of the commit)")
    p.add_argument("--quick", action="store_true", help="20 latency samples, 3+3 runs of 40 executions")
    p.add_argument("--keep", action="store_true", help="keep the bench's data (default: delete it)")
    p.add_argument("--purge-leftovers", action="store_true", help="first delete data of earlier runs")
    p.add_argument("--out", default=str(BENCH_DIR / "learning-results.md"))
    p.add_argument("--no-readme", action="store_true", help="do not update the table in bench/README.md")
    args = p.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.quick:
        if "--latency-samples" not in given:
            args.latency_samples = 20
        if "--executions" not in given:
            args.executions = 40
        if "--warmup" not in given:
            args.warmup = 3
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
