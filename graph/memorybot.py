"""The memory Bot's records: its settings (C3, D9.13), model calls with their cost (C5, L6, D9.12)
and confessions (D9.6). Request, result, confession and answer texts arrive encrypted (E1).
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, NotRequired, TypedDict

from neo4j import AsyncManagedTransaction

from graph.chats import MEMORY_OFF, ChatNode
from graph.driver import Ciphertext, QueryTarget, rows, single
from graph.entries import count

#: The settings of a Bot's memory Bot with the Bot's owner organization and data key.
SETTINGS: Final[LiteralString] = """
MATCH (b:Bot {id: $botId})-[:HAS_MEMORY]->(m:Memory)
RETURN m {.settingsVersion, .instructions, .concurrency, .budgetPeriod, .budgetLimitMicros} AS settings
"""


class SettingsMap(TypedDict):
    """The memory Bot's settings: None where the Bot keeps the default."""

    settingsVersion: int
    instructions: str | None
    concurrency: int | None
    budgetPeriod: str | None
    budgetLimitMicros: int | None


class SettingsRow(TypedDict):
    settings: SettingsMap


#: A compare-and-set on the settings' own version (C3, D9.13): nothing changes on a mismatch.
#: Fields absent from ``$set`` keep their value.
UPDATE_SETTINGS: Final[LiteralString] = """
MATCH (b:Bot {id: $botId})-[:HAS_MEMORY]->(held:Memory)
CALL apoc.lock.nodes([held])
WITH held
MATCH (m:Memory) WHERE elementId(m) = elementId(held)
WITH m, m.settingsVersion = $expected AS matches
FOREACH (_ IN CASE WHEN matches THEN [1] ELSE [] END |
  SET m += $set, m.settingsVersion = m.settingsVersion + 1)
RETURN matches, m {.settingsVersion, .instructions, .concurrency, .budgetPeriod, .budgetLimitMicros} AS settings
"""


#: The Bot's Memory locked exclusively (as UPDATE_SETTINGS locks it), for a check that must hold
#: when the settings are written: who may write them is read again under it.
LOCK_SETTINGS: Final[LiteralString] = """
MATCH (b:Bot {id: $botId})-[:HAS_MEMORY]->(m:Memory)
CALL apoc.lock.nodes([m])
"""


class UpdatedSettingsRow(SettingsRow):
    matches: bool


#: Everything a memory-Bot task needs about a Chat, read at the time the task runs (D9.12):
#: the Chat's organization settings (L5, L6: a shared Bot uses the Chat's organization), the
#: memory Bot's settings and the Bot's wrapped key.
CHAT_ROUTE: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})-[:WITH_BOT]->(b:Bot)-[:HAS_MEMORY]->(m:Memory),
      (ch)-[:IN_ORG]->(o:Organization)
RETURN ch {.*, botModel: b.model, botName: b.name} AS chat, o.botMemory AS botMemory,
       o.botMemoryModel AS model,
       m {.settingsVersion, .instructions, .concurrency, .budgetPeriod, .budgetLimitMicros} AS settings,
       b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped
"""


class RouteChat(ChatNode):
    """CHAT_ROUTE's ``chat``: the Chat with its Bot's model (None: none named) and name."""

    botModel: str | None
    botName: str


class RouteRow(TypedDict):
    """CHAT_ROUTE: ``model`` is the organization's memory-Bot model, None when it has none."""

    chat: RouteChat
    botMemory: bool
    model: str | None
    settings: SettingsMap
    keyMaster: str
    keyWrapped: bytes


#: Confirmed spend of a Bot in one budget period, over all organizations (L6).
SPENT: Final[LiteralString] = """
MATCH (s:Spend) WHERE s.botId = $botId AND s.period = $period
RETURN coalesce(sum(s.micros), 0) AS micros, coalesce(sum(s.unknownCalls), 0) AS unknownCalls
"""


class SpentRow(TypedDict):
    micros: int
    unknownCalls: int


