"""Operator commands: ``python -m botmemory.cli <command>`` (also installed as ``botmemory``).

A failure is one line on stderr, ``botmemory: <CODE>: <message>``, and exit status 2 for bad
input (arguments, ids, files) or 1 otherwise; ``--debug`` or ``BOTMEMORY_DEBUG=1`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn, TypeVar

from neo4j.exceptions import DriverError, Neo4jError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from botmemory.rest_input import once
from learning import backfill
from learning.embedders import make_embedder
from services.bootstrap import open_runtime
from services.changes import ItemRef, check_content
from services.embedding import EmbedderUnavailable
from services.errors import BadInput, ServiceError
from services.maintenance import (
    MAX_LEGACY_ENTRIES,
    MAX_LEGACY_TAGS,
    MAX_REBUILDS,
    LegacyEntry,
    Rebuild,
    check_legacy_layer,
    check_legacy_tag,
    import_legacy,
    rebuild_legacy,
    relabel_all,
)
from services.rotation import rotate_data_keys, unrotated
from services.runtime import Runtime
from services.settings import ConfigurationError, Settings, load_settings, parse_settings, write_secret


@asynccontextmanager
async def _runtime(settings: Settings) -> AsyncGenerator[Runtime]:
    """The stores, checked once: a stopped Neo4j fails at once, not after the driver's retries."""
    async with open_runtime(settings, schema="none") as runtime:
        await runtime.driver.verify_connectivity()
        yield runtime


def new_master_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def _replace_local_key(settings: Settings) -> None:
    """Local stacks keep their key in the data dir: the old one joins ``master-key.previous`` (one
    key a line). It replaced the file: a second ``--generate`` before the processes restarted
    (they still wrapped new Bots' data keys with the first key) left that key nowhere."""
    current = settings.data_dir / "master-key"
    previous = settings.data_dir / "master-key.previous"
    kept = previous.read_text().split() if previous.exists() else []
    write_secret(previous, "\n".join([*kept, current.read_text().strip()]))
    write_secret(current, new_master_key())


async def _rotate(generate: bool) -> int:
    settings = parse_settings()  # never Settings(): its error quotes a key of the wrong shape
    if generate:
        if settings.env == "production" or settings.master_key is not None:
            raise CommandFailed("BAD_INPUT", "--generate is for local stacks whose key lives in the data dir")
        # The current key becomes the previous one and the previous one is gone: only when no
        # data key is still wrapped by a key other than the current (a rotation that failed half
        # way, Bots made by a process that had not restarted) — else that key would be lost, and
        # with it every Bot's data. Checked before anything is written, so a store that does
        # not answer changes nothing.
        async with _runtime(load_settings()) as runtime:
            behind = await unrotated(runtime.driver, runtime.keyring)
        if behind:
            raise CommandFailed(
                "CONFLICT",
                f"{behind} data keys are not wrapped by the current master key yet: run "
                "`botmemory rotate-master-key` (without --generate) once every process has "
                "restarted, then generate a new key",
            )
        _replace_local_key(settings)
    settings = load_settings()
    async with _runtime(settings) as runtime:
        changed = await rotate_data_keys(runtime.driver, runtime.keyring)
        behind = await unrotated(runtime.driver, runtime.keyring)
    print(f"re-wrapped {changed} data keys with master key {runtime.keyring.current_id}")
    if behind:
        # "Then drop the old key" (README) must not follow: those Bots' data would be lost with it.
        raise CommandFailed(
            "CONFLICT",
            f"{behind} data keys are still not wrapped by the current master key (wrapped by a key "
            "this process does not know, or made meanwhile by a process with the older key as "
            "current): keep every older key, restart the processes with them as previous keys, "
            "and run this again",
        )
    return 0


