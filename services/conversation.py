"""``contextPack`` (DESIGN §6, D9.17): summary, preferences, the last messages and the visible
memory ``context`` of a Chat, built for the Chat's audience — every reader of an answer in it —
never for the caller alone, and never holding a rewritten input. Preferences are memory entries
with the topic ``preferences``."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from neo4j import AsyncManagedTransaction

from graph import chats as chats_q
from graph import conversation as conversation_q
from graph import memory as memory_q
from graph.driver import QueryTarget, autocommit, read, write
from graph.memorybot import RouteChat, RouteRow
from services import chats, memory, retrieval, search
from services.auth import require_person
from services.crypto import Cipher, Kind
from services.domain import Item, ItemKind, Principal
from services.embedding import Embedder
from services.errors import BadInput, Conflict, Forbidden, NotFound
from services.memorybot import Route, reader_of, route_of
from services.runtime import Runtime, now_ms
from services.validation import check_expected, check_page

LAST_MESSAGES = 10
#: Preferences a pack holds at most: the first in memory order (pinned, then the newest) — it is
#: for a prompt, and a Bot may hold thousands of entries with the topic.
MAX_PREFERENCES = 20


@dataclass(frozen=True, slots=True)
class ContextPack:
    chat_id: str
    summary: str | None
    preferences: tuple[memory.Entry, ...]
    last_messages: tuple[Item, ...]
    memory: retrieval.Context
    #: Seed 004's meta (D9.30): the summary, then ``i-N`` → the messages after what it covers, so
    #: no message between the summary and the last ten is missing from the pack.
    meta: dict[str, str]


@dataclass(frozen=True, slots=True)
class History:
    """What the built-in runner shows the Bot of a Chat's history before its last messages: the
    summary (as text) and the meta's messages after it, oldest first, still sealed."""

    summary: str | None
    #: Newest first.
    messages: tuple[conversation_q.RecentItem, ...]
    cipher: Cipher
    #: The characters of text the messages before the window may take (``summary_threshold_chars``).
    room: int

    def before(self, seq: int) -> list[tuple[ItemKind, str]]:
        """The messages numbered below ``seq`` (those the runner's window leaves out) that fit
        ``room`` (the newest always), oldest first, decrypted. Counted from ``seq`` down: counted
        from the newest, the window's own messages took the room, and long ones left none."""
        kept = _newest_within([i for i in self.messages if i["seq"] < seq], self.room)
        return [(ItemKind(i["kind"]), self.cipher.decrypt(Kind.ITEM, i["uid"], i["text"])) for i in kept]


async def context_pack(
    rt: Runtime, principal: Principal, chat_id: str, embedder: Embedder | None = None
) -> ContextPack:
    """Summary, preferences, the last 10 messages and the visible memory ``context`` (D9.17),
    chosen by relevance to the latest person message (design §10)."""
    chat, last = await chats.last_messages(rt, principal, chat_id, LAST_MESSAGES)
    room = rt.settings.summary_threshold_chars
    # As the runner reads it (route_and_history): as many messages, bounded by what the meta may
    # hold before the last ten and the last ten themselves.
    chars = room + LAST_MESSAGES * rt.settings.max_text_chars
    row, route = await _head(
        rt,
        lambda s: conversation_q.pack_head(
            s, chat_id=chat_id, kinds=META_KINDS, limit=RUNNER_META_ITEMS, chars=chars
        ),
    )
    reader = reader_of(row)
    preferences: tuple[memory.Entry, ...] = ()
    known = retrieval.Context("", ())
    # Memory for the Chat's audience; none in review chats or with botMemory off (D9.16, L5).
    if reader is not None and route.bot_memory and not chat.review:
        preferences = tuple(await _preferences(rt, route, reader))
        said = [i for i in last.items if i.kind is ItemKind.PERSON_MESSAGE and i.text]
        # Its "yesterday" is the day before it was said (D9.31: a history imported says when),
        # where it was said (D9.32).
        known = await search.context(
            rt,
            embedder,
            route.bot_id,
            reader,
            rt.settings.answer_context_chars,
            query=said[-1].text if said else None,
            said_at=said[-1].said_at if said else None,
            zone=said[-1].time_zone if said else None,
        )
    # The caller's access is checked again after the reads: the statements above ran after the
    # first check, and what they read (a message, the summary) may have been written after the
    # caller left the Chat; everything read was committed before this check passed.
    await read(rt.driver, lambda tx: chats.readable_chat(tx, principal, chat_id))
    summary = summary_map(route.cipher, chat_id, row["summary"])
    shown = {i.id: i.text for i in last.items if i.text is not None}  # decrypted once, for both
    first_shown = min((i.seq for i in last.items), default=None)
    meta = _meta_map(rt, route.cipher, summary, row["recent"], shown, before=first_shown)
    return ContextPack(chat_id, summary_text(summary), preferences, tuple(last.items), known, meta)