#: Whether every entry a saved text embeds (``$entryIds`` of the Bot ``$botId``) still exists
#: (``present``), read under the shared Memory lock, taken first (a purge holds it exclusively while
#: it deletes the entries and strips what embeds them, D9.20: a model call, rewrite or answer in
#: flight meanwhile was saved after, with the purged text), and whether the text is kept
#: (``kept``): only when asked to (``$withText``; a save that could not wait for the lock within
#: its deadline keeps none, and takes no lock) and every entry is present. One row, also without a
#: Memory node.
EMBEDDED_KEPT: Final[LiteralString] = """
OPTIONAL MATCH (m:Memory {id: $botId})
CALL apoc.lock.read.nodes([x IN [m] WHERE x IS NOT NULL AND $withText AND size($entryIds) > 0])
WITH all(i IN $entryIds WHERE EXISTS { MATCH (e:Entry {id: i}) USING INDEX e:Entry(id) WHERE e.botId = $botId }) AS present
WITH present, $withText AND present AS kept
"""

#: A model call with its attempts (C5), and its confirmed cost added to the day and month of
#: the call, per organization (L6). Counters are MERGEd on a unique key and locked before the
#: increment, so concurrent processes add atomically and never upgrade a lock. A call for a Chat
#: whose history was deleted while it ran (``$historyEpoch`` behind, D9.23) keeps no request or
#: result, as the deletion left the calls saved before it.
SAVE_MODEL_CALL: Final[LiteralString] = (
    EMBEDDED_KEPT
    + """
OPTIONAL MATCH (heldC:Chat {id: $chatId})
CALL apoc.lock.nodes([x IN [heldC] WHERE x IS NOT NULL])
OPTIONAL MATCH (hc:Chat) WHERE elementId(hc) = elementId(heldC)
WITH present, kept, hc IS NULL OR coalesce(hc.historyEpoch, 0) = $historyEpoch AS held
CREATE (c:ModelCall {id: $id, botId: $botId, chatId: $chatId, org: $org, task: $task, model: $model,
                     executionId: $executionId, epoch: $epoch, step: $step,
                     requestHash: CASE WHEN held AND kept THEN $requestHash END,
                     entryIds: $entryIds, historyDeletedAt: CASE WHEN held THEN null ELSE $at END,
                     purgedAt: CASE WHEN present THEN null ELSE $at END,
                     request: CASE WHEN held AND kept THEN $request END,
                     result: CASE WHEN held AND kept THEN $result END,
                     status: $status, attempts: $attempts,
                     attemptLog: $attemptLog, usageKnown: $usageKnown, promptTokens: $promptTokens,
                     completionTokens: $completionTokens, costMicros: $costMicros, at: $at})
WITH c
UNWIND CASE WHEN $charged THEN $periods ELSE [] END AS period
MERGE (s:Spend {key: $botId + '|' + period + '|' + $org})
  ON CREATE SET s.botId = $botId, s.period = period, s.org = $org, s.micros = 0, s.calls = 0, s.unknownCalls = 0
WITH s
CALL apoc.lock.nodes([s])
SET s.micros = s.micros + coalesce($costMicros, 0), s.calls = s.calls + $calls,
    s.unknownCalls = s.unknownCalls + $unknownCalls
"""
)

#: Saved results of one learning step, reused by recovery instead of a new call (C5, D9.9); the
#: caller picks the one whose request hash matches the request it would send now.
SAVED_STEP_RESULTS: Final[LiteralString] = """
MATCH (c:ModelCall)
WHERE c.executionId = $executionId AND c.step = $step AND c.status = 'ok' AND c.result IS NOT NULL
WITH c ORDER BY c.at
RETURN collect(c {.id, .result, .requestHash}) AS calls
"""


#: The saved result of a summary of a Chat made for this very request (C5): a summary whose call
#: was saved but not its text (the worker killed in between) is made from it again, not paid for
#: twice. Sought by the Chat and the request (``model_call_chat_request``).
SAVED_SUMMARY_RESULT: Final[LiteralString] = """
MATCH (c:ModelCall {chatId: $chatId, requestHash: $requestHash})
WHERE c.task = 'summary' AND c.status = 'ok' AND c.result IS NOT NULL
WITH c ORDER BY c.at DESC LIMIT 1
RETURN collect(c {.id, .result, .requestHash}) AS calls
"""


class SavedCall(TypedDict):
    """One of SAVED_STEP_RESULTS's ``calls``: the result is ciphertext."""

    id: str
    result: Ciphertext
    requestHash: str


class SavedCallsRow(TypedDict):
    calls: list[SavedCall]


