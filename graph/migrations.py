"""Schema migrations: uniqueness constraints and indexes, applied idempotently at start.

Each step is an ``IF NOT EXISTS`` statement; the highest applied version is recorded on
the ``(:SchemaVersion {id: 'schema'})`` node, so a second run changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Final, LiteralString

from neo4j import AsyncDriver, AsyncManagedTransaction
from neo4j.exceptions import ClientError, DriverError, Neo4jError

from graph import access
from graph.topics import TOPICS_OF_E, link_topics

log = logging.getLogger(__name__)

MIGRATIONS: Final[tuple[tuple[int, tuple[LiteralString, ...]], ...]] = (
    (
        1,
        (
            "CREATE CONSTRAINT organization_id IF NOT EXISTS FOR (n:Organization) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT person_id IF NOT EXISTS FOR (n:Person) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT token_id IF NOT EXISTS FOR (n:Token) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT token_hash IF NOT EXISTS FOR (n:Token) REQUIRE n.hash IS UNIQUE",
            "CREATE CONSTRAINT channel_id IF NOT EXISTS FOR (n:Channel) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT bot_id IF NOT EXISTS FOR (n:Bot) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT memory_id IF NOT EXISTS FOR (n:Memory) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT chat_id IF NOT EXISTS FOR (n:Chat) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT turn_id IF NOT EXISTS FOR (n:Turn) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT item_uid IF NOT EXISTS FOR (n:Item) REQUIRE n.uid IS UNIQUE",
            "CREATE CONSTRAINT entry_id IF NOT EXISTS FOR (n:Entry) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT change_id IF NOT EXISTS FOR (n:Change) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT confession_id IF NOT EXISTS FOR (n:Confession) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT enrichment_id IF NOT EXISTS FOR (n:Enrichment) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT execution_id IF NOT EXISTS FOR (n:LearningExecution) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT model_call_id IF NOT EXISTS FOR (n:ModelCall) REQUIRE n.id IS UNIQUE",
            "CREATE CONSTRAINT read_position_id IF NOT EXISTS FOR (n:ReadPosition) REQUIRE n.id IS UNIQUE",
            "CREATE INDEX item_chat_seq IF NOT EXISTS FOR (n:Item) ON (n.chatId, n.seq)",
            "CREATE INDEX turn_chat_seq IF NOT EXISTS FOR (n:Turn) ON (n.chatId, n.seq)",
        ),
    ),
    (
        2,
        (
            # Candidates of every memory read: one seek per audience key, in memory order (§8).
            "CREATE INDEX entry_audience IF NOT EXISTS FOR (n:Entry) ON (n.botId, n.audienceKey, n.memoryRank)",
            "CREATE INDEX change_bot_version IF NOT EXISTS FOR (n:Change) ON (n.botId, n.version)",
            "CREATE INDEX entry_bot IF NOT EXISTS FOR (n:Entry) ON (n.botId)",
        ),
    ),
    (
        3,
        (
            # The memory Bot: budget counters (unique, so concurrent MERGEs meet), executions by
            # status and Turn, saved step results, confessions by Chat.
            "CREATE CONSTRAINT spend_key IF NOT EXISTS FOR (n:Spend) REQUIRE n.key IS UNIQUE",
            "CREATE INDEX spend_bot_period IF NOT EXISTS FOR (n:Spend) ON (n.botId, n.period)",
            "CREATE INDEX execution_status IF NOT EXISTS FOR (n:LearningExecution) ON (n.status)",
            "CREATE INDEX execution_turn IF NOT EXISTS FOR (n:LearningExecution) ON (n.turnId)",
            "CREATE INDEX model_call_step IF NOT EXISTS FOR (n:ModelCall) ON (n.executionId, n.step)",
            "CREATE INDEX confession_chat IF NOT EXISTS FOR (n:Confession) ON (n.chatId)",
        ),
    ),
    (
        4,
        (
            # Purge finds the saved model calls and answers that embed a Bot's entries (D9.20).
            "CREATE INDEX model_call_bot IF NOT EXISTS FOR (n:ModelCall) ON (n.botId)",
            "CREATE INDEX confession_bot IF NOT EXISTS FOR (n:Confession) ON (n.botId)",
        ),
    ),
    (
        5,
        (
            # Input rewrites by Chat (reuse, the owner's route) and by Bot (purge, D9.20).
            "CREATE INDEX enrichment_chat IF NOT EXISTS FOR (n:Enrichment) ON (n.chatId)",
            "CREATE INDEX enrichment_bot IF NOT EXISTS FOR (n:Enrichment) ON (n.botId)",
            "CREATE CONSTRAINT chat_summary_id IF NOT EXISTS FOR (n:ChatSummary) REQUIRE n.chatId IS UNIQUE",
        ),
    ),
    (
        6,
        (
            # context's candidates: active entries only, per audience key in memory order, with
            # the id and stored length a candidate needs read from the index, not the node (§8).
            "CREATE INDEX entry_active IF NOT EXISTS FOR (n:Entry)"
            " ON (n.botId, n.activeKey, n.memoryRank, n.contentLength, n.id)",
        ),
    ),
    (
        7,
        (
            # Retrieval by meaning (design §10): keywords as blind tokens (keyed hashes, one token
            # each for the whitespace analyzer, scored by Lucene's BM25), and the seek of the
            # vectors a process's index lacks (stamped after its ``vecSeq``).
            "CREATE FULLTEXT INDEX entry_keywords IF NOT EXISTS FOR (n:Entry) ON EACH [n.kwBlind]"
            " OPTIONS {indexConfig: {`fulltext.analyzer`: 'whitespace'}}",
            "CREATE INDEX entry_vec_seq IF NOT EXISTS FOR (n:Entry) ON (n.botId, n.vecSeq)",
            # The backfill pages through a Bot's entries in id order.
            "CREATE INDEX entry_bot_id IF NOT EXISTS FOR (n:Entry) ON (n.botId, n.id)",
        ),
    ),
    (
        8,
        (
            # The Chat owner's view of its learning executions (D9.21: what was set aside).
            "CREATE INDEX execution_chat IF NOT EXISTS FOR (n:LearningExecution) ON (n.chatId)",
            # History deletion finds a Chat's saved model calls (D9.23).
            "CREATE INDEX model_call_chat IF NOT EXISTS FOR (n:ModelCall) ON (n.chatId)",
            "CREATE INDEX model_call_execution IF NOT EXISTS FOR (n:ModelCall) ON (n.executionId)",
        ),
    ),
    (
        9,
        (
            # What a change hid from its readers, by change (D9.24: the log and the change feed).
            "CREATE INDEX removal_bot_version IF NOT EXISTS FOR (n:Removal) ON (n.botId, n.version)",
        ),
    ),
    (
        10,
        (
            # Keywords are scored by the process's index, not Lucene (D9.29); every entry with
            # keywords now carries a derived-data stamp (``vecSeq``), which the data step below
            # gives the entries written with keywords but without a vector before.
            "DROP INDEX entry_keywords IF EXISTS",
        ),
    ),
    (
        11,
        (
            # A person's own Chats (seed 004's list of conversation meta, D9.30).
            "CREATE INDEX chat_owner IF NOT EXISTS FOR (n:Chat) ON (n.ownerId)",
        ),
    ),
    (
        12,
        (
            # A Bot's preferences (contextPack, D9.17) without reading its other entries: the
            # entries with the topic carry ``:Preference`` (``graph.entries``); the data step
            # below labels those written before.
            "CREATE INDEX entry_preference IF NOT EXISTS FOR (n:Preference) ON (n.botId)",
        ),
    ),
    (
        13,
        (
            # ... by audience key in memory order, as ``entry_audience`` finds entries: a reader's
            # newest visible preferences are read first and the rest never (contextPack shows a
            # bounded number of them).
            "DROP INDEX entry_preference IF EXISTS",
            "CREATE INDEX entry_preference_audience IF NOT EXISTS "
            "FOR (n:Preference) ON (n.botId, n.audienceKey, n.memoryRank)",
        ),
    ),
    (
        14,
        (
            # learningContext (L4) by the valid entries of one organization in memory order, not
            # by filtering every entry of the Bot: ``validOrg`` is set with the labels
            # (``graph.access``); the data step below gives it to the entries labelled before.
            "CREATE INDEX entry_valid IF NOT EXISTS FOR (n:Entry) ON (n.botId, n.validOrg, n.memoryRank)",
            # ... and its topic counts, kept where validity and topics change (``graph.topics``).
            "CREATE CONSTRAINT topic_count_key IF NOT EXISTS FOR (n:TopicCount) REQUIRE n.key IS UNIQUE",
            "CREATE INDEX topic_count_bot_org IF NOT EXISTS FOR (n:TopicCount) ON (n.botId, n.org)",
        ),
    ),
    (
        15,
        (
            # A tag filter on a topic, a topic rename: the entries with a topic are its Topic's
            # HAS_TOPIC relationships (``graph.topics``), not a filter over the Bot's entries; the
            # data step below links the entries written before.
            "CREATE CONSTRAINT topic_key IF NOT EXISTS FOR (n:Topic) REQUIRE n.key IS UNIQUE",
        ),
    ),
    (
        16,
        (),  # the data step below: saved calls' plain request hashes go (E1)
    ),
    (
        17,
        (
            # startTurn's reuse of a saved rewrite of an equal input (SAVED_REWRITE) seeks it by
            # digest; by ``enrichment_chat`` it read every rewrite of the Chat, one per Turn.
            "CREATE INDEX enrichment_chat_digest IF NOT EXISTS FOR (n:Enrichment) ON (n.chatId, n.inputDigest)",
        ),
    ),
    (
        18,
        (),  # the data step below: each Chat's characters not yet summarized, kept from now on
    ),
    (
        19,
        (
            # Pages of a Chat's confessions, rewrites and learning executions in index order:
            # every one of the Chat's was read and sorted for each page.
            "CREATE INDEX confession_chat_order IF NOT EXISTS FOR (n:Confession) ON (n.chatId, n.createdAt, n.id)",
            "CREATE INDEX enrichment_chat_order IF NOT EXISTS FOR (n:Enrichment) ON (n.chatId, n.createdAt, n.id)",
            "CREATE INDEX execution_chat_order IF NOT EXISTS "
            "FOR (n:LearningExecution) ON (n.chatId, n.createdAt, n.id)",
        ),
    ),
    (
        20,
        (
            # The worker's sweep for Chats whose summary is due (graph.conversation.SUMMARIES_DUE),
            # the most behind first.
            "CREATE INDEX chat_unsummarized IF NOT EXISTS FOR (n:Chat) ON (n.unsummarizedChars)",
        ),
    ),
    (
        21,
        (
            # /healthz's budget state (graph.memorybot.BUDGETED_MODELS) reads the budgeted Memories
            # only: each probe, unauthenticated, read every Bot's Memory.
            "CREATE INDEX memory_budget IF NOT EXISTS FOR (n:Memory) ON (n.budgetLimitMicros)",
        ),
    ),
    (
        22,
        (
            # A summary's saved call, found by its request in its Chat (graph.memorybot
            # .SAVED_SUMMARY_RESULT): by the Chat alone, every call of a long Chat was read.
            "CREATE INDEX model_call_chat_request IF NOT EXISTS FOR (n:ModelCall) ON (n.chatId, n.requestHash)",
        ),
    ),
    (
        23,
        (
            # The worker's sweep for Chats whose summary is due (graph.conversation.SUMMARIES_DUE)
            # seeks them by what their summary would take in, no longer by their Items alone.
            "CREATE INDEX chat_summary_input IF NOT EXISTS FOR (n:Chat) ON (n.summaryInputChars)",
            "DROP INDEX chat_unsummarized IF EXISTS",
        ),
    ),
    (
        24,
        (
            # Topics are kept per audience key (graph.topics): a topic rename finds the Topics of
            # every key of its Bot.
            "CREATE INDEX topic_bot_topic IF NOT EXISTS FOR (n:Topic) ON (n.botId, n.topic)",
        ),
    ),
    (
        25,
        (
            # A purge's node ids, which every process's index drops at its next catch-up
            # (graph.purge.COUNT_PURGE, graph.search): sought by the stamps after the index's.
            "CREATE INDEX purged_bot_seq IF NOT EXISTS FOR (n:Purged) ON (n.botId, n.vecSeq)",
        ),
    ),
    (
        26,
        (
            # Idempotency keys (graph.idempotency): one record per caller's key, which a second
            # claim waits on; swept by their time, and found by their Chat when its history goes.
            "CREATE CONSTRAINT idempotency_id IF NOT EXISTS FOR (n:Idempotency) REQUIRE n.id IS UNIQUE",
            "CREATE INDEX idempotency_expires IF NOT EXISTS FOR (n:Idempotency) ON (n.expiresAt)",
            "CREATE INDEX idempotency_chat IF NOT EXISTS FOR (n:Idempotency) ON (n.chatId)",
            # The rewrite of a Turn whose start is sent again (graph.memorybot.TURN_REWRITE).
            "CREATE INDEX enrichment_turn IF NOT EXISTS FOR (n:Enrichment) ON (n.turnId)",
        ),
    ),
    # Each entry's changedVersion, from the change log (_SET_CHANGED_VERSION).
    (27, ()),
    # Each Removal's time, from its change's (_SET_REMOVAL_AT).
    (28, ()),
)

#: Entries whose labels predate the current label properties: without ``memoryRank`` (before
#: version 2) or without ``lblRequires`` (before version 6).
_UNLABELLED: Final[LiteralString] = """
MATCH (e:Entry) WHERE e.lblRequires IS NULL
RETURN e.botId AS botId, collect(e.id) AS ids
"""

#: The label property that ``lblRequires`` replaced (version 6).
_DROP_OLD_LABEL: Final[LiteralString] = (
    "MATCH (e:Entry {botId: $botId}) WHERE e.lblAtoms IS NOT NULL REMOVE e.lblAtoms"
)

#: Bots with entries that have keywords but no derived-data stamp (written before version 10
#: without a vector).
_UNSTAMPED: Final[LiteralString] = """
MATCH (e:Entry) WHERE e.kwBlind IS NOT NULL AND e.vecSeq IS NULL
RETURN DISTINCT e.botId AS botId
"""

#: Under the Bot's lock, those entries stamped with the Memory's next derived-data sequence.
_STAMP: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
CALL apoc.lock.nodes([m])
SET m.vecSeq = coalesce(m.vecSeq, 0) + 1
WITH m
MATCH (e:Entry {botId: $botId}) WHERE e.kwBlind IS NOT NULL AND e.vecSeq IS NULL
SET e.vecSeq = m.vecSeq
"""

