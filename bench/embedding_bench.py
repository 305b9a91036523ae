"""Embedder benchmark: the local default embedder (``learning.embedders.LocalMiniLM``) and the
stored-vector and keyword helpers, in process, without Neo4j, Redis or a model server.

Run::

    python -m bench.embedding_bench                  # 1 thread, 200 queries, 1,024 entries
    python -m bench.embedding_bench --threads 2      # onnxruntime intra-op threads

What is measured (synthetic English texts from fixed templates, the same on every run):

* **Load** — the first call: model sha256 check, ONNX session and tokenizer.
* **Query latency** — one short question (27–50 characters) per ``embed`` call, as a search
  embeds its query, after 20 warm-up calls; p50 / p95 / max over ``--queries`` calls.
* **Batch throughput** — ``--entries`` entry texts (73–94 characters, like learned facts) in one
  ``embed`` call, which runs them in batches of ``--batch``; entries per second.
* **Decode** — ``decode_vectors`` of ``--vectors`` stored vectors (one per entry of a large pool).
* **Keywords** — ``blind_text`` (tokens, stems, keyed hashes) per entry text, and per entry of six
  texts in other scripts (accented Latin, Cyrillic, Greek, Han, kana, Thai), which take the
  tokeniser's longer way.

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import time

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from learning.embedders import LocalMiniLM
from services.crypto import Keyring
from services.embedding import Embedder, decode_vectors, encode_vector
from services.keywords import blind_text

_NAMES = ["Caroline", "Melanie", "Jon", "Gina", "Maria", "John", "Audrey", "Andrew", "Nate", "Joanna"]
_THINGS = ["a sunrise", "the lake", "a pottery class", "a charity race", "an adoption agency",
           "a dance studio", "a camping trip", "a support group", "a new puppy", "a job interview"]  # fmt: skip
_QUESTIONS = ["What did {n} attend last week?", "When did {n} go to {t}?", "Why did {n} like {t}?",
              "Who joined {n} at {t}?", "What does {n} think about {t}?", "Where did {n} find {t}?"]  # fmt: skip
_FACTS = ["{n} went to {t} with her kids and said it made her feel calm and grateful.",
          "{n} is planning {t} next month because a friend recommended it to her.",
          "{n} told {m} that {t} reminded him of his childhood summers by the sea.",
          "After {t}, {n} decided to keep a journal and to paint every weekend."]  # fmt: skip


def _texts(templates: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(templates).format(n=rng.choice(_NAMES), m=rng.choice(_NAMES), t=rng.choice(_THINGS))
        for _ in range(count)
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


async def query_latency(embedder: Embedder, questions: list[str], warmup: int = 20) -> list[float]:
    """Seconds per ``embed`` call of one question each (as a search embeds its query), after
    ``warmup`` unrecorded calls."""
    for q in questions[:warmup]:
        await embedder.embed([q])
    timings: list[float] = []
    for q in questions:
        started = time.perf_counter()
        await embedder.embed([q])
        timings.append(time.perf_counter() - started)
    return timings


async def batch_throughput(embedder: Embedder, texts: list[str]) -> tuple[float, npt.NDArray[np.float32]]:
    """Entries per second of one ``embed`` call of all ``texts`` (the embedder batches them), and
    the vectors."""
    started = time.perf_counter()
    vectors = await embedder.embed(texts)
    return len(texts) / (time.perf_counter() - started), vectors


async def _run(args: argparse.Namespace) -> list[tuple[str, str]]:
    embedder = LocalMiniLM(threads=args.threads, batch=args.batch)
    questions = _texts(_QUESTIONS, args.queries, seed=1)
    entries = _texts(_FACTS, args.entries, seed=2)
    rows: list[tuple[str, str]] = []

    started = time.perf_counter()
    await embedder.embed(["load"])
    rows.append(("load (first call), ms", _ms(time.perf_counter() - started)))

    timings = await query_latency(embedder, questions)
    cuts = statistics.quantiles(timings, n=100)
    latency = f"{_ms(cuts[49])} / {_ms(cuts[94])} / {_ms(max(timings))}"
    rows.append((f"query p50 / p95 / max, ms ({len(questions)} calls)", latency))

    throughput, vectors = await batch_throughput(embedder, entries)
    rows.append(
        (f"batch throughput, entries/s (batch {args.batch}, {len(entries)} entries)", f"{throughput:.0f}")
    )

    stored = [encode_vector(vectors[i % len(vectors)]) for i in range(args.vectors)]
    started = time.perf_counter()
    decode_vectors(stored, embedder.dims)
    rows.append((f"decode_vectors of {args.vectors:,} vectors, ms", _ms(time.perf_counter() - started)))

    keyring = Keyring(os.urandom(32))
    cipher = keyring.cipher("bench", keyring.new_data_key("bench"))
    started = time.perf_counter()
    for text in entries:
        blind_text(cipher, text)
    rows.append(("blind_text per entry, µs", f"{(time.perf_counter() - started) / len(entries) * 1e6:.1f}"))
    blind_text(cipher, OTHER_SCRIPTS[0])  # the table of marks, made once per process (~10 ms)
    others = [OTHER_SCRIPTS[i % len(OTHER_SCRIPTS)] for i in range(len(entries))]
    started = time.perf_counter()
    for text in others:
        blind_text(cipher, text)
    rows.append(
        (
            "blind_text per entry of other scripts (accented Latin, Cyrillic, Greek, Han, kana, Thai), µs",
            f"{(time.perf_counter() - started) / len(others) * 1e6:.1f}",
        )
    )
    await embedder.aclose()
    return rows


#: Entries in other scripts, for the cost of their keywords (each goes the way of NFKC, folding and
#: the runs of its script; ASCII text takes a shorter way).
OTHER_SCRIPTS = (
    "Ann met José and Zoë at the Café Müller in Zürich last spring",
    "Собаку Анны зовут Шарик, и она любит гулять у реки по утрам",
    "Ο αδελφός της Άννας, ο Γιώργος, ζει στη Θεσσαλονίκη εδώ και χρόνια",
    "安娜的猫叫小白，它三岁了，喜欢在窗台上晒太阳",
    "アンは東京で寿司を食べて、そのあと友達と映画を見た",
    "แอนพบสมชายที่ตลาดนัดเมื่อวันเสาร์ที่แล้ว",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--entries", type=int, default=1024)
    parser.add_argument("--vectors", type=int, default=100_000)
    args = parser.parse_args()
    rows = asyncio.run(_run(args))
    versions = f"onnxruntime {ort.__version__}, numpy {np.__version__}, Python {platform.python_version()}"
    print(f"{LocalMiniLM().id}: {versions}, {os.cpu_count()} CPUs, {args.threads} thread(s)\n")
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