_Row = TypeVar("_Row", bound=RouteRow)


async def _head(rt: Runtime, read_row: Callable[[QueryTarget], Awaitable[_Row | None]]) -> tuple[_Row, Route]:
    """A Chat's head row, read in one auto-commit statement, and its route."""
    row = await autocommit(rt.driver, read_row)
    if row is None:
        raise NotFound("chat not found")
    return row, route_of(rt, row)


async def route_and_history(rt: Runtime, chat_id: str) -> tuple[RouteChat, Route, History]:
    """The Chat's route and its history as the runner shows it (D9.17: whoever reads the Chat's
    messages, or answers in it, may read it), in one auto-commit statement; the summary is
    decrypted after the read, the messages when the runner knows which it needs."""
    room = rt.settings.summary_threshold_chars
    # What the window may hold besides (its messages are not known yet), so that what is read is
    # bounded: a Chat never summarised read 1,000 messages of up to 20,000 characters each.
    window = rt.settings.runner_history_items * rt.settings.max_text_chars
    row, route = await _head(
        rt,
        lambda s: conversation_q.route_and_meta(
            s, chat_id=chat_id, kinds=META_KINDS, limit=RUNNER_META_ITEMS, chars=room + window
        ),
    )
    summary = summary_text(summary_map(route.cipher, chat_id, row["summary"]))
    return row["chat"], route, History(summary, tuple(row["recent"]), route.cipher, room)


def _within(rt: Runtime, recent: list[conversation_q.RecentItem]) -> list[conversation_q.RecentItem]:
    """The meta's messages (``recent``: newest first) that fit ``summary_threshold_chars`` of text
    (the newest always), oldest first."""
    return _newest_within(recent, rt.settings.summary_threshold_chars)


def _newest_within(recent: Sequence[conversation_q.RecentItem], room: int) -> list[conversation_q.RecentItem]:
    """Of ``recent`` (newest first), the newest that fit ``room`` characters of text (the newest
    always), oldest first."""
    kept: list[conversation_q.RecentItem] = []
    for item in recent:
        room -= item["textLength"]
        if kept and room < 0:
            break
        kept.append(item)
    return kept[::-1]


def _meta_map(
    rt: Runtime,
    cipher: Cipher,
    summary: dict[str, str],
    recent: list[conversation_q.RecentItem],
    known: dict[str, str] | None = None,
    *,
    before: int | None = None,
) -> dict[str, str]:
    """Seed 004's meta (D9.30): the summary map, then ``i-N`` → text of its messages after it
    (``known``: texts already decrypted, by Item id, taken as they are). ``before``: the number of
    the first of a pack's last messages — those from it on are all listed, and the room is counted
    from it down (as the runner's ``History.before``): counted from the newest, ten long last
    messages took it, and a Chat of more than 100 short messages, too short to be summarized, lost
    its first ones, against the pack's promise that none between the summary and them is missing."""
    meta = dict(summary)
    if before is None:
        kept = _within(rt, recent)
    else:
        room = rt.settings.summary_threshold_chars
        older = _newest_within([i for i in recent if i["seq"] < before], room)
        kept = older + [i for i in reversed(recent) if i["seq"] >= before]
    for item in kept:
        text = (known or {}).get(item["id"])
        meta[item["id"]] = text if text is not None else cipher.decrypt(Kind.ITEM, item["uid"], item["text"])
    return meta


def summary_map(cipher: Cipher, chat_id: str, saved: conversation_q.SummaryNode | None) -> dict[str, str]:
    """A saved summary as seed 004's map (D9.30): a caller's map as it was set, the worker's text
    as ``{"summary": text}``; empty before the first."""
    if saved is None or "text" not in saved:
        return {}
    plain = cipher.decrypt(Kind.CHAT_SUMMARY, chat_id, saved["text"])
    if saved.get("form") == "map":
        held: dict[str, str] = json.loads(plain)
        return held
    return {"summary": plain}