#: Entries with the topic ``preferences`` written before version 12, labelled in batches.
_LABEL_PREFERENCES: Final[LiteralString] = """
MATCH (e:Entry) WHERE 'preferences' IN e.tags AND NOT e:Preference
CALL (e) { SET e:Preference } IN TRANSACTIONS OF 10000 ROWS
"""

#: Each entry's ``changedVersion`` (version 27): the version of the last change whose log row names
#: it, as ``graph.changelog`` sets it since (a change committed meanwhile set a later one: kept).
_SET_CHANGED_VERSION: Final[LiteralString] = """
MATCH (c:Change) WHERE c.entryIds IS NOT NULL
UNWIND c.entryIds AS id
WITH c.botId AS bot, id, max(c.version) AS version
CALL (bot, id, version) {
  MATCH (e:Entry) WHERE e.id = id AND e.botId = bot AND coalesce(e.changedVersion, 0) < version
  SET e.changedVersion = version
} IN TRANSACTIONS OF 10000 ROWS
"""

#: Each Removal written before version 28 gets its change's time as its ``at`` (a Removal gets the
#: server's clock since, as memberships' and grants' ``since``: ``graph.access.REMOVED_FOR``).
_SET_REMOVAL_AT: Final[LiteralString] = """
MATCH (c:Change)-[:REMOVED]->(r:Removal) WHERE r.at IS NULL
CALL (c, r) { SET r.at = c.at } IN TRANSACTIONS OF 10000 ROWS
"""

