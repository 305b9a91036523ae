"""Helpers for memory tests: learned facts and observations go through the real apply_changes."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, LiteralString, cast

from graph.access import ReaderMap, readers_now
from services.changes import AddFact, AddObservation, Applied, ItemRef, MemoryChange
from services.memory import Reader
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, bearer


async def said(
    api: Api, token: str, chat: str, text: str, *, said_at: int | None = None, time_zone: str | None = None
) -> tuple[str, str]:
    """A person's message as a completed Turn (``said_at``: when it was said, as a platform
    importing history gives it; ``time_zone``: where); returns (chat id, item id)."""
    turn = await api.turn(token, chat, text, said_at=said_at, time_zone=time_zone)
    await api.gql("mutation($t: ID!) { completeTurn(turnId: $t) { id } }", {"t": turn["id"]}, token)
    page = await api.gql("query($c: ID!) { chat(id: $c) { messageCount } }", {"c": chat}, token)
    return chat, f"i-{page['chat']['messageCount']}" if page["chat"] else "i-0"


async def fact(
    rt: Runtime, bot: str, content: str, *sources: tuple[str, str], topics: tuple[str, ...] = ()
) -> str:
    change = AddFact(content=content, sources=tuple(ItemRef(c, i) for c, i in sources), topics=topics)
    await apply_changes(rt, bot, [change], "memory_bot")
    return change.id


async def observation(rt: Runtime, bot: str, content: str, *source_ids: str, confidence: float = 0.8) -> str:
    change = AddObservation(content=content, source_entry_ids=source_ids, confidence=confidence)
    await apply_changes(rt, bot, [change], "memory_bot")
    return change.id


async def apply(rt: Runtime, bot: str, *changes: MemoryChange) -> Applied:
    return await apply_changes(rt, bot, list(changes), "memory_bot")


async def visible(api: Api, token: str, bot: str, tags: str | None = None) -> dict[str, Any]:
    """GET memory over REST: {id: entry}."""
    query = f"?tags={tags}" if tags else ""
    response = await api.http.get(f"/v1/bots/{bot}/memory{query}", headers=bearer(token))
    assert response.status_code == 200, response.text
    return {e["id"]: e for e in response.json()["entries"]}


async def db_hits(rt: Runtime, query: str, params: Mapping[str, Any]) -> int:
    """The database hits of ``query`` with ``params``, PROFILEd (it runs)."""
    _, summary, _ = await rt.driver.execute_query(cast(LiteralString, "PROFILE " + query), dict(params))

    def hits(plan: Any) -> int:
        return int(plan.get("dbHits", 0)) + sum(hits(child) for child in plan.get("children", []))

    return hits(summary.profile)


async def checked_readers(rt: Runtime, bot: str, reader: Reader) -> list[ReaderMap]:
    """The readers as a statement that checks sees them (``readers_now``, under no lock): a group
    chat's whole reader is built from its channel's members there, not passed in."""
    records, _, _ = await rt.driver.execute_query(
        readers_now() + "RETURN readers", botId=bot, **reader.params
    )
    return cast(list[ReaderMap], records[0]["readers"])


async def command(api: Api, token: str, bot: str, body: dict[str, Any]) -> Any:
    return await api.http.post(f"/v1/bots/{bot}/memory", json={"command": body}, headers=bearer(token))


def sealed(stored: Any) -> bytes:
    """The bytes of a ciphertext as stored (``services.crypto.Sealed``: base64 text), to check
    that no plaintext is in it."""
    assert isinstance(stored, str), f"a ciphertext is stored as text, not {type(stored).__name__}"
    return base64.b64decode(stored, validate=True)
