"""The unit tier (``make test-unit``): pure functions only, no Neo4j, Redis, API or model server.

``tests/conftest.py`` is still loaded, but its service fixtures are lazy; this hook fails a unit
test that asks for one of them before any fixture starts, so the tier runs without a stack.
"""

from __future__ import annotations

import pytest

SERVICE_FIXTURES = frozenset(
    {
        "settings",
        "runtime",
        "model_server",
        "service_env",
        "api_process",
        "worker_process",
        "api",
        "learning_worker",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    used = (
        SERVICE_FIXTURES.intersection(item.fixturenames) if isinstance(item, pytest.Function) else set[str]()
    )
    if used:
        pytest.fail(
            f"unit tests run without services; move this test out of tests/unit (uses {sorted(used)})"
        )
