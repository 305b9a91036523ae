"""Chats, Turns and Items.

Item numbers (``i-N``) and Turn numbers are allocated by incrementing counters on the
Chat node, which also serialises concurrent writers of one Chat. Item text arrives
already encrypted: callers encrypt between :func:`allocate_items` and :func:`create_items`,
inside the same transaction.
"""

from __future__ import annotations

from typing import Any, Final, LiteralString, NotRequired, TypedDict

from neo4j import AsyncManagedTransaction

from graph.driver import Ciphertext, QueryTarget, rows, single

CREATE_CHAT: Final[LiteralString] = """
MATCH (b:Bot {id: $botId}), (p:Person {id: $ownerId})-[:MEMBER_OF]->(o:Organization {id: $organizationId})
OPTIONAL MATCH (c:Channel {id: $channelId})-[:IN]->(o)
CREATE (ch:Chat {id: $id, botId: b.id, organizationId: o.id, ownerId: p.id, channelId: c.id,
                 review: $review, createdAt: $now, nextItemSeq: 0, nextTurnSeq: 0})
CREATE (ch)-[:WITH_BOT]->(b), (ch)-[:OWNED_BY]->(p), (ch)-[:IN_ORG]->(o)
FOREACH (_ IN CASE WHEN c IS NULL THEN [] ELSE [1] END | CREATE (ch)-[:IN_CHANNEL]->(c))
RETURN ch {.*} AS chat
"""


class ChatNode(TypedDict):
    """A Chat's properties (``ch {.*}``): a private chat has no ``channelId``."""

    id: str
    botId: str
    organizationId: str
    ownerId: str
    channelId: NotRequired[str]
    review: bool
    createdAt: int
    nextItemSeq: int
    nextTurnSeq: int
    #: How many times its history was deleted (absent: never): work that began before a deletion
    #: and writes after it finds it moved and keeps none of the words (D9.23).
    historyEpoch: NotRequired[int]
    #: Its meta's version (D9.30): moved by every set of the meta, compression and history
    #: deletion, never back (absent: the summary's own version, or 0; before session 42).
    metaVersion: NotRequired[int]


class ChatRow(TypedDict):
    chat: ChatNode


#: A Chat with its Bot's wrapped key and whether $personId is one of its people (D9.6): the
#: owner of a private chat; the current members of a group chat's channel (its owner too, only
#: while a member: removal from a channel hides the channel's chats at once).
CHAT_FOR: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})-[:WITH_BOT]->(b:Bot)
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
RETURN ch {.*} AS chat, b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped,
       ($personId IS NOT NULL AND CASE WHEN c IS NULL THEN ch.ownerId = $personId
         ELSE EXISTS { MATCH (:Person {id: $personId})-[:MEMBER]->(c) } END) AS isPerson
"""


class ChatKeyRow(TypedDict):
    """A Chat with its Bot's wrapped key: what decrypting the Chat's texts needs."""

    chat: ChatNode
    keyMaster: str
    keyWrapped: bytes


class ChatForRow(ChatKeyRow):
    """CHAT_FOR, CHATS_FOR."""

    isPerson: bool


#: For each id of $chatIds that names a Chat (unknown ids give no row): CHAT_FOR's columns, so
#: the Chat, its Bot's wrapped key and whether $personId is one of its people (D9.6). Hops: the
#: Chat's Bot and channel only.
CHATS_FOR: Final[LiteralString] = """
UNWIND $chatIds AS chatId
MATCH (ch:Chat {id: chatId})-[:WITH_BOT]->(b:Bot)
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
RETURN ch {.*} AS chat, b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped,
       ($personId IS NOT NULL AND CASE WHEN c IS NULL THEN ch.ownerId = $personId
         ELSE EXISTS { MATCH (:Person {id: $personId})-[:MEMBER]->(c) } END) AS isPerson
"""

#: CHATS_FOR's Chats with the Items ``i`` each may show (read only where $personId is one of the
#: Chat's people, D9.6: any other Chat gets none), up to the ordering and paging that follow.
#: ``i.seq IS NOT NULL`` (every Item has one) lets the planner seek ``item_chat_seq`` (chatId,
#: seq): a composite index serves only a predicate on each of its properties, and without one on
#: ``seq`` every Item of the database was scanned for each Chat.
_ITEMS_OF_CHATS: Final[LiteralString] = """
UNWIND $chatIds AS chatId
MATCH (ch:Chat {id: chatId})-[:WITH_BOT]->(b:Bot)
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
WITH ch, b, ($personId IS NOT NULL AND CASE WHEN c IS NULL THEN ch.ownerId = $personId
         ELSE EXISTS { MATCH (:Person {id: $personId})-[:MEMBER]->(c) } END) AS isPerson
