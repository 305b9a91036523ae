"""The one visibility check (V1–V5, V7, V9, V11, V12, D9.1, D9.2, D9.4) as Cypher fragments.

``PATH_VISIBLE`` is the check written as a path query over SOURCE edges; it is the oracle.
``COMPUTE_LABELS`` runs the same closure logic once per change, under the exclusive lock, and
stores its reader-independent result on each entry (DESIGN §8); ``VISIBLE``, used by every
read, combines that label with the reader's current channels and grants. A property test
proves ``VISIBLE`` equal to ``PATH_VISIBLE`` after every kind of change.

``VISIBLE`` is a predicate over a candidate entry ``e``. It is spliced into every read query
(list, log, context, subscriptions, source graph, validateReferences, edits), never run as a
separate pre-check. It reads two variables that the query binds first (``readers_now``, or per
subscriber in a batched check): ``org``, the request's organization, and ``readers``, a list of
reader maps that must all pass — READER_MAP for a person's own read and a private chat, one
GROUP_READER for a group chat, standing for the group and every current member of its channel
(D9.15, D9.22). Channel membership and grants are read at request time, so a removal from a
channel hides at once.

For every reader, every entry ``x`` in the source closure of ``e`` (``e`` itself included, at
most 8 SOURCE hops, D9.2) must:
- carry an access proof: not legacy (V9); as many SOURCE edges as it declared (a missing
  source hides it, V4); facts rest on Items only, observations on Entries only, pinned
  entries on nothing (they keep their own rule);
- be active unless it is ``e`` itself (V5: an inactive source hides conclusions above it);
- have at least one ``for:`` tag and pass all of them (V1, V2, D9.1: conjunctive), and pass
  every ``org:`` tag (V2, V12);
- not be excluded for the reader (Forget, V11, D9.4 — exclusions propagate to dependents).
And every SOURCE edge to an Item anywhere below ``e`` must admit the reader by the rule saved
on it at learning time (V3), in the request's organization. Closures deeper than 8 hops and
closures containing a loop fail closed (V4, D9.2).
"""

from __future__ import annotations

from typing import Final, LiteralString, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import single
from graph.topics import relinked, revalidate

#: Hop bound of source chains (D9.2); the fragments below spell it out as literals.
MAX_SOURCE_DEPTH: Final = 8

_STRUCTURE_OK: Final[LiteralString] = """
NOT coalesce(x.legacy, false)
AND (x = e OR x.status = 'active')
AND x.sourceCount = COUNT { (x)-[:SOURCE]->() }
AND CASE x.layer
      WHEN 'pinned' THEN x.sourceCount = 0
      WHEN 'fact' THEN x.sourceCount > 0 AND NOT EXISTS { (x)-[:SOURCE]->(:Entry) }
      WHEN 'observation' THEN x.sourceCount > 0 AND NOT EXISTS { (x)-[:SOURCE]->(:Item) }
      ELSE false
    END
AND any(t IN x.tags WHERE t STARTS WITH 'for:')
"""

_ENTRY_OK: Final[LiteralString] = (
    _STRUCTURE_OK
    + """
AND all(t IN x.tags WHERE
      (NOT t STARTS WITH 'for:'
        OR t = 'for:person:' + rd.id
        OR (t STARTS WITH 'for:channel:' AND substring(t, 12) IN rd.channels)
        OR (t = 'for:bot' AND rd.usesBot))
      AND (NOT t STARTS WITH 'org:' OR t = 'org:' + org))
AND none(i IN rd.ids WHERE i IN coalesce(x.excluded, []))
"""
)

_RULE_OK: Final[LiteralString] = """
r.org = org
AND (r.rule = 'person:' + rd.id OR (r.rule STARTS WITH 'channel:' AND substring(r.rule, 8) IN rd.channels))
"""

