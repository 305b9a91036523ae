"""Purge by tag (D9.20), deleting a Chat's history (V13, D9.23) and who an audience admits (the
share check, V6). Each runs inside a change transaction that holds the exclusive Memory lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph import access
from graph.driver import rows, single
from graph.entries import count
from graph.topics import deleting, unlinked

#: The entries carrying the purge tag, and the labels of those someone may see or saw (``gone``,
#: the removals of the purge, D9.24: after it, no one sees them): the label an entry has now,
#: and the label before each earlier removal of it — those removals go with the purge
#: (PURGE_CHANGES), and a reader who had not yet been told of one (a feed or log read from before
#: it) learns of the removal from the purge's own row. Only the label of now counted: an entry
#: hidden or retracted before the purge was never announced as removed to such readers. (The
#: removals are sought by the Bot's version index, ``version IS NOT NULL`` as PURGE_CHANGES.)
TAGGED_IDS: Final[LiteralString] = """
MATCH (e:Entry {botId: $botId})
WHERE $tag IN e.tags
WITH collect(e) AS tagged
CALL (tagged) {
  MATCH (r:Removal {botId: $botId})
  WHERE r.version IS NOT NULL AND r.entryId IN [x IN tagged | x.id]
  RETURN collect(DISTINCT {id: r.entryId, requires: r.beforeRequires,
                           excluded: coalesce(r.beforeExcluded, []),
                           at: coalesce(r.at, COLLECT { MATCH (c:Change)-[:REMOVED]->(r)
                                                        RETURN c.at }[0])}) AS earlier
}
RETURN [x IN tagged | x.id] AS ids,
       [g IN earlier WHERE g.requires IS NOT NULL | g {.*, afterRequires: ['#unproved'], afterExcluded: []}]
       + [x IN tagged WHERE x.status <> 'retracted' AND x.lblRequires IS NOT NULL |
          {id: x.id, requires: x.lblRequires, excluded: coalesce(x.lblExcluded, []), at: null,
           afterRequires: ['#unproved'], afterExcluded: []}] AS gone
"""


class GoneLabel(TypedDict):
    """One of TAGGED_IDS's ``gone``: a deleted entry with its label before and after (the
    ``$gone`` of RELABEL_RECORDING_REMOVALS), and for one removed before, that removal's time
    (``at``, kept: REMOVED_FOR judges a reader as they were then)."""

    id: str
    requires: list[str]
    excluded: list[str]
    at: int | None
    afterRequires: list[str]
    afterExcluded: list[str]


class TaggedRow(TypedDict):
    ids: list[str]
    gone: list[GoneLabel]


#: The entries carrying the purge tag, by the ids TAGGED_IDS found (observations carry their
#: sources' provenance, V12), their topics counted down and the Topics they leave empty deleted
#: (``graph.topics``).
PURGE_ENTRIES: Final[LiteralString] = (
    """
UNWIND $ids AS id
MATCH (e:Entry {id: id}) USING INDEX e:Entry(id)
WHERE e.botId = $botId
"""
    + deleting()
    + """WITH collect(e) AS doomed, collect(e.id) AS ids, collect(elementId(e)) AS nodes