#: Whether the Chat's organization learns nothing now (``botMemory`` off or no model, L5), as
#: ``graph.chats._CREATE_ITEM`` marks an Item: such a confession never reaches a learning request,
#: whatever the settings are when a later execution runs. Needs ``t`` (the Turn).
_MEMORY_OFF: Final[LiteralString] = (
    """
MATCH (t)-[:IN_CHAT]->(:Chat)-[:IN_ORG]->(o:Organization)
WITH t, """
    + MEMORY_OFF
    + """ AS memoryOff
"""
)

#: What the Bot confided (saved before the answer is sought, so a crash loses nothing).
CREATE_CONFESSION: Final[LiteralString] = (
    "MATCH (t:Turn {id: $turnId})"
    + _MEMORY_OFF
    + """CREATE (f:Confession {id: $id, botId: $botId, chatId: t.chatId, turnId: t.id, text: $text, answer: null,
                      usedEntryIds: [], answeredBy: null, createdAt: $now, memoryOff: memoryOff})-[:ABOUT]->(t)
"""
)

#: Confessions saved answered at once (the fixed calm answer, ``fixed``), in the order given
#: (``$rows``: ``id, text, answer``; each ``createdAt`` a millisecond after the one before, so that
#: listings and learning requests keep that order).
CREATE_ANSWERED_CONFESSIONS: Final[LiteralString] = (
    "MATCH (t:Turn {id: $turnId})"
    + _MEMORY_OFF
    + """UNWIND range(0, size($rows) - 1) AS at
WITH t, memoryOff, at, $rows[at] AS row
CREATE (f:Confession {id: row.id, botId: $botId, chatId: t.chatId, turnId: t.id, text: row.text,
                      answer: row.answer, usedEntryIds: [], answeredBy: 'fixed', answeredAt: $now,
                      createdAt: $now + at, memoryOff: memoryOff})-[:ABOUT]->(t)
"""
)

#: The answer given, with the ids of the entries it could draw on (re-validated on read, D9.6);
#: none when the Chat's history was deleted while it was sought (D9.23).
ANSWER_CONFESSION: Final[LiteralString] = (
    EMBEDDED_KEPT
    + """
MATCH (f:Confession {id: $id})
MATCH (heldC:Chat {id: f.chatId})
CALL apoc.lock.nodes([heldC])
MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
WITH f, present, kept, coalesce(ch.historyEpoch, 0) = $historyEpoch AS held
SET f.answer = CASE WHEN held AND kept THEN $answer END, f.usedEntryIds = $entryIds,
    f.answerPurged = CASE WHEN present THEN null ELSE true END,
    f.answeredBy = $answeredBy, f.answeredAt = $now
"""
)

#: A Chat's confessions, oldest first (ciphertext; decrypted by the caller after commit).
#: A page of the Chat's confessions, oldest first, read in the order of ``confession_chat_order``
#: (its range predicates and the hint let the index give the order: they were all read and
#: sorted for every page).
LIST_CONFESSIONS: Final[LiteralString] = """
MATCH (f:Confession) USING INDEX f:Confession(chatId, createdAt, id)
WHERE f.chatId = $chatId AND f.createdAt >= 0 AND f.id >= ''
RETURN f {.*} AS confession ORDER BY f.chatId, f.createdAt, f.id SKIP $skip LIMIT $limit
"""


class ConfessionNode(TypedDict):
    """A Confession's properties (``f {.*}``), ciphertext texts: ``answer``, ``answeredBy`` and
    ``answeredAt`` once answered; ``text`` and ``answer`` gone after a history deletion (V13) or
    a purge of what the answer used (D9.20, ``answerPurged``)."""

    id: str
    botId: str
    chatId: str
    turnId: str
    text: NotRequired[Ciphertext]
    answer: NotRequired[Ciphertext]
    usedEntryIds: list[str]
    answeredBy: NotRequired[str]
    answeredAt: NotRequired[int]
    answerPurged: NotRequired[bool]
    createdAt: int


class ConfessionRow(TypedDict):
    confession: ConfessionNode


#: One confession by its id (its texts gone after a history deletion, as LIST_CONFESSIONS').
CONFESSION_BY_ID: Final[LiteralString] = """
MATCH (f:Confession {id: $id})
RETURN f {.*} AS confession
"""


