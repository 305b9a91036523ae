"""Every Cypher constant of graph/ compiles on the real server (EXPLAIN), so a typo fails here first."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import LiteralString, cast

import pytest

import graph
from services.runtime import Runtime

QUERIES = [
    (f"{module.name}.{name}", value)
    for module in pkgutil.iter_modules(graph.__path__, "graph.")
    for name, value in vars(importlib.import_module(module.name)).items()
    if name.isupper()
    and not name.startswith("_")  # fragments, not whole queries
    and isinstance(value, str)
    and re.match(r"\s*(MATCH|CREATE|MERGE|UNWIND|CALL|WITH|OPTIONAL)\b", value)
    and not re.match(r"\s*CALL \(\w", value)  # a subquery importing variables is a fragment
]


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=[n for n, _ in QUERIES])
async def test_query_compiles(runtime: Runtime, name: str, query: str) -> None:
    params = {p: None for p in re.findall(r"\$(\w+)", query)}
    if re.search(r"\n(MATCH|WITH) [^\n]*\s*$", query):  # a head (e.g. READ_LOCK): compile it as one
        query += "RETURN *\n"
    # The constants are LiteralStrings in graph/; here they are read back reflectively.
    await runtime.driver.execute_query(cast(LiteralString, "EXPLAIN " + query), params)
