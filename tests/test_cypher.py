"""Every Cypher constant of graph/ compiles on the real server (EXPLAIN), so a typo fails here first,
and none reads a whole label or relationship type where it means a few of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, LiteralString, cast

import pytest

from graph.memorybot import SAVED_REWRITE
from graph.snapshot import statements
from services.runtime import Runtime

QUERIES = [
    (name, value)
    for name, value in statements().items()
    if re.match(r"\s*(MATCH|CREATE|MERGE|UNWIND|CALL|WITH|OPTIONAL)\b", value)
    and not re.match(r"\s*CALL \(\w", value)  # a subquery importing variables is a fragment
]


#: Operators that read every node of a label, every node, or every relationship of a type.
SCANS = frozenset(
    {"NodeByLabelScan", "AllNodesScan", "DirectedRelationshipTypeScan", "UndirectedRelationshipTypeScan"}
)

#: The statements that mean to read every node of their label, and why that stays small.
SWEEPS = {
    "graph.bots.ALL_BOT_KEYS": "every Bot's wrapped key, for a master-key rotation",
    "graph.bots.ALL_BOTS": "the operator's list of Bots (one per Bot, at most 1,000 rows)",
    "graph.bots.FOREIGN_KEY_MASTERS": "every Bot's key name, once as a process starts (E1)",
}

#: The statements that mean to read every entry of a Bot, and why.
BOT_SWEEPS = {
    "graph.backfill.PROGRESS": "a backfill's progress counts the Bot's entries (CLI and status)",
    "graph.entries.ALL_IDS": "relabel of a whole Bot (python -m botmemory.cli relabel)",
    "graph.purge.TAGGED_IDS": "a purge by OpenBot's tag (D9.20), an operator's rare act (only topics are linked)",
}

#: An index operator on Entry that seeks only the Bot: ``botId = $botId``, perhaps with a
#: predicate every entry meets (``id IS NOT NULL``).
_WHOLE_BOT = re.compile(
    r":Entry\((?:botId|botId, \w+)\) WHERE botId = \$botId(?: AND \w+ IS NOT NULL)?(?:,|$)"
)

#: Tails of statements: their ``e`` is bound by what comes before them, not read from a label.
TAILS = frozenset({"graph.memory.ENTRY_ROW", "graph.memory.ENTRY_LIST"})


async def explained(runtime: Runtime, query: str) -> Any:
    """The plan of ``query`` (EXPLAIN, every parameter null; a head is closed with RETURN *)."""
    params = {p: None for p in re.findall(r"\$(\w+)", query)}
    if re.search(r"\n(MATCH|WITH) [^\n]*\s*$", query):  # a head (e.g. READ_LOCK): compile it as one
        query += "RETURN *\n"
    # The constants are LiteralStrings in graph/; here they are read back reflectively.
    _, summary, _ = await runtime.driver.execute_query(cast(LiteralString, "EXPLAIN " + query), params)
    return cast(Any, summary.plan)


def operators(plan: Any, keep: Callable[[str, str], bool]) -> list[str]:
    """The operators of ``plan`` (kind without ``@runtime``, details) that ``keep`` picks."""
    kind, details = plan["operatorType"].split("@")[0], plan.get("args", {}).get("Details", "")
    found = [f"{kind} {details}"] if keep(kind, details) else []
    return found + [s for child in plan.get("children", []) for s in operators(child, keep)]


def scans(plan: Any) -> list[str]:
    """The operators of ``plan`` that read a whole label or type, with what they read."""
    return operators(plan, lambda kind, _: kind in SCANS)


def whole_bot_reads(plan: Any) -> list[str]:
    """The index operators of ``plan`` that read every entry of a Bot."""
    return operators(plan, lambda kind, details: "Index" in kind and bool(_WHOLE_BOT.search(details)))


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=[n for n, _ in QUERIES])
async def test_query_compiles(runtime: Runtime, name: str, query: str) -> None:
    await explained(runtime, query)


async def test_no_statement_reads_a_whole_label_it_could_seek(runtime: Runtime) -> None:
    """A statement finds its nodes through an index: a Chat's Items by ``item_chat_seq``, a Bot's
    change log by ``change_bot_version``, not by reading every Item or Change of the database
    (a composite index serves only a predicate on each of its properties: CHAT_PAGES read every
    Item for each Chat until its ``i.seq IS NOT NULL``). Only the sweeps of SWEEPS read a label."""
    found = {name: scans(await explained(runtime, query)) for name, query in QUERIES if name not in TAILS}
    assert {name: s for name, s in found.items() if s and name not in SWEEPS} == {}
    assert all(found[name] for name in SWEEPS), "a sweep that no longer scans: take it off SWEEPS"


async def test_no_statement_reads_every_entry_of_a_bot_but_those_that_mean_it(runtime: Runtime) -> None:
    """learningContext reads the valid entries of its organization (``entry_valid``) and kept
    topic counts, not every entry of the Bot (it filtered and sorted all of them: 342 ms at 100k,
    under the shared lock, before every learning step). Only the statements of BOT_SWEEPS read a
    whole Bot; of the tags only topics are indexed, as relationships (``graph.topics``: a full-text
    index of the tags cost every write ~2 ms, bench/README.md)."""
    found = {
        name: whole_bot_reads(await explained(runtime, query)) for name, query in QUERIES if name not in TAILS
    }
    assert {name: s for name, s in found.items() if s and name not in BOT_SWEEPS} == {}
    assert all(found[name] for name in BOT_SWEEPS), (
        "a sweep that no longer reads the Bot: take it off BOT_SWEEPS"
    )


#: A statement that begins by locking a Bot's Memory (READ_LOCK, BUMP_VERSION and their kin): the
#: lock call, as a plan names it.
MEMORY_LOCK = re.compile(
    r"\s*MATCH \((\w+):Memory [^\n]*\n(?:WHERE [^\n]*\n)?(CALL apoc\.lock\.(?:read\.)?nodes\(\[\1\]\))"
)


#: Statements that read before the Memory's lock, and why that is not what the lock guards.
READ_BEFORE_LOCK = dict.fromkeys(
    [
        "graph.memory.LOCK_AND_READER",
        "graph.memory.LOCK_READER_AND_LIST",
        "graph.memory.LOCK_READER_AND_PAGE",
    ],
    "whether the Bot is owned by or linked into the caller's organization (D9.4): no lock for a "
    "Bot of another organization",
)


def _read_before(plan: Any, lock: str) -> list[str]:
    """What ``plan`` reads before it takes ``lock``: below the lock's operator anything but the
    seek of the Memory node, and the first input of a binary operator whose second input takes
    it (Apply, CartesianProduct: run for each of its rows; a hash join's build side: wholly)."""
    details = plan.get("args", {}).get("Details", "")
    children = plan.get("children", [])
    if lock in details:
        return [s for child in children for s in _reads(child)]
    if len(children) == 2 and _takes(children[1], lock):
        return _reads(children[0]) + _read_before(children[1], lock)
    return [s for child in children for s in _read_before(child, lock)]


def _takes(plan: Any, lock: str) -> bool:
    details = plan.get("args", {}).get("Details", "")
    return lock in details or any(_takes(child, lock) for child in plan.get("children", []))


def _reads(plan: Any) -> list[str]:
    """The operators of ``plan`` that read the graph, but a seek of a Memory node."""
    return operators(
        plan,
        lambda kind, details: (
            ("Seek" in kind or "Scan" in kind or "Expand" in kind) and ":Memory(" not in details
        ),
    )


async def test_every_memory_lock_is_taken_before_anything_is_read_under_it(runtime: Runtime) -> None:
    """C1, D9.8: a read holds the Memory's shared lock, a change its exclusive one, before it
    reads what the lock guards. The statements take it first and read the rest in subqueries
    (``CALL () {…}``), which Neo4j plans after it today (an Apply, or a CartesianProduct whose
    first input is the lock's); a plan that ran such a subquery first would read the log, the
    entries or the readers unlocked — plans chosen by the store's statistics changed before
    (session 55). No plan reads anything but the Memory node before its lock."""
    locked = [(name, query, m.group(2)) for name, query in QUERIES if (m := MEMORY_LOCK.match(query))]
    found = {
        name: _read_before(await explained(runtime, query), lock.split(" ", 1)[1])
        for name, query, lock in locked
    }
    assert {name: ops for name, ops in found.items() if ops and name not in READ_BEFORE_LOCK} == {}
    assert all(found[name] for name in READ_BEFORE_LOCK), "no longer read first: take it off READ_BEFORE_LOCK"
    assert len(found) >= 20, found.keys()  # the locked statements were looked at


async def test_a_saved_rewrite_is_sought_by_its_input_digest(runtime: Runtime) -> None:
    """startTurn looks for a saved rewrite of an equal input: sought by the Chat and the digest
    (``enrichment_chat_digest``), not by reading every rewrite of the Chat (one per Turn)."""
    seeks = operators(await explained(runtime, SAVED_REWRITE), lambda kind, _: "Index" in kind)
    assert any("inputDigest" in s for s in seeks), seeks


@pytest.mark.parametrize(
    "name",
    ["graph.memorybot.LIST_CONFESSIONS", "graph.memorybot.LIST_ENRICHMENTS", "graph.sweeps.LIST_EXECUTIONS"],
)
async def test_a_chats_pages_are_read_in_index_order(runtime: Runtime, name: str) -> None:
    """A page of a Chat's confessions, rewrites (one per Turn) or learning executions: read in the
    order of a (chatId, createdAt, id) index, skip + limit rows, not all of the Chat's sorted."""
    plan = await explained(runtime, statements()[name])
    assert operators(plan, lambda kind, _: kind in {"Sort", "Top", "PartialSort", "PartialTop"}) == []
    assert any("createdAt" in s for s in operators(plan, lambda kind, _: "Index" in kind))


#: Statements that sort Items by ``seq`` after all, and why that stays small.
ITEM_SORTS = {
    "graph.chats.CHAT_TAILS": "puts the $last Items read newest first back in order",
    "graph.chats.CREATE_ITEMS": "the Items it creates",
    "graph.chats.FIRST_ITEM_OF_TURN": "the Items of one Turn",
    "graph.chats.ITEMS_OF_TURN": "the Items of one Turn",
    "graph.chats.ITEMS_BY_UID": "the Items one addItems added (at most 100)",
}


async def test_no_statement_sorts_a_chats_items(runtime: Runtime) -> None:
    """A Chat's Items are read in the order of ``item_chat_seq`` (ordered by chatId and seq, which
    the planner takes from the index): ordered by seq alone, it read every Item after the cut and
    kept the best, so a context pack's last messages, a summary's and a learning step's Items, a
    chat meta and the runner's history cost the whole history of a Chat without a summary."""
    sorts = {
        name: operators(
            await explained(runtime, query),
            lambda kind, details: kind in {"Sort", "Top", "PartialSort", "PartialTop"} and "i.seq" in details,
        )
        for name, query in QUERIES
        if name not in TAILS
    }
    assert {name: s for name, s in sorts.items() if s and name not in ITEM_SORTS} == {}
    assert all(sorts[name] for name in ITEM_SORTS), "no longer sorts: take it off ITEM_SORTS"