CALL (ch, isPerson) {
  MATCH (i:Item {chatId: ch.id})
  WHERE isPerson AND i.seq IS NOT NULL"""

_ITEMS_AND_CHAT: Final[LiteralString] = """
  RETURN collect(i {.*}) AS items
}
RETURN ch {.*} AS chat, b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped, isPerson, items
"""

#: CHATS_FOR plus one page of each Chat's Items in ``seq`` order (the $limit after the first $skip,
#: the same for every Chat). Its number of Items is the Chat's ``nextItemSeq``: Items are numbered
#: 1, 2, … with no gap (a number is taken in the transaction that creates its Item, and Items are
#: never removed), so the page starts at the seek ``seq > $skip`` (SKIP read the $skip entries
#: before it: a page deep in a long chat cost its depth). Hops: as CHATS_FOR.
CHAT_PAGES: Final[LiteralString] = (
    _ITEMS_OF_CHATS + " AND i.seq > $skip\n  WITH i ORDER BY i.chatId, i.seq LIMIT $limit" + _ITEMS_AND_CHAT
)

#: CHAT_PAGES with each Chat's last $last Items (in ``seq`` order) instead of a page from the
#: start: ``item_chat_seq`` read backwards from the Chat's newest Item. Both order by ``chatId``
#: too: only then does the planner take the index's order (by ``seq`` alone it read every Item of
#: the Chat and kept the best: a context pack's last 10 messages cost the whole history).
CHAT_TAILS: Final[LiteralString] = (
    _ITEMS_OF_CHATS
    + "\n  WITH i ORDER BY i.chatId DESC, i.seq DESC LIMIT $last\n  WITH i ORDER BY i.seq"
    + _ITEMS_AND_CHAT
)


class ItemNode(TypedDict):
    """An Item's properties (``i {.*}``): text is ciphertext, gone once the Chat's history was
    deleted (V13); ``app`` only on App results, ``speakerId`` only where a person spoke."""

    uid: str
    id: str
    chatId: str
    turnId: str
    seq: int
    kind: str
    text: NotRequired[Ciphertext]
    textLength: int
    app: NotRequired[str]
    speakerId: NotRequired[str]
    createdAt: int
    #: Not on Items saved before Items were dated (their ``createdAt`` stands for it).
    saidAt: NotRequired[int]
    #: The IANA time zone it was said in (D9.32); none: UTC.
    timeZone: NotRequired[str]


class ChatPageRow(ChatForRow):
    items: list[ItemNode]


class TurnNode(TypedDict):
    """A Turn's properties (``t {.*}``): ``actorId`` unless the actor is anonymous,
    ``completedAt`` once completed, ``historyEpoch``: the Chat's when the Turn began (Turns made
    before it was kept have none)."""

    id: str
    chatId: str
    seq: int
    status: str
    actorKind: str
    actorId: NotRequired[str]
    createdAt: int
    lastActivityAt: int
    completedAt: NotRequired[int]
    historyEpoch: NotRequired[int]
    #: The time zone its start was given (D9.32): its actor's later messages are said there too.
    timeZone: NotRequired[str]


class TurnRow(TypedDict):
    turn: TurnNode


class CreatedTurnRow(TurnRow):
    """CREATE_TURN: the Turn, the characters its Chat's summary would hold now, and the time zone
    its input was said in (None: UTC)."""

    unsummarized: int
    inputZone: str | None


class TurnForRow(ChatForRow):
    turn: TurnNode


#: The row of a Turn ``t`` of the Chat ``ch`` of the Bot ``b`` (TurnForRow).
_TURN_ROW: Final[LiteralString] = """
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
RETURN t {.*} AS turn, ch {.*} AS chat, b.keyMaster AS keyMaster, b.keyWrapped AS keyWrapped,
       ($personId IS NOT NULL AND CASE WHEN c IS NULL THEN ch.ownerId = $personId
         ELSE EXISTS { MATCH (:Person {id: $personId})-[:MEMBER]->(c) } END) AS isPerson
