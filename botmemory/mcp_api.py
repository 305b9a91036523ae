"""The API as the MCP server reaches it: GraphQL POSTs over HTTP with the caller's person token.

The MCP server holds no database credentials and no master key; every read it makes goes through
the API and so through the one visibility check (V7, V10). An API error becomes an MCP tool error
that carries the API's code and message, never a traceback or the token.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import httpx
from mcp.server.mcpserver.exceptions import ToolError

#: Entry fields every tool shows the model (``saidAt``: when its newest source was said, D9.31).
_ENTRY: Final = "id layer content tags saidAt"

REMEMBER: Final = (
    "mutation($b: ID!, $c: String!, $t: [String!], $k: String) {"
    f" remember(botId: $b, content: $c, tags: $t, idempotencyKey: $k) {{ version entry {{ {_ENTRY} }} }} }}"
)
WHY: Final = (
    "query($b: ID!, $id: ID!) { entry(botId: $b, id: $id) {"
    f" entry {{ {_ENTRY} }} why {{ summary steps {{ entry chat item rule admittedBy reason }} }} }} }}"
)
#: Whether the API accepts a token (any person's token reads itself).
WHO: Final = "query { me { id } }"
FORGET: Final = (
    "mutation($b: ID!, $id: ID!, $k: String) { forget(botId: $b, id: $id, idempotencyKey: $k) { version } }"
)
#: How many times a change is sent, with one idempotency key, while no answer says what became of
#: it (:meth:`Api.change`).
CHANGE_ATTEMPTS: Final = 3
SEARCH: Final = (
    "query($b: ID!, $q: String!, $l: Int!) {"
    f" search(botId: $b, query: $q, limit: $l) {{ score entry {{ {_ENTRY} }} }} }}"
)


class ApiError(ToolError):
    """A failed call, shown to the model as ``CODE: message`` (the API's stable codes)."""

    def __init__(self, code: str, message: str, *, unanswered: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        #: A change sent and not answered: it may have been made.
        self.unanswered = unanswered


def _failure(body: object, status: int, names: Mapping[str, str]) -> ApiError | None:
    """The first error of a GraphQL answer (or of the REST error shape), if any; a message about an
    argument the API calls by another name (``names``: the API's → the tool's) says the tool's."""
    if not isinstance(body, dict):
        return ApiError("UNAVAILABLE", f"the botmemory API answered HTTP {status} without a JSON object")
    answer = cast(dict[str, Any], body)
    errors: Any = answer.get("errors") or ([answer["error"]] if answer.get("error") else [])
    if errors:
        first: dict[str, Any] = errors[0]
        extensions: dict[str, Any] = first.get("extensions") or {}
        code = first.get("code") or extensions.get("code") or "BAD_INPUT"
        message, field = str(first.get("message") or ""), extensions.get("field")
        if isinstance(field, str) and field in names and message.startswith(field + " "):
            message = names[field] + message[len(field) :]
        return ApiError(str(code), message)
    if not isinstance(answer.get("data"), dict):
        return ApiError("UNAVAILABLE", f"the botmemory API answered HTTP {status} without data")
    return None


#: What a proxy in front of the API answers when the API did not answer it in time (or broke off).
_GATEWAY: Final = frozenset({502, 504})
#: What an agent is told of a change whose outcome it cannot know (after what happened).
_MAY_HAVE_BEEN_MADE: Final = ": the change may have been made; read before sending it again"
#: Failures of a request that never reached the API: sent again, it is done once.
_NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True, slots=True)
class Api:
    """One HTTP client for the API at ``base_url``; each call carries the token it is given."""

    http: httpx.AsyncClient
    #: Whether its messages name the API's URL: over stdio they go to the agent of the person who
    #: configured it; over HTTP to any remote agent, whom the API's internal address does not concern.
    named: bool = True

    async def call(
        self, query: str, variables: dict[str, Any], token: str, names: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The data of a successful operation; raises ApiError otherwise (``names``: the tool's
        names of the API's arguments, for its messages)."""
        change = query.startswith("mutation")
        try:
            response = await self.http.post(
                "/graphql",
                json={"query": query, "variables": variables},
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            # Without the URL's user and password, if it has them: this goes to the agent.
            api = (
                f"the botmemory API at {self.http.base_url.copy_with(userinfo=b'')}"
                if self.named
                else "the botmemory API"
            )
            if change and not isinstance(exc, _NOT_SENT):
                # Sent, and no answer came (a slow commit behind a held lock, a dropped
                # connection): the API may have made the change. Said as "not reachable", an
                # agent sent it again (UNAVAILABLE: try again), and a second entry was pinned.
                message = f"{api} did not answer ({type(exc).__name__})"
                raise ApiError("UNAVAILABLE", message + _MAY_HAVE_BEEN_MADE, unanswered=True) from None
            raise ApiError("UNAVAILABLE", f"{api} is not reachable ({type(exc).__name__})") from None
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if change and response.status_code in _GATEWAY and body is None:
            # A proxy in front of the API gave up waiting: the API may have gone on and made it.
            message = f"a proxy before the botmemory API answered HTTP {response.status_code}"
            raise ApiError("UNAVAILABLE", message + _MAY_HAVE_BEEN_MADE, unanswered=True)
        failure = _failure(body, response.status_code, names or {})
        if failure is not None:
            raise failure
        data: dict[str, Any] = body["data"]
        return data

    async def change(
        self, query: str, variables: dict[str, Any], token: str, names: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """A mutation taking ``$k``, sent with an idempotency key of its own (D9.35) and sent again
        with it, CHANGE_ATTEMPTS times at most, while no answer says whether it was made (sent and
        unanswered, a proxy's 502/504, the API or Neo4j away: UNAVAILABLE): made once, whichever
        answers were lost. When every attempt failed so, one that was sent and not answered makes
        the last failure say the change may have been made (a later attempt that finds the API
        away says only that, and an agent would send it again with another key)."""
        keyed, attempt, unanswered = {**variables, "k": secrets.token_hex(16)}, 1, False
        while True:
            try:
                return await self.call(query, keyed, token, names)
            except ApiError as exc:
                unanswered = unanswered or exc.unanswered
                if exc.code != "UNAVAILABLE":
                    raise
                if attempt == CHANGE_ATTEMPTS:
                    if unanswered and not exc.unanswered:
                        raise ApiError(exc.code, exc.message + _MAY_HAVE_BEEN_MADE, unanswered=True) from None
                    raise
            await asyncio.sleep(0.5 * attempt)
            attempt += 1
