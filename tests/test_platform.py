"""Health, metrics, migrations, GraphiQL and the schema snapshot."""

from __future__ import annotations

from botmemory.runtime import Runtime
from botmemory.settings import Settings
from graph.migrations import LATEST, current_version, migrate
from resolvers.schema import SNAPSHOT, build_schema
from tests.client import Api


async def test_healthz_checks_neo4j_and_redis(api: Api) -> None:
    response = await api.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "neo4j": "ok", "redis": "ok", "model": "configured"}


async def test_graphiql_loads(api: Api) -> None:
    page = await api.http.get("/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert "graphiql" in page.text.lower()


async def test_migrations_are_idempotent_and_recorded(runtime: Runtime) -> None:
    async def constraints() -> set[str]:
        records, _, _ = await runtime.driver.execute_query("SHOW CONSTRAINTS YIELD name RETURN name")
        return {r["name"] for r in records}

    first = await migrate(runtime.driver)
    names = await constraints()
    second = await migrate(runtime.driver)
    assert first == second == LATEST == await current_version(runtime.driver)
    assert await constraints() == names
    assert {"entry_id", "chat_id", "item_uid", "token_hash", "bot_id"} <= names


def test_schema_snapshot_is_current(settings: Settings) -> None:
    """Regenerate with `python -m resolvers.snapshot` when the schema changes on purpose."""
    assert str(build_schema(settings)).strip() == SNAPSHOT.read_text().strip()
