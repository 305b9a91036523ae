"""The Chat owner's view of how the memory Bot learned from the Chat (D9.21): each execution's
status, how many entries it learned, its error code, and the evidence it set aside with the
refusal codes — codes and positions, never content."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from neo4j import AsyncManagedTransaction

from graph import sweeps as sweeps_q
from services.domain import Principal
from services.memorybot import owner_records
from services.runtime import Runtime


@dataclass(frozen=True, slots=True)
class SetAside:
    """Evidence a refused step never learned: Items ``first``..``last`` of the Chat (by sequence)."""

    first: int
    last: int
    codes: tuple[str, ...]

    @classmethod
    def parse(cls, stored: str) -> SetAside:
        span, codes = stored.split(":", 1)
        first, last = span.split("-", 1)
        return cls(int(first), int(last), tuple(codes.split(",")))


@dataclass(frozen=True, slots=True)
class Execution:
    id: str
    turn_id: str
    status: str
    learned: int
    error: str | None
    set_aside: tuple[SetAside, ...]
    created_at: int
    ended_at: int | None


async def executions(
    rt: Runtime, principal: Principal, chat_id: str, *, limit: int = 50, skip: int = 0
) -> tuple[list[Execution], int]:
    """The Chat owner's learning executions, newest first (the same owner check as confessions):
    one page, and how many there are."""

    async def fetch(
        tx: AsyncManagedTransaction, chat: str, skip: int, limit: int
    ) -> tuple[list[sweeps_q.ExecutionMap], int]:
        return await sweeps_q.list_executions(tx, chat_id=chat, skip=skip, limit=limit)

    view = await owner_records(rt, principal, chat_id, fetch, limit=limit, skip=skip)
    return [
        Execution(
            str(f["id"]),
            str(f["turnId"]),
            str(f["status"]),
            _learned(f, view.visible),
            f.get("error"),
            tuple(SetAside.parse(str(a)) for a in cast(list[Any], f.get("setAside") or [])),
            int(f["createdAt"]),
            None if f["endedAt"] is None else int(f["endedAt"]),
        )
        for f in view.records
    ], view.total


def _learned(execution: sweeps_q.ExecutionMap, visible: set[str]) -> int:
    """How many of the entries an execution added the owner may see now: it may also have changed
    entries of others (learningContext holds the organization's), which a count of its changes
    told the owner of. An execution that kept no ids (``producedIds`` None) shows its count."""
    produced = execution.get("producedIds")
    if produced is None:
        return int(execution.get("learned") or 0)
    return sum(i in visible for i in produced)
