"""Starting is boring: several processes migrating the same database at once all succeed and
agree on the schema version (the API and the worker start together on a fresh data directory)."""

from __future__ import annotations

import asyncio

from graph.migrations import LATEST, current_version, migrate
from services.runtime import Runtime

DROPS = (
    "DROP INDEX entry_bot_id IF EXISTS",
    "DROP INDEX entry_vec_seq IF EXISTS",
    "DROP INDEX enrichment_bot IF EXISTS",
    "DROP INDEX confession_bot IF EXISTS",
)


async def test_concurrent_starters_all_migrate_to_the_latest_version(runtime: Runtime) -> None:
    driver = runtime.driver
    for _ in range(3):
        # As if nothing had been applied: every schema statement runs again in every starter, and
        # a few indexes really are missing, so the starters race to create them.
        for drop in DROPS:
            await driver.execute_query(drop)
        await driver.execute_query("MATCH (s:SchemaVersion {id: 'schema'}) SET s.version = 0")
        versions = await asyncio.gather(*(migrate(driver) for _ in range(4)))
        assert versions == [LATEST] * 4
        assert await current_version(driver) == LATEST
