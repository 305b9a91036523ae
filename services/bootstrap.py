"""Open and close the runtime of a process (API, worker, CLI) from its settings."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool

from graph.driver import make_driver
from graph.migrations import migrate
from services import jobs
from services.crypto import Keyring
from services.runtime import Runtime
from services.settings import Settings

log = logging.getLogger("botmemory")


@asynccontextmanager
async def open_runtime(settings: Settings, *, run_migrations: bool = True) -> AsyncGenerator[Runtime]:
    """Connect to Neo4j and Redis, apply migrations, and close everything on exit."""
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    driver = make_driver(settings.neo4j_uri, settings.neo4j_user, password)
    redis = ArqRedis(
        ConnectionPool.from_url(settings.redis_url),
        job_serializer=jobs.serialize,
        job_deserializer=jobs.deserialize,
    )
    try:
        if run_migrations:
            version = await migrate(driver)
            log.info("schema version %s", version)
        keyring = Keyring(settings.master_key_bytes(), settings.previous_master_key_bytes())
        yield Runtime(settings=settings, driver=driver, redis=redis, keyring=keyring)
    finally:
        await redis.aclose(close_connection_pool=True)
        await driver.close()
