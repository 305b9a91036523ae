"""A change's row in the Bot's change log (C2): the version, what it touched and what it hid
(D9.24), written with the relabelling in the same statement as the change itself; and the
add-only change (new facts) that takes the lock, adds and logs in one statement."""

from __future__ import annotations

from typing import Any, Final, LiteralString, TypedDict

from neo4j import AsyncDriver, AsyncManagedTransaction

from graph.access import RELABEL_RECORDING_REMOVALS, USES_BOT
from graph.driver import autocommit, single
from graph.entries import ADD_ENTRIES
from graph.purge import GoneLabel

#: The log row of a change (C2), then the labels of the relabelled entries (``$ids``: the logged
#: ones, or for a purge the entries resting on the deleted ones) and of everything resting on
#: them, recording what the change hid (``$gone``: deleted entries with their labels, D9.24).
#: Each logged entry there is gets the version as its ``changedVersion`` (what ``shareEntry``'s
#: ``expected`` compares). Needs ``m`` and ``version``; binds ``c`` and ``removed``.
_LOG: Final[LiteralString] = (
    """
CREATE (c:Change {id: $id, botId: $botId, version: version, at: $at, actor: $actor,
                  entryIds: $entryIds, payload: $payload})-[:OF]->(m)
WITH c, version
CALL (version) {
  MATCH (changed:Entry) USING INDEX changed:Entry(id)
  WHERE changed.id IN $entryIds AND changed.botId = $botId
  SET changed.changedVersion = version
}
"""
    + RELABEL_RECORDING_REMOVALS
)


#: The head of a change's later statements: the Memory (already locked) at ``$version``.
_AT_VERSION: Final[LiteralString] = "MATCH (m:Memory {id: $botId})\nWITH m, $version AS version\n"


#: After ADD_ENTRIES: ``then`` runs only when no new entry was refused.
_UNLESS_REFUSED: Final[LiteralString] = (
    "CALL (m, version, problem) {\n  WITH m, version WHERE problem IS NULL\n"
)


#: The end of a change in one round trip: the log row and the labels (version ``$version``);
#: returns the ids of what it hid from someone (D9.24).
LOG_CHANGE: Final[LiteralString] = _AT_VERSION + _LOG + "RETURN removed\n"


class LoggedRow(TypedDict):
    removed: list[str]


#: The end of a change that adds entries, in one round trip: ADD_ENTRIES, then LOG_CHANGE
#: unless an entry was refused (``problem``; the caller then rolls the whole change back).
ADD_AND_LOG_CHANGE: Final[LiteralString] = (
    _AT_VERSION
    + ADD_ENTRIES
    + _UNLESS_REFUSED
    + _LOG
    + "}\nOPTIONAL MATCH (c:Change {id: $id})\nRETURN problem, coalesce(c.removedIds, []) AS removed\n"
)


class AddedAndLoggedRow(TypedDict):
    """ADD_AND_LOG_CHANGE: ``problem`` is a code of REFUSALS, or None once all were added."""

    problem: str | None
    removed: list[str]


#: A whole change that only adds entries, as one statement (an auto-commit transaction, one
#: round trip): the exclusive lock first (C1), then ADD_ENTRIES under it (C7), then — unless an
#: entry was refused — the new version and the log row (C2) with the labels. When ``problem``
#: is set, nothing was written (the version stays). A person's change (``$personId`` in
#: ``$org``, else both null) needs that person to use the Bot, read under the lock (D9.1): no
#: record otherwise, as without the Bot.
ADD_ONLY_CHANGE: Final[LiteralString] = (
    """
MATCH (held:Memory {id: $botId})
CALL apoc.lock.nodes([held])
WITH held
MATCH (m:Memory) WHERE elementId(m) = elementId(held)
WITH m, m.version + 1 AS version
CALL (m) {
  OPTIONAL MATCH (p:Person {id: $personId})-[:MEMBER_OF]->(o:Organization {id: $org})
  OPTIONAL MATCH (b:Bot {id: $botId})
  RETURN $personId IS NULL OR (p IS NOT NULL AND b IS NOT NULL AND """
    + USES_BOT
    + """) AS allowed
}
WITH m, version WHERE allowed
"""
    + ADD_ENTRIES
    + _UNLESS_REFUSED
    + "  SET m.version = version\n"
    + _LOG
    + "}\nRETURN version, problem\n"
)


class AddOnlyRow(TypedDict):
    """ADD_ONLY_CHANGE (see AddedAndLoggedRow)."""

    version: int
    problem: str | None


def _log_params(
    id: str, bot_id: str, at: int, actor: str, entry_ids: list[str], payload: str | None
) -> dict[str, Any]:
    """The parameters of _LOG (and of new entries' ``$now``)."""
    return {
        "id": id,
        "botId": bot_id,
        "at": at,
        "now": at,
        "actor": actor,
        "payload": payload,
        "entryIds": entry_ids,
        "ids": entry_ids,
        "gone": [],
    }


async def log_change(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    bot_id: str,
    version: int,
    at: int,
    actor: str,
    entry_ids: list[str],
    payload: str | None,
    adds: list[dict[str, Any]] | None = None,
    relabel: list[str] | None = None,
    gone: list[GoneLabel] | None = None,
) -> tuple[str | None, list[str]]:
    """The log row of a change (C2) and the labels it affects (DESIGN §8), in one statement —
    with ``adds``, the change's last new entries are added first (ADD_ENTRIES) in the same
    statement. ``relabel``: the entries whose labels the change affects when they are not the
    logged ones (a purge), ``gone``: the entries it deleted, from :func:`graph.purge.purge`.
    Returns the code of a refused new entry (nothing written) or None, and the ids of what the
    change hid from someone (D9.24)."""
    params = _log_params(id, bot_id, at, actor, entry_ids, payload) | {"version": version}
    if relabel is not None:
        params["ids"] = relabel
    if gone:
        params["gone"] = gone
    if not adds:
        record = await single(tx, LOG_CHANGE, LoggedRow, **params)
        return None, [] if record is None else record["removed"]
    record = await single(tx, ADD_AND_LOG_CHANGE, AddedAndLoggedRow, adds=adds, **params)
    return (None, []) if record is None else (record["problem"], record["removed"])


async def add_only_change(
    driver: AsyncDriver,
    *,
    id: str,
    bot_id: str,
    at: int,
    actor: str,
    entry_ids: list[str],
    payload: str,
    adds: list[dict[str, Any]],
    person: tuple[str, str] | None = None,
) -> tuple[int, str | None] | None:
    """ADD_ONLY_CHANGE as an auto-commit transaction: (new version, None) once applied,
    (version, code of the first refused entry) when nothing was written, None without the Bot
    or, for a ``person`` (id, organization), when they do not use it."""
    person_id, org = person or (None, None)
    params = _log_params(id, bot_id, at, actor, entry_ids, payload) | {
        "adds": adds,
        "personId": person_id,
        "org": org,
    }
    record = await autocommit(
        driver, lambda session: single(session, ADD_ONLY_CHANGE, AddOnlyRow, **params), writes=True
    )
    return None if record is None else (record["version"], record["problem"])