#: The path query (the oracle): predicate on ``e`` as described in the module docstring.
#: Needs the variables ``readers`` and ``org``. Hop bound 8 (D9.2). Only the property tests use
#: it, with a group chat's members as readers of their own (READER_MAP) beside the group: it reads
#: exclusions from each reader's ``ids``, so given a GROUP_READER it would miss the members'.
PATH_VISIBLE: Final[LiteralString] = (
    """
(size(readers) > 0
 AND all(rd IN readers WHERE rd.usesBot)
 AND NOT EXISTS { (e)-[:SOURCE*9]->() }
 AND NOT EXISTS { MATCH (e)-[:SOURCE*0..8]->(y:Entry)-[:SOURCE*1..8]->(y) }
 AND all(rd IN readers WHERE
   all(x IN [e] + [(e)-[:SOURCE*1..8]->(s:Entry) | s] WHERE """
    + _ENTRY_OK
    + """)
   AND all(r IN [(e)-[:SOURCE*0..7]->(:Entry)-[r:SOURCE]->(:Item) | r] WHERE """
    + _RULE_OK
    + """)))
"""
)

#: The source closure of ``e`` (itself and every entry below, 8 hops), every Item edge below
#: it, and ``proved``: the reader-independent half of PATH_VISIBLE (proof, active sources,
#: depth bound, no loop). Shared by the labels and the share check.
_CLOSURE: Final[LiteralString] = (
    """
WITH e, [e] + [(e)-[:SOURCE*1..8]->(s:Entry) | s] AS closure,
     [(e)-[:SOURCE*0..7]->(:Entry)-[r:SOURCE]->(:Item) | r] AS rules
WITH e, closure, rules,
     NOT EXISTS { (e)-[:SOURCE*9]->() }
     AND NOT EXISTS { MATCH (e)-[:SOURCE*0..8]->(y:Entry)-[:SOURCE*1..8]->(y) }
     AND all(x IN closure WHERE """
    + _STRUCTURE_OK
    + """) AS proved
"""
)

#: Stores the label computed by _CLOSURE for ``e`` (see COMPUTE_LABELS). An entry whose
#: ``activeKey`` changes is stamped with the Memory's next derived-data sequence (``vecSeq``), as
#: a write of its keywords or vector is: each process's search index holds every entry's
#: ``activeKey`` and ranks only the entries whose key the reader holds (``services.vectorindex``),
#: so it must catch up with a key as it does with a vector before it ranks. An entry whose
#: ``validOrg`` changes moves its topics' counts, and one whose ``audienceKey`` changes its topics'
#: links (``graph.topics``).
_SET_LABELS: Final[LiteralString] = (
    """
WITH e, proved, e.activeKey AS keyBefore, e.validOrg AS validBefore,
     reduce(acc = [], x IN closure | acc + [t IN x.tags WHERE t STARTS WITH 'for:' | substring(t, 4)])
       + [r IN rules | r.rule] AS atoms,
     reduce(acc = [], x IN closure | acc + [t IN x.tags WHERE t STARTS WITH 'org:' | substring(t, 4)])
       + [r IN rules | r.org] AS orgs,
     reduce(acc = [], x IN closure | acc + coalesce(x.excluded, [])) AS excluded
WITH e, proved, keyBefore, validBefore,
     reduce(acc = [], a IN atoms | CASE WHEN a IN acc THEN acc ELSE acc + a END) AS atoms,
     reduce(acc = [], o IN orgs | CASE WHEN o IN acc THEN acc ELSE acc + o END) AS orgs,
     reduce(acc = [], p IN excluded | CASE WHEN p IN acc THEN acc ELSE acc + p END) AS excluded
WITH e, proved, keyBefore, validBefore, atoms, orgs, excluded,
     CASE WHEN NOT proved THEN null
       ELSE coalesce(head([a IN atoms WHERE a STARTS WITH 'person:']),
                     head([a IN atoms WHERE a STARTS WITH 'channel:']),
                     head([a IN atoms WHERE a = 'bot'])) END AS audienceKey
SET e.lblProved = proved, e.lblOrgs = orgs, e.lblExcluded = excluded,
    e.lblRequires = CASE WHEN NOT proved OR size(atoms) = 0 THEN ['#unproved']
      ELSE atoms + [o IN orgs | '#org:' + o] + CASE WHEN size(excluded) > 0 THEN ['#excluded'] ELSE [] END END,
    e.memoryRank = CASE WHEN e.layer = 'pinned' THEN 1125899906842624 ELSE 0 END + e.orderKey,
    e.audienceKey = audienceKey,
    e.activeKey = CASE WHEN e.status = 'active' THEN audienceKey END,
    e.validOrg = CASE WHEN e.status = 'active' AND proved AND size(orgs) = 1 THEN orgs[0] END
"""
    + revalidate()
    + "WITH e, keyBefore\n"
    + relinked()
    + """WITH e WHERE coalesce(e.activeKey, '') <> coalesce(keyBefore, '')
MATCH (keyed:Memory {id: e.botId})
SET keyed.vecSeq = coalesce(keyed.vecSeq, 0) + 1
SET e.vecSeq = keyed.vecSeq
"""
)

