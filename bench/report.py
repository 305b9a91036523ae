"""Where benchmark results go: a results file and a marked section of ``bench/README.md``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def write_results(table: str, out: Path, *, title: str, section: str, update_readme: bool) -> None:
    """Write ``# title`` + the table to ``out``; replace the README's ``<!-- section:start/end -->`` part."""
    out.write_text(f"# {title}\n\n{table}\n")
    readme = BENCH_DIR / "README.md"
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    if update_readme and readme.exists():
        text = readme.read_text()
        if start in text and end in text:
            head, rest = text.split(start, 1)
            _, tail = rest.split(end, 1)
            readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")


def machine_state() -> str:
    """The load average and a CPU probe: how long a fixed pure-Python loop takes now (median of
    5, in ms). The machine is shared, and its speed drifts by up to 2-3x over a day; the probe
    says how fast it was while the numbers were taken (compare runs by it)."""
    times: list[float] = []
    for _ in range(5):
        t = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i
        times.append((time.perf_counter() - t) * 1000)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{load} (CPU probe {sorted(times)[2]:.0f} ms)"


def run_header(
    module: str,
    info: dict[str, str],
    services: str,
    label: str | None,
    extra: dict[str, object],
    elapsed: float,
) -> str:
    """The first lines of a results file: when, the command, the machine, the code and the load.
    ``services``: the server versions (e.g. ``Neo4j 5.26.19, Redis 7.0.15``)."""
    return (
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} · `{' '.join(['python -m ' + module, *sys.argv[1:]])}`\n\n"
        f"Machine: {info['cpu']}, {info['memory']} RAM, {info['os']}; Python {info['python']}, "
        f"{info['driver']}, {services}; code: {label or 'commit ' + info['commit']}. "
        f"Load average (and CPU probe, see bench/report.py) before/after: {extra.get('load_before', '?')} / {extra.get('load_after', '?')}. "
        f"Total run time {elapsed / 60:.1f} min.\n"
    )
