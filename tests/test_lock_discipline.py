"""C1, D9.8: every statement that reads or writes what a Bot's Memory lock guards (its entries,
their sources and labels) runs in a transaction that took that lock first, or is one of the few
listed below with the reason it need not.

Checked on what runs, not on what the statements say: an API runs in this process (uvicorn, over
the suite's Neo4j and Redis), every statement of every transaction is recorded while a workload
goes through its routes and a learning step runs, and each transaction's statements are read in
order. ``tests/test_cypher.py`` checks, on their plans, that the statements which take the lock
read nothing before it."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
from typing import Any

import httpx
import pytest
import uvicorn
from neo4j import AsyncManagedTransaction, AsyncSession, AsyncTransaction

from botmemory.app import create_app
from graph.snapshot import statements
from learning.executions import ExecutionRunner
from learning.gateway import Gateway
from services.changes import Invalidate, RenameTopic, Revise, SetTopics, Share
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api, bearer
from tests.learning_helpers import complete, confide, executions, fact_call, first_item, learn, memory_world
from tests.memory_helpers import apply, command, fact, said
from tests.model_server import ModelServer, Reply, ToolCall
from tests.test_cypher import MEMORY_LOCK
from tests.test_learning_steps import queued_in_the_graph_only
from tests.test_removals import remember
from tests.waiting import until

#: What a Memory's lock guards, as a statement names it: entries, their SOURCE edges.
GUARDED = re.compile(r"\(\w*:Entry\b|:Entry\)|-\[:SOURCE")

#: The lock taken only when the statement has entries to look at (its ids given): a model call's
#: or a confession's record, which keeps its texts only while every entry they drew on is there.
LOCK_WHEN_NEEDED = re.compile(
    r"\s*OPTIONAL MATCH \((\w+):Memory [^\n]*\nCALL apoc\.lock\.(?:read\.)?nodes\(\[x IN \[\1\] WHERE "
)

#: Statements that read entries with no lock of the Memory, and why that is safe.
UNLOCKED = {
    "graph.search.DERIVED_SINCE": "a cold load of the search index reads every entry's derived data "
    "with no lock, then the search catches up under the shared lock from the Memory's vecSeq it "
    "read first (design §10): what it proposes is checked under the lock",
}


@dataclasses.dataclass
class Recorded:
    """Each statement run, in order, with the transaction it ran in (an auto-commit statement is
    a transaction of its own)."""

    runs: list[tuple[object, str]] = dataclasses.field(default_factory=list[tuple[object, str]])

    def unlocked(self) -> list[str]:
        """The statements that touched what the lock guards in a transaction that had not taken
        it (the lock's own statement counts: it takes it first)."""
        locked: set[int] = set()
        found: list[str] = []
        for tx, query in self.runs:
            if MEMORY_LOCK.match(query) or LOCK_WHEN_NEEDED.match(query):
                locked.add(id(tx))
            elif GUARDED.search(query) and id(tx) not in locked:
                found.append(_name_of(query))
        return found


def _name_of(query: str) -> str:
    """The statement constant ``query`` is made of (the longest one), or its first line."""
    known: dict[str, str] = statements()
    names = [name for name, text in known.items() if len(text.strip()) > 40 and text.strip() in query]
    return max(names, key=lambda name: len(known[name])) if names else query.strip().splitlines()[0]


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    seen = Recorded()

    def wrap(cls: Any, own_transaction: bool) -> None:
        original = cls.run

        async def run(self: Any, query: Any, parameters: Any = None, **kwargs: Any) -> Any:
            seen.runs.append((object() if own_transaction else self, str(getattr(query, "text", query))))
            return await original(self, query, parameters, **kwargs)

        monkeypatch.setattr(cls, "run", run)

    wrap(AsyncManagedTransaction, False)
    wrap(AsyncTransaction, False)
    wrap(AsyncSession, True)
    return seen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_what_the_memory_lock_guards_is_touched_only_under_it(
    api: Api, runtime: Runtime, settings: Settings, model_server: ModelServer, recorded: Recorded
) -> None:
    port = _free_port()
    here = settings.model_copy(update={"openai_base_url": model_server.base_url})
    server = uvicorn.Server(
        uvicorn.Config(create_app(here), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:

        async def started() -> bool:
            assert not serving.done(), "the in-process API did not start"
            return server.started

        await until(started, "the in-process API did not start")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            await _workload(Api(http, api.admin_token), runtime, here, model_server)
    finally:
        server.should_exit = True
        await serving
    touched = {_name_of(q) for _, q in recorded.runs if GUARDED.search(q)}
    assert len(touched) >= 25, sorted(touched)  # the workload reached the statements it is for
    found = recorded.unlocked()
    assert "\n".join(sorted({n for n in found if n not in UNLOCKED})) == ""
    assert set(UNLOCKED) <= set(found), "no longer run without the lock: take it off UNLOCKED"


async def _workload(api: Api, runtime: Runtime, settings: Settings, model_server: ModelServer) -> None:
    """Most routes that read or change a Bot's memory, as people and a platform use them."""
    model_server.reset()
    w = await memory_world(api, ("ann", "bob"), channel=("ann", "bob"))
    ann, bob = w.tokens["ann"], w.tokens["bob"]
    private = await api.chat(ann, w.bot)
    group = await api.chat(ann, w.bot, channel=w.channel)
    trains = await fact(runtime, w.bot, "Ann prefers trains", await said(api, ann, private, "trains"))
    team = await fact(runtime, w.bot, "The team ships on Fridays", await said(api, bob, group, "fridays"))
    await fact(runtime, w.bot, "Ann likes tea", await said(api, ann, private, "tea"), topics=("drinks",))
    pinned = await remember(api, ann, w.bot, "Ann's locker code is 4711")
    await apply(
        runtime,
        w.bot,
        SetTopics(trains, ("travel",)),
        RenameTopic("drinks", "tea-time", w.org),
        Share(team, (f"for:channel:{w.channel}",)),
        Revise(pinned, "Ann's locker code is 4712"),
    )
    # Reads of a person: the list, a page, search, the log, context and a pack of a Chat.
    for path in ("memory", "memory?limit=1", "memory/search?q=trains", "memory/log"):
        response = await api.http.get(f"/v1/bots/{w.bot}/{path}", headers=bearer(ann))
        assert response.status_code == 200, (path, response.text)
    data = await api.gql(
        'query($b: ID!, $c: ID!) { search(botId: $b, query: "tea", limit: 5) { score }'
        " contextPack(chatId: $c) { memory { ids } } }",
        {"b": w.bot, "c": private},
        ann,
    )
    assert data["search"]
    # A platform's calls on behalf of a Chat's readers (D9.26).
    platform = await api.platform_token(w.org)
    for path in ("memory/context?limit=4000&q=ship", "memory/has-entries", "memory/search?q=ship"):
        response = await api.http.get(f"/v1/chats/{group}/{path}", headers=bearer(platform))
        assert response.status_code == 200, (path, response.text)
    response = await api.http.post(
        f"/v1/chats/{group}/memory/validate-references", json={"ids": [team]}, headers=bearer(platform)
    )
    assert response.status_code == 200, response.text
    # A Turn enriched by a rewrite, a confide answered from memory, its learning step run here.
    model_server.script(
        "rewrite",
        Reply(tool_calls=[ToolCall("rewrite_input", {"text": "Book a train.", "used_entry_ids": [trains]})]),
    )
    turn = await api.turn(ann, private, "Book me a trip.")
    item = await first_item(api, ann, private)
    model_server.script("confide", Reply(text="That happens."))
    await confide(api, ann, turn["id"], "I booked the plane.")
    queued = await queued_in_the_graph_only(runtime, turn["id"])
    model_server.script("learn", learn(fact_call("Ann books trains.", item)))
    learner = dataclasses.replace(runtime, settings=settings)
    runner = ExecutionRunner(learner, Gateway(settings), "test")
    try:
        await runner.run(queued["id"], 0)
    finally:
        await runner.gateway.close()
    assert [x["status"] for x in await executions(runtime, turn["id"])] == ["done"]
    await complete(api, ann, turn["id"])
    # Taking back: Invalidate, Forget, a purge of a Chat's entries.
    await fact(runtime, w.bot, "Ann flies", await said(api, ann, private, "flies"))
    response = await command(api, ann, w.bot, {"_tag": "Forget", "id": trains})
    assert response.status_code == 200, response.text
    invalidated = await fact(runtime, w.bot, "Ann drives", await said(api, ann, private, "drives"))
    await apply(runtime, w.bot, Invalidate(invalidated))
    response = await api.http.post(
        f"/v1/bots/{w.bot}/memory/purge", json={"tag": f"chat:{private}"}, headers=bearer(ann)
    )
    assert response.status_code == 200, response.text
    response = await api.http.get(f"/v1/bots/{w.bot}/memory", headers=bearer(bob))
    assert response.status_code == 200, response.text
