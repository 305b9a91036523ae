"""The evaluation's own processes around the test-profile Neo4j and Redis: the scripted model
server, one API and one learning worker (``tools.processes``) on their own Redis database, and the
removal of what a run created."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import tarfile
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, LiteralString, TypedDict

import httpx
from neo4j import AsyncManagedTransaction

from bench.learning_bench import delete_world, with_db
from eval.scripted import ScriptedModel
from graph.access import IdsRow
from graph.driver import read, single, write
from graph.entries import CountRow
from services.bootstrap import open_runtime
from services.runtime import Runtime
from services.settings import Settings
from tests.client import Api
from tests.model_server import ModelServer
from tools.processes import ServerProcess, WorkerProcess

ROOT = Path(__file__).resolve().parent.parent

#: What ``bench.learning_bench.delete_world`` leaves: the chats' summaries and saved rewrites.
DELETE_SUMMARIES: Final[LiteralString] = (
    "MATCH (s:ChatSummary) WHERE s.chatId IN $chats WITH s LIMIT 5000 DETACH DELETE s RETURN count(*) AS n"
)
DELETE_ENRICHMENTS: Final[LiteralString] = (
    "MATCH (n:Enrichment) WHERE n.botId IN $bots WITH n LIMIT 5000 DETACH DELETE n RETURN count(*) AS n"
)
ORG_CHATS: Final[LiteralString] = """
MATCH (o:Organization {id: $org})
OPTIONAL MATCH (b:Bot)-[:OWNED_BY]->(o)
OPTIONAL MATCH (c:Chat {botId: b.id})
RETURN collect(DISTINCT b.id) AS bots, collect(DISTINCT c.id) AS chats
"""


class _OrgChats(TypedDict):
    bots: list[str]
    chats: list[str]


ORGS_NAMED: Final[LiteralString] = (
    "MATCH (o:Organization) WHERE o.name STARTS WITH $prefix RETURN collect(o.id) AS ids"
)


@dataclass
class Stack:
    api: Api
    model: ScriptedModel
    rt: Runtime
    api_process: ServerProcess
    worker: WorkerProcess

    async def stop_services(self) -> None:
        """Stop the worker and the API (again: no-op), e.g. before deleting what they wrote."""
        await asyncio.to_thread(self.worker.stop)
        await asyncio.to_thread(self.api_process.stop)


def export(rev: str) -> tuple[Path, str]:
    """The tree of commit ``rev`` (``git archive``, extracted once under .data/eval/code/) and its
    full id: the API and the worker run from it, the harness from the working tree."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = ROOT / ".data" / "eval" / "code" / sha[:12]
    if not (dest / ".exported").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha], cwd=ROOT, capture_output=True, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(dest, filter="data")
        (dest / ".exported").write_text(sha + "\n")
    return dest, sha


def service_env(settings: Settings, model: ModelServer, budget: int | None) -> dict[str, str]:
    """The API's and the worker's environment: the scripted model, no sweeper and no backfill
    (both would act on every Bot in Neo4j, a test suite's included: the backfill gave a running
    suite's Bots the keywords its tests had just taken away; the replay's entries get theirs,
    and their vectors, as they are written), and the data dir as an absolute path (the processes
    may run in an exported tree)."""
    env = {
        "BOTMEMORY_DATA_DIR": str(settings.data_dir.resolve()),
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-eval",
        "BOTMEMORY_REDIS_URL": settings.redis_url,
        "BOTMEMORY_SWEEP_INTERVAL_SECONDS": "86400",
        "BOTMEMORY_BACKFILL": "false",
    }
    if budget is not None:
        env["BOTMEMORY_ANSWER_CONTEXT_CHARS"] = str(budget)
    return env


def redis_db(settings: Settings, db: int) -> Settings:
    return settings.model_copy(update={"redis_url": with_db(settings.redis_url, db)})


@contextlib.asynccontextmanager
async def running(settings: Settings, budget: int | None, code: Path = ROOT) -> AsyncGenerator[Stack]:
    """The model server, an API and a worker running the code in ``code`` (logs under the data
    dir), and a runtime for cleanup."""
    assert settings.admin_token is not None
    logs = settings.data_dir / "logs"
    server = ModelServer().start()
    env = service_env(settings, server, budget)
    api_process: ServerProcess | None = None
    worker: WorkerProcess | None = None
    try:
        api_process = await asyncio.to_thread(ServerProcess, logs / "eval-api.log", env, code)
        worker = WorkerProcess(logs / "eval-worker.log", env, cwd=code)
        await asyncio.to_thread(worker.wait_ready, 60)
        async with (
            open_runtime(settings, schema="none") as rt,
            httpx.AsyncClient(base_url=api_process.url, timeout=60) as http,
        ):
            yield Stack(
                Api(http, settings.admin_token.get_secret_value()),
                ScriptedModel(server),
                rt,
                api_process,
                worker,
            )
    finally:
        if worker is not None:
            await asyncio.to_thread(worker.stop)
        if api_process is not None:
            await asyncio.to_thread(api_process.stop)
        server.stop()


async def delete_org(rt: Runtime, org: str) -> None:
    """Everything of one Organization: its Bots' learning records, chats, entries, people."""
    found = await read(rt.driver, lambda tx: single(tx, ORG_CHATS, _OrgChats, org=org))
    bots: list[str] = [] if found is None else list(found["bots"])
    chats: list[str] = [] if found is None else list(found["chats"])
    for query in (DELETE_SUMMARIES, DELETE_ENRICHMENTS):
        while True:

            async def work(tx: AsyncManagedTransaction, query: LiteralString = query) -> int:
                r = await single(tx, query, CountRow, chats=chats, bots=bots)
                return 0 if r is None else int(r["n"])

            if await write(rt.driver, work) < 5000:
                break
    await delete_world(rt, org)


async def orgs_named(rt: Runtime, prefix: str) -> list[str]:
    found = await read(rt.driver, lambda tx: single(tx, ORGS_NAMED, IdsRow, prefix=prefix))
    return [] if found is None else list(found["ids"])