def summary_text(summary: dict[str, str]) -> str | None:
    """The summary as text (what ``contextPack``, the runner and the next compression read): the
    worker's own text, or a caller's map as ``key: value`` lines; None when there is none."""
    if not summary:
        return None
    if list(summary) == ["summary"]:
        return summary["summary"]
    return "\n".join(f"{key}: {value}" for key, value in summary.items())


# Seed 004's conversation meta (D9.30) ----------------------------------------------------------

#: The Items a Chat's meta lists after its summary: the turns of the conversation.
META_KINDS: Final = [ItemKind.PERSON_MESSAGE.value, ItemKind.BOT_MESSAGE.value]
#: At most this many of them, the latest (within ``summary_threshold_chars`` of text).
META_ITEMS: Final = 100
#: The most messages after the summary the runner reads for its Bot (then as many of the newest as
#: fit ``summary_threshold_chars``, ``_within``): the meta's 100 left a Chat of 130 short messages,
#: too short to be summarized, without its first 30 (between what a summary covers and the
#: runner's window nothing may be lost, D9.17). Past this many, or without a memory-Bot model to
#: summarize the Chat, the oldest are left out.
RUNNER_META_ITEMS: Final = 1_000
#: Keys a caller's map may not use: the ids of Items, which the meta lists after the summary.
_ITEM_KEY: Final = re.compile(r"i-[0-9]+")
_KEY_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class ChatMeta:
    """Seed 004's ConversationMeta of a Chat: its summary (the worker's text under ``summary``, or
    the map its owner set), then ``i-N`` → text of the latest messages after it."""

    chat_id: str
    summary: dict[str, str]
    #: Its version (0 before the first summary): a replacement, the worker's compression or a
    #: history deletion moves it, never back; ``set_chat_meta``'s ``expected``.
    version: int = 0


def _meta_of(rt: Runtime, row: conversation_q.MetaRow) -> ChatMeta:
    chat_id = row["chat"]["id"]
    cipher = chats.chat_cipher(rt, row)
    saved = row["summary"]
    summary_version = 0 if saved is None else saved["version"]
    return ChatMeta(
        chat_id,
        _meta_map(rt, cipher, summary_map(cipher, chat_id, saved), row["recent"]),
        row["chat"].get("metaVersion", summary_version),
    )


async def chat_meta(rt: Runtime, principal: Principal, chat_id: str) -> ChatMeta:
    """The Chat's meta, for its people (D9.6); NOT_FOUND when it has none yet (no summary and no
    message), as for a Chat the caller may not read."""

    async def work(tx: AsyncManagedTransaction) -> list[conversation_q.MetaRow]:
        await chats.readable_chat(tx, principal, chat_id)
        rows = await conversation_q.meta(
            tx,
            chat_ids=[chat_id],
            kinds=META_KINDS,
            limit=META_ITEMS,
            chars=rt.settings.summary_threshold_chars,
        )
        # Checked again once read (as contextPack): the read may hold what was written after the
        # caller left the Chat; everything read was committed before this check passed.
        await chats.readable_chat(tx, principal, chat_id)
        return rows

    rows = await read(rt.driver, work)
    found = _meta_of(rt, rows[0]) if rows else None
    if found is None or not found.summary:
        raise NotFound("this chat has no meta yet; create it with POST")
    return found


async def chat_metas(
    rt: Runtime, principal: Principal, *, limit: int, skip: int
) -> tuple[list[ChatMeta], int]:
    """The meta of the Chats the caller may read that have one, newest Chat first: one page, and
    how many there are. People only: a platform token reads no history (D9.6)."""
    limit, skip = check_page(limit, skip, max_limit=rt.settings.max_page_size)
    if principal.kind == "platform":
        raise Forbidden(chats.PLATFORM_READS)
    person_id = require_person(principal)  # an admin token's message names no platform routes

    async def work(tx: AsyncManagedTransaction) -> tuple[int, list[conversation_q.MetaRow]]:
        total, page = await conversation_q.metas_of(
            tx, person_id=person_id, kinds=META_KINDS, skip=skip, limit=limit
        )
        found = await conversation_q.meta(
            tx, chat_ids=page, kinds=META_KINDS, limit=META_ITEMS, chars=rt.settings.summary_threshold_chars
        )
        # The page's Chats the caller may still read, once read (as chat_meta): one they left
        # meanwhile is left out. (Its own ids: a page read again shifted when a Chat came or went
        # before it, and dropped Chats the caller may read.)
        still = await conversation_q.readable_of(tx, person_id=person_id, chat_ids=page)
        order = {chat_id: n for n, chat_id in enumerate(page) if chat_id in still}
        return total, sorted(
            (r for r in found if r["chat"]["id"] in order), key=lambda r: order[r["chat"]["id"]]
        )

    total, rows = await read(rt.driver, work)
    return [_meta_of(rt, row) for row in rows], total


