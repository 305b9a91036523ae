"""``python -m eval.simulate``: candidate recall of ``context(4000, query)`` simulated offline, in
seconds, for tuning the ranking on the dev split (``make eval`` takes ~10 minutes for all eight).

What it simulates: every observation of the conversation learnt as an entry everyone sees (the
group replay of ``make eval``), ranked for each question of categories 1–4 by the product's own
index (:class:`services.vectorindex.BotIndex`: the default embedder's vectors, BM25 over the
keyword tokens, reciprocal-rank fusion with the prior), and chosen as ``services.search.context``
chooses: the first ``wanted`` candidates that fit the budget. Each observation holds the terms of
the day its newest evidence turn's session took place, and each question the dates it names, as
the product's index and query do (D9.31; ``--no-dates``: without them). A question counts when a
chosen observation cites one of its evidence turns. What it leaves out: the access check (everything is
visible in the group replay), blinding (BM25 ranks equal tokens the same, hashed or not), and the
memory-order fill of a budget that relevance leaves room in (the observations always fill it).
Measured beside ``make eval`` at 0dc3c0f's constants: 79.0 % on the dev split against 79.1 %;
with dates, 81.6 % on the dev split against 80.1 % without.

    python -m eval.simulate                        # the dev split, the product's constants
    python -m eval.simulate --rrf-k 10,20,60       # one line per value
    python -m eval.simulate --all                  # all eight (report; tune on the dev split only)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np

from eval.dataset import ALL_CONVERSATIONS, DEV_SPLIT, Conversation, Observation, Question, load
from learning.embedders import LocalMiniLM
from services import search
from services.datewords import day_of, entry_terms, query_terms
from services.embedding import decode_vectors, encode_vector
from services.keywords import tokens
from services.vectorindex import F32, BotIndex

BUDGET = 4_000


@dataclass(frozen=True, slots=True)
class Prepared:
    """A conversation with its observations and questions embedded (once per run)."""

    observations: list[Observation]
    vectors: F32
    questions: list[Question]
    question_vectors: F32
    #: Per observation, when its newest evidence turn was said (None: no session date).
    said_at: list[int | None]


@dataclass(frozen=True, slots=True)
class Ranking:
    """What is varied: the fusion constant and the priors (in units of a first rank's share)."""

    rrf_k: float = search.RRF_K
    pinned: float = 0.3
    recency: float = 0.2
    overask: float = search.CONTEXT_OVERASK
    dates: bool = True


async def prepare(conversation: Conversation, embedder: LocalMiniLM) -> Prepared:
    observations = [o for s in conversation.sessions for o in s.observations]
    questions = conversation.asked()
    said = {t.dia_id: s.said_at for s in conversation.sessions for t in s.turns}
    return Prepared(
        observations,
        await embedder.embed([o.sentence for o in observations]),
        questions,
        await embedder.embed([q.text for q in questions]),
        [
            max((at for e in o.evidence if (at := said.get(e)) is not None), default=None)
            for o in observations
        ],
    )


def index_of(p: Prepared, dates: bool) -> BotIndex:
    """The observations as a Bot's index holds them (in learning order, the newest last)."""
    n = len(p.observations)
    days = [() if at is None or not dates else entry_terms(day_of(at)) for at in p.said_at]
    q, scales = decode_vectors([encode_vector(v) for v in p.vectors], p.vectors.shape[1])  # as stored
    index = BotIndex("simulated")
    index.upsert(
        [str(i) for i in range(n)],
        [f"4:simulated:{i}" for i in range(n)],
        [" ".join([*tokens(o.sentence), *day]) for o, day in zip(p.observations, days, strict=True)],
        [False] * n,
        [(i + 1) * 1_000_000 for i in range(n)],
        ["channel:group"] * n,  # the group replay: everyone sees every observation
        (list(range(n)), q, scales),
    )
    return index


def recall(p: Prepared, r: Ranking) -> tuple[int, int]:
    """(questions with a chosen observation on their evidence, questions)."""
    index = index_of(p, r.dates)
    now = int(time.time() * 1000)
    texts = [o.sentence for o in p.observations]
    mean = float(np.mean([len(t) + 3 for t in texts]))
    wanted = max(8, min(search.MAX_LIMIT, math.ceil(BUDGET / mean * r.overask)))
    found = 0
    for question, vector in zip(p.questions, p.question_vectors, strict=True):
        ids = index.rank(
            vector,
            list(dict.fromkeys(tokens(question.text))) + (query_terms(question.text, now) if r.dates else []),
            None,
            dense_k=max(search.DENSE_MIN, search.DENSE_FACTOR * wanted),
            keyword_k=max(search.KEYWORD_LIMIT, search.DENSE_FACTOR * wanted),
            rrf_k=r.rrf_k,
            pinned_prior=r.pinned / (r.rrf_k + 1),
            recency_prior=r.recency / (r.rrf_k + 1),
            half_life=search.RECENCY_HALF_LIFE,
        ).ids
        chosen: list[int] = []
        size = 0
        for entry in ids[:wanted]:
            line = len(texts[int(entry)]) + 2 + (1 if chosen else 0)
            if size + line <= BUDGET:
                chosen.append(int(entry))
                size += line
        evidence = set(question.evidence)
        found += any(evidence & set(p.observations[i].evidence) for i in chosen)
    return found, len(p.questions)


async def run(args: argparse.Namespace) -> None:
    names = ALL_CONVERSATIONS if args.all else DEV_SPLIT
    embedder = LocalMiniLM(threads=1, batch=64)
    prepared = {name: await prepare(load(name), embedder) for name in names}
    for k in (float(x) for x in args.rrf_k.split(",")):
        for recency in (float(x) for x in args.recency.split(",")):
            ranking = Ranking(rrf_k=k, recency=recency, overask=args.overask, dates=not args.no_dates)
            counts = {name: recall(p, ranking) for name, p in prepared.items()}
            hits, total = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
            per = " ".join(f"{name} {100 * h / t:.1f}" for name, (h, t) in counts.items())
            print(
                f"rrf_k {k:g} recency {recency:g} overask {args.overask:g}: {100 * hits / total:.1f} % ({per})"
            )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eval.simulate", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="all eight conversations (report only)")
    p.add_argument("--rrf-k", default=f"{search.RRF_K:g}", help="fusion constants, comma separated")
    p.add_argument("--recency", default="0.2", help="recency priors (first-rank shares), comma separated")
    p.add_argument("--overask", type=float, default=search.CONTEXT_OVERASK)
    p.add_argument("--no-dates", action="store_true", help="entries and questions without date terms")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