CALL (doomed) {
  UNWIND doomed AS e
  MATCH (e)-[:HAS_TOPIC]->(tp:Topic)
  RETURN collect(DISTINCT tp) AS topics
}
FOREACH (e IN doomed | DETACH DELETE e)
"""
    + unlinked("topics")
    + "RETURN ids, nodes\n"
)


class PurgedRow(TypedDict):
    ids: list[str]
    nodes: list[str]


#: Change-log rows that embed purged entries lose their payload and those ids (D9.20), and
#: earlier removals of them (D9.24) go: the purge's own row names them for who saw them.
#: (``version IS NOT NULL``, true of every row and removal, lets the planner seek
#: ``change_bot_version`` and ``removal_bot_version``: a composite index serves only a predicate on
#: each of its properties.)
PURGE_CHANGES: Final[LiteralString] = """
CALL () {
  MATCH (c:Change {botId: $botId})
  WHERE c.version IS NOT NULL AND any(i IN c.entryIds WHERE i IN $ids)
  SET c.payload = null, c.entryIds = [i IN c.entryIds WHERE NOT i IN $ids]
  RETURN count(c) AS rows
}
CALL () {
  MATCH (r:Removal {botId: $botId})
  WHERE r.version IS NOT NULL AND r.entryId IN $ids
  MATCH (c:Change)-[:REMOVED]->(r)
  SET c.removedIds = [i IN c.removedIds WHERE NOT i IN $ids]
  DETACH DELETE r
  RETURN count(r) AS removals
}
RETURN rows, removals
"""


#: Saved model calls, confession answers and input rewrites that embed purged entries lose their
#: texts (D9.20); usage and cost stay for the budget, the person's original words stay.
PURGE_EMBEDDINGS: Final[LiteralString] = """
CALL (){
  MATCH (c:ModelCall {botId: $botId})
  WHERE any(i IN coalesce(c.entryIds, []) + coalesce(c.producedIds, []) WHERE i IN $ids)
  SET c.request = null, c.result = null, c.requestHash = null, c.purgedAt = timestamp()
  RETURN count(c) AS calls
}
CALL (){
  MATCH (f:Confession {botId: $botId})
  WHERE any(i IN f.usedEntryIds WHERE i IN $ids)
  SET f.answer = null, f.answerPurged = true
  RETURN count(f) AS answers
}
CALL (){
  MATCH (n:Enrichment {botId: $botId})
  WHERE any(i IN n.usedEntryIds + coalesce(n.sentEntryIds, []) WHERE i IN $ids)
  SET n.text = null, n.rewritePurged = true
  RETURN count(n) AS rewrites
}
RETURN calls, answers, rewrites
"""


#: The Memory counts its purges (under the exclusive lock the purge holds; a person's Forget counts
#: too, ``graph.entries.COUNT_TAKE_BACK``): a learning step whose inputs were read before one is
#: stale at its commit (COMMIT_STEP), and asks again without the purged entries, which its answer
#: could otherwise restate as a new fact of another Chat. The
#: purge is also stamped with the next derived-data sequence (``vecSeq``) as a ``Purged`` node
#: holding the node ids the entries had: every process's index drops them at its next catch-up
#: (``graph.search``), before any walk meets them — a walk loses its candidates one walk at a
#: time, and a purge of thousands that ranked high for a query would cost that query rounds of
#: them. ``Purged`` nodes older than PURGED_KEEP_MS go: an index that has not caught up since
#: loses the rest by walks, as it does any it missed.
COUNT_PURGE: Final[LiteralString] = """
MATCH (m:Memory {id: $botId})
SET m.purges = coalesce(m.purges, 0) + 1, m.vecSeq = coalesce(m.vecSeq, 0) + 1
CREATE (:Purged {botId: $botId, vecSeq: m.vecSeq, nodes: $nodes, at: timestamp()})
WITH m
CALL (m) {
  MATCH (old:Purged)
  WHERE old.botId = $botId AND old.vecSeq IS NOT NULL AND old.at < timestamp() - $keepMs
  DELETE old
}
"""

#: How long a purge's node ids are kept for the indexes of other processes to catch up (a day).
PURGED_KEEP_MS: Final = 86_400_000

#: Current members of channels (index seeks by channel id).
CHANNEL_MEMBERS: Final[LiteralString] = """
UNWIND $channelIds AS channelId
MATCH (c:Channel {id: channelId})
OPTIONAL MATCH (p:Person)-[:MEMBER]->(c)
RETURN channelId, collect(p.id) AS people
"""


class ChannelMembersRow(TypedDict):
    channelId: str
    people: list[str]


#: People holding a grant on the Bot in the given organizations (``for:bot``, D9.1).
BOT_USERS: Final[LiteralString] = """
MATCH (p:Person)-[:GRANT]->(:Bot {id: $botId})
MATCH (p)-[:MEMBER_OF]->(o:Organization)
WHERE o.id IN $orgs
RETURN collect(p.id) AS people
"""


class PeopleRow(TypedDict):
    people: list[str]


#: A Chat's history deleted (V13, D9.23): the words of its people wherever they are kept — the
#: Items' text, the input rewrites (rewrite, original words and the digest the rewrite cache finds
#: them by), the confessions with their answers, and the requests and results of the model calls
#: made for the Chat (learning steps found by their execution, calls saved before model calls
#: recorded their Chat included), the time zones the words were said in (D9.32: where a
#: person was) and the digests of the requests idempotency keys were sent with (a retry then
#: gets what its key created, unchecked). Ids, rules, usage and cost stay; what was learned stays.
#: (``i.seq IS NOT NULL``: the Items by a seek on ``item_chat_seq``, as ``graph.chats``' reads; the
#: Turns so on ``turn_chat_seq``.)
#: The Chat is locked first and its ``historyEpoch`` moved on: a model call, summary, rewrite or
#: confide answer that began before and is saved after finds it moved (``graph.memorybot``,
#: ``graph.conversation``) and keeps none of the words.
DELETE_CHAT_HISTORY: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})
CALL apoc.lock.nodes([ch])
SET ch.historyEpoch = coalesce(ch.historyEpoch, 0) + 1,
    ch.summaryInputChars = coalesce(ch.summaryInputChars, 0) - coalesce(ch.unsummarizedChars, 0),
    ch.unsummarizedChars = 0
WITH ch
CALL () {
  MATCH (i:Item {chatId: $chatId})
  WHERE i.seq IS NOT NULL
  SET i.text = null, i.timeZone = null
  RETURN count(i) AS n
}
CALL () {
  MATCH (t:Turn {chatId: $chatId})
  WHERE t.seq IS NOT NULL AND t.timeZone IS NOT NULL
  SET t.timeZone = null
  RETURN count(t) AS zoned
}
CALL () {
  MATCH (n:Enrichment {chatId: $chatId})
  SET n.text = null, n.original = null, n.inputDigest = null
  RETURN count(n) AS enrichments
}
CALL () {
  MATCH (f:Confession {chatId: $chatId})
  SET f.text = null, f.answer = null
  RETURN count(f) AS confessions
}
CALL () {
  CALL () {
    MATCH (c:ModelCall {chatId: $chatId})
    RETURN c
    UNION
    MATCH (x:LearningExecution {chatId: $chatId})
    MATCH (c:ModelCall {executionId: x.id})
    RETURN c
  }
  SET c.request = null, c.result = null, c.requestHash = null, c.historyDeletedAt = timestamp()
  RETURN count(c) AS calls
}
CALL () {
  MATCH (k:Idempotency {chatId: $chatId})
  SET k.request = null
  RETURN count(k) AS keys
}
RETURN n
"""


