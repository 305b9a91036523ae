"""Where benchmark results go: a results file and a marked section of ``bench/README.md``."""

from __future__ import annotations

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
