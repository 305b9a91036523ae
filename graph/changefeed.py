"""The batched visibility check of change events for the subscribers of one API process."""

from __future__ import annotations

from typing import Any, Final

from graph.access import READER_MAP, VISIBLE
from graph.driver import QueryTarget, single
from graph.memory import ENTRY_LIST, READ_LOCK

#: For each local subscriber (``$subs``: ``{key, person, org, token}``) the ids among the changed
#: entries (``$ids``) it may see now: current membership, a live token, read on the Bot (V10);
#: subscribers that lost access are absent. Then the entries anyone may see, read once for all
#: (content as ciphertext). One statement per event per API process, under the shared lock
#: taken first in the same statement (the first of the read, C1).
LOCKED_DELIVERY: Final = (
    READ_LOCK
    + """
WITH m
MATCH (b:Bot {id: $botId})
UNWIND $subs AS sub
MATCH (t:Token {id: sub.token})-[:FOR]->(p:Person {id: sub.person})-[:MEMBER_OF]->(o:Organization {id: sub.org})
WHERE t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
OPTIONAL MATCH (p)-[:MEMBER]->(c:Channel)-[:IN]->(o)
WITH sub, o, b, p, collect(c.id) AS channels
WITH sub, o.id AS org, ["""
    + READER_MAP
    + """] AS readers
WHERE readers[0].usesBot
CALL (org, readers) {
  UNWIND $ids AS entryId
  MATCH (e:Entry {id: entryId})
  WHERE e.botId = $botId AND e.status <> 'retracted' AND """
    + VISIBLE
    + """
  RETURN collect(e.id) AS visible
}
WITH collect({key: sub.key, visible: visible}) AS found
CALL (found) {
  UNWIND found AS f
  UNWIND f.visible AS entryId
  WITH DISTINCT entryId
  MATCH (e:Entry {id: entryId})
  WHERE e.botId = $botId
"""
    + ENTRY_LIST
    + """}
RETURN found, entries
"""
)


async def deliveries(
    tx: QueryTarget, *, bot_id: str, ids: list[str], subs: list[dict[str, str]], now: int
) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """Visible changed entry ids per subscriber key (subscribers that lost access are absent),
    and the rows of the entries among them (content as ciphertext)."""
    row = await single(tx, LOCKED_DELIVERY, botId=bot_id, ids=ids, subs=subs, now=now)
    if row is None:
        return {}, []
    return {f["key"]: list(f["visible"]) for f in row["found"]}, list(row["entries"])