#: The valid entries labelled before version 14 get ``validOrg`` (``graph.access``), in batches.
_SET_VALID_ORG: Final[LiteralString] = """
MATCH (e:Entry) WHERE e.status = 'active' AND e.lblProved AND size(e.lblOrgs) = 1 AND e.validOrg IS NULL
CALL (e) { SET e.validOrg = e.lblOrgs[0] } IN TRANSACTIONS OF 10000 ROWS
"""

#: Every topic count recomputed from the entries (version 14, after ``validOrg``).
_RECOUNT_TOPICS: Final[LiteralString] = (
    """
MATCH (e:Entry) WHERE e.validOrg IS NOT NULL
UNWIND """
    + TOPICS_OF_E
    + """ AS topic
WITH e.botId AS botId, e.validOrg AS org, topic, count(*) AS n
MERGE (tc:TopicCount {key: botId + '|' + org + '|' + topic})
SET tc.botId = botId, tc.org = org, tc.topic = topic, tc.n = n
"""
)

#: Entries written before version 15 linked to their topics (``graph.topics.link_topics``), in
#: batches; an entry already linked (written by a newer process meanwhile) is left as it is.
_LINK_TOPICS: Final[LiteralString] = (
    """
MATCH (e:Entry) WHERE any(t IN e.tags WHERE NOT t CONTAINS ':') AND NOT EXISTS { (e)-[:HAS_TOPIC]->() }
CALL (e) {
  """
    + link_topics(TOPICS_OF_E, concurrent=True)
    + """} IN TRANSACTIONS OF 10000 ROWS
"""
)