async def confession_by_id(tx: AsyncManagedTransaction, *, id: str) -> ConfessionNode | None:
    record = await single(tx, CONFESSION_BY_ID, ConfessionRow, id=id)
    return None if record is None else record["confession"]


#: A Turn's confessions in the order they were made (a reply made again goes on from them).
TURN_CONFESSIONS: Final[LiteralString] = """
MATCH (t:Turn {id: $turnId})<-[:ABOUT]-(f:Confession)
RETURN f {.*} AS confession ORDER BY f.createdAt, f.id
"""


async def turn_confessions(tx: QueryTarget, *, turn_id: str) -> list[ConfessionNode]:
    return [r["confession"] for r in await rows(tx, TURN_CONFESSIONS, ConfessionRow, turnId=turn_id)]


async def settings(tx: AsyncManagedTransaction, *, bot_id: str) -> SettingsMap | None:
    record = await single(tx, SETTINGS, SettingsRow, botId=bot_id)
    return None if record is None else record["settings"]


#: The models the Bot's organizations use for its memory Bot (its owner's and those it is linked
#: into), none for an organization without one.
BOT_MODELS: Final[LiteralString] = """
MATCH (b:Bot {id: $botId})
OPTIONAL MATCH (b)-[:OWNED_BY|LINKED]->(o:Organization)
RETURN [m IN collect(DISTINCT o.botMemoryModel) WHERE m IS NOT NULL] AS models
"""


class ModelsRow(TypedDict):
    models: list[str]


#: The models of every organization of a Bot that has a budget (``/healthz``, D9.25), and how
#: many Bots have one.
BUDGETED_MODELS: Final[LiteralString] = """
MATCH (m:Memory) WHERE m.budgetLimitMicros IS NOT NULL
OPTIONAL MATCH (:Bot {id: m.id})-[:OWNED_BY|LINKED]->(o:Organization)
RETURN count(DISTINCT m) AS budgets, [x IN collect(DISTINCT o.botMemoryModel) WHERE x IS NOT NULL] AS models
"""


class BudgetedModelsRow(ModelsRow):
    budgets: int


async def budgeted_models(tx: QueryTarget) -> tuple[int, list[str]]:
    record = await single(tx, BUDGETED_MODELS, BudgetedModelsRow)
    return (0, []) if record is None else (record["budgets"], record["models"])


async def bot_models(tx: AsyncManagedTransaction, *, bot_id: str) -> list[str]:
    record = await single(tx, BOT_MODELS, ModelsRow, botId=bot_id)
    return [] if record is None else record["models"]


async def update_settings(
    tx: AsyncManagedTransaction, *, bot_id: str, expected: int, values: dict[str, Any]
) -> tuple[bool, SettingsMap] | None:
    record = await single(
        tx, UPDATE_SETTINGS, UpdatedSettingsRow, botId=bot_id, expected=expected, set=values
    )
    return None if record is None else (record["matches"], record["settings"])


async def lock_settings(tx: AsyncManagedTransaction, *, bot_id: str) -> None:
    await (await tx.run(LOCK_SETTINGS, botId=bot_id)).consume()


async def chat_route(tx: AsyncManagedTransaction, *, chat_id: str) -> RouteRow | None:
    return await single(tx, CHAT_ROUTE, RouteRow, chatId=chat_id)


async def spent(tx: AsyncManagedTransaction, *, bot_id: str, period: str) -> tuple[int, int]:
    record = await single(tx, SPENT, SpentRow, botId=bot_id, period=period)
    assert record is not None
    return record["micros"], record["unknownCalls"]


async def save_model_call(tx: AsyncManagedTransaction, *, with_text: bool = True, **fields: Any) -> None:
    """SAVE_MODEL_CALL of ``fields`` (``with_text``: EMBEDDED_KEPT's ``$withText``)."""
    await tx.run(SAVE_MODEL_CALL, {**fields, "withText": with_text})


async def saved_step_results(tx: AsyncManagedTransaction, *, execution_id: str, step: int) -> list[SavedCall]:
    record = await single(tx, SAVED_STEP_RESULTS, SavedCallsRow, executionId=execution_id, step=step)
    return [] if record is None else record["calls"]


