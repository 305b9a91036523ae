"""What the benchmarks share: statistics and formatting, the timed loops (a checked call beside
its unchecked raw read, or one call), and the round-trip breakdown of a profiled call (Cypher
statements, transactions, the server's own time, AES-GCM time and the rest)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY

from services.crypto import Cipher, Kind


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- statistics --------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation between closest ranks (q in 0..1)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt_ms(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "–"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def fmt_ratio(v: float | None) -> str:
    return "–" if v is None or math.isnan(v) or math.isinf(v) else f"{v:.2f}×"


# --- instrumentation (round-trip breakdown) -------------------------------------------------------


@dataclass
class Probe:
    results: list[Any] = field(default_factory=list[Any])
    transactions: int = 0
    decrypt_seconds: float = 0.0
    decrypts: int = 0

    def server_ms(self) -> float:
        total = 0.0
        for r in self.results:
            md: dict[str, Any] = getattr(r, "_metadata", {}) or {}
            total += float(md.get("t_first", 0) or 0) + float(md.get("t_last", 0) or 0)
        return total


@contextlib.contextmanager
def probing() -> Generator[Probe]:
    """Count Bolt queries and transactions (explicit and auto-commit), sum Neo4j's own time from
    the result summaries (``result_available_after`` + ``result_consumed_after``), and time
    decryptions (one at a time and in batches: entries, vectors)."""
    from neo4j import AsyncSession
    from neo4j._async.work import transaction as txmod  # the driver's transaction class

    probe = Probe()
    base: Any = txmod.AsyncTransactionBase
    session: Any = AsyncSession
    cipher: Any = Cipher
    orig_run, orig_begin, orig_autocommit = base.run, base._begin, session.run
    decrypts = ("decrypt", "decrypt_all", "decrypt_bytes", "decrypt_bytes_all")
    originals: dict[str, Callable[..., Any]] = {name: getattr(cipher, name) for name in decrypts}

    async def run(self: Any, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
        result = await orig_run(self, query, parameters, **kwargs)
        probe.results.append(result)
        return result

    async def begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe.transactions += 1
        return await orig_begin(self, *args, **kwargs)

    async def autocommit(self: Any, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
        probe.transactions += 1
        result = await orig_autocommit(self, query, parameters, **kwargs)
        probe.results.append(result)
        return result

    def timed(orig: Callable[..., Any], batch: bool) -> Callable[..., Any]:
        def decrypt(self: Cipher, kind: Kind, *args: Any) -> Any:
            t = time.perf_counter()
            try:
                return orig(self, kind, *args)
            finally:
                probe.decrypt_seconds += time.perf_counter() - t
                probe.decrypts += len(args[0]) if batch else 1

        return decrypt

    base.run, base._begin, session.run = run, begin, autocommit
    for name in decrypts:
        setattr(cipher, name, timed(originals[name], name.endswith("_all")))
    try:
        yield probe
    finally:
        base.run, base._begin, session.run = orig_run, orig_begin, orig_autocommit
        for name in decrypts:
            setattr(cipher, name, originals[name])


@dataclass
class Breakdown:
    total_ms: float
    queries: float
    transactions: float
    server_ms: float
    decrypt_ms: float

    @property
    def other_ms(self) -> float:
        return max(0.0, self.total_ms - self.server_ms - self.decrypt_ms)


async def breakdown(call: Callable[[], Awaitable[Any]], times: int) -> Breakdown:
    parts: list[Breakdown] = []
    for _ in range(times):
        with probing() as probe:
            t = time.perf_counter()
            await call()
            total = (time.perf_counter() - t) * 1000
        parts.append(
            Breakdown(
                total,
                len(probe.results),
                probe.transactions,
                probe.server_ms(),
                probe.decrypt_seconds * 1000,
            )
        )
    mid = sorted(parts, key=lambda b: b.total_ms)[len(parts) // 2]
    return mid


# --- measurements --------------------------------------------------------------------------------


def entry_decryptions() -> float:
    return REGISTRY.get_sample_value("botmemory_decryptions_total", {"kind": "entry"}) or 0.0


@dataclass
class Row:
    size: int
    op: str
    reader: str
    samples: list[float]
    returned: list[int] = field(default_factory=list[int])
    decrypts: list[float] = field(default_factory=list[float])
    unchecked: list[float] = field(default_factory=list[float])
    checked_bd: Breakdown | None = None
    unchecked_bd: Breakdown | None = None
    note: str = ""
    #: The median of each separate run, when the measurement was repeated (``samples`` holds them all).
    run_medians: list[float] = field(default_factory=list[float])

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median_of_runs(self) -> float:
        """The median of the runs' medians (of all samples when it ran once)."""
        return pct(self.run_medians, 0.5) if self.run_medians else self.median

    @property
    def median(self) -> float:
        return pct(self.samples, 0.5)

    @property
    def p95(self) -> float:
        return pct(self.samples, 0.95)

    @property
    def p99(self) -> float:
        return pct(self.samples, 0.99)

    @property
    def ratio(self) -> float | None:
        if not self.unchecked:
            return None
        u = pct(self.unchecked, 0.5)
        return math.inf if u <= 0 else self.median / u

    @property
    def decrypt_mismatches(self) -> int:
        return sum(1 for r, d in zip(self.returned, self.decrypts, strict=False) if r != d)