@dataclass(frozen=True, slots=True)
class Purged:
    """What :func:`purge` deleted (``ids``), the entries resting on them whose labels the purge's
    log row recomputes (``above``: a missing source hides them, V4), and the labels of the deleted
    ones someone could see (``gone``, for the log row's removals, D9.24)."""

    ids: list[str]
    above: list[str]
    gone: list[GoneLabel]


async def purge(tx: AsyncManagedTransaction, *, bot_id: str, tag: str) -> Purged:
    """Delete the entries carrying ``tag`` and strip what embeds them from the change log (D9.20).
    The caller writes the purge's log row with ``above`` and ``gone`` (``graph.changelog.log_change``)."""
    doomed = await single(tx, TAGGED_IDS, TaggedRow, botId=bot_id, tag=tag)
    if doomed is None or not doomed["ids"]:
        return Purged([], [], [])
    doomed_ids: list[str] = list(doomed["ids"])
    above = [
        i for i in await access.dependents_of(tx, bot_id=bot_id, ids=doomed_ids) if i not in set(doomed_ids)
    ]
    record = await single(tx, PURGE_ENTRIES, PurgedRow, botId=bot_id, ids=doomed_ids)
    ids: list[str] = [] if record is None else list(record["ids"])
    await tx.run(PURGE_CHANGES, botId=bot_id, ids=ids)
    if ids and record is not None:
        await tx.run(PURGE_EMBEDDINGS, botId=bot_id, ids=ids)
        await tx.run(COUNT_PURGE, botId=bot_id, nodes=record["nodes"], keepMs=PURGED_KEEP_MS)
    return Purged(ids, above, list(doomed["gone"]))


async def _channel_members(tx: AsyncManagedTransaction, channel_ids: list[str]) -> dict[str, set[str]]:
    found = await rows(tx, CHANNEL_MEMBERS, ChannelMembersRow, channelIds=channel_ids)
    return {r["channelId"]: set(r["people"]) for r in found}


async def audience_people(
    tx: AsyncManagedTransaction, *, bot_id: str, for_tags: list[str], orgs: list[str]
) -> set[str] | None:
    """The people admitted now by all of ``for_tags`` (conjunctive); None when there are none."""
    if not for_tags:
        return None
    members = await _channel_members(tx, [t[12:] for t in for_tags if t.startswith("for:channel:")])
    result: set[str] | None = None
    for tag in for_tags:
        people: set[str]
        if tag.startswith("for:person:"):
            people = {tag[11:]}
        elif tag.startswith("for:channel:"):
            people = members.get(tag[12:], set())
        else:
            record = await single(tx, BOT_USERS, PeopleRow, botId=bot_id, orgs=orgs)
            people = set() if record is None else set(record["people"])
        result = people if result is None else result & people
    return result


async def rule_people(tx: AsyncManagedTransaction, *, rules: list[str]) -> list[set[str]]:
    """For each rule (``person:<id>`` or ``channel:<id>``), the people it admits now."""
    members = await _channel_members(tx, [r[8:] for r in rules if r.startswith("channel:")])
    return [{r[7:]} if r.startswith("person:") else members.get(r[8:], set()) for r in rules]


async def delete_chat_history(tx: AsyncManagedTransaction, *, chat_id: str) -> int:
    """Remove the content of a Chat's Items; ids and the rules saved on SOURCE edges stay (V13)."""
    return await count(tx, DELETE_CHAT_HISTORY, chatId=chat_id)