def _read_legacy(path: str) -> dict[int, LegacyEntry]:
    """One JSON object per line: ``{"content": ..., "tags": [...], "layer": "fact"}``. A line of
    another shape is refused with its number, before anything is imported: ``"tags": "work"`` was
    read as the tags w, o, r and k; a misspelt key (``"tag"``) or a key given twice was dropped, and
    a private pinned entry lost its author's rule for good (hidden, V9); an over-long content
    failed the whole import without saying where. A layer is read in any case (``"Pinned"``);
    one of no such name is refused, not read as a fact.
    A file holds at most MAX_LEGACY_ENTRIES entries (one import is one change, in one transaction)
    and a line at most MAX_LEGACY_TAGS tags: a larger file is refused at the line past it, before
    the rest is read. The entries are keyed by their line numbers, in file order."""
    entries: dict[int, LegacyEntry] = {}
    with Path(path).open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, start=1):
            if line.strip():
                if len(entries) == MAX_LEGACY_ENTRIES:
                    raise CommandFailed(
                        "BAD_INPUT",
                        f"line {n}: a file holds at most {MAX_LEGACY_ENTRIES:,} entries; split it and import each part",
                    )
                entries[n] = _legacy_line(n, line)
    return entries


L = TypeVar("L", bound=BaseModel)


def _json_line(model: type[L], n: int, line: str, expected: str) -> L:
    """Line ``n`` of a JSON-lines file as ``model``, strictly (each key once, no other)."""
    try:
        return model.model_validate(json.loads(line, object_pairs_hook=once))
    except (ValidationError, ValueError, RecursionError):
        raise CommandFailed("BAD_INPUT", f"line {n}: expected {expected} (each key once, no other)") from None


def _legacy_line(n: int, line: str) -> LegacyEntry:
    """Line ``n`` of a legacy file, read strictly (:func:`_read_legacy`)."""
    row = _json_line(
        _LegacyLine, n, line, '{"content": "<text>", "tags": ["<tag>", ...], "layer": "<layer>"}'
    )
    try:
        check_content(row.content)
        if len(row.tags) > MAX_LEGACY_TAGS:
            raise BadInput(f"at most {MAX_LEGACY_TAGS} tags", field="tags")
        for tag in row.tags:
            check_legacy_tag(tag)
        layer = check_legacy_layer(row.layer.strip().lower())
    except BadInput as exc:
        raise CommandFailed("BAD_INPUT", f"line {n}: {exc.message}") from None
    return LegacyEntry(content=row.content, tags=tuple(row.tags), layer=layer)


class _LegacyLine(BaseModel):
    """One line of a legacy export, strictly: a string is not a list of tags, and no other key."""

    model_config = ConfigDict(strict=True, extra="forbid")

    content: str
    tags: list[str] = []
    layer: str = "fact"


def _read_rebuilds(path: str) -> list[Rebuild]:
    """One JSON object per line: ``{"id": "mem_…", "sources": [{"chat": "chat_…", "item": "i-3"}]}``
    for a fact, or ``{"id": "mem_…", "sourceEntries": ["mem_…"], "confidence": 0.8}`` for an
    observation; a line of another shape is refused with its number before anything changes."""
    rebuilds: list[Rebuild] = []
    with Path(path).open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if len(rebuilds) == MAX_REBUILDS:
                raise CommandFailed(
                    "BAD_INPUT", f"line {n}: a file holds at most {MAX_REBUILDS:,} entries; split it"
                )
            row = _json_line(
                _RebuildLine,
                n,
                line,
                '{"id": "<entry>", "sources": [{"chat": "<chat>", "item": "<item>"}]} or '
                '{"id": "<entry>", "sourceEntries": ["<entry>"], "confidence": <0..1>}',
            )
            sources = tuple(ItemRef(s.chat, s.item) for s in row.sources)
            rebuilds.append(Rebuild(row.id, sources, tuple(row.source_entries), row.confidence))
    return rebuilds