async def saved_summary_result(
    tx: AsyncManagedTransaction, *, chat_id: str, request_hash: str
) -> SavedCall | None:
    record = await single(tx, SAVED_SUMMARY_RESULT, SavedCallsRow, chatId=chat_id, requestHash=request_hash)
    return None if record is None or not record["calls"] else record["calls"][0]


async def create_confession(
    tx: AsyncManagedTransaction, *, id: str, bot_id: str, turn_id: str, text: str, now: int
) -> None:
    await tx.run(CREATE_CONFESSION, id=id, botId=bot_id, turnId=turn_id, text=text, now=now)


async def create_answered_confessions(
    tx: AsyncManagedTransaction, *, bot_id: str, turn_id: str, rows: list[dict[str, str]], now: int
) -> None:
    """CREATE_ANSWERED_CONFESSIONS."""
    await tx.run(CREATE_ANSWERED_CONFESSIONS, botId=bot_id, turnId=turn_id, rows=rows, now=now)


async def answer_confession(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    answer: str,
    used_entry_ids: list[str],
    answered_by: str,
    now: int,
    history_epoch: int,
    bot_id: str,
    with_text: bool = True,
) -> None:
    """ANSWER_CONFESSION (``with_text``: EMBEDDED_KEPT's ``$withText``)."""
    await tx.run(
        ANSWER_CONFESSION,
        id=id,
        answer=answer,
        entryIds=used_entry_ids,
        answeredBy=answered_by,
        now=now,
        historyEpoch=history_epoch,
        botId=bot_id,
        withText=with_text,
    )


#: How many confessions a Chat has (LIST_CONFESSIONS' pages, counted on the same index).
COUNT_CONFESSIONS: Final[LiteralString] = """
MATCH (f:Confession) USING INDEX f:Confession(chatId, createdAt, id)
WHERE f.chatId = $chatId AND f.createdAt >= 0 AND f.id >= ''
RETURN count(f) AS n
"""


async def list_confessions(
    tx: AsyncManagedTransaction, *, chat_id: str, skip: int, limit: int
) -> tuple[list[ConfessionNode], int]:
    """One page of the Chat's confessions and how many it has."""
    found = await rows(tx, LIST_CONFESSIONS, ConfessionRow, chatId=chat_id, skip=skip, limit=limit)
    return [r["confession"] for r in found], await count(tx, COUNT_CONFESSIONS, chatId=chat_id)


#: A rewrite of a Turn's input (N2): new text and original encrypted, the entries it says it used
#: and every entry it was sent (``$entryIds``: what its text may embed, undeclared or not), and a
#: keyed digest of the input so an equal input can reuse it while the entries it was sent are
#: still visible; without them when the Chat's history was deleted while the model rewrote (D9.23). The Turn is locked
#: before the Chat, as addItems locks them (the other order could deadlock with it).
CREATE_ENRICHMENT: Final[LiteralString] = (
    EMBEDDED_KEPT
    + """
MATCH (t:Turn {id: $turnId})-[:IN_CHAT]->(heldC:Chat)
CALL apoc.lock.nodes([t])
CALL apoc.lock.nodes([heldC])
MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
WITH t, present, kept, coalesce(ch.historyEpoch, 0) = $historyEpoch AS held
CREATE (n:Enrichment {id: $id, botId: $botId, chatId: t.chatId, turnId: t.id,
                      text: CASE WHEN held AND kept THEN $text END,
                      original: CASE WHEN held THEN $original END,
                      rewritePurged: CASE WHEN present THEN null ELSE true END,
                      usedEntryIds: $usedEntryIds, sentEntryIds: $entryIds,
                      inputDigest: CASE WHEN held AND kept THEN $inputDigest END,
                      createdAt: $now})-[:FOR_TURN]->(t)
"""
)

#: The latest rewrite of an equal input in the same Chat (same audience), for reuse — one that
#: recorded every entry it was sent: one saved before they were recorded may draw on an entry it
#: did not declare and that is hidden now, so it is asked anew (D9.15).
SAVED_REWRITE: Final[LiteralString] = """
MATCH (n:Enrichment {chatId: $chatId})
WHERE n.inputDigest = $inputDigest AND n.text IS NOT NULL AND n.sentEntryIds IS NOT NULL
RETURN n {.id, .text, .usedEntryIds, .sentEntryIds} AS enrichment
ORDER BY n.createdAt DESC LIMIT 1
"""