"""

TURN_FOR: Final[LiteralString] = (
    "MATCH (t:Turn {id: $turnId})-[:IN_CHAT]->(ch:Chat)-[:WITH_BOT]->(b:Bot)" + _TURN_ROW
)

#: TURN_FOR with the Turn locked first (as QUEUE_TURN locks it when the Turn completes), then read
#: again: its status is the one after any completion that committed meanwhile (read unlocked, an
#: addItems racing a completeTurn read "open" and appended to the completed Turn).
TURN_FOR_UPDATE: Final[LiteralString] = (
    """
MATCH (held:Turn {id: $turnId})
CALL apoc.lock.nodes([held])
WITH held
MATCH (t:Turn)-[:IN_CHAT]->(ch:Chat)-[:WITH_BOT]->(b:Bot) WHERE elementId(t) = elementId(held)"""
    + _TURN_ROW
)

#: The Chat's latest open Turn of a person (``$personId``'s own when given): the one a reply
#: answers when it names none (seed 004's save-a-message, D9.33).
LATEST_OPEN_TURN: Final[LiteralString] = """
MATCH (t:Turn {chatId: $chatId})
WHERE t.seq IS NOT NULL AND t.status = 'open' AND t.actorKind = 'person'
  AND ($personId IS NULL OR t.actorId = $personId)
RETURN t {.*} AS turn
ORDER BY t.seq DESC
LIMIT 1
"""

#: The Chat locked until the transaction ends (after its Turn, as addItems locks them): what the
#: transaction reads of it next (its history epoch) is not moved by a deletion meanwhile.
LOCK_CHAT: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})
CALL apoc.lock.nodes([ch])
RETURN ch.id AS id
"""

#: Whether ``$personId`` is a person of the Chat: its owner (a private chat) or a member of its
#: channel, and not removed from their organization.
IS_PERSON_OF_CHAT: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
OPTIONAL MATCH (who:Person {id: $personId})
RETURN who IS NOT NULL AND who.removedAt IS NULL
       AND CASE WHEN c IS NULL THEN ch.ownerId = $personId
           ELSE EXISTS { MATCH (who)-[:MEMBER]->(c) } END AS ok
"""


class OkRow(TypedDict):
    ok: bool


#: Counters are incremented after an explicit exclusive lock: a read-then-write SET would
#: take a shared lock and upgrade, and concurrent writers of one Chat would deadlock.
ALLOCATE_TURN: Final[LiteralString] = """
MATCH (ch:Chat {id: $chatId})
CALL apoc.lock.nodes([ch])
WITH ch
SET ch.nextTurnSeq = ch.nextTurnSeq + 1, ch.nextItemSeq = ch.nextItemSeq + 1
RETURN ch.nextTurnSeq AS turnSeq, ch.nextItemSeq AS itemSeq
"""


class AllocatedTurnRow(TypedDict):
    turnSeq: int
    itemSeq: int


#: ``true`` while the organization ``o`` learns nothing (``botMemory`` off or no model, L5), else
#: null: what an Item or a confession is marked with when saved (``memoryOff``), so that it is
#: never evidence whatever the settings are when a later execution runs.
MEMORY_OFF: Final[LiteralString] = (
    "CASE WHEN coalesce(o.botMemory, false) AND o.botMemoryModel IS NOT NULL THEN null ELSE true END"
)

#: One Item ``item`` of the Turn ``t`` (a row of ``$items``: ``uid, id, seq, kind, text, textLength,
#: app, speakerId, saidAt, timeZone``, the text already encrypted), in the Chat's organization ``o``.
#: ``saidAt``: when it was said, as the platform gave it (history imported), else now; ``timeZone``,
#: of a person's message only: where (D9.32), as the platform gave it for the Item or for its
#: Turn's start, else its speaker's as set now (none: UTC). ``memoryOff``
#: marks an Item said while the organization's memory Bot learns nothing (``botMemory`` off or no
#: model, L5): it is never evidence, whatever the settings are when a later execution runs.
_CREATE_ITEM: Final[LiteralString] = (
    """
OPTIONAL MATCH (speaker:Person {id: item.speakerId}) WHERE item.kind = 'PERSON_MESSAGE'
CREATE (i:Item {uid: item.uid, id: item.id, chatId: t.chatId, turnId: t.id, seq: item.seq, kind: item.kind,
                text: item.text, textLength: item.textLength, app: item.app, speakerId: item.speakerId,
                createdAt: $now, saidAt: coalesce(item.saidAt, $now),
                timeZone: CASE WHEN item.kind = 'PERSON_MESSAGE'
                          THEN coalesce(item.timeZone, t.timeZone, speaker.timeZone) END,
                memoryOff: """
    + MEMORY_OFF
    + """})-[:IN_TURN]->(t)
