"""Memory queries and mutations (DESIGN §5): the same services as the REST routes."""

from __future__ import annotations

from typing import Annotated

import strawberry

from schema.context import Info
from schema.memory import (
    AccessProof,
    HistoryDeleted,
    MemoryChange,
    MemoryEntry,
    MemoryLog,
    MemoryPage,
    PurgePayload,
    RememberPayload,
    SearchHit,
    SourceItem,
    SourceNeighbour,
    SourceNeighbourhood,
    VersionPayload,
)
from schema.types import IdempotencyKey, Long, MemoryContext
from services import chatmemory, commands, memory, search, sourcegraph
from services.memory import MAX_PAGE


@strawberry.type
class ExploredEntry:
    """An entry for source-graph exploration; neighbours are resolved with the caller's rights."""

    bot_id: strawberry.Private[str]
    entry: MemoryEntry

    async def _hood(self, info: Info, direction: sourcegraph.Direction, depth: int) -> SourceNeighbourhood:
        principal = await info.context.principal()
        hood = await sourcegraph.neighbourhood(
            info.context.runtime, principal, self.bot_id, str(self.entry.id), direction, depth
        )
        return SourceNeighbourhood(
            entries=[
                SourceNeighbour(entry=MemoryEntry.of(n.entry), distance=n.distance) for n in hood.entries
            ],
            items=[
                SourceItem(chat=strawberry.ID(i.chat), item=strawberry.ID(i.item), distance=i.distance)
                for i in hood.items
            ],
            hidden=hood.hidden,
        )

    @strawberry.field(description="What this entry rests on, within depth hops (max 8).")
    async def sources(self, info: Info, depth: int = 1) -> SourceNeighbourhood:
        return await self._hood(info, "sources", depth)

    @strawberry.field(description="Observations that rest on this entry, within depth hops (max 8).")
    async def dependents(self, info: Info, depth: int = 1) -> SourceNeighbourhood:
        return await self._hood(info, "dependents", depth)

    @strawberry.field(
        description="Why you can see this entry: each rule of it and of its sources, met by you."
    )
    async def why(self, info: Info) -> AccessProof:
        principal = await info.context.principal()
        proof = await sourcegraph.why(info.context.runtime, principal, self.bot_id, str(self.entry.id))
        return AccessProof.of(proof)