#: The Topics of before version 24, one per topic of a Bot (without ``audienceKey``): their links
#: deleted in batches (a Topic may hold a hundred thousand), then the Topics; _LINK_TOPICS then
#: links every entry to those of its audience key.
_DROP_UNKEYED_LINKS: Final[LiteralString] = """
MATCH (tp:Topic)<-[h:HAS_TOPIC]-() WHERE tp.audienceKey IS NULL
CALL (h) { DELETE h } IN TRANSACTIONS OF 10000 ROWS
"""
_DROP_UNKEYED_TOPICS: Final[LiteralString] = """
MATCH (tp:Topic) WHERE tp.audienceKey IS NULL
CALL (tp) { DETACH DELETE tp } IN TRANSACTIONS OF 10000 ROWS
"""

#: Saved model calls written before version 16 lose their request hash: a plain SHA-256 of the
#: request (evidence, kept entries), which a store copy could test guessed messages against. The
#: hashes are keyed digests now; a step that finds no match asks the model again (C5), which only a
#: step interrupted across the upgrade can meet.
_DROP_PLAIN_REQUEST_HASHES: Final[LiteralString] = """
MATCH (c:ModelCall) WHERE c.requestHash IS NOT NULL
CALL (c) { SET c.requestHash = null } IN TRANSACTIONS OF 10000 ROWS
"""

