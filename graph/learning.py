"""Learning executions, read positions and evidence (L2–L4, C4–C7, D9.9).

Neo4j is the log of record: an execution has a status, an epoch, a lease and an attempt count.
Every transition is a compare-and-set under an explicit lock on the execution node, so two
workers (or a worker and the sweeper) never both own one epoch. Lock order where several are
taken: the Memory node (``apply_changes``), then the execution, then the read position.
"""

from __future__ import annotations

from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import Ciphertext, single
from graph.memory import TOP_RANK

#: Statuses: ``waiting`` (its Turn is open), ``queued``, ``running`` (leased), ``budget``
#: (waits for the next period or a raised limit), and the ends ``done``, ``failed``, ``skipped``.
ENDS: Final = ("done", "failed", "skipped")
#: Confessions a learning step reads at most (the request carries what fits in its characters).
CONFIDED_READ: Final = 100

#: Recorded at confide (L2), under the Turn's lock so a concurrent completeTurn queues it.
CREATE_EXECUTION: Final[LiteralString] = """
MATCH (held:Turn {id: $turnId})
CALL apoc.lock.nodes([held])
WITH held
MATCH (t:Turn) WHERE elementId(t) = elementId(held)
CREATE (x:LearningExecution {id: $id, botId: $botId, chatId: t.chatId, turnId: t.id, turnSeq: t.seq,
                             confessionId: $confessionId, epoch: 0, attempts: 0, leaseUntil: null,
                             status: CASE WHEN t.status = 'completed' THEN 'queued' ELSE 'waiting' END,
                             queuedAt: CASE WHEN t.status = 'completed' THEN $now ELSE null END,
                             createdAt: $now, endedAt: null, error: null, learned: 0})
RETURN x.status AS status, x.epoch AS epoch
"""


class CreatedRow(TypedDict):
    status: str
    epoch: int


class Queued(TypedDict):
    """An execution to enqueue at its epoch."""

    id: str
    epoch: int


class QueuedRow(TypedDict):
    """QUEUE_TURN, REQUEUE, the sweeps (SWEEP_EXPIRED, SWEEP_STALE_QUEUED, SWEEP_IDLE_TURNS),
    RELEASE_BUDGET."""

    queued: list[Queued]


#: completeTurn: the Turn's waiting executions become queued (in its transaction, under its lock).
QUEUE_TURN: Final[LiteralString] = """
MATCH (t:Turn {id: $turnId})
CALL apoc.lock.nodes([t])
WITH t
MATCH (heldX:LearningExecution {turnId: t.id})
CALL apoc.lock.nodes([heldX])
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(heldX) AND x.status = 'waiting'
SET x.status = 'queued', x.queuedAt = $now
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""

#: The head of a transition of one epoch: the execution ``$id`` locked, then read again (after the
#: lock, so a transition that committed meanwhile is seen) and held to ``$epoch`` and a status
#: (the statement goes on with that status's literal).
_OF_EPOCH: Final[LiteralString] = """
MATCH (held:LearningExecution {id: $id})
CALL apoc.lock.nodes([held])
WITH held
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(held)
WITH x
WHERE x.epoch = $epoch AND x.status = """

#: A worker takes the execution for one epoch: only a queued execution of that very epoch. Its
#: lease is kept by Neo4j's clock (``timestamp()``), as the sweepers compare it (SWEEP_EXPIRED):
#: by each worker's own clock, one running 30 s ahead expired every other worker's leases.
CLAIM: Final[LiteralString] = (
    _OF_EPOCH
    + """'queued'
SET x.status = 'running', x.leaseUntil = timestamp() + $leaseMs, x.attempts = x.attempts + 1,
    x.worker = $worker, x.startedAt = coalesce(x.startedAt, $now)
RETURN x {.id, .botId, .chatId, .turnId, .turnSeq, .epoch, .attempts} AS execution
"""
)


class ClaimMap(TypedDict):
    id: str
    botId: str
    chatId: str
    turnId: str
    turnSeq: int
    epoch: int
    attempts: int


class ClaimRow(TypedDict):
    execution: ClaimMap


RENEW_LEASE: Final[LiteralString] = (
    _OF_EPOCH
    + """'running'
SET x.leaseUntil = timestamp() + $leaseMs
RETURN count(x) AS renewed
"""
)


class RenewedRow(TypedDict):
    renewed: int


#: Leave ``running`` without a commit: a safe failure, a skip, or waiting for budget.
FINISH: Final[LiteralString] = (
    _OF_EPOCH
    + """'running'