@strawberry.type
class MemoryQuery:
    @strawberry.field(description="One entry you may see, for source-graph exploration.")
    async def entry(self, info: Info, bot_id: strawberry.ID, id: strawberry.ID) -> ExploredEntry:
        principal = await info.context.principal()
        found = await sourcegraph.entry(info.context.runtime, principal, str(bot_id), str(id))
        return ExploredEntry(bot_id=str(bot_id), entry=MemoryEntry.of(found))

    @strawberry.field(
        description="Entries for you in your organization; tags are all-of. With limit (1–1000), "
        "one page in memory order after the cursor after, and the next page's cursor. Without "
        "either, every entry: at most one such field per operation."
    )
    async def memory(
        self,
        info: Info,
        bot_id: strawberry.ID,
        tags: list[str] | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> MemoryPage:
        principal = await info.context.principal()
        rt, bot, tags = info.context.runtime, str(bot_id), tags or []
        if limit is None and after is None:
            info.context.read_whole_memory()
            found, version = await memory.list_entries(rt, principal, bot, tags)
            return MemoryPage(entries=[MemoryEntry.of(e) for e in found], version=version)
        page, version, next_page = await memory.list_page(
            rt, principal, bot, tags, MAX_PAGE if limit is None else limit, after
        )
        return MemoryPage(entries=[MemoryEntry.of(e) for e in page], version=version, next=next_page)

    @strawberry.field(
        description="The active entries you may see that are most relevant to query (meaning and "
        "keywords), best first, at most limit (1–100)."
    )
    async def search(
        self,
        info: Info,
        bot_id: strawberry.ID,
        query: str,
        limit: int = 10,
        chat_id: strawberry.ID | None = None,
    ) -> list[SearchHit]:
        principal = await info.context.principal()
        rt, embedder = info.context.runtime, info.context.embedder
        if chat_id is None:
            hits = await search.person_search(rt, embedder, principal, str(bot_id), query, limit)
        else:
            hits = await chatmemory.chat_search(
                rt, embedder, principal, str(chat_id), query, limit, bot_id=str(bot_id)
            )
        return [SearchHit(score=h.score, entry=MemoryEntry.of(h.entry)) for h in hits]

    @strawberry.field(
        description="Server callers (a platform token of the chat's organization): the visible "
        "memory of every reader of an answer in the chat as text within limit characters, chosen "
        "by relevance to query when given, with the ids of the entries used."
    )
    async def context(
        self, info: Info, chat_id: strawberry.ID, limit: int = 4000, query: str | None = None
    ) -> MemoryContext:
        principal = await info.context.principal()
        found = await chatmemory.context(
            info.context.runtime, info.context.embedder, principal, str(chat_id), limit, query
        )
        return MemoryContext(text=found.text, ids=[strawberry.ID(i) for i in found.ids])

    @strawberry.field(
        description="Server callers: whether any active entry is visible to the chat's readers."
    )
    async def has_entries(self, info: Info, chat_id: strawberry.ID) -> bool:
        principal = await info.context.principal()
        return await chatmemory.has_entries(info.context.runtime, principal, str(chat_id))

    @strawberry.field(
        description="Server callers: whether a saved answer that used these entry ids may still be "
        "shown to the chat's readers (no content is read)."
    )
    async def validate_references(self, info: Info, chat_id: strawberry.ID, ids: list[strawberry.ID]) -> bool:
        principal = await info.context.principal()
        return await chatmemory.validate_references(
            info.context.runtime, principal, str(chat_id), [str(i) for i in ids]
        )

    @strawberry.field(
        description="Changes of entries you may see, newest first: limit (1–1000) rows of versions "
        "below before."
    )
    async def memory_log(
        self, info: Info, bot_id: strawberry.ID, limit: int = MAX_PAGE, before: int | None = None
    ) -> MemoryLog:
        principal = await info.context.principal()
        changes, version, next_page = await memory.change_log(
            info.context.runtime, principal, str(bot_id), limit, before
        )
        rows = [
            MemoryChange(
                version=c.version,
                at=Long(c.at),
                actor=c.actor,
                ids=[strawberry.ID(i) for i in c.ids],
                removed=[strawberry.ID(i) for i in c.removed],
            )
            for c in changes
        ]
        return MemoryLog(changes=rows, version=version, next=next_page)


@strawberry.type
class MemoryMutation:
    @strawberry.mutation(description="A pinned entry only you see.")
    async def remember(
        self,
        info: Info,
        bot_id: strawberry.ID,
        content: str,
        tags: list[str] | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> RememberPayload:
        principal = await info.context.principal()
        key = commands.remember_key(principal, idempotency_key, str(bot_id), content, tags or [])
        entry, version = await commands.remember(
            info.context.runtime, principal, str(bot_id), content, tags or [], info.context.embedder, key
        )
        return RememberPayload(entry=MemoryEntry.of(entry), version=version)

    @strawberry.mutation(description="Take back your part of an entry (CONFLICT when it is not for you).")
    async def forget(
        self, info: Info, bot_id: strawberry.ID, id: strawberry.ID, idempotency_key: IdempotencyKey = None
    ) -> VersionPayload:
        principal = await info.context.principal()
        key = commands.forget_key(principal, idempotency_key, str(bot_id), str(id))
        return VersionPayload(
            version=await commands.forget(info.context.runtime, principal, str(bot_id), str(id), key)
        )

    @strawberry.mutation(description="Share an entry with a wider audience, within every source rule (V6).")
    async def share_entry(
        self,
        info: Info,
        bot_id: strawberry.ID,
        id: strawberry.ID,
        audience: list[str],
        expected: Annotated[
            Long | None,
            strawberry.argument(
                description="The entry's changedVersion as you read it: CONFLICT when a change named "
                "the entry since (another share, a forget). Null: shared whatever changed."
            ),
        ] = None,
    ) -> VersionPayload:
        principal = await info.context.principal()
        applied = await commands.share(
            info.context.runtime,
            principal,
            str(bot_id),
            str(id),
            audience,
            None if expected is None else int(expected),
        )
        return VersionPayload(version=applied.version)

    @strawberry.mutation(description="Remove every entry carrying a from:, chat:, org: or channel: tag.")
    async def purge(self, info: Info, bot_id: strawberry.ID, tag: str) -> PurgePayload:
        principal = await info.context.principal()
        return PurgePayload(removed=await commands.purge(info.context.runtime, principal, str(bot_id), tag))

    @strawberry.mutation(description="Remove the content of a Chat's Items; what was learned stays (V13).")
    async def delete_chat_history(self, info: Info, chat_id: strawberry.ID) -> HistoryDeleted:
        principal = await info.context.principal()
        return HistoryDeleted(
            items=await commands.delete_chat_history(info.context.runtime, principal, str(chat_id))
        )
