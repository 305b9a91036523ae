"""What a caller of the API waits for (the ``http`` phase of ``bench.memory_bench``): requests
to a real API process (``python -m botmemory.serve``, the bench's Neo4j and Redis) over
HTTP/1.1 on one kept-alive connection, timed by the client from the request sent to the body read.

Per pool and reader, in one loop and in turn (each round in a new random order), so that every
operation meets the same machine: GraphQL ``{ __typename }`` with no token (HTTP, the ASGI app,
GraphQL's parse, validation and execution, and the client: no Neo4j), GraphQL ``me { id }``
(that and the token's lookup in Neo4j), REST and GraphQL ``search(limit 10)`` for the pool's
questions in turn, REST ``search(limit 10)`` for a question the process has not embedded yet (the
pool's question and a number never asked before), REST ``GET memory?limit=100`` (the first
page) and the same with the filter ``tags=rare-topic`` (the topic of the reader's five oldest
facts, RARE_TOPIC: the walk of the reader's keys reads every visible entry to find them). The
API process embeds each question once and then keeps its vector (``QueryVectors``), so after the
warm-up the other search rows exclude the query embedding, as the in-process rows do;
the difference between such a row and the in-process ``search(10)`` row is what the API adds to
it, and the new question's row is what a caller waits for with the embedding (LocalMiniLM).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import Final

import httpx

from bench.measure import BenchSettings, Row, fmt_ms, log
from tools.processes import ServerProcess

#: GraphQL's search as a client asks it: each hit's score and entry.
SEARCH_QUERY: Final = (
    "query($b: ID!, $q: String!) { search(botId: $b, query: $q, limit: 10) "
    "{ score entry { id content layer tags } } }"
)
ME_QUERY: Final = "query { me { id } }"
#: The topic of the five oldest facts of the dense and of the 1 % reader (``memory_bench.Planner``).
RARE_TOPIC: Final = "rare-topic"
TYPENAME_QUERY: Final = "query { __typename }"

#: Operations in the order of the report.
OPS: Final = (
    "HTTP GraphQL __typename",
    "HTTP GraphQL me",
    "HTTP REST search(10)",
    "HTTP GraphQL search(10)",
    "HTTP REST search(10), new question",
    "HTTP REST GET memory (first 100)",
    f"HTTP REST GET memory?tags={RARE_TOPIC}",
)


async def measure_http(
    api: ServerProcess,
    size: int,
    bot: str,
    readers: dict[str, str],
    questions: list[str],
    s: BenchSettings,
    out: list[Row],
) -> None:
    """The rows of :data:`OPS` for each reader (``readers``: kind → bearer token) of one pool."""
    rng = random.Random(size)
    fresh = itertools.count(rng.randrange(10**9))  # numbers no question of the run had
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
        for kind, token in readers.items():
            auth = {"Authorization": f"Bearer {token}"}

            def request(op: str, n: int, auth: dict[str, str] = auth) -> httpx.Request:
                question = questions[n % len(questions)]
                if op == "HTTP GraphQL __typename":
                    return http.build_request("POST", "/graphql", json={"query": TYPENAME_QUERY})
                if op == "HTTP GraphQL me":
                    return http.build_request("POST", "/graphql", json={"query": ME_QUERY}, headers=auth)
                if op.startswith("HTTP REST search(10)"):
                    if op.endswith("new question"):
                        question = f"{question} {next(fresh)}"
                    params = {"q": question, "limit": 10}
                    return http.build_request(
                        "GET", f"/v1/bots/{bot}/memory/search", params=params, headers=auth
                    )
                if op == "HTTP GraphQL search(10)":
                    body = {"query": SEARCH_QUERY, "variables": {"b": bot, "q": question}}
                    return http.build_request("POST", "/graphql", json=body, headers=auth)
                params = {"limit": 100} | ({"tags": RARE_TOPIC} if op.endswith(RARE_TOPIC) else {})
                return http.build_request("GET", f"/v1/bots/{bot}/memory", params=params, headers=auth)

            rows = {op: Row(size, op, kind, []) for op in OPS}
            await _loop(http, request, rows, questions, s, rng)
            out.extend(rows.values())
            log(
                f"  {size:>7,} HTTP {kind:<5} "
                + " · ".join(f"{op.removeprefix('HTTP ')} {fmt_ms(r.median)}" for op, r in rows.items())
                + " ms (medians)"
            )


async def _loop(
    http: httpx.AsyncClient,
    request: Callable[[str, int], httpx.Request],
    rows: dict[str, Row],
    questions: list[str],
    s: BenchSettings,
    rng: random.Random,
) -> None:
    """Every operation once a round, in a new order each round; the warm-up embeds every question."""
    ops = list(rows)
    for n in range(max(s.warmup, len(questions))):
        for op in ops:
            _check(await http.send(request(op, n)))
    started = time.perf_counter()
    first = next(iter(rows.values()))
    n = 0
    while s.keep_going(first.n, s.runs, time.perf_counter() - started, factor=len(ops)):
        rng.shuffle(ops)
        for op in ops:
            sent = request(op, n)
            t = time.perf_counter()
            response = await http.send(sent)
            await response.aread()
            rows[op].samples.append((time.perf_counter() - t) * 1000)
            _check(response)
        n += 1


def _check(response: httpx.Response) -> None:
    """A failed request would time an error page: the bench stops instead."""
    response.raise_for_status()
    if response.request.url.path == "/graphql" and "errors" in response.json():
        raise RuntimeError(f"/graphql: {response.text[:300]}")