SET x.status = $status, x.error = $error, x.leaseUntil = null,
    x.endedAt = CASE WHEN $status IN ['done', 'failed', 'skipped'] THEN $now ELSE null END
RETURN count(x) AS finished
"""
)


class FinishedRow(TypedDict):
    finished: int


#: Its own worker hands the execution on to a new epoch, queued at once (as SWEEP_EXPIRED does for
#: a lease that lapsed): it waited for the Chat's step slot as long as its job may, or used its
#: job's time with evidence left. The next job reads on from the read position.
REQUEUE: Final[LiteralString] = (
    _OF_EPOCH
    + """'running'
SET x.epoch = x.epoch + 1, x.status = 'queued', x.queuedAt = $now, x.leaseUntil = null
RETURN collect({id: x.id, epoch: x.epoch}) AS queued
"""
)


POSITION: Final[LiteralString] = """
OPTIONAL MATCH (p:ReadPosition {id: $botId + '|' + $chatId})
RETURN coalesce(p.seq, 0) AS seq
"""


class PositionRow(TypedDict):
    seq: int


#: The commit of one step (C4): a compare-and-set of the epoch and the start position. When both
#: hold, the position moves to ``$end`` and, on the last step, the execution ends — in the same
#: transaction as the memory change that ``apply_changes`` writes around it. The step's saved
#: ModelCall records the entries made from its answer (a purge of them removes it, D9.20). A step
#: whose answers were refused records its range and codes in ``setAside`` (D9.21). A step is
#: fresh only while the Chat's history is the one its evidence was read from (``$historyEpoch``,
#: D9.23): an answer made of words deleted since is read again without them. The Chat is locked
#: first (a history deletion locks it, then strips the executions) and read after the lock: read
#: unlocked, a deletion still running was not seen, and facts made of its words were committed
#: after it.
COMMIT_STEP: Final[LiteralString] = """
MATCH (heldX:LearningExecution {id: $id})
OPTIONAL MATCH (heldC:Chat {id: heldX.chatId})
CALL apoc.lock.nodes([c IN [heldC] WHERE c IS NOT NULL])
CALL apoc.lock.nodes([heldX])
WITH heldX, heldC
MERGE (heldP:ReadPosition {id: heldX.botId + '|' + heldX.chatId})
  ON CREATE SET heldP.botId = heldX.botId, heldP.chatId = heldX.chatId, heldP.seq = 0
WITH heldX, heldP, heldC
CALL apoc.lock.nodes([heldP])
WITH heldX, heldP, heldC
MATCH (x:LearningExecution) WHERE elementId(x) = elementId(heldX)
MATCH (p:ReadPosition) WHERE elementId(p) = elementId(heldP)
OPTIONAL MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
OPTIONAL MATCH (m:Memory {id: x.botId})
WITH x, p, x.epoch = $epoch AND x.status = 'running' AS mine,
     p.seq = $start AND coalesce(ch.historyEpoch, 0) = $historyEpoch
       AND ($purges IS NULL OR coalesce(m.purges, 0) = $purges) AS fresh
FOREACH (_ IN CASE WHEN mine AND fresh THEN [1] ELSE [] END |
  SET p.seq = $end, p.updatedAt = $now, x.learned = x.learned + $learned, x.expiries = 0,
      x.producedIds = coalesce(x.producedIds, []) + $produced)
FOREACH (_ IN CASE WHEN mine AND fresh AND $setAside IS NOT NULL THEN [1] ELSE [] END |
  SET x.setAside = coalesce(x.setAside, []) + [$setAside])
FOREACH (_ IN CASE WHEN mine AND fresh AND $final THEN [1] ELSE [] END |
  SET x.status = $status, x.endedAt = $now, x.leaseUntil = null)
WITH x, p, mine, fresh
OPTIONAL MATCH (c:ModelCall) WHERE c.executionId = x.id AND c.step = $start
WITH x, p, mine, fresh, collect(c) AS calls
FOREACH (c IN CASE WHEN mine AND fresh AND size($produced) > 0 THEN calls ELSE [] END |
  SET c.producedIds = coalesce(c.producedIds, []) + $produced)
