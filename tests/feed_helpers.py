"""Subscriptions over graphql-transport-ws for tests: a subscription is used only once the API
process has registered it (its ``botmemory_subscriptions_opened_total`` counter moved), so a
test never sleeps and hopes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from tests.client import Api
from tests.waiting import until

SUBSCRIBE = "subscription($b: ID!) { memoryChanges(botId: $b) { version entries { id content status } } }"


def ws_url(api: Api) -> str:
    return str(api.http.base_url).replace("http://", "ws://").rstrip("/") + "/graphql"


async def opened(api: Api, feed: str) -> float:
    """How many subscriptions of ``feed`` the API process has registered so far."""
    text = (await api.http.get("/metrics")).text
    prefix = f'botmemory_subscriptions_opened_total{{feed="{feed}"}} '
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


async def until_opened(api: Api, feed: str, count: float, within: float = 20) -> None:
    """Until the API process has registered ``count`` subscriptions of ``feed``."""

    async def registered() -> bool:
        return await opened(api, feed) >= count

    await until(registered, f"the server never registered the {feed} subscription", within=within, every=0.02)


@asynccontextmanager
async def subscribed(
    api: Api,
    token: str,
    query: str,
    variables: dict[str, Any],
    feed: str,
    id: str = "1",
    wait: bool = True,
    **connect: Any,
) -> AsyncGenerator[ClientConnection]:
    """A subscription of ``feed``, yielded once the server registered it (every later event
    reaches it); ``wait=False`` for one the server refuses."""
    before = await opened(api, feed)
    async with websockets.connect(ws_url(api), subprotocols=["graphql-transport-ws"], **connect) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}})
        )
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "connection_ack"
        await ws.send(
            json.dumps({"id": id, "type": "subscribe", "payload": {"query": query, "variables": variables}})
        )
        if wait:
            await until_opened(api, feed, before + 1)
        yield ws


def subscription(
    api: Api, token: str, bot: str, query: str = SUBSCRIBE, id: str = "1", **connect: Any
) -> Any:
    """``memoryChanges(botId: bot)``, registered."""
    return subscribed(api, token, query, {"b": bot}, "memoryChanges", id, **connect)


async def next_event(ws: ClientConnection, within: float = 10) -> dict[str, Any]:
    message = json.loads(await asyncio.wait_for(ws.recv(), within))
    assert message["type"] == "next", message
    return message["payload"]["data"]["memoryChanges"]
