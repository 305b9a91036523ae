"""Per-request DataLoaders: each batch of lookups is one statement, read for the request's principal."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from strawberry.dataloader import DataLoader

from services import chats, provisioning
from services.domain import Bot, Chat, Item, Page, Principal
from services.errors import ServiceError
from services.runtime import Runtime


class Loaders:
    """Chats, message pages, message counts and Bots by id, batched per event-loop tick.

    Each key gets exactly what the single lookup gives the same caller: the value, null, or that
    key's error. With ``cache`` off (a WebSocket connection, whose context outlives its
    operations) loads are still batched but never reused by a later operation.
    """

    __slots__ = ("_cache", "_pages", "_principal", "_rt", "bot", "chat", "message_count")

    def __init__(
        self, runtime: Runtime, principal: Callable[[], Awaitable[Principal]], *, cache: bool
    ) -> None:
        self._rt, self._principal, self._cache = runtime, principal, cache
        self._pages: dict[tuple[int, int], DataLoader[str, Page[Item]]] = {}
        self.chat: DataLoader[str, Chat | None] = DataLoader(self._chats, cache=cache)
        self.message_count: DataLoader[str, int] = DataLoader(self._counts, cache=cache)
        self.bot: DataLoader[str, Bot] = DataLoader(self._bots, cache=cache)

    def messages(self, limit: int, skip: int) -> DataLoader[str, Page[Item]]:
        """Pages of Chats' Items; one loader per paging, so each batch is one statement."""
        loader = self._pages.get((limit, skip))
        if loader is None:

            async def load(ids: list[str]) -> Sequence[Page[Item] | ServiceError]:
                principal = await self._principal()
                return await chats.message_pages(self._rt, principal, ids, limit=limit, skip=skip)

            loader = self._pages[(limit, skip)] = DataLoader(load, cache=self._cache)
        return loader

    async def _chats(self, ids: list[str]) -> Sequence[Chat | ServiceError | None]:
        return await chats.get_chats(self._rt, await self._principal(), ids)

    async def _counts(self, ids: list[str]) -> Sequence[int | ServiceError]:
        return await chats.message_counts(self._rt, await self._principal(), ids)

    async def _bots(self, ids: list[str]) -> Sequence[Bot | ServiceError]:
        return await provisioning.get_bots(self._rt, await self._principal(), ids)