#: The derived label of DESIGN §8, computed by the same path query without a reader, for the
#: entries ``$ids`` (callers pass the changed entries plus every dependent, see DEPENDENTS).
#: ``lblRequires``, what VISIBLE reads — one property, so a candidate costs one property read:
#: every audience condition of the closure (the ``for:`` tags of each entry and every Item rule
#: below, as ``person:<id>``, ``channel:<id>``, ``bot``), ``#org:<id>`` for every organization
#: they name, ``#excluded`` when the closure holds a Forget exclusion (listed in
#: ``lblExcluded``), and only ``#unproved`` when the reader-independent part fails (``lblProved``:
#: proof, activity of sources, depth, loops). ``lblOrgs``: the organizations alone.
#: ``audienceKey`` is the most selective atom (an index seek key, null when unprovable),
#: ``activeKey`` the same for active entries only (null otherwise: the ``entry_active`` index
#: holds just what ``context`` may return), ``validOrg`` the organization of an entry valid for
#: learning (L4: active, proved, of that one organization; null otherwise: the ``entry_valid``
#: index holds what learningContext reads), and ``memoryRank`` the memory order as one indexed
#: number (pinned first, then ``orderKey``). Maintained under the exclusive lock by every change
#: (C1), which relabels every entry whose status, order or closure it touches. Hop bound 8 (D9.2).
COMPUTE_LABELS: Final[LiteralString] = (
    """
UNWIND $ids AS entryId
MATCH (e:Entry {id: entryId, botId: $botId}) USING INDEX e:Entry(id)
"""
    + _CLOSURE
    + _SET_LABELS
)


class ShareBasisRow(TypedDict):
    """SHARE_BASIS. ``authors``: of the pinned entries of the closure; one that passes the proof
    (``proved``) was remembered by a person, so it has one."""

    proved: bool
    rules: list[str]
    authors: list[str]


#: What a wider audience must stay within (V6, D9.3): every Item rule below the entry and the
#: author of every pinned entry in its closure; an entry without proof is never widened (V9, D9.2).
SHARE_BASIS: Final[LiteralString] = (
    """
MATCH (e:Entry {id: $id, botId: $botId})
"""
    + _CLOSURE
    + """
RETURN proved, [r IN rules | r.rule] AS rules, [x IN closure WHERE x.layer = 'pinned' | x.author] AS authors
"""
)


#: The entries ``$ids`` and everything resting on them within 8 hops (whose labels they feed),
#: each once as ``e``.
_RELABELLED: Final[LiteralString] = """
UNWIND $ids AS entryId
MATCH (s:Entry {id: entryId, botId: $botId}) USING INDEX s:Entry(id)
OPTIONAL MATCH (d:Entry)-[:SOURCE*1..8]->(s)
WITH collect(DISTINCT s) + collect(DISTINCT d) AS targets
UNWIND targets AS e
WITH DISTINCT e
"""

#: Labels of the changed entries ``$ids`` and of everything resting on them within 8 hops
#: (whose labels they feed), in one statement under the exclusive lock.
RELABEL: Final[LiteralString] = _RELABELLED + _CLOSURE + _SET_LABELS