RETURN mine, fresh, p.seq AS position
"""


class CommittedRow(TypedDict):
    """COMMIT_STEP: ``mine`` (the epoch held), ``fresh`` (the start position and the history held),
    the position now."""

    mine: bool
    fresh: bool
    position: int


#: The Chat's Items after ``$after`` in order, each with the number of its Turn (the caller stops
#: at the first Item of a later Turn than the execution's), but those said while the memory Bot
#: learnt nothing (``memoryOff``, L5). Text is ciphertext. With them, the first ``$confided`` of
#: what the Bot confided during their Turns (seed: the Bot's words "only show the memory Bot where
#: to look"), oldest first, but those confided while it learnt nothing.
EVIDENCE: Final[LiteralString] = """
MATCH (i:Item)
WHERE i.chatId = $chatId AND i.seq > $after AND i.memoryOff IS NULL
WITH i ORDER BY i.chatId, i.seq LIMIT $limit
MATCH (i)-[:IN_TURN]->(t:Turn)
WITH collect(i {.uid, .id, .seq, .kind, .text, .app, .speakerId, .timeZone, turnSeq: t.seq,
                saidAt: coalesce(i.saidAt, i.createdAt), textLength: coalesce(i.textLength, 0)}) AS items,
     collect(DISTINCT t) AS turns
CALL (turns) {
  UNWIND turns AS t
  MATCH (f:Confession)-[:ABOUT]->(t)
  WHERE f.text IS NOT NULL AND f.memoryOff IS NULL
  WITH f, t ORDER BY t.seq, f.createdAt, f.id
  LIMIT $confided
  RETURN collect(f {.id, .text, turnSeq: t.seq}) AS confided
}
RETURN items, confided
"""


class EvidenceMap(TypedDict):
    """One of EVIDENCE's ``items``: ``text`` (ciphertext) None once the history was deleted (V13),
    ``app`` None but on App results, ``speakerId`` None where no person spoke."""

    uid: str
    id: str
    seq: int
    kind: str
    text: Ciphertext | None
    app: str | None
    speakerId: str | None
    turnSeq: int
    #: When it was said (D9.31), and in which IANA time zone (D9.32; None: UTC).
    saidAt: int
    timeZone: str | None
    #: Characters of its text as said (``learning.protocol.within_chars``).
    textLength: int


class ConfidedMap(TypedDict):
    """One of EVIDENCE's ``confided``: what the Bot confided during a Turn of the evidence (its
    ``text`` ciphertext; none once the history was deleted, D9.23), oldest first."""

    id: str
    text: Ciphertext
    turnSeq: int


class EvidenceRow(TypedDict):
    items: list[EvidenceMap]
    confided: list[ConfidedMap]


#: learningContext (L4, D9.14, V9): the first ``$limit`` valid entries of the Chat's organization
#: in memory order — active, with every source proved, in that organization only (``validOrg``,
#: set with the labels proved equal to the path query) — as far as ``$chars`` characters of their
#: content hold them (the first always; it stops at the first that does not fit, decided from
#: stored lengths, N3), and the ``$topics`` most used topics with their counts over all of them.
#: (The bounds keep every learning request of the organization within what a model takes, however
#: long its pinned entries and however many its topics.)
#: The entries are the first rows of ``entry_valid`` (botId, validOrg, memoryRank); the counts are
#: kept where validity and topics change (``graph.topics``). (Filtering every entry of the Bot on
#: its status and labels, sorting them and counting their tags took 342 ms at 100k.)
LEARNING_CONTEXT: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.read.nodes([m])
WITH m
CALL () {
  MATCH (e:Entry)
  USING INDEX e:Entry(botId, validOrg, memoryRank)
  WHERE e.botId = $botId AND e.validOrg = $org AND e.memoryRank < $top
  WITH e ORDER BY e.botId DESC, e.validOrg DESC, e.memoryRank DESC, e.id LIMIT $limit
  WITH collect(e) AS first
  WITH first, reduce(cut = [0, 0, false], e IN first |
    CASE WHEN cut[2] OR (cut[0] > 0 AND cut[1] + coalesce(e.contentLength, 0) > $chars)
         THEN [cut[0], cut[1], true]
         ELSE [cut[0] + 1, cut[1] + coalesce(e.contentLength, 0), false] END)[0] AS n
  RETURN [e IN first[0..n] |
    e {.id, .layer, .content, .tags, .confidence, saidAt: coalesce(e.saidAt, e.createdAt)}] AS entries
}
CALL () {
  MATCH (tc:TopicCount)
  WHERE tc.botId = $botId AND tc.org = $org
  WITH tc ORDER BY tc.n DESC, tc.topic LIMIT $topics
  RETURN collect({topic: tc.topic, count: tc.n}) AS topics
}
RETURN entries, topics, coalesce(m.purges, 0) AS purges
"""


