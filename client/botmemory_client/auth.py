"""The generated clients with a base URL and a bearer token: the only hand-written part.

Every operation is a method of the generated ``Client`` (``generated_sync`` / ``generated_async``);
these subclasses only point it at ``<url>/graphql`` and send the token, as the ``Authorization``
header over HTTP and in the ``connection_init`` payload of a subscription (graphql-transport-ws).
"""

from __future__ import annotations

from typing import cast

import httpx

from botmemory_client.generated_async import Client as AsyncClient
from botmemory_client.generated_async.async_base_client import HttpClient as AsyncHttpClient
from botmemory_client.generated_sync import Client as SyncClient
from botmemory_client.generated_sync.base_client import HttpClient


def graphql_url(url: str) -> str:
    """The GraphQL endpoint of an API base URL (``http://host:8000`` or ``…/graphql``)."""
    base = url.rstrip("/")
    return base if base.endswith("/graphql") else base + "/graphql"


def websocket_url(url: str) -> str:
    """The subscription endpoint of an API base URL (``ws://`` or ``wss://``)."""
    endpoint = graphql_url(url)
    if endpoint.startswith("https://"):
        return "wss://" + endpoint.removeprefix("https://")
    return "ws://" + endpoint.removeprefix("http://")


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# The generated HttpClient protocols declare post()'s arguments positional where httpx has them
# keyword-only; the generated clients only ever pass them by keyword, hence the casts below.
class BotMemory(SyncClient):
    """Blocking client: ``BotMemory("http://127.0.0.1:8000", token).memory(bot_id=…)``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        headers = bearer(token)
        http = httpx.Client(headers=headers, timeout=timeout)
        super().__init__(url=graphql_url(url), headers=headers, http_client=cast(HttpClient, http))


class AsyncBotMemory(AsyncClient):
    """Asyncio client, with the subscriptions: ``async for change in client.memory_changes(bot_id=…)``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        headers = bearer(token)
        super().__init__(
            url=graphql_url(url),
            headers=headers,
            http_client=cast(AsyncHttpClient, httpx.AsyncClient(headers=headers, timeout=timeout)),
            ws_url=websocket_url(url),
            ws_connection_init_payload=headers or None,
        )
