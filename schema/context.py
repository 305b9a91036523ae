"""The typed per-request GraphQL context."""

from __future__ import annotations

from dataclasses import dataclass, field

from strawberry.types import Info as _Info

from learning.gateway import Gateway
from services.auth import authenticate
from services.changefeed import ChangeHub
from services.domain import Principal
from services.embedding import Embedder
from services.runtime import Runtime
from services.turnfeed import TurnHub


@dataclass(slots=True)
class Context:
    """Runtime dependencies, the model gateway and embedder, plus the caller's credentials, authenticated lazily once per request."""

    runtime: Runtime
    gateway: Gateway
    embedder: Embedder | None
    authorization: str | None
    hub: ChangeHub | None = None
    turn_hub: TurnHub | None = None
    connection_params: dict[str, object] | None = None
    _principal: Principal | None = field(default=None)

    async def principal(self) -> Principal:
        if self._principal is None:
            self._principal = await authenticate(self.runtime, self.authorization)
        return self._principal

    async def authenticate_connection(self) -> None:
        """graphql-transport-ws: the token comes in ``connection_init`` (or the upgrade request)."""
        params = self.connection_params or {}
        token = params.get("Authorization") or params.get("authorization")
        if isinstance(token, str):
            self.authorization = token
        self._principal = await authenticate(self.runtime, self.authorization)


Info = _Info[Context, None]
