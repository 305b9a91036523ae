"""``make eval``: retrieval recall on LoCoMo conversations replayed through the public API.

Run (the test-profile Neo4j and Redis; the harness starts its own scripted model server, API and
learning worker on Redis db 6)::

    make eval                                  # the dev split conv-41 … conv-44
    make eval ARGS='--conversations conv-41 --questions 20'
    make eval ARGS='--all'                     # all eight conversations
    make eval ARGS='--leak-check'              # private chats; exits 1 if A is offered B's entries

Each conversation gets its own Organization (named ``botmemory-eval-…``), deleted at the end unless
``--keep``. Results: a markdown table printed and written into ``eval/RESULTS.md`` (its section of
the mode), and every question's row as JSON under ``.data/eval/``. See eval/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from eval.dataset import ALL_CONVERSATIONS, DATA_DIR, DEV_SPLIT, Conversation, load
from eval.replay import ORG_PREFIX, Replayer, ReplayError, ReplayStats
from eval.scoring import QuestionRow, score, table
from eval.scripted import mentioned
from eval.stack import ROOT, delete_org, export, orgs_named, redis_db, running
from services.settings import load_settings

EVAL_DIR = Path(__file__).resolve().parent
SECTIONS = {"group": "recall", "leak-check": "leak-check"}
#: The issue's target: candidate recall on every conversation.
TARGET = 0.9
TITLE = (
    "# LoCoMo retrieval evaluation (`make eval`)\n\n"
    "What the API offers the model for each LoCoMo question (categories 1–4), asked by speaker A after the "
    "conversation was replayed through the public API with a scripted model; how it is measured and what "
    "each column means: [README.md](README.md). Each section is rewritten by the last run of its mode.\n"
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def replay_table(stats: dict[str, ReplayStats], leak_check: bool) -> str:
    head = (
        "| conversation | sessions | turns | observations | facts learned | cited in part | skipped | "
        "entries | replay (of which waiting for learning) | questions |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if leak_check:
        head += (
            " entries from B's chat | of those listed to A | of those in A's chat's requests during the replay"
            " (requests checked) |"
        )
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, s in stats.items():
        line = (
            f"| {name} | {s.sessions} | {s.turns} | {s.observations} | {s.facts} | {s.partial} | {s.skipped} | "
            f"{s.entries} | {minutes(s.replay_seconds)} ({minutes(s.learn_wait_seconds)} waiting) | "
            f"{minutes(s.question_seconds)} |"
        )
        if leak_check:
            line += (
                f" {s.foreign_entries} | {s.foreign_listed} | {s.foreign_replayed} ({s.replay_requests:,}) |"
            )
        lines.append(line)
    return "\n".join(lines)


def report(
    args: argparse.Namespace,
    code: str,
    rows: list[QuestionRow],
    stats: dict[str, ReplayStats],
    budget: int,
    search_error: str | None,
    elapsed: float,
) -> str:
    limit = "all" if args.questions is None else f"the first {args.questions}"
    search = (
        f"n/a — `search` answered: {search_error}" if search_error else "GraphQL `search(limit: 10)` as A"
    )
    replay = (
        "each speaker in their own private chat; A asks"
        if args.leak_check
        else "one group chat of a channel holding both speakers; A asks in a private chat"
    )
    leaks = sum(len(r.leaks) for r in rows) + sum(
        s.foreign_listed + s.foreign_replayed for s in stats.values()
    )
    parts = [
        f"Run {time.strftime('%Y-%m-%d %H:%M %Z')} · `python -m eval.locomo {' '.join(sys.argv[1:])}` · "
        f"code under test: {code} · context budget **{budget:,} characters** (`answer_context_chars`) · "
        f"conversations {', '.join(stats)} · questions per conversation: {limit} of categories 1–4 · "
        f"replay: {replay} · search: {search} · total {minutes(elapsed)}.",
        "",
        table(rows),
        "",
        replay_table(stats, args.leak_check),
    ]
    if not args.leak_check:
        parts += ["", target_line(rows)]
    if args.leak_check:
        parts += [
            "",
            f"Leaks (entries of B's chat — or unknown to both lists — offered to A for a question, found by A's "
            f"`search`, listed to A, or named or quoted in a rewrite or confide request of A's chat during the "
            f"replay): **{leaks}** (must be 0).",
        ]
    return "\n".join(parts)


def target_line(rows: list[QuestionRow]) -> str:
    """Whether the issue's target — candidate recall ≥ 90 % on every conversation — is met, and
    how many conversations the data's ceiling leaves it reachable on."""
    names = list(dict.fromkeys(r.conversation for r in rows))

    def share(flags: list[bool]) -> float:
        return sum(flags) / len(flags) if flags else 0.0

    met = [n for n in names if share([r.candidate_hit for r in rows if r.conversation == n]) >= TARGET]
    reachable = [n for n in names if share([r.ceiling_hit for r in rows if r.conversation == n]) >= TARGET]
    verdict = "**met**" if len(met) == len(names) else "**not met**"
    return (
        f"Target: candidate recall ≥ {100 * TARGET:.0f} % on every conversation — {verdict}: {len(met)} of {len(names)} "
        f"reach it. The ceiling (the questions some entry A may see rests on the evidence of) reaches it on "
        f"{len(reachable)} of {len(names)}: no ranking can meet the target on the others with these observations."
    )