#: RELABEL as part of a change's log row ``c`` at ``version`` (a fragment: ``CALL (c, version)``),
#: recording what the change hid (D9.24): every relabelled entry whose label narrowed or that
#: the change retracted gets a ``(:Removal)`` with its label before and after (after: seen by no
#: one when retracted), and ``$gone`` adds entries deleted by the change (purge), given with their
#: label before. Whether a reader lost an entry is decided when it is read — VISIBLE on the label
#: before and not on the label after, for that reader (``REMOVED_FOR``) — so the rows hold ids,
#: access atoms and their time ``at`` only (E4). New entries have no label before and are never
#: removals; entries already retracted before the change are not either. Sets ``c.removedIds``.
RELABEL_RECORDING_REMOVALS: Final[LiteralString] = (
    "CALL (c, version) {"
    + _RELABELLED
    + """WITH collect(e) AS targets,
       collect(CASE WHEN e.lblRequires IS NOT NULL AND (e.status <> 'retracted' OR e.id IN $ids)
         THEN {entry: e, requires: e.lblRequires, excluded: coalesce(e.lblExcluded, [])} END) AS before
  CALL (targets) {
    UNWIND targets AS e
"""
    + _CLOSURE
    + _SET_LABELS
    + """  }
  WITH c, version, [b IN before | b {
         .requires, .excluded, id: b.entry.id,
         afterRequires: CASE WHEN b.entry.status = 'retracted' THEN ['#unproved'] ELSE b.entry.lblRequires END,
         afterExcluded: coalesce(b.entry.lblExcluded, [])}] AS relabelled
  UNWIND [r IN relabelled WHERE r.afterRequires <> r.requires OR r.afterExcluded <> r.excluded] + $gone AS r
  CREATE (c)-[:REMOVED]->(:Removal {botId: $botId, version: version, entryId: r.id,
    at: coalesce(r.at, timestamp()),
    beforeRequires: r.requires, beforeExcluded: r.excluded,
    afterRequires: r.afterRequires, afterExcluded: r.afterExcluded})
  RETURN collect(DISTINCT r.id) AS removed
}
SET c.removedIds = removed
"""
)


class IdsRow(TypedDict):
    """One list of ids (DEPENDENTS and the other statements that return ``ids``)."""

    ids: list[str]


#: The entries ``$ids`` and everything resting on them within 8 hops (whose labels they feed).
DEPENDENTS: Final[LiteralString] = """
UNWIND $ids AS entryId
MATCH (s:Entry {id: entryId, botId: $botId}) USING INDEX s:Entry(id)
OPTIONAL MATCH (d:Entry)-[:SOURCE*1..8]->(s)
WITH collect(DISTINCT s.id) + collect(DISTINCT d.id) AS ids
UNWIND ids AS id
RETURN collect(DISTINCT id) AS ids
"""

#: The label check (DESIGN §8): equal to PATH_VISIBLE after every change (a property test
#: proves it). Channel membership and grants are still read per request through ``readers``:
#: every condition of ``lblRequires`` must be met by every reader — an atom among the atoms the
#: reader meets (READER_MAP), an organization that is the request's, no Forget exclusion of the
#: reader (for a group chat's reader: of the group or of a current member of its channel, read
#: from the channel for the few excluded, D9.22); ``#unproved`` is met by no one. One property read per candidate (``lblExcluded`` only
#: when the closure holds an exclusion): reading a property is most of a candidate's cost. A
#: reader who does not use the Bot (no READ or WRITE grant, D9.1) sees nothing, their own
#: entries included (seed 000: "You need read on the Bot"): the direct reads refused them, but an
#: owner whose grant was set to NONE kept their memory through the chats they had (their
#: rewrites, contextPack, a platform's context of the chat).
VISIBLE: Final[LiteralString] = """
(size(readers) > 0
 AND all(rd IN readers WHERE rd.usesBot AND all(a IN e.lblRequires WHERE
       a IN rd.atoms OR a = '#org:' + org OR (a = '#excluded' AND none(i IN rd.ids WHERE i IN e.lblExcluded)
         AND (rd.id <> '#group' OR none(i IN e.lblExcluded WHERE
           EXISTS { (:Person {id: i})-[:MEMBER]->(:Channel {id: rd.channels[0]}) }))))))
"""