#: The measurements of a run, in order; ``--phases`` picks some (for experiments).


@dataclass
class BenchSettings:
    runs: int
    fanout_runs: int
    budget: float
    min_runs: int
    warmup: int
    profile_calls: int
    subscribers: int
    same_operation_only: bool = False

    def keep_going(self, n: int, runs: int, elapsed: float, factor: float = 1.0) -> bool:
        """Up to ``runs`` samples within the time budget; at least ``min_runs`` unless that takes
        more than three budgets (very slow calls)."""
        if n >= runs:
            return False
        if n < self.min_runs:
            return n == 0 or elapsed < 3 * self.budget * factor
        return elapsed < self.budget * factor


async def measure_pair(
    size: int,
    op: str,
    reader: str,
    checked: Callable[[], Awaitable[int]],
    unchecked: Callable[[], Awaitable[Any]] | None,
    s: BenchSettings,
) -> Row:
    """Alternate the checked read and the unchecked raw read in one loop (same run, same cache)."""
    for _ in range(s.warmup):
        t = time.perf_counter()
        await checked()
        if unchecked is not None:
            await unchecked()
        if time.perf_counter() - t > 1.0:  # slow calls: one warm-up is enough
            break
    row = Row(size, op, reader, [])
    started = time.perf_counter()
    i = 0
    while s.keep_going(row.n, s.runs, time.perf_counter() - started):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                before = entry_decryptions()
                t = time.perf_counter()
                returned = await checked()
                row.samples.append((time.perf_counter() - t) * 1000)
                row.decrypts.append(entry_decryptions() - before)
                row.returned.append(returned)
            elif unchecked is not None:
                t = time.perf_counter()
                await unchecked()
                row.unchecked.append((time.perf_counter() - t) * 1000)
        i += 1
    times = s.profile_calls if row.median < 1000 else 1
    row.checked_bd = await breakdown(checked, times)
    if unchecked is not None:
        row.unchecked_bd = await breakdown(unchecked, times)
    return row


async def measure_calls(
    size: int, op: str, call: Callable[[int], Awaitable[Any]], s: BenchSettings, runs: int | None = None
) -> Row:
    for k in range(s.warmup):
        await call(-1 - k)
    row = Row(size, op, "most", [])
    started = time.perf_counter()
    limit = runs or s.runs
    while s.keep_going(row.n, limit, time.perf_counter() - started):
        t = time.perf_counter()
        await call(row.n)
        row.samples.append((time.perf_counter() - t) * 1000)
    row.checked_bd = await breakdown(lambda: call(10_000 + row.n), s.profile_calls)
    return row


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "**FAIL**")


def find(rows_: list[Row], size: int, op: str, reader: str | None = None) -> Row | None:
    for r in rows_:
        if r.size == size and r.op.startswith(op) and (reader is None or r.reader == reader):
            return r
    return None
