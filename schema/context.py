"""The typed per-request GraphQL context."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

from strawberry.extensions import SchemaExtension
from strawberry.types import Info as _Info

from learning.gateway import Gateway
from schema.loaders import Loaders
from services.auth import authenticate
from services.changefeed import ChangeHub
from services.domain import Principal
from services.embedding import Embedder
from services.errors import BadInput, ServiceError
from services.runtime import Runtime
from services.turnfeed import TurnHub

#: The unpaged ``memory`` fields the running operation has read (:meth:`Context.read_whole_memory`):
#: one counter per operation, set in the operation's own task as it starts. A WebSocket connection
#: runs its operations side by side on one Context, and a count kept on the Context was set back
#: to zero by every operation that started: one sent while another ran let that one read a second.
_WHOLE_READS: Final[ContextVar[list[int]]] = ContextVar("botmemory_whole_reads")


@dataclass(slots=True)
class Context:
    """Runtime dependencies, the model gateway and embedder, the caller's credentials (authenticated
    once per request or WebSocket connection) and the DataLoaders of the request."""

    runtime: Runtime
    gateway: Gateway
    embedder: Embedder | None
    authorization: str | None
    hub: ChangeHub | None = None
    turn_hub: TurnHub | None = None
    connection_params: dict[str, object] | None = None
    #: False for a WebSocket connection: its context serves every operation on it (see Loaders).
    cache_loaders: bool = True
    loaders: Loaders = field(init=False)
    _auth: Principal | ServiceError | None = field(default=None)
    _authenticating: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.loaders = Loaders(self.runtime, self.principal, cache=self.cache_loaders)

    async def principal(self) -> Principal:
        """The caller: the first call authenticates, concurrent and later calls share its outcome."""
        outcome = self._auth
        if outcome is None:
            async with self._authenticating:
                outcome = self._auth
                if outcome is None:
                    try:
                        outcome = await authenticate(self.runtime, self.authorization)
                    except ServiceError as exc:
                        outcome = exc
                    self._auth = outcome
        if isinstance(outcome, ServiceError):
            raise type(outcome)(outcome.message, field=outcome.field)
        return outcome

    @property
    def streamed(self) -> bool:
        """Whether operations on this context are streamed (a WebSocket connection)."""
        return not self.cache_loaders

    def operation_started(self) -> None:
        """A WebSocket connection's context serves every operation sent on it: each authenticates
        the token again and has loaders of its own, so a token revoked or expired while the socket is open stops working for
        the next operation, as it does over HTTP (subscriptions check it again as they deliver)."""
        if self.streamed:
            self._auth = None
            # Fresh loaders too: a connection's kept one per message paging it was ever asked for
            # (``messages(skip: 1)``, ``skip: 2``…), for as long as the socket stayed open.
            self.loaders = Loaders(self.runtime, self.principal, cache=False)
        _WHOLE_READS.set([0])  # the operation's task and the fields' tasks it starts share the list

    def read_whole_memory(self) -> None:
        """An unpaged ``memory`` field: every entry the caller may see, decrypted (3.3 s and
        ~73k decryptions at 100k entries). One per operation: thirty aliases of it, within the
        alias limit, held a process for ~100 s and answered hundreds of MB. Counted as the
        fields run, so a ``limit`` passed as a null variable counts too."""
        reads = _WHOLE_READS.get(None)
        if reads is None:  # outside an operation: counted from here
            reads = [0]
            _WHOLE_READS.set(reads)
        reads[0] += 1
        if reads[0] > 1:
            raise BadInput(
                "an operation reads at most one unpaged memory; page the others (limit, after)",
                field="limit",
            )

    async def authenticate_connection(self) -> None:
        """graphql-transport-ws: the token comes in ``connection_init`` (or the upgrade request) as
        ``{"Authorization": "Bearer <t>"}`` (any case), ``{"token": "<t>"}`` or those headers
        under ``"headers"`` (what GraphiQL's header editor sends)."""
        authorization = _authorization(self.connection_params or {})
        if authorization is not None:
            if self.authorization not in (None, authorization):  # and another on the upgrade
                raise BadInput(ONE_CREDENTIAL, field="connection_init")
            self.authorization = authorization
        await self.principal()


#: What a ``connection_init`` carrying more than one credential is told (its socket closes, 4400).
ONE_CREDENTIAL: Final = (
    "send one credential in connection_init: Authorization, token or headers.Authorization"
)


def _authorization(params: dict[str, object]) -> str | None:
    """The credential of a ``connection_init`` payload, as an Authorization header's value. One
    that carries two (``token`` and ``Authorization``, or ``Authorization`` in two cases) is
    BadInput, as two Authorization headers are over HTTP: which one would count?"""
    headers = params.get("headers")
    sources: list[dict[str, object]] = [params]
    if isinstance(headers, dict):
        sources.append({str(k): v for k, v in headers.items()})  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    named = [
        value
        for source in sources
        for key, value in source.items()
        if key.lower() == "authorization" and value is not None
    ]
    token = params.get("token")
    if len(named) + (token is not None) > 1:
        raise BadInput(ONE_CREDENTIAL, field="connection_init")
    if named:
        return named[0] if isinstance(named[0], str) else None
    return f"Bearer {token}" if isinstance(token, str) else None


Info = _Info[Context, None]


class PerOperationAuth(SchemaExtension):
    """Starts each operation with :meth:`Context.operation_started`."""

    def on_operation(self) -> Iterator[None]:
        context = self.execution_context.context
        if isinstance(context, Context):
            context.operation_started()
        yield