#: The entries removed for the reader (D9.24) by the changes of versions ``$versions``: their
#: label before the change admitted the reader and their label after does not (VISIBLE on each),
#: the reader as they were when the change was made (its Removal's ``at``; its change's time for
#: one written without it, by a process older than version 28): a person uses the Bot from their
#: grant's ``since`` (and its link's, for a linked Bot) and holds a channel's atom from their
#: membership's ``since``, so someone who joined later is told of no entry hidden before (its id
#: told them of an entry they never saw); joined in the same millisecond counts as later. A
#: membership, grant or link older than these times (version 28) counts as always held; with no
#: ``$versions`` none of this is read (a delivery of a change that hid nothing). A group's reader
#: (``#group``) is judged with its channel's members of now: no caller passes one (the log and
#: the feed read for a person). Who left and came back, or lost the grant and got it again, is
#: judged from their return: a removal while they were there before is not told them. Needs
#: ``readers`` and ``org``; a fragment (``CALL (readers, org)``) that returns ``removed``, a list
#: of ``{version, id}``.
REMOVED_FOR: Final[LiteralString] = (
    """CALL (readers, org) {
  CALL (readers, org) {
    UNWIND CASE WHEN size($versions) = 0 THEN [] ELSE readers END AS rd
    OPTIONAL MATCH (p:Person {id: rd.id})-[g:GRANT]->(b:Bot {id: $botId})
    OPTIONAL MATCH (b)-[l:LINKED]->(:Organization {id: org})
    CALL (p, rd) {
      OPTIONAL MATCH (p)-[m:MEMBER]->(c:Channel) WHERE c.id IN rd.channels AND m.since IS NOT NULL
      RETURN collect(['channel:' + c.id, m.since]) AS joined
    }
    RETURN collect(rd {.*, joined: joined,
                       since: CASE WHEN coalesce(l.since, 0) > coalesce(g.since, 0)
                                   THEN l.since ELSE g.since END}) AS past
  }
  CALL (past, org) {
    UNWIND $versions AS v
    MATCH (r:Removal {botId: $botId, version: v})
    OPTIONAL MATCH (ch:Change)-[:REMOVED]->(r) WHERE r.at IS NULL
    WITH past, org, r, coalesce(r.at, ch.at) AS at
    WITH org, r, [rd IN past | CASE WHEN rd.id = '#group' THEN rd ELSE rd {.*,
           usesBot: rd.usesBot AND coalesce(rd.since, 0) < at,
           atoms: [a IN rd.atoms WHERE none(j IN rd.joined WHERE j[0] = a AND j[1] >= at)]} END] AS readers
    WITH readers, org, r, {lblRequires: r.beforeRequires, lblExcluded: r.beforeExcluded} AS e
    WHERE """
    + VISIBLE
    + """
    WITH readers, org, r, {lblRequires: r.afterRequires, lblExcluded: r.afterExcluded} AS e
    WHERE NOT """
    + VISIBLE
    + """
    RETURN collect(DISTINCT {version: r.version, id: r.entryId}) AS removed
  }
  RETURN removed
}
"""
)


class RemovedEntry(TypedDict):
    """One of REMOVED_FOR's ``removed``: an entry the change of ``version`` hid from the readers."""

    version: int
    id: str


#: Whether the Person ``p`` uses the Bot ``b`` in the Organization ``o``: a READ/WRITE grant,
#: with the Bot owned by or linked into that organization (D9.1).
USES_BOT: Final[LiteralString] = (
    "EXISTS { (p)-[:GRANT]->(b) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))"
)

#: A reader as the checks read it, for the Person ``p`` with the ids of their current channels
#: in the Organization ``o`` (``channels``) and the Bot ``b``: ``id``, ``channels``, ``usesBot``
#: (what PATH_VISIBLE reads) and ``atoms``, the audience conditions they meet as VISIBLE and the
#: candidate seeks read them (``person:<id>``, ``channel:<id>`` each, ``bot`` when they use it).
READER_MAP: Final[LiteralString] = (
    "{id: p.id, ids: [p.id], channels: channels, usesBot: "
    + USES_BOT
    + """,
  atoms: ['person:' + p.id] + [cid IN channels | 'channel:' + cid]
         + CASE WHEN """
    + USES_BOT
    + " THEN ['bot'] ELSE [] END}"
)


class ReaderMap(TypedDict):
    """A reader as READER_MAP (or GROUP_READER) builds it and the checks read it in ``$readers``:
    ``ids``, the people a Forget exclusion of whom hides an entry from it (the person; for a
    group, ``#group``: VISIBLE reads its members' exclusions from its channel)."""

    id: str
    ids: list[str]
    channels: list[str]
    usesBot: bool
    atoms: list[str]