class LearnedEntry(TypedDict):
    """One of LEARNING_CONTEXT's ``entries``: ``confidence`` None but on observations."""

    id: str
    layer: str
    content: Ciphertext
    tags: list[str]
    confidence: float | None
    saidAt: int


class TopicCount(TypedDict):
    topic: str
    count: int


class LearningContextRow(TypedDict):
    entries: list[LearnedEntry]
    topics: list[TopicCount]
    #: How many purges the Memory had (a step's commit is stale after another, COMMIT_STEP).
    purges: int


async def create_execution(
    tx: AsyncManagedTransaction, *, id: str, bot_id: str, turn_id: str, confession_id: str, now: int
) -> CreatedRow:
    record = await single(
        tx,
        CREATE_EXECUTION,
        CreatedRow,
        id=id,
        botId=bot_id,
        turnId=turn_id,
        confessionId=confession_id,
        now=now,
    )
    assert record is not None
    return record


async def queue_turn(tx: AsyncManagedTransaction, *, turn_id: str, now: int) -> list[Queued]:
    record = await single(tx, QUEUE_TURN, QueuedRow, turnId=turn_id, now=now)
    return [] if record is None else record["queued"]


async def claim(
    tx: AsyncManagedTransaction, *, id: str, epoch: int, worker: str, now: int, lease_ms: int
) -> ClaimMap | None:
    record = await single(tx, CLAIM, ClaimRow, id=id, epoch=epoch, worker=worker, now=now, leaseMs=lease_ms)
    return None if record is None else record["execution"]


async def renew_lease(tx: AsyncManagedTransaction, *, id: str, epoch: int, lease_ms: int) -> bool:
    record = await single(tx, RENEW_LEASE, RenewedRow, id=id, epoch=epoch, leaseMs=lease_ms)
    return bool(record and record["renewed"])


async def finish(
    tx: AsyncManagedTransaction, *, id: str, epoch: int, status: str, error: str | None, now: int
) -> bool:
    record = await single(tx, FINISH, FinishedRow, id=id, epoch=epoch, status=status, error=error, now=now)
    return bool(record and record["finished"])


async def requeue(tx: AsyncManagedTransaction, *, id: str, epoch: int, now: int) -> list[Queued]:
    record = await single(tx, REQUEUE, QueuedRow, id=id, epoch=epoch, now=now)
    return [] if record is None else record["queued"]


async def position(tx: AsyncManagedTransaction, *, bot_id: str, chat_id: str) -> int:
    record = await single(tx, POSITION, PositionRow, botId=bot_id, chatId=chat_id)
    return 0 if record is None else record["seq"]


async def commit_step(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    epoch: int,
    start: int,
    end: int,
    final: bool,
    status: str,
    learned: int,
    now: int,
    history_epoch: int,
    purges: int | None = None,
    produced: list[str] | None = None,
    set_aside: str | None = None,
) -> CommittedRow:
    record = await single(
        tx,
        COMMIT_STEP,
        CommittedRow,
        historyEpoch=history_epoch,
        purges=purges,
        setAside=set_aside,
        produced=produced or [],
        id=id,
        epoch=epoch,
        start=start,
        end=end,
        final=final,
        status=status,
        learned=learned,
        now=now,
    )
    assert record is not None
    return record


async def evidence(tx: AsyncManagedTransaction, *, chat_id: str, after: int, limit: int) -> EvidenceRow:
    record = await single(
        tx, EVIDENCE, EvidenceRow, chatId=chat_id, after=after, limit=limit, confided=CONFIDED_READ
    )
    return {"items": [], "confided": []} if record is None else record


async def learning_context(
    tx: AsyncManagedTransaction, *, bot_id: str, org: str, limit: int, chars: int, topics: int
) -> LearningContextRow:
    record = await single(
        tx,
        LEARNING_CONTEXT,
        LearningContextRow,
        botId=bot_id,
        org=org,
        limit=limit,
        chars=chars,
        topics=topics,
        top=TOP_RANK,
    )
    return {"entries": [], "topics": [], "purges": 0} if record is None else record