"""
)

#: What new Items add to their Chat's characters not yet summarized (``unsummarizedChars``) and to
#: those its next summary would take in (``summaryInputChars``, read by
#: ``graph.conversation.UNSUMMARIZED``); the Chat is locked by ALLOCATE_TURN or ALLOCATE_ITEMS
#: earlier in the transaction.
_COUNT_CHARS: Final[LiteralString] = """
SET ch.unsummarizedChars = coalesce(ch.unsummarizedChars, 0) + reduce(n = 0, x IN $items | n + x.textLength),
    ch.summaryInputChars = coalesce(ch.summaryInputChars, 0) + reduce(n = 0, x IN $items | n + x.textLength)
"""

#: A Turn with its first Items (the input), in one statement, and the characters its Chat's
#: summary would hold now (as ``graph.conversation.UNSUMMARIZED``): a new Turn is where a history
#: past the threshold is noticed, its earlier Turns completed or not.
CREATE_TURN: Final[LiteralString] = (
    """
MATCH (ch:Chat {id: $chatId})-[:IN_ORG]->(o:Organization)"""
    + _COUNT_CHARS
    + """CREATE (t:Turn {id: $id, chatId: ch.id, seq: $seq, status: 'open', actorKind: $actorKind,
                actorId: $actorId, createdAt: $now, lastActivityAt: $now, completedAt: null,
                historyEpoch: coalesce(ch.historyEpoch, 0), timeZone: $timeZone})-[:IN_CHAT]->(ch)
WITH t, o, ch
CALL (t, o) {
  UNWIND $items AS item"""
    + _CREATE_ITEM
    + """  RETURN collect(i.timeZone)[0] AS inputZone
}
RETURN t {.*} AS turn, ch.summaryInputChars AS unsummarized, inputZone
"""
)

ALLOCATE_ITEMS: Final[LiteralString] = """
MATCH (heldC:Chat {id: $chatId})
CALL apoc.lock.nodes([heldC])
MATCH (ch:Chat) WHERE elementId(ch) = elementId(heldC)
SET ch.nextItemSeq = ch.nextItemSeq + $count
RETURN ch.nextItemSeq - $count + 1 AS first, coalesce(ch.historyEpoch, 0) AS historyEpoch
"""


class FirstRow(TypedDict):
    """ALLOCATE_ITEMS: the first number, and the Chat's history epoch read under its lock."""

    first: int
    historyEpoch: int


CREATE_ITEMS: Final[LiteralString] = (
    """
MATCH (t:Turn {id: $turnId})-[:IN_CHAT]->(ch:Chat)-[:IN_ORG]->(o:Organization)
SET t.lastActivityAt = $now"""
    + _COUNT_CHARS
    + """WITH t, o
UNWIND $items AS item"""
    + _CREATE_ITEM
    + """RETURN i {.*} AS item ORDER BY i.seq
"""
)


class ItemRow(TypedDict):
    item: ItemNode


COMPLETE_TURN: Final[LiteralString] = """
MATCH (t:Turn {id: $turnId})
SET t.completedAt = coalesce(t.completedAt, $now), t.status = 'completed'
RETURN t {.*} AS turn
"""

#: The Turn's first Item, among the Turn's own (the Chat's Items were read from the first, every
#: one of them for a late Turn).
FIRST_ITEM_OF_TURN: Final[LiteralString] = """
MATCH (:Turn {id: $turnId})<-[:IN_TURN]-(i:Item)
WHERE i.chatId = $chatId
RETURN i {.*} AS item ORDER BY i.seq LIMIT 1
"""


#: The Turn's Items, in the Chat's order.
ITEMS_OF_TURN: Final[LiteralString] = """
MATCH (:Turn {id: $turnId})<-[:IN_TURN]-(i:Item)
WHERE i.chatId = $chatId
RETURN i {.*} AS item ORDER BY i.seq
"""


