"""Every Cypher constant of graph/ compiles on the real server (EXPLAIN), so a typo fails here first."""

from __future__ import annotations

import re
from typing import LiteralString, cast

import pytest

from graph.snapshot import statements
from services.runtime import Runtime

QUERIES = [
    (name, value)
    for name, value in statements().items()
    if re.match(r"\s*(MATCH|CREATE|MERGE|UNWIND|CALL|WITH|OPTIONAL)\b", value)
    and not re.match(r"\s*CALL \(\w", value)  # a subquery importing variables is a fragment
]


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=[n for n, _ in QUERIES])
async def test_query_compiles(runtime: Runtime, name: str, query: str) -> None:
    params = {p: None for p in re.findall(r"\$(\w+)", query)}
    if re.search(r"\n(MATCH|WITH) [^\n]*\s*$", query):  # a head (e.g. READ_LOCK): compile it as one
        query += "RETURN *\n"
    # The constants are LiteralStrings in graph/; here they are read back reflectively.
    await runtime.driver.execute_query(cast(LiteralString, "EXPLAIN " + query), params)