#: Each Chat's ``unsummarizedChars`` (version 18): its Items after its summary that still have
#: their text, as ``graph.conversation.UNSUMMARIZED`` summed them at every completeTurn before.
#: One Chat a row, locked before its Items are read (a newer process adding Items meanwhile waits,
#: or has added them already and they are summed).
_COUNT_UNSUMMARIZED: Final[LiteralString] = """
MATCH (ch:Chat) WHERE ch.unsummarizedChars IS NULL
CALL (ch) {
  CALL apoc.lock.nodes([ch])
  OPTIONAL MATCH (s:ChatSummary {chatId: ch.id})
  WITH ch, coalesce(s.coversThroughSeq, 0) AS after
  OPTIONAL MATCH (i:Item) WHERE i.chatId = ch.id AND i.seq > after AND i.text IS NOT NULL
  WITH ch, coalesce(sum(i.textLength), 0) AS later
  SET ch.unsummarizedChars = later
} IN TRANSACTIONS OF 1000 ROWS
"""

#: Each Chat's ``summaryInputChars`` (version 23): its summary's characters and those after it
#: (``unsummarizedChars``, version 18), as ``graph.conversation.UNSUMMARIZED`` added them up at
#: every read before. One Chat a row, locked first, as version 18's count.
_COUNT_SUMMARY_INPUT: Final[LiteralString] = """
MATCH (ch:Chat) WHERE ch.summaryInputChars IS NULL
CALL (ch) {
  CALL apoc.lock.nodes([ch])
  OPTIONAL MATCH (s:ChatSummary {chatId: ch.id})
  SET ch.summaryInputChars = coalesce(s.chars, 0) + coalesce(ch.unsummarizedChars, 0)
} IN TRANSACTIONS OF 1000 ROWS
"""

LATEST: Final = MIGRATIONS[-1][0]

