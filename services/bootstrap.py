"""Open and close the runtime of a process (API, worker, CLI) from its settings."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import AsyncGenerator, Generator
from contextlib import asynccontextmanager, contextmanager
from typing import Final, Literal
from urllib.parse import urlsplit

from arq.connections import ArqRedis
from neo4j import AsyncDriver
from threadpoolctl import threadpool_limits

from graph import bots as bots_q
from graph.driver import make_driver, ping, read
from graph.migrations import LATEST, current_version, migrate
from services import jobs, slots
from services.crypto import Keyring
from services.errors import outage
from services.redisconn import Pool, keeping_cancels
from services.redisquiet import QuietRedis
from services.runtime import Runtime
from services.settings import ConfigurationError, Settings
from services.vectorindex import VectorIndexes

log = logging.getLogger("botmemory")


#: How often a process that waits for the schema reads its version, and logs that it waits.
SCHEMA_POLL_SECONDS: Final = 0.5
SCHEMA_LOG_SECONDS: Final = 10.0

#: What a process does about the schema at start: apply the migrations (the API), wait until
#: another process has (the worker: one migrating process at a time), or nothing (the CLI).
Schema = Literal["migrate", "wait", "none"]


class SchemaTooNew(ConfigurationError):
    """The database was migrated by newer code than this process runs."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"the database schema is version {version}, newer than this code's {LATEST}: upgrade this process"
        )


async def wait_for_schema(driver: AsyncDriver) -> int:
    """Until the schema version is this code's (``LATEST``), reading it every half second and
    saying at once, then every ten seconds, that it waits; a newer version is refused."""
    said: float | None = None
    while True:
        version = await current_version(driver)
        if version > LATEST:
            raise SchemaTooNew(version)
        if version == LATEST:
            return version
        if said is None or time.monotonic() - said >= SCHEMA_LOG_SECONDS:
            said = time.monotonic()
            log.info(
                "waiting for schema version %s (the database has %s); the API applies it at start",
                LATEST,
                version,
            )
        await asyncio.sleep(SCHEMA_POLL_SECONDS)


#: How often a process that waits for Neo4j at start tries it again, and how often it says so.
NEO4J_POLL_SECONDS: Final = 1.0
NEO4J_LOG_SECONDS: Final = 10.0


async def wait_for_neo4j(driver: AsyncDriver, uri: str) -> None:
    """Until Neo4j answers a statement: tried every NEO4J_POLL_SECONDS, saying at once and then
    every NEO4J_LOG_SECONDS that it waits, never giving up: a process started before its database,
    or while it restarts, serves once it is up. Any other failure (a refused login) is raised."""
    parts = urlsplit(uri)
    where = f"{parts.hostname}:{parts.port or 7687}"  # never the URI's user or password
    said: float | None = None  # when it last said it waits
    with _stopped_by_signals():
        while True:
            try:
                await ping(driver)
                break
            except Exception as exc:
                if not outage(exc):
                    raise
                if said is None:
                    log.warning(
                        "waiting for Neo4j at %s (%s); this process starts once it answers",
                        where,
                        type(exc).__name__,
                    )
                    said = time.monotonic()
                elif time.monotonic() - said >= NEO4J_LOG_SECONDS:
                    log.warning("still waiting for Neo4j at %s (%s)", where, type(exc).__name__)
                    said = time.monotonic()
            await asyncio.sleep(NEO4J_POLL_SECONDS)
    if said is not None:
        log.info("Neo4j answers at %s", where)


@contextmanager
def _stopped_by_signals() -> Generator[None]:
    """SIGTERM and SIGINT end the process at once while it waits: nothing is served or held yet,
    and uvicorn's own handlers only note a signal until the application has started (a stopped
    API would go on waiting). The handlers set before are set again after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


async def _check_master_keys(driver: AsyncDriver, keyring: Keyring) -> None:
    """Refuse to start when a Bot's data key is wrapped by a master key this process lacks: a lost
    or mistyped ``BOTMEMORY_MASTER_KEY`` (or the old one left out during a rotation) started a
    healthy-looking service whose every read of that Bot's content failed (INTERNAL)."""
    # A managed transaction: retried while a Neo4j that is still starting does not answer, as the
    # migration after it is.
    found = await read(driver, lambda tx: bots_q.foreign_key_masters(tx, known=keyring.known_ids))
    if found["bots"]:
        raise ConfigurationError(
            f"{found['bots']} Bots' data keys are wrapped by a master key this process does not have "
            f"(key ids {', '.join(found['masters'])}; this process has {', '.join(keyring.known_ids)}): "
            "set BOTMEMORY_MASTER_KEY to the key they were made with, or list it in "
            "BOTMEMORY_PREVIOUS_MASTER_KEYS during a rotation"
        )


def redis_of(settings: Settings) -> ArqRedis:
    """The process's Redis client: each command and each connection given at most
    ``redis_timeout_seconds`` (a Redis that accepts connections and never answers held requests,
    and the worker's queue polling, for ever), its writes keeping a cancel, each caller waiting for
    its own connection alone (``services.redisconn``)."""
    return ArqRedis(
        keeping_cancels(
            Pool.from_url(
                settings.redis_url,
                socket_timeout=settings.redis_timeout_seconds,
                socket_connect_timeout=settings.redis_timeout_seconds,
                socket_keepalive=True,
            )
        ),
        job_serializer=jobs.serialize,
        job_deserializer=jobs.deserialize,
    )


@asynccontextmanager
async def open_runtime(settings: Settings, *, schema: Schema = "migrate") -> AsyncGenerator[Runtime]:
    """Connect to Neo4j and Redis, see to the schema (``schema``), and close everything on exit.
    numpy's BLAS runs on ``index_threads`` threads meanwhile."""
    blas = threadpool_limits(limits=settings.index_threads, user_api="blas")
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    driver = make_driver(settings.neo4j_uri, settings.neo4j_user, password, settings.neo4j_retry_seconds)
    redis = redis_of(settings)
    quiet = QuietRedis(redis, settings.redis_timeout_seconds)
    try:
        # The keys are read and checked before the schema is touched: a deploy with a key of the
        # wrong shape, or another deployment's, migrated the database, then failed, and the old
        # release refused the newer schema.
        keyring = Keyring(settings.master_key_bytes(), settings.previous_master_key_bytes())
        if schema != "none":
            await wait_for_neo4j(driver, settings.neo4j_uri)
            await _check_master_keys(driver, keyring)
        if schema == "migrate":
            version = await migrate(driver)
            if version > LATEST:
                raise SchemaTooNew(version)
            log.info("schema version %s", version)
        elif schema == "wait":
            log.info("schema version %s", await wait_for_schema(driver))
        vectors = VectorIndexes(max_bytes=settings.index_memory_mb * 2**20)
        yield Runtime(
            settings=settings, driver=driver, redis=redis, keyring=keyring, quiet=quiet, vectors=vectors
        )
    finally:
        try:  # slots being given back (their tasks cancelled by the shutdown) go before Redis does
            await asyncio.wait_for(slots.given_back(), settings.redis_timeout_seconds)
        except TimeoutError:
            log.warning("task slots were still being given back; they free when their leases end")
        finally:
            await quiet.close()
            await redis.aclose(close_connection_pool=True)
            await driver.close()
            blas.restore_original_limits()
