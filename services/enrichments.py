"""The Chat owner's enrichments (N2, D9.6): each rewrite with its original words, withheld when an
entry it used is no longer visible to the owner."""

from __future__ import annotations

from dataclasses import dataclass

from neo4j import AsyncManagedTransaction

from graph import memorybot as memorybot_q
from services.crypto import Kind
from services.domain import Principal
from services.memorybot import owner_records
from services.runtime import Runtime


@dataclass(frozen=True, slots=True)
class Enrichment:
    id: str
    turn_id: str
    text: str | None
    original: str | None
    entry_ids: tuple[str, ...]
    created_at: int


async def enrichments(
    rt: Runtime, principal: Principal, chat_id: str, *, limit: int = 50, skip: int = 0
) -> tuple[list[Enrichment], int]:
    """The Chat owner's view (D9.6): a rewrite whose entries are no longer all visible to the
    owner is withheld; only the original words are returned. One page, oldest first, and how
    many there are."""

    async def fetch(
        tx: AsyncManagedTransaction, chat: str, skip: int, limit: int
    ) -> tuple[list[memorybot_q.EnrichmentNode], int]:
        return await memorybot_q.list_enrichments(tx, chat_id=chat, skip=skip, limit=limit)

    view = await owner_records(rt, principal, chat_id, fetch, limit=limit, skip=skip)
    out: list[Enrichment] = []
    for f in view.records:
        ids = view.shown(f)
        sealed, original = f.get("text"), f.get("original")
        out.append(
            Enrichment(
                f["id"],
                f["turnId"],
                None
                if sealed is None or ids is None
                else view.cipher.decrypt(Kind.ENRICHMENT, f["id"], sealed),
                None
                if original is None
                else view.cipher.decrypt(Kind.ENRICHMENT_ORIGINAL, f["id"], original),
                () if sealed is None or ids is None else ids,
                f["createdAt"],
            )
        )
    return out, view.total