#: Of each Chat asked for (``$chats``: its id and the tokens of those who follow it), its people
#: now (D9.6: a private chat's owner, a group chat's current channel members) and which of those
#: tokens are still live (not revoked, not expired at ``$now``): who may go on following its Turns
#: (``services.turnfeed``). A Chat that no longer exists has no row.
CHATS_PEOPLE: Final[LiteralString] = """
UNWIND $chats AS want
MATCH (ch:Chat {id: want.chatId})
OPTIONAL MATCH (ch)-[:IN_CHANNEL]->(c:Channel)
OPTIONAL MATCH (p:Person)-[:MEMBER]->(c)
WITH want, ch, c, collect(p.id) AS members
OPTIONAL MATCH (t:Token)
WHERE t.id IN want.tokens AND t.revokedAt IS NULL AND (t.expiresAt IS NULL OR t.expiresAt > $now)
RETURN ch.id AS chatId, CASE WHEN c IS NULL THEN [ch.ownerId] ELSE members END AS people,
       collect(t.id) AS live
"""


class ChatPeopleRow(TypedDict):
    chatId: str
    people: list[str]
    live: list[str]


#: One Item by its uid (``<chatId>/<itemId>``).
ITEM_BY_UID: Final[LiteralString] = "MATCH (i:Item {uid: $uid}) RETURN i {.*} AS item\n"
#: The Items of ``$uids`` there are, in the Chat's order.
ITEMS_BY_UID: Final[LiteralString] = (
    "MATCH (i:Item) WHERE i.uid IN $uids RETURN i {.*} AS item ORDER BY i.seq\n"
)


async def create_chat(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    bot_id: str,
    owner_id: str,
    organization_id: str,
    channel_id: str | None,
    review: bool,
    now: int,
) -> ChatNode | None:
    record = await single(
        tx,
        CREATE_CHAT,
        ChatRow,
        id=id,
        botId=bot_id,
        ownerId=owner_id,
        organizationId=organization_id,
        channelId=channel_id,
        review=review,
        now=now,
    )
    return None if record is None else record["chat"]


async def chat_for(tx: QueryTarget, *, chat_id: str, person_id: str | None) -> ChatForRow | None:
    """The Chat, its Bot key and whether ``person_id`` is one of its people; None if unknown."""
    return await single(tx, CHAT_FOR, ChatForRow, chatId=chat_id, personId=person_id)


async def chats_for(tx: QueryTarget, *, chat_ids: list[str], person_id: str | None) -> dict[str, ChatForRow]:
    """:func:`chat_for` of many Chats in one statement, by Chat id; unknown ids are left out."""
    found = await rows(tx, CHATS_FOR, ChatForRow, chatIds=chat_ids, personId=person_id)
    return {r["chat"]["id"]: r for r in found}


async def chat_pages(
    tx: QueryTarget, *, chat_ids: list[str], person_id: str | None, skip: int, limit: int
) -> dict[str, ChatPageRow]:
    """:func:`chats_for` with one page of Items (``items``) of each Chat ``person_id`` may read."""
    found = await rows(
        tx, CHAT_PAGES, ChatPageRow, chatIds=chat_ids, personId=person_id, skip=skip, limit=limit
    )
    return {r["chat"]["id"]: r for r in found}


async def chat_tail(tx: QueryTarget, *, chat_id: str, person_id: str | None, last: int) -> ChatPageRow | None:
    """:func:`chat_pages` of one Chat with its last ``last`` Items; None if it is unknown."""
    return await single(tx, CHAT_TAILS, ChatPageRow, chatIds=[chat_id], personId=person_id, last=last)


async def turn_for(tx: QueryTarget, *, turn_id: str, person_id: str | None) -> TurnForRow | None:
    return await single(tx, TURN_FOR, TurnForRow, turnId=turn_id, personId=person_id)


async def latest_open_turn(tx: QueryTarget, *, chat_id: str, person_id: str | None) -> TurnNode | None:
    """LATEST_OPEN_TURN; None when there is none."""
    record = await single(tx, LATEST_OPEN_TURN, TurnRow, chatId=chat_id, personId=person_id)
    return None if record is None else record["turn"]


async def lock_chat(tx: AsyncManagedTransaction, *, chat_id: str) -> None:
    """LOCK_CHAT."""
    await (await tx.run(LOCK_CHAT, chatId=chat_id)).consume()


async def turn_for_update(
    tx: AsyncManagedTransaction, *, turn_id: str, person_id: str | None
) -> TurnForRow | None:
    """:func:`turn_for` with the Turn locked until the transaction ends (TURN_FOR_UPDATE)."""
    return await single(tx, TURN_FOR_UPDATE, TurnForRow, turnId=turn_id, personId=person_id)


