"""The one visibility check (V1–V5, V7, V9, V11, V12, D9.1, D9.2, D9.4) as Cypher fragments.

``VISIBLE`` is a predicate over a candidate entry ``e``. It is spliced into every read query
(list, log, context, subscriptions, source graph, validateReferences, edits), never run as a
separate pre-check. It reads two variables that the query binds first (``WITH $readers AS
readers, $org AS org``, or per subscriber in a batched check): ``org``, the request's
organization, and ``readers``, a list of ``{id, channels, usesBot}`` maps — one reader for a person's own read, every reader of the
answer for a group chat (D9.15). Channel membership and grants are read at request time, so a
removal from a channel hides at once.

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

from typing import Final

#: Hop bound of source chains (D9.2); the fragments below spell it out as literals.
MAX_SOURCE_DEPTH: Final = 8

_ENTRY_OK: Final = """
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
AND all(t IN x.tags WHERE
      (NOT t STARTS WITH 'for:'
        OR t = 'for:person:' + rd.id
        OR (t STARTS WITH 'for:channel:' AND substring(t, 12) IN rd.channels)
        OR (t = 'for:bot' AND rd.usesBot))
      AND (NOT t STARTS WITH 'org:' OR t = 'org:' + org))
AND NOT rd.id IN coalesce(x.excluded, [])
"""

_RULE_OK: Final = """
r.org = org
AND (r.rule = 'person:' + rd.id OR (r.rule STARTS WITH 'channel:' AND substring(r.rule, 8) IN rd.channels))
"""

#: Predicate on ``e`` (see the module docstring). Needs the variables ``readers`` and ``org``.
VISIBLE: Final = (
    """
(size(readers) > 0
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

#: The reader map of one person for ``$readers``: current channels and whether they use the Bot
#: (a READ/WRITE grant, with the Bot owned by or linked into the request's organization, D9.1).
READER: Final = """
MATCH (p:Person {id: $personId})-[:MEMBER_OF]->(o:Organization {id: $org})
MATCH (b:Bot {id: $botId})
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH p, o, b, collect(c.id) AS channels
RETURN {id: p.id, channels: channels,
        usesBot: EXISTS { (p)-[:GRANT]->(b) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))} AS reader
"""

#: Reader maps of a Chat's audience (D9.15): its owner in a private chat, every current member
#: of its channel in a group chat.
CHAT_READERS: Final = """
MATCH (ch:Chat {id: $chatId})-[:WITH_BOT]->(b:Bot)
MATCH (ch)-[:IN_ORG]->(o:Organization)
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
OPTIONAL MATCH (m:Person)-[:MEMBER]->(c)
WITH ch, b, o, c, collect(m) AS members
MATCH (owner:Person {id: ch.ownerId})
WITH b, o, CASE WHEN c IS NULL THEN [owner] ELSE members END AS people
UNWIND people AS p
OPTIONAL MATCH (p)-[:MEMBER]->(pc:Channel)-[:IN]->(o)
WITH b, o, p, collect(pc.id) AS channels
RETURN collect({id: p.id, channels: channels,
        usesBot: EXISTS { (p)-[:GRANT]->(b) } AND ((b)-[:OWNED_BY]->(o) OR (b)-[:LINKED]->(o))}) AS readers,
       o.id AS org
"""