class ReaderRow(TypedDict):
    """READER: ``known``, whether the Bot is owned by or linked into the organization."""

    reader: ReaderMap
    known: bool


#: The members of the Channel ``c`` of the Organization ``o`` for the Bot ``b`` as GROUP_READER
#: reads them (a ``CALL`` clause; any of the three may be null): ``allUse``, whether the channel
#: has a member and every one of them is in ``o`` and uses ``b`` (D9.1). The search stops at the
#: first member who does not; their ids are not collected (VISIBLE reads exclusions from the
#: channel): at 20,000 members the members' ids cost ~15 ms a statement, and the check as
#: ``all(…)`` over the collected members ~35 ms against ~20 now.
GROUP_MEMBERS: Final[LiteralString] = """  CALL (c, o, b) {
    RETURN c IS NOT NULL AND o IS NOT NULL AND b IS NOT NULL
           AND EXISTS { (:Person)-[:MEMBER]->(c) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))
           AND NOT EXISTS { MATCH (m:Person)-[:MEMBER]->(c)
                            WHERE NOT (EXISTS { (m)-[:MEMBER_OF]->(o) } AND EXISTS { (m)-[:GRANT]->(b) }) } AS allUse
  }
"""

#: A group chat's one reader (D9.15, D9.22), for the Channel ``c`` after GROUP_MEMBERS: an answer
#: there must pass every current member of the channel and the group itself. The group meets
#: only the channel's atom and ``bot`` — so the answer draws only on entries for the group or for
#: everyone, never on a member's personal entries, also in a channel of one — and each member
#: meets both (a member of the channel who uses the Bot): so the group and its members together
#: are this one reader, which uses the Bot when every member does; a Forget exclusion of a member
#: is read from the channel by VISIBLE. Checking each member as a reader of its own cost each
#: candidate as much as the channel had members (a 1,000-member channel: ~130 ms a context; at
#: 5,000 Neo4j failed the statement with a TransientError).
GROUP_READER: Final[LiteralString] = (
    "{id: '#group', ids: ['#group'], channels: CASE WHEN c IS NULL THEN [] ELSE [c.id] END,"
    " usesBot: allUse, atoms: CASE WHEN allUse THEN ['channel:' + c.id, 'bot'] ELSE [] END}"
)


def readers_now(carry: LiteralString = "") -> LiteralString:
    """``WITH <carry>readers, org``: the readers of ``$readers`` as they stand now, for a statement
    that runs under the shared lock (``carry``: what the statement carries on, with a trailing
    comma). Each person is read again — their channels in ``$org``, whether they use the Bot
    ``$botId`` (READER_MAP); one no longer in the organization reads nothing — and a group reader
    (GROUP_READER) is built again from its channel's members now. The readers a read passes come
    from an earlier transaction (a search embeds its query and ranks first; an answer waits for
    the model, then checks what it used): a membership or grant change committed meanwhile, and
    content written after it under the exclusive lock, would otherwise meet the old rules (C1).
    The candidate seeks may still follow the audience keys of the readers as passed: only what
    they find can be less."""
    return (
        """CALL () {
  UNWIND [r IN $readers WHERE r.id <> '#group' | r.id] AS pid
  OPTIONAL MATCH (p:Person {id: pid})-[:MEMBER_OF]->(o:Organization {id: $org})
  OPTIONAL MATCH (b:Bot {id: $botId})
  OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
  WITH pid, p, o, b, collect(c.id) AS channels
  RETURN collect(CASE WHEN p IS NULL OR b IS NULL
                   THEN {id: pid, ids: [pid], channels: [], usesBot: false, atoms: []}
                 ELSE """
        + READER_MAP
        + """ END) AS people
}
CALL () {
  UNWIND [r IN $readers WHERE r.id = '#group' | r.channels[0]] AS cid
  OPTIONAL MATCH (c:Channel {id: cid})-[:IN]->(o:Organization {id: $org})
  OPTIONAL MATCH (b:Bot {id: $botId})
"""
        + GROUP_MEMBERS
        + "  RETURN collect("
        + GROUP_READER
        + """) AS groups
}
WITH """
        + carry
        + """groups + people AS readers, $org AS org
"""
    )


