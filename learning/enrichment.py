"""Input additions at Turn start (N1–N5, D9.15, D9.16) and the Chat owner's enrichments (D9.6).

``start_turn`` saves the person's words as the Turn's first Item, then asks the memory Bot to
rewrite them with entries that every reader of the answer may see (the person of a private
chat, every current member of a group chat). The model is sent only those entries; its
``used_entry_ids`` must be among them; ``validateReferences`` runs again before the rewrite is
returned or saved. Anything else — a notice, a review chat, ``botMemory`` off, no model, budget
spent, nothing visible, no answer within the deadline — leaves the input as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from typing import Final

from neo4j.exceptions import DriverError, Neo4jError

from graph import memorybot as memorybot_q
from graph.driver import read, save_within
from learning import toolcalls
from learning.gateway import Call, Gateway, ModelUnavailable, ToolCall
from learning.prompts import MEMORY_VOCABULARY, system_prompt
from services import metrics, retrieval, search, turns
from services.crypto import Kind
from services.datewords import day_of, query_terms, zone_key, zone_of
from services.domain import Principal, Turn
from services.embedding import Embedder
from services.idempotency import Key
from services.ids import new_id
from services.memorybot import Route, route_and_reader
from services.runtime import Runtime, now_ms

log = logging.getLogger("botmemory.enrichment")

_SAVE_MARGIN = 0.3

REWRITE_SYSTEM = (
    "You help an assistant understand the message a person just sent it. You get the message and "
    "notes that may help, each with an id and the day it was said (in the person's time zone; UTC "
    "when it is unknown). When notes help, rewrite "
    "the message so that it carries what helps from them (with their days where the message asks "
    "when something happened or names a time), in the person's voice, keeping everything the "
    "person says and asks; then call rewrite_input with the new text and the ids of the notes you "
    "used. Never mention the notes as such. When nothing helps, call no tool."
)

REWRITE_TOOL: Final = toolcalls.tool("rewrite_input", toolcalls.RewriteInput)


async def start_turn(
    rt: Runtime,
    gateway: Gateway,
    principal: Principal,
    chat_id: str,
    text: str,
    *,
    actor_id: str | None,
    notice: bool,
    said_at: int | None = None,
    time_zone: str | None = None,
    arrived: float | None = None,
    complete: bool = False,
    key: Key | None = None,
) -> Turn:
    """``startTurn``: the Turn with its input saved, and ``enriched_input`` for the caller only (D9.16).
    ``complete``: the Turn is saved completed; ``key``: the caller's idempotency key
    (:func:`services.turns.start_turn`) — a start sent again with it gets its Turn's saved rewrite
    while every entry it was sent is still visible to the Chat's readers (D9.15), else the input,
    and asks no model."""
    deadline = (arrived or time.monotonic()) + rt.settings.answer_deadline_seconds
    # A person's words are the query of the enrichment: their embedding runs while the Turn is
    # written, started once the caller may write the Chat (dropped when the enrichment does not
    # search). Started before that check, a refused caller — any token, any chat id — spent the
    # process's one embedder on it.
    embedder, early = gateway.embedder, None
    if embedder is not None and not notice and len(text) <= rt.settings.max_text_chars:
        early = search.EarlyQuery(embedder, text)
    try:
        turn = await turns.start_turn(
            rt,
            principal,
            chat_id,
            text,
            actor_id=actor_id,
            notice=notice,
            said_at=said_at,
            time_zone=time_zone,
            allowed=None if early is None else early.start,
            complete=complete,
            key=key,
        )
        if turn.replayed:
            enriched, drawn = await replayed_rewrite(rt, turn)
        else:
            enriched, drawn = await rewrite(rt, gateway, turn, deadline, early or embedder, said_at=said_at)
    finally:
        if early is not None:
            await early.aclose()
    return replace(turn, enriched_input=enriched, drawn_entry_ids=drawn)


async def replayed_rewrite(rt: Runtime, turn: Turn) -> tuple[str, tuple[str, ...]]:
    """The rewrite saved for ``turn``'s start, while every entry it was sent is still visible to
    every reader of the answer (D9.15) and the Chat's history was not deleted since (D9.23);
    else its input as it is. With the entries it may draw on, as :func:`rewrite`."""
    original = turn.input or ""
    if turn.actor_kind != "person" or turn.input is None:
        return original, ()
    _, route, reader = await route_and_reader(rt, turn.chat_id)
    if reader is None or route.history_epoch != turn.history_epoch:
        return original, ()
    saved = await read(rt.driver, lambda tx: memorybot_q.turn_rewrite(tx, turn_id=turn.id))
    if saved is None:
        return original, ()
    sent = list(saved["sentEntryIds"])
    if not await retrieval.validate_references(rt, route.bot_id, reader, sent):
        return original, ()
    return route.cipher.decrypt(Kind.ENRICHMENT, saved["id"], saved["text"]), tuple(sent)


async def rewrite(
    rt: Runtime,
    gateway: Gateway,
    turn: Turn,
    deadline: float,
    embedder: Embedder | None,
    *,
    said_at: int | None = None,
) -> tuple[str, tuple[str, ...]]:
    """The input with what helps from memory, or the input as it is (N1), and the entries it may
    draw on (every entry its rewrite was sent); ``embedder`` embeds the query (the gateway's, or an :class:`services.search.EarlyQuery`
    of it). The input's days are read in the time zone it was said in (``turn.input_time_zone``,
    D9.32)."""
    original = turn.input or ""
    if turn.actor_kind != "person":  # notices are not a person's words
        return original, ()
    outcome, drawn = "kept", ()
    try:
        enriched, outcome, drawn = await _rewrite(
            rt,
            gateway,
            embedder,
            turn,
            original,
            deadline - _SAVE_MARGIN,
            now_ms() if said_at is None else said_at,
        )
    except ModelUnavailable as exc:  # budget_spent and busy among them (read with a slot held)
        enriched, outcome = original, exc.code
    except TimeoutError:
        enriched = original
    except (Neo4jError, DriverError) as exc:
        # The Turn is committed: failed now, the caller was told to send startTurn again (503),
        # which started a second Turn of the same words. The input is kept, as for any failure.
        log.warning("enrichment kept the input: the store failed (%s)", type(exc).__name__)
        enriched, outcome = original, "store_failed"
    metrics.ENRICHMENTS.labels(outcome=outcome).inc()
    return enriched, drawn


async def _rewrite(
    rt: Runtime,
    gateway: Gateway,
    embedder: Embedder | None,
    turn: Turn,
    original: str,
    deadline: float,
    said_at: int,
) -> tuple[str, str, tuple[str, ...]]:
    """The rewritten input, how it went, and the entries it may draw on (all it was sent); ``said_at``: when
    the input was said, the day its "yesterday" is counted from (D9.31), in the time zone it was
    said in (D9.32)."""
    zone = turn.input_time_zone
    async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
        chat, route, reader = await route_and_reader(rt, turn.chat_id)
        if route.history_epoch != turn.history_epoch:
            # The Chat's history was deleted after the Turn began: its words are gone (D9.23), and
            # nothing made of them may be kept (the route read after the deletion let it be).
            return original, "history_deleted", ()
        if chat["review"] or not route.bot_memory or route.model is None:
            return original, "off", ()
        if reader is None:
            return original, "nothing_visible", ()
        # A spent budget keeps the input as it is (L6, seed 000), a saved rewrite included.
        if await gateway.budget_spent(rt, route):
            return original, "budget_spent", ()
        # Equal words that name another day ("yesterday", asked again tomorrow) are another input,
        # and so are words said in a time zone of other rules (the notes' days are that zone's,
        # D9.32); "UTC" is no zone, and "US/Pacific" is "America/Los_Angeles".
        terms = query_terms(original, said_at, zone)
        where = [] if (key := zone_key(zone)) is None else [f"zone:{key}"]
        digest = route.cipher.digest(Kind.INPUT_DIGEST, "\x00".join([original, *terms, *where]))
        saved = await read(
            rt.driver, lambda tx: memorybot_q.saved_rewrite(tx, chat_id=turn.chat_id, input_digest=digest)
        )
        if saved is not None:
            # Every entry the model was sent, not only those it says it used: its text may draw on
            # any of them, and one may have become invisible to a reader since (D9.15).
            ids, sent = list(saved["usedEntryIds"]), list(saved["sentEntryIds"])
            if await retrieval.validate_references(rt, route.bot_id, reader, sent):
                text = route.cipher.decrypt(Kind.ENRICHMENT, saved["id"], saved["text"])
                await _save(rt, route, turn, text, original, ids, sent, digest, deadline + _SAVE_MARGIN)
                return text, "reused", tuple(sent)
        # One read decides: nothing visible (or nothing that fits) → no model call (N3).
        known = await search.context(
            rt,
            embedder,
            route.bot_id,
            reader,
            rt.settings.answer_context_chars,
            original,
            said_at=said_at,
            zone=zone,
        )
        if not known.ids:
            return original, "nothing_visible", ()
    # Each note with the day it was said (D9.31): "when did …?" is answered from it, the day as
    # the person lives it (D9.32).
    local = zone_of(zone)
    notes = [
        {"id": i, "text": c, "said": day_of(at, local).isoformat()}
        for i, c, at in zip(known.ids, known.contents, known.said_at, strict=True)
    ]
    body = {
        "messages": [
            {"role": "system", "content": system_prompt(REWRITE_SYSTEM, route)},
            {
                "role": "user",
                "content": json.dumps({"message": original, "notes": notes}, ensure_ascii=False),
            },
        ],
        "tools": [REWRITE_TOOL],
        "tool_choice": "auto",
    }
    call = Call("rewrite", body, deadline, entry_ids=known.ids, save_by=deadline + _SAVE_MARGIN)
    completion = await gateway.complete(rt, route, call, gate=True)
    parsed = _parse(completion.tool_calls, set(known.ids), rt.settings.max_text_chars)
    if parsed is None:
        return original, "refused", ()
    text, used = parsed
    # Sources may have changed while the model thought: check again before returning (D9.15),
    # every entry it was sent (its text may draw on any), within what is left of the wait (it
    # takes the shared lock, which a long purge may hold).
    sent = list(known.ids)
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
            valid = await retrieval.validate_references(rt, route.bot_id, reader, sent)
    except TimeoutError:
        return original, "stale", ()
    if not valid:
        return original, "stale", ()
    await _save(rt, route, turn, text, original, used, sent, digest, deadline + _SAVE_MARGIN)
    return text, "rewritten", tuple(sent)


def _parse(calls: tuple[ToolCall, ...], sent: set[str], limit: int) -> tuple[str, list[str]] | None:
    """``rewrite_input(text, used_entry_ids)`` citing only what was sent; else None (keep the input)."""
    found = [c for c in calls if c.name == "rewrite_input"]
    if len(found) != 1 or len(calls) != 1:
        return None
    args = toolcalls.checked(toolcalls.RewriteInput, found[0].arguments)
    if args is None:
        return None
    text, ids = args.text, args.used_entry_ids
    if len(text) > limit:  # NUL and lone surrogates: refused by RewriteInput (bad_string)
        return None
    if not set(ids) <= sent:
        return None  # D9.15: citing anything that was not sent refuses the rewrite
    if MEMORY_VOCABULARY.search(text):
        return None  # D9.16
    return text, list(dict.fromkeys(ids))


async def _save(
    rt: Runtime,
    route: Route,
    turn: Turn,
    text: str,
    original: str,
    used: list[str],
    sent: list[str],
    digest: str,
    by: float,
) -> None:
    """The rewrite, saved by ``by`` (``time.monotonic``; past it, without its text), with the
    entries it says it ``used`` and every entry it was ``sent``."""
    enrichment_id = new_id("enr")
    fields = {
        "id": enrichment_id,
        "botId": route.bot_id,
        "turnId": turn.id,
        "text": route.cipher.encrypt(Kind.ENRICHMENT, enrichment_id, text),
        "original": route.cipher.encrypt(Kind.ENRICHMENT_ORIGINAL, enrichment_id, original),
        "usedEntryIds": used,
        "sentEntryIds": sent,
        "inputDigest": digest,
        "now": now_ms(),
        "historyEpoch": route.history_epoch,
    }
    await save_within(
        rt.driver,
        by - time.monotonic(),
        lambda with_text: lambda tx: memorybot_q.create_enrichment(tx, with_text=with_text, **fields),
    )