_READ_VERSION: Final[LiteralString] = "MATCH (s:SchemaVersion {id: 'schema'}) RETURN s.version AS version"
#: Never backwards: of processes starting together, a slow one that finished an older step after a
#: faster one recorded the latest wrote the older version over it, and the next start ran the
#: later steps' data changes again (16's clears every saved request hash, the keyed ones too).
_WRITE_VERSION: Final[LiteralString] = """
MERGE (s:SchemaVersion {id: 'schema'})
WITH s WHERE coalesce(s.version, 0) < $version
SET s.version = $version, s.appliedAt = timestamp()
"""


async def current_version(driver: AsyncDriver) -> int:
    """The schema version recorded in the graph (0 before any migration)."""
    records, _, _ = await driver.execute_query(_READ_VERSION)
    return int(records[0]["version"]) if records else 0


#: One starter migrates at a time: the others wait for its lease to end (given back, or lapsed
#: when that process died), then find the latest version and run nothing. Before, two starters
#: that read the same version both ran its data step (16's cleared the request hashes that the
#: first one's processes had written since). The lease lives on Neo4j's clock, as executions' do.
_LEASE_RULE: Final[LiteralString] = (
    "CREATE CONSTRAINT migration_lease_id IF NOT EXISTS FOR (n:MigrationLease) REQUIRE n.id IS UNIQUE"
)
_TAKE_LEASE: Final[LiteralString] = """
MERGE (held:MigrationLease {id: 'schema'})
WITH held CALL apoc.lock.nodes([held])
WITH held
MATCH (l:MigrationLease) WHERE elementId(l) = elementId(held)
WITH l WHERE l.holder IS NULL OR l.holder = $holder OR l.until < timestamp()
SET l.holder = $holder, l.until = timestamp() + $leaseMs
RETURN count(l) AS taken
"""
_GIVE_BACK_LEASE: Final[LiteralString] = """
MATCH (l:MigrationLease {id: 'schema', holder: $holder})
SET l.holder = null, l.until = null
"""
LEASE_MS: Final = 30_000
_RENEW_SECONDS: Final = 5.0
_POLL_SECONDS: Final = 0.5


async def migrate(driver: AsyncDriver) -> int:
    """Apply every migration newer than the recorded version; return the version now recorded.

    Schema statements run one per auto-commit transaction (Neo4j forbids mixing schema and
    data writes in one transaction). Every statement is ``IF NOT EXISTS``, and a rule another
    process created at the same moment counts as done, so processes may start together; the
    steps themselves run in one starter at a time, under the migration lease.
    """
    applied = await current_version(driver)
    if applied >= LATEST:
        return applied
    async with _migration_lease(driver) as lease:
        if lease is None:
            return await current_version(driver)
        return await _apply_steps(driver, lease)


class LeaseLost(RuntimeError):
    """The migration lease lapsed while this starter held it (it stalled past ``LEASE_MS``, or
    could not renew it): another may be migrating now, so this one stops before its next step."""


@dataclass(slots=True)
class _Lease:
    holder: str
    lost: bool = False


@contextlib.asynccontextmanager
async def _migration_lease(driver: AsyncDriver) -> AsyncGenerator[_Lease | None]:
    """Hold the lease while the body runs (renewed meanwhile); yield None instead when another
    starter applied every step while this one waited."""
    await _apply(driver, _LEASE_RULE)
    lease = _Lease(secrets.token_hex(8))
    waited = False
    while not await _take_lease(driver, lease.holder):
        if not waited:
            log.info("waiting for another process to migrate the schema")
            waited = True
        await asyncio.sleep(_POLL_SECONDS)
        if await current_version(driver) >= LATEST:
            yield None
            return
    renewing = asyncio.create_task(_renew_lease(driver, lease))
    try:
        yield lease
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        try:
            await driver.execute_query(_GIVE_BACK_LEASE, holder=lease.holder)
        except (Neo4jError, DriverError) as exc:  # it lapses on its own; the body's outcome stands
            log.warning("the migration lease was not given back (%s); it lapses", type(exc).__name__)


async def _take_lease(driver: AsyncDriver, holder: str) -> bool:
    records, _, _ = await driver.execute_query(_TAKE_LEASE, holder=holder, leaseMs=LEASE_MS)
    return bool(records[0]["taken"])