def _checked_map(summary: dict[str, str], limit: int) -> dict[str, str]:
    if not summary:
        raise BadInput("summary must hold at least one key", field="summary")
    for key, value in summary.items():
        if not key.strip() or len(key) > _KEY_CHARS or "\x00" in key:
            raise BadInput(f"summary keys are 1 to {_KEY_CHARS} characters, without NUL", field="summary")
        if _ITEM_KEY.fullmatch(key):
            raise BadInput(
                f"summary key {key!r} is a message id; the meta lists messages itself", field="summary"
            )
        if "\x00" in value:
            raise BadInput("summary values must not contain NUL", field="summary")
    # Counted as it is kept and read (``summary_text``: ``key: value`` lines), as the summary's
    # characters are counted for compression: a map within the limit is never compressed at once.
    if len(summary_text(summary) or "") > limit:
        raise BadInput(f"summary holds more than {limit} characters (as 'key: value' lines)", field="summary")
    return summary


async def set_chat_meta(
    rt: Runtime,
    principal: Principal,
    chat_id: str,
    summary: dict[str, str],
    *,
    create: bool,
    expected: int | None = None,
) -> ChatMeta:
    """The Chat owner sets its summary as seed 004's map (D9.30): it replaces the rolling summary
    and covers every message so far, so the meta is that map until the next messages. ``create``:
    CONFLICT when the Chat has meta already; else NOT_FOUND when it has none. ``expected``: the
    meta's ``version`` the caller read — CONFLICT when it moved since (another replacement, the
    worker's compression, a history deletion), so that two editors never overwrite each other
    unseen."""
    check_expected(expected)
    checked = _checked_map(summary, rt.settings.summary_threshold_chars)
    plain = json.dumps(checked, ensure_ascii=False)

    async def owned(tx: QueryTarget) -> chats_q.ChatForRow:
        row = await chats.readable_chat(tx, principal, chat_id)
        if row["chat"]["ownerId"] != principal.person_id:
            raise Forbidden("only the chat's owner sets its meta")
        return row

    async def work(tx: AsyncManagedTransaction) -> conversation_q.SetMetaRow | None:
        # The caller's access is checked again in the transaction that writes, under the Chat's
        # lock: a removal committed while the write waited for it refuses the write (read only
        # before, a removed owner's write landed after the removal).
        await chats_q.lock_chat(tx, chat_id=chat_id)
        row = await owned(tx)
        return await conversation_q.set_meta(
            tx,
            chatId=chat_id,
            kinds=META_KINDS,
            create=create,
            expected=expected,
            text=chats.chat_cipher(rt, row).encrypt(Kind.CHAT_SUMMARY, chat_id, plain),
            chars=len(summary_text(checked) or ""),
            now=now_ms(),
        )

    # First without the lock: another's Chat is never locked. Locked first, the refusal waited
    # behind whatever held the Chat (a history deletion, a summary, a Turn), which told a busy
    # Chat from an unknown id, and held the Chat's own writers meanwhile (D9.4).
    await autocommit(rt.driver, owned)
    saved = await write(rt.driver, work)
    if saved is None:  # the Chat was deleted since it was read
        raise NotFound("chat not found")
    if saved["held"] == create:
        if create:
            raise Conflict("this chat has meta already; replace it with PUT")
        raise NotFound("this chat has no meta yet; create it with POST")
    if saved["version"] is None:
        raise Conflict(
            f"the meta changed since you read it (version {saved['current']}, not {expected}); read it again"
        )
    return ChatMeta(chat_id, dict(checked), saved["version"])


async def _preferences(rt: Runtime, route: Route, reader: memory.Reader) -> list[memory.Entry]:
    """The first MAX_PREFERENCES in memory order of the Bot's active preferences every reader of
    the Chat may see, in one auto-commit statement."""
    rows = await autocommit(
        rt.driver,
        lambda s: memory_q.locked_preferences(s, bot_id=route.bot_id, limit=MAX_PREFERENCES, **reader.params),
    )
    return [memory.decrypt_entry(route.cipher, row) for row in rows]