async def is_person_of_chat(tx: AsyncManagedTransaction, *, chat_id: str, person_id: str) -> bool:
    record = await single(tx, IS_PERSON_OF_CHAT, OkRow, chatId=chat_id, personId=person_id)
    return bool(record and record["ok"])


async def allocate_turn(tx: AsyncManagedTransaction, *, chat_id: str) -> tuple[int, int]:
    """Reserve the next Turn number and the number of its first Item (locks the Chat)."""
    record = await single(tx, ALLOCATE_TURN, AllocatedTurnRow, chatId=chat_id)
    assert record is not None
    return int(record["turnSeq"]), int(record["itemSeq"])


async def create_turn(
    tx: AsyncManagedTransaction,
    *,
    id: str,
    chat_id: str,
    seq: int,
    actor_kind: str,
    actor_id: str | None,
    items: list[dict[str, Any]],
    now: int,
    time_zone: str | None = None,
) -> tuple[TurnNode, int, str | None]:
    """A Turn with its first Items (rows as :func:`create_items` takes them), the characters its
    Chat's summary would hold now, and the time zone its first Item was said in; ``time_zone``:
    the one its start was given (D9.32)."""
    record = await single(
        tx,
        CREATE_TURN,
        CreatedTurnRow,
        id=id,
        chatId=chat_id,
        seq=seq,
        actorKind=actor_kind,
        actorId=actor_id,
        items=items,
        now=now,
        timeZone=time_zone,
    )
    assert record is not None
    return record["turn"], int(record["unsummarized"]), record["inputZone"]


async def allocate_items(tx: AsyncManagedTransaction, *, chat_id: str, count: int) -> tuple[int, int]:
    """The first of ``count`` new Item numbers of the Chat (its lock held to the commit), and its
    history epoch as of that lock."""
    record = await single(tx, ALLOCATE_ITEMS, FirstRow, chatId=chat_id, count=count)
    assert record is not None
    return int(record["first"]), int(record["historyEpoch"])


async def create_items(
    tx: AsyncManagedTransaction, *, turn_id: str, items: list[dict[str, Any]], now: int
) -> list[ItemNode]:
    """Create Items (``uid, id, seq, kind, text, app, speakerId``; text already encrypted)."""
    return [r["item"] for r in await rows(tx, CREATE_ITEMS, ItemRow, turnId=turn_id, items=items, now=now)]


async def complete_turn(tx: AsyncManagedTransaction, *, turn_id: str, now: int) -> TurnNode | None:
    record = await single(tx, COMPLETE_TURN, TurnRow, turnId=turn_id, now=now)
    return None if record is None else record["turn"]


async def first_item_of_turn(tx: AsyncManagedTransaction, *, chat_id: str, turn_id: str) -> ItemNode | None:
    record = await single(tx, FIRST_ITEM_OF_TURN, ItemRow, chatId=chat_id, turnId=turn_id)
    return None if record is None else record["item"]


async def chats_people(
    tx: AsyncManagedTransaction, *, tokens: dict[str, list[str]], now: int
) -> dict[str, ChatPeopleRow]:
    """Of each Chat of ``tokens`` (Chat id -> tokens of its followers), its people now and which of
    its tokens are live, by Chat id, in one statement; a Chat that no longer exists is left out."""
    chats = [{"chatId": chat_id, "tokens": held} for chat_id, held in tokens.items()]
    return {r["chatId"]: r for r in await rows(tx, CHATS_PEOPLE, ChatPeopleRow, chats=chats, now=now)}


async def items_of_turn(tx: QueryTarget, *, chat_id: str, turn_id: str) -> list[ItemNode]:
    return [r["item"] for r in await rows(tx, ITEMS_OF_TURN, ItemRow, chatId=chat_id, turnId=turn_id)]


async def items_by_uid(tx: QueryTarget, *, uids: list[str]) -> list[ItemNode]:
    return [r["item"] for r in await rows(tx, ITEMS_BY_UID, ItemRow, uids=uids)]


async def item_by_uid(tx: AsyncManagedTransaction, *, uid: str) -> ItemNode | None:
    """The Item of ``uid`` (None: gone)."""
    found = await single(tx, ITEM_BY_UID, ItemRow, uid=uid)
    return None if found is None else found["item"]