#: The rewrite saved for a Turn (its start's; the latest, were there two), while it has its text
#: and records every entry it was sent (as SAVED_REWRITE): what a start sent again with its
#: idempotency key answers (``services.idempotency``).
TURN_REWRITE: Final[LiteralString] = """
MATCH (n:Enrichment {turnId: $turnId})
WHERE n.text IS NOT NULL AND n.sentEntryIds IS NOT NULL
RETURN n {.id, .text, .usedEntryIds, .sentEntryIds} AS enrichment
ORDER BY n.createdAt DESC LIMIT 1
"""


class SavedRewrite(TypedDict):
    """SAVED_REWRITE's and TURN_REWRITE's ``enrichment``: the rewrite (ciphertext), the entries it
    says it used and those it was sent."""

    id: str
    text: Ciphertext
    usedEntryIds: list[str]
    sentEntryIds: list[str]


class SavedRewriteRow(TypedDict):
    enrichment: SavedRewrite


#: A page of the Chat's rewrites (one per Turn), oldest first, in index order (as
#: LIST_CONFESSIONS).
LIST_ENRICHMENTS: Final[LiteralString] = """
MATCH (n:Enrichment) USING INDEX n:Enrichment(chatId, createdAt, id)
WHERE n.chatId = $chatId AND n.createdAt >= 0 AND n.id >= ''
RETURN n {.*} AS enrichment ORDER BY n.chatId, n.createdAt, n.id SKIP $skip LIMIT $limit
"""


class EnrichmentNode(TypedDict):
    """An Enrichment's properties (``n {.*}``): ``text``, ``original`` (ciphertexts) and
    ``inputDigest`` gone after a history deletion (V13), ``text`` after a purge of what it used
    (D9.20, ``rewritePurged``)."""

    id: str
    botId: str
    chatId: str
    turnId: str
    text: NotRequired[Ciphertext]
    original: NotRequired[Ciphertext]
    usedEntryIds: list[str]
    sentEntryIds: NotRequired[list[str]]
    inputDigest: NotRequired[str]
    rewritePurged: NotRequired[bool]
    createdAt: int


class EnrichmentRow(TypedDict):
    enrichment: EnrichmentNode


async def create_enrichment(tx: AsyncManagedTransaction, *, with_text: bool = True, **fields: Any) -> None:
    """CREATE_ENRICHMENT of ``fields`` (``usedEntryIds``: the entries the rewrite says it used,
    ``sentEntryIds``: every entry it was sent, what EMBEDDED_KEPT checks; ``with_text``:
    EMBEDDED_KEPT's ``$withText``)."""
    params = {k: v for k, v in fields.items() if k != "sentEntryIds"}  # fields stay whole: retried
    await tx.run(CREATE_ENRICHMENT, {**params, "entryIds": fields["sentEntryIds"], "withText": with_text})


async def saved_rewrite(
    tx: AsyncManagedTransaction, *, chat_id: str, input_digest: str
) -> SavedRewrite | None:
    record = await single(tx, SAVED_REWRITE, SavedRewriteRow, chatId=chat_id, inputDigest=input_digest)
    return None if record is None else record["enrichment"]


async def turn_rewrite(tx: AsyncManagedTransaction, *, turn_id: str) -> SavedRewrite | None:
    record = await single(tx, TURN_REWRITE, SavedRewriteRow, turnId=turn_id)
    return None if record is None else record["enrichment"]


#: How many rewrites a Chat has (LIST_ENRICHMENTS' pages, counted on the same index).
COUNT_ENRICHMENTS: Final[LiteralString] = """
MATCH (n:Enrichment) USING INDEX n:Enrichment(chatId, createdAt, id)
WHERE n.chatId = $chatId AND n.createdAt >= 0 AND n.id >= ''
RETURN count(n) AS n
"""


async def list_enrichments(
    tx: AsyncManagedTransaction, *, chat_id: str, skip: int, limit: int
) -> tuple[list[EnrichmentNode], int]:
    """One page of the Chat's rewrites and how many it has."""
    found = await rows(tx, LIST_ENRICHMENTS, EnrichmentRow, chatId=chat_id, skip=skip, limit=limit)
    return [r["enrichment"] for r in found], await count(tx, COUNT_ENRICHMENTS, chatId=chat_id)