class _SourceLine(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    chat: str
    item: str


class _RebuildLine(BaseModel):
    """One line of a rebuild file, strictly."""

    model_config = ConfigDict(strict=True, extra="forbid")

    id: str
    sources: list[_SourceLine] = []
    source_entries: list[str] = Field(default=[], alias="sourceEntries")
    confidence: float | None = None


class _Bar:
    """A progress bar on stderr (a line per tenth when stderr is not a terminal)."""

    def __init__(self, phase: str, done: int, total: int) -> None:
        self.phase, self.done, self.total = phase, done, max(total, 1)
        self.started, self.shown = time.monotonic(), -1
        self.tty = sys.stderr.isatty()
        self.show()

    def advance(self, n: int) -> None:
        self.done = min(self.total, self.done + n)
        self.show()

    def show(self) -> None:
        tenth = self.done * 10 // self.total
        if not self.tty and tenth == self.shown:
            return
        self.shown = tenth
        filled = self.done * 30 // self.total
        rate = self.done / max(time.monotonic() - self.started, 1e-3)
        line = f"{self.phase:9} [{'#' * filled}{'-' * (30 - filled)}] {self.done}/{self.total} ({rate:.0f}/s)"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)


async def _reindex(bot_id: str) -> int:
    """Keywords and vectors of the current embedder for every entry of the Bot that lacks them,
    with a progress bar; run it again after a kill and it goes on where it stopped."""
    settings = load_settings()
    embedder = make_embedder(settings)
    try:
        async with _runtime(settings) as runtime:
            model = embedder.id if embedder is not None else "-"
            start = await backfill.progress(runtime, bot_id, model)
            bars: dict[str, _Bar] = {}

            def on_batch(phase: str, n: int) -> None:
                if phase not in bars:
                    for bar in bars.values():
                        bar.close()
                    done = start.keyworded if phase == "keywords" else start.embedded
                    bars[phase] = _Bar(phase, done, start.total)
                bars[phase].advance(n)

            done = await backfill.run(runtime, bot_id, embedder, on_batch=on_batch)
            for bar in bars.values():
                bar.close()
            end = await backfill.progress(runtime, bot_id, model)
    finally:
        if embedder is not None:
            await embedder.aclose()
    print(f"{end.embedded}/{end.total} entries have a vector of {model}; {end.keyworded} have keywords")
    return 0 if done else 1


async def _relabel(bot_id: str) -> int:
    async with _runtime(load_settings()) as runtime:
        count = await relabel_all(runtime, bot_id)
    print(f"relabelled {_counted(count, 'entry', 'entries')}")
    return 0


