"""A Neo4j that accepts connections and never answers (its JVM paused, a host that stopped
responding) holds no request: a connection is given up after the silence Neo4j's keep-alive hint
allows (our launcher: NOOPs every second, 5 probes), and a new one after
``graph.driver.CONNECT_SECONDS``; requests are answered 503 UNAVAILABLE."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import httpx
import pytest
from neo4j import AsyncManagedTransaction
from neo4j.exceptions import IncompleteCommit, ServiceUnavailable

from graph.driver import autocommit, make_driver, single, write
from services.errors import unavailable
from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import ApiProcess
from tests.proxies import SilentProxy, through_proxy
from tests.waiting import until

REMEMBER: dict[str, Any] = {"command": {"_tag": "Remember", "content": "Call me Annie", "tags": []}}
MEMORY_QUERY = "query($b: ID!) { memory(botId: $b) { entries { id } } }"
#: How long a test waits for an answer from a process whose Neo4j is silent: far above what the
#: silences and the retries add up to, far below the driver's own 2 min read timeout.
ANSWER_WITHIN = 60


class One(TypedDict):
    n: int


async def test_a_silent_neo4j_is_unavailable_and_the_process_answers_once_it_is_heard_again(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    """An API process whose Neo4j falls silent answers REST and GraphQL requests 503 UNAVAILABLE
    while the silence lasts (they hung 2.5–4 min, the driver's read timeout, then its retries),
    and serves again once Neo4j is heard again."""
    proxy = SilentProxy(settings.neo4j_bolt_port)
    await proxy.start()
    env = through_proxy(proxy.port, service_env)
    log_path = settings.data_dir / "logs" / "pytest-api-neo4j-silent.log"
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    silent = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    offset = log_path.stat().st_size
    try:
        w = await make_world(api, ("ann",))
        ann = bearer(w.tokens["ann"])
        memory = f"/v1/bots/{w.bot}/memory"
        async with httpx.AsyncClient(base_url=silent.url, timeout=ANSWER_WITHIN) as http:
            assert (await http.get(memory, headers=ann)).status_code == 200
            proxy.fall_silent()
            for method, body in (("GET", None), ("POST", REMEMBER)):
                down = await http.request(method, memory, json=body, headers=ann)
                assert down.status_code == 503, down.text
                assert down.headers["retry-after"] == "1"
                assert down.json()["error"]["code"] == "UNAVAILABLE", down.text
            answer = await http.post(
                "/graphql", json={"query": MEMORY_QUERY, "variables": {"b": w.bot}}, headers=ann
            )
            [error] = answer.json()["errors"]
            assert error["extensions"] == {"code": "UNAVAILABLE"}, error
            proxy.hear_again()

            async def back() -> bool:
                return (await http.get(memory, headers=ann)).status_code == 200

            await until(back, "the process never answered again once Neo4j was heard", within=ANSWER_WITHIN)
        logged = log_path.read_bytes()[offset:]
        assert b"unavailable on GET" in logged and b"internal error" not in logged
    finally:
        proxy.hear_again()
        await asyncio.to_thread(silent.stop)
        await proxy.close()


async def test_a_commit_that_neo4j_never_answers_may_have_been_saved(settings: Settings) -> None:
    """A commit sent to a Neo4j that fell silent may have been made: it is said as such ("read
    before sending it again"), never as "try again"; a read that meets the silence is, after one
    attempt (the five attempts of a one-statement read are for a loss found at once: four more
    connections to a silent Neo4j each waited out its silence too)."""
    proxy = SilentProxy(settings.neo4j_bolt_port)
    await proxy.start()
    password = settings.neo4j_password.get_secret_value() if settings.neo4j_password else ""
    driver = make_driver(f"bolt://127.0.0.1:{proxy.port}", settings.neo4j_user, password, retry_seconds=0.5)

    async def silenced_before_the_commit(tx: AsyncManagedTransaction) -> None:
        await single(tx, "RETURN 1 AS n", One)
        proxy.fall_silent()

    try:
        with pytest.raises(IncompleteCommit) as lost:
            await write(driver, silenced_before_the_commit)
        said = unavailable(lost.value)
        assert said is not None and "may have been saved" in said.message
        with pytest.raises(ServiceUnavailable) as gone:
            await autocommit(driver, lambda session: single(session, "RETURN 1 AS n", One))
        assert not isinstance(gone.value, IncompleteCommit)
        assert proxy.unheard == 1  # the read's one connection: the commit's was open before
        said = unavailable(gone.value)
        assert said is not None and "try again" in said.message
    finally:
        proxy.hear_again()
        await driver.close()
        await proxy.close()