#: The seek keys ``$keys`` that every reader as it stands now (``readers_now``) still holds. An
#: entry passes VISIBLE only when each reader holds its audience key (its ``activeKey`` is one of
#: its ``lblRequires``) and every reader uses the Bot, so a seek under a key some reader lacks
#: walks only entries that cannot pass — every key, for a group chat one of whose members does
#: not use the Bot (the keys it is passed under, GROUP_SEEK, say nothing of its members), or for
#: the owner of a private chat who lost their grant.
HELD_KEYS: Final[LiteralString] = (
    "[k IN $keys WHERE size(readers) > 0 AND all(rd IN readers WHERE rd.usesBot AND k IN rd.atoms)]"
)


#: The reader map of one person for ``$readers`` (READER_MAP), and whether the Bot is theirs to
#: know of (``known``: owned by or linked into their organization).
READER: Final[LiteralString] = (
    """
MATCH (p:Person {id: $personId})-[:MEMBER_OF]->(o:Organization {id: $org})
MATCH (b:Bot {id: $botId})
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH p, o, b, collect(c.id) AS channels
RETURN """
    + READER_MAP
    + " AS reader, EXISTS { (b)-[:OWNED_BY|LINKED]->(o) } AS known\n"
)

#: A group chat's reader as it is passed in ``$readers`` (GROUP_READER's shape): its channel, and
#: the keys its candidates are sought by. It proves nothing — ``usesBot`` is false, so that code
#: that ever read it for a decision would refuse — every statement that checks builds the whole
#: GROUP_READER from the channel's members again under the lock (``readers_now``) and seeks only
#: the keys that one holds (HELD_KEYS). So the members are read once per statement that checks,
#: not also by the statement that names the readers (which read them all: ~50 ms at 20,000).
GROUP_SEEK: Final[LiteralString] = (
    "{id: '#group', ids: ['#group'], channels: [c.id], usesBot: false, atoms: ['channel:' + c.id, 'bot']}"
)

#: The reader of an answer in a Chat (D9.15) as a list of one: its owner in a private chat (as
#: READER_MAP), the group in a group chat (as GROUP_SEEK: ``readers_now`` makes it whole); no row
#: for a group chat whose channel has no member (nobody reads there).
CHAT_READERS: Final[LiteralString] = (
    """
MATCH (ch:Chat {id: $chatId})-[:WITH_BOT]->(b:Bot)
MATCH (ch)-[:IN_ORG]->(o:Organization)
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
CALL (ch, b, o, c) {
  WITH ch, b, o WHERE c IS NULL
  MATCH (p:Person {id: ch.ownerId})
  OPTIONAL MATCH (p)-[:MEMBER]->(pc:Channel)-[:IN]->(o)
  WITH p, o, b, collect(pc.id) AS channels
  RETURN """
    + READER_MAP
    + """ AS reader
UNION
  WITH c WHERE c IS NOT NULL AND EXISTS { (:Person)-[:MEMBER]->(c) }
  RETURN """
    + GROUP_SEEK
    + """ AS reader
}
RETURN [reader] AS readers, o.id AS org
"""
)


class ChatReadersRow(TypedDict):
    readers: list[ReaderMap]
    org: str


async def share_basis(tx: AsyncManagedTransaction, *, bot_id: str, id: str) -> ShareBasisRow | None:
    return await single(tx, SHARE_BASIS, ShareBasisRow, botId=bot_id, id=id)


async def relabel(tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str]) -> None:
    """Recompute the labels of ``ids`` and of everything resting on them (under the exclusive lock)."""
    if not ids:
        return
    await tx.run(RELABEL, botId=bot_id, ids=ids)


async def dependents_of(tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str]) -> list[str]:
    """``ids`` and every entry resting on them within 8 hops."""
    record = await single(tx, DEPENDENTS, IdsRow, botId=bot_id, ids=ids)
    return [] if record is None else record["ids"]


async def compute_labels(tx: AsyncManagedTransaction, *, bot_id: str, ids: list[str]) -> None:
    await tx.run(COMPUTE_LABELS, botId=bot_id, ids=ids)