async def _renew_lease(driver: AsyncDriver, lease: _Lease) -> None:
    """Renew every ``_RENEW_SECONDS`` (a failed renewal is tried again at the next); a lease found
    taken over marks it lost, and the steps stop before the next one."""
    while True:
        await asyncio.sleep(_RENEW_SECONDS)
        try:
            taken = await _take_lease(driver, lease.holder)
        except (Neo4jError, DriverError) as exc:
            log.warning("renewing the migration lease failed (%s); trying again", type(exc).__name__)
            continue
        if not taken:
            log.warning("the migration lease lapsed while this process held it: it stops migrating")
            lease.lost = True
            return


#: The data steps of a version that run in batches (``CALL … IN TRANSACTIONS``), in order.
_BATCHED: Final[dict[int, tuple[LiteralString, ...]]] = {
    12: (_LABEL_PREFERENCES,),
    14: (_SET_VALID_ORG,),
    15: (_LINK_TOPICS,),
    16: (_DROP_PLAIN_REQUEST_HASHES,),
    18: (_COUNT_UNSUMMARIZED,),
    23: (_COUNT_SUMMARY_INPUT,),
    24: (_DROP_UNKEYED_LINKS, _DROP_UNKEYED_TOPICS, _LINK_TOPICS),
    27: (_SET_CHANGED_VERSION,),
    28: (_SET_REMOVAL_AT,),
}


async def _apply_steps(driver: AsyncDriver, lease: _Lease) -> int:
    applied = await current_version(driver)
    for version, statements in MIGRATIONS:
        if version <= applied:
            continue
        if lease.lost:
            raise LeaseLost("the migration lease lapsed while this process migrated; start it again")
        # Read again before each one: a starter whose lease lapsed while it stalled may find a
        # step applied by the one that took the lease over (16's clears request hashes written
        # since, so interrupted steps would pay for their model calls again).
        applied = await current_version(driver)
        if version <= applied:
            continue
        for statement in statements:
            await _apply(driver, statement)
        if version in (2, 6):
            await _label_existing_entries(driver)
        if version == 10:
            await _stamp_keyworded_entries(driver)
        if version in _BATCHED:
            async with driver.session() as session:  # CALL … IN TRANSACTIONS needs auto-commit
                for statement in _BATCHED[version]:
                    await (await session.run(statement)).consume()
        if version == 14:
            await driver.execute_query(_RECOUNT_TOPICS)  # after _SET_VALID_ORG
        await driver.execute_query(_WRITE_VERSION, version=version)
        applied = version
    return applied


#: What Neo4j answers when another process created the same index or constraint a moment before,
#: although the statement says IF NOT EXISTS (two processes starting at once).
_CREATED_ELSEWHERE: Final = frozenset(
    {
        "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists",
        "Neo.ClientError.Schema.IndexAlreadyExists",
        "Neo.ClientError.Schema.ConstraintAlreadyExists",
    }
)


async def _apply(driver: AsyncDriver, statement: LiteralString) -> None:
    """One schema statement; an index or constraint another starter just created counts as done."""
    try:
        await driver.execute_query(statement)
    except ClientError as exc:
        if exc.code not in _CREATED_ELSEWHERE:
            raise


async def _label_existing_entries(driver: AsyncDriver) -> None:
    """Entries labelled before the current label properties existed (or not at all) get them,
    one transaction per Bot under its lock."""
    records, _, _ = await driver.execute_query(_UNLABELLED)
    for record in records:
        bot_id, ids = record["botId"], list(record["ids"])

        async def work(tx: AsyncManagedTransaction, bot_id: str = bot_id, ids: list[str] = ids) -> None:
            await tx.run("MATCH (m:Memory {id: $botId}) CALL apoc.lock.nodes([m])", botId=bot_id)
            await access.compute_labels(tx, bot_id=bot_id, ids=ids)
            await tx.run(_DROP_OLD_LABEL, botId=bot_id)

        async with driver.session() as session:
            await session.execute_write(work)


async def _stamp_keyworded_entries(driver: AsyncDriver) -> None:
    """Entries with keywords but no derived-data stamp get one, one transaction per Bot."""
    records, _, _ = await driver.execute_query(_UNSTAMPED)
    for record in records:
        await driver.execute_query(_STAMP, botId=record["botId"])


__all__ = ["LATEST", "LEASE_MS", "MIGRATIONS", "LeaseLost", "current_version", "migrate"]