def _counted(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


async def _import(bot_id: str, lines: dict[int, LegacyEntry]) -> int:
    """Import the file's entries and print each line's new entry id (what ``rebuild-legacy``
    names an entry by)."""
    settings = load_settings()
    embedder = make_embedder(settings)  # the entries that keep their rule are embedded as they load
    legacy = list(lines.values())
    try:
        async with _runtime(settings) as runtime:
            applied = await import_legacy(runtime, bot_id, legacy, embedder)
    finally:
        if embedder is not None:
            await embedder.aclose()
    kept = sum(entry.remembered_by() is not None for entry in legacy)
    print(
        f"imported {_counted(len(applied.entry_ids), 'legacy entry', 'legacy entries')} (hidden until "
        "rebuilt from provable sources, botmemory rebuild-legacy; "
        f"private pinned entries made with Remember stay their authors': up to {kept}); by line:"
    )
    for n, entry in lines.items():
        print(f"  line {n} -> {entry.id}")
    return 0


async def _rebuild(bot_id: str, rebuilds: list[Rebuild]) -> int:
    settings = load_settings()
    embedder = make_embedder(settings)  # the rebuilt entries are searchable from the commit
    try:
        async with _runtime(settings) as runtime:
            applied, made = await rebuild_legacy(runtime, bot_id, rebuilds, embedder)
    finally:
        if embedder is not None:
            await embedder.aclose()
    print(f"rebuilt {_counted(len(made), 'legacy entry', 'legacy entries')} (version {applied.version}):")
    for old, new in made.items():
        print(f"  {old} -> {new}")
    return 0


class CommandFailed(Exception):
    """A failure already described for the operator: ``botmemory: <code>: <message>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line too (argparse prints the usage and exits otherwise)."""

    def error(self, message: str) -> NoReturn:
        raise CommandFailed("BAD_INPUT", f"{message} (see botmemory --help)")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else type(exc).__name__


def describe(exc: Exception) -> CommandFailed:
    """The one line an operator sees for ``exc`` (messages of drivers, never a secret of ours)."""
    match exc:
        case CommandFailed():
            return exc
        case ServiceError():
            return CommandFailed(exc.code, exc.message)
        case ConfigurationError():
            return CommandFailed("CONFIGURATION", str(exc))
        case EmbedderUnavailable():
            return CommandFailed("UNAVAILABLE", f"the embedder failed ({exc.code}); run it again to go on")
        case Neo4jError() | DriverError():
            return CommandFailed("UNAVAILABLE", f"Neo4j (BOTMEMORY_NEO4J_URI): {_one_line(exc)}")
        case RedisError():
            return CommandFailed("UNAVAILABLE", f"Redis (BOTMEMORY_REDIS_URL): {_one_line(exc)}")
        case json.JSONDecodeError() | KeyError() | UnicodeDecodeError():
            return CommandFailed("BAD_INPUT", f"the file is not JSON lines as expected ({_one_line(exc)})")
        case ConnectionError() | TimeoutError():
            return CommandFailed("UNAVAILABLE", _one_line(exc))
        case OSError():
            return CommandFailed("BAD_INPUT", _one_line(exc))
        case _:
            return CommandFailed("INTERNAL", f"{type(exc).__name__} (run with --debug for the traceback)")


def main(argv: list[str] | None = None) -> int:
    """Run one command; a failure prints one line (or the traceback with --debug)."""
    debug = os.environ.get("BOTMEMORY_DEBUG", "") not in ("", "0")
    args = sys.argv[1:] if argv is None else argv
    if not (debug or "--debug" in args):
        # Stderr holds progress and the one line of a failure: the libraries' log records (an
        # embedder's warning before the failure it raises) are not printed there.
        logging.getLogger().addHandler(logging.NullHandler())
    try:
        return _main(args)
    except Exception as exc:
        if debug or "--debug" in args:
            raise
        failed = describe(exc)
        print(f"botmemory: {failed.code}: {failed.message}", file=sys.stderr)
        return 2 if failed.code == "BAD_INPUT" else 1


def _main(argv: list[str]) -> int:
    parser = _Parser(prog="botmemory")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("new-master-key", help="print a fresh random master key (base64)")
    rotate = commands.add_parser(
        "rotate-master-key",
        help="re-wrap every Bot data key with the current master key (previous keys must be configured)",
    )
    rotate.add_argument(
        "--generate", action="store_true", help="local stacks: make a new key in the data dir first"
    )
    relabel = commands.add_parser("relabel", help="recompute a Bot's visibility labels from the path query")
    relabel.add_argument("bot_id")
    reindex = commands.add_parser(
        "reindex", help="keywords and vectors of the current embedder for a Bot's entries that lack them"
    )
    reindex.add_argument("bot_id")
    imp = commands.add_parser("import-legacy", help="load legacy entries without access proof (V9)")
    imp.add_argument("bot_id")
    imp.add_argument("file", help="JSON lines: content, tags, layer")
    rebuild = commands.add_parser(
        "rebuild-legacy", help="rebuild legacy entries from sources whose access can be checked (V9)"
    )
    rebuild.add_argument("bot_id")
    rebuild.add_argument("file", help="JSON lines: id, and sources (Items) or sourceEntries")
    args = parser.parse_args(argv)
    if args.command == "rebuild-legacy":
        return asyncio.run(_rebuild(args.bot_id, _read_rebuilds(args.file)))
    if args.command == "new-master-key":
        print(new_master_key())
        return 0
    if args.command == "reindex":
        return asyncio.run(_reindex(args.bot_id))
    if args.command == "relabel":
        return asyncio.run(_relabel(args.bot_id))
    if args.command == "import-legacy":
        return asyncio.run(_import(args.bot_id, _read_legacy(args.file)))
    return asyncio.run(_rotate(args.generate))


if __name__ == "__main__":
    sys.exit(main())