def write_section(out: Path, section: str, text: str) -> None:
    """Replace the ``<!-- section:start/end -->`` part of ``out`` (appended when missing)."""
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    old = out.read_text() if out.exists() else TITLE
    block = f"{start}\n{text}\n{end}"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = (
            old.rstrip("\n") + f"\n\n## {'Leak check' if section == 'leak-check' else 'Recall'}\n\n{block}\n"
        )
    out.write_text(new)


async def evaluate(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    settings = load_settings()
    if settings.env != "test":
        log("run it with `make eval` (the test profile: BOTMEMORY_ENV=test and its ports)")
        return 2
    settings = redis_db(settings, args.redis_db)
    budget = args.budget or settings.answer_context_chars
    names = list(ALL_CONVERSATIONS) if args.all else args.conversations.split(",")
    conversations: list[Conversation] = [load(n.strip(), Path(args.data)) for n in names if n.strip()]
    mode = "leak-check" if args.leak_check else "group"
    code_dir, code = ROOT, f"working tree, commit {commit()}"
    if args.code:
        code_dir, sha = export(args.code)
        code = f"commit {sha[:12]} (`--code {args.code}`, exported with git archive)"
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    rows: list[QuestionRow] = []
    stats: dict[str, ReplayStats] = {}
    orgs: list[str] = []
    log(f"{mode} replay of {', '.join(c.name for c in conversations)}; budget {budget:,} characters; {code}")
    async with running(settings, args.budget, code_dir) as stack:
        log(
            f"API {stack.api_process.url} (log {stack.api_process.log_path}), worker log {stack.worker.log_path}"
        )
        if args.purge_leftovers:
            for org in await orgs_named(stack.rt, ORG_PREFIX):
                await delete_org(stack.rt, org)
                log(f"deleted leftover organization {org}")
        replayer = Replayer(stack.api, stack.model, tag, log)
        try:
            for conv in conversations:
                stack.model.install()
                stage = await replayer.provision(conv, mode)
                orgs.append(stage.org)
                log(f"{conv.name}: {conv.speaker_a} and {conv.speaker_b}, organization {stage.org}")
                s = await replayer.replay(stage)
                entries, visible = await replayer.entries(stage)
                foreign = stage.foreign_chats()
                s.entries = len(entries)
                s.foreign_entries = sum(1 for e in entries.values() if e.foreign(foreign))
                s.foreign_listed = sum(1 for i in visible[stage.asker] if entries[i].foreign(foreign))
                s.replay_requests = len(stage.replay_requests)
                if mode == "leak-check" and not s.replay_requests:
                    raise ReplayError(f"{conv.name}: no rewrite or confide request of A's chat to check")
                s.foreign_replayed = len(
                    mentioned(
                        stage.replay_requests,
                        {i: e.content for i, e in entries.items() if e.foreign(foreign)},
                    )
                )
                t = time.perf_counter()
                asked = await replayer.ask(stage, conv.asked(args.questions))
                s.question_seconds = time.perf_counter() - t
                over = [a.question.index for a in asked if sum(len(o.text) for o in a.offered) > budget]
                if over:
                    raise ReplayError(
                        f"{conv.name}: questions {over[:5]} were offered more than {budget:,} characters"
                    )
                stats[conv.name] = s
                mine = [
                    score(
                        conv.name,
                        mode,
                        a.question,
                        a.offered,
                        a.search,
                        entries,
                        visible[stage.asker],
                        foreign,
                    )
                    for a in asked
                ]
                rows += mine
                hits = sum(r.candidate_hit for r in mine)
                log(
                    f"{conv.name}: candidate recall {hits}/{len(mine)}, ceiling {sum(r.ceiling_hit for r in mine)}"
                    f"/{len(mine)}; replay {minutes(s.replay_seconds)}, questions {minutes(s.question_seconds)}"
                )
        finally:
            await stack.stop_services()
            for org in orgs:
                if args.keep:
                    log(f"kept organization {org}")
                else:
                    await delete_org(stack.rt, org)
            if orgs and not args.keep:
                log(f"deleted {len(orgs)} organization(s)")
    text = report(args, code, rows, stats, budget, replayer.search_error, time.perf_counter() - started)
    write_section(Path(args.out), SECTIONS[mode], text)
    out_dir = ROOT / ".data" / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"locomo-{mode}-{tag}.json"
    meta = {
        "command": sys.argv,
        "code": code,
        "harness": commit(),
        "budget": budget,
        "mode": mode,
        "search": replayer.search_error,
    }
    json_path.write_text(
        json.dumps(
            {
                "meta": meta,
                "stats": {n: asdict(s) for n, s in stats.items()},
                "rows": [asdict(r) for r in rows],
            },
            indent=1,
            ensure_ascii=False,
        )
    )
    print(text)
    log(f"results in {args.out}, rows in {json_path}")
    leaks = sum(len(r.leaks) for r in rows) + sum(
        s.foreign_listed + s.foreign_replayed for s in stats.values()
    )
    if leaks:
        log(f"LEAK: {leaks} entries of another person's chat reached A")
        return 1
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.locomo", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--conversations", default=",".join(DEV_SPLIT), help="comma-separated (default: the dev split)"
    )
    p.add_argument("--all", action="store_true", help="all eight conversations")
    p.add_argument(
        "--leak-check", action="store_true", help="each speaker in a private chat; fail on any leak"
    )
    p.add_argument("--questions", type=int, default=None, help="at most N questions per conversation")
    p.add_argument("--keep", action="store_true", help="keep the organizations (default: delete them)")
    p.add_argument(
        "--budget", type=int, default=None, help="context budget in characters (default: settings)"
    )
    p.add_argument(
        "--code",
        default=None,
        help="run the API and worker of this commit (git archive), e.g. HEAD for a baseline",
    )
    p.add_argument("--data", default=str(DATA_DIR), help="directory of the conv-N.json files")
    p.add_argument("--redis-db", type=int, default=6, help="Redis database of the harness's API and worker")
    p.add_argument(
        "--purge-leftovers", action="store_true", help="first delete botmemory-eval-… organizations"
    )
    p.add_argument("--out", default=str(EVAL_DIR / "RESULTS.md"), help="markdown results file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM (make interrupted, a kill) stops the run as Ctrl-C does: the harness's API and
    # worker are stopped and its organizations deleted on the way out (they were left running).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return asyncio.run(evaluate(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
