"""The one write path of a Bot's memory: :func:`apply_changes` (C1, C2, C7, E3, V6, V8, V11).

Each call takes the exclusive Memory lock first (by bumping the version), re-checks the latest
state of every source under it, applies all changes or none, and writes the change-log row with
an encrypted payload in the same transaction.

New entries are checked and get their tags in Cypher (``graph.entries.ADD_ENTRIES``), from their
sources as they are under the lock. A change of new entries only (what learning mostly writes)
is therefore one statement in an auto-commit transaction: lock, checks, entries, version, log
row and labels in one round trip. Any other change is an explicit transaction of a few.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import access, changelog, entries
from graph import context as context_q
from graph import memory as memory_q
from graph import purge as purge_q
from graph.driver import read, write
from services import idempotency
from services.changes import (
    MAX_CHANGES,
    Actor,
    AddFact,
    AddObservation,
    Applied,
    Forget,
    Invalidate,
    ItemRef,
    MemoryChange,
    Remember,
    RenameTopic,
    Revise,
    SetTopics,
    Share,
    validate,
)
from services.crypto import Cipher, Kind
from services.derived import Derived, derive
from services.embedding import Embedder
from services.errors import BadInput, Conflict, NotFound
from services.idempotency import Key
from services.ids import new_id
from services.memory import Reader, cipher_of, require_use, user_reader
from services.runtime import Runtime, now_ms
from services.validation import ID_PATTERN

log = logging.getLogger("services.writepath")

ORDER_SLOTS = 1_000_000  # orderKey = version * slots + position within the change


def _new_entry(
    cipher: Cipher,
    change: AddFact | AddObservation | Remember,
    position: int,
    earlier: set[str],
    derived: dict[str, Derived],
) -> dict[str, Any]:
    """A row of ``graph.entries.ADD_ENTRIES``, which checks the sources under the lock (C7) and
    derives the tags of facts and observations from them; ``earlier``: ids of the rows before."""
    row: dict[str, Any] = {
        **derived[change.id].row,
        "id": change.id,
        "content": cipher.encrypt(Kind.ENTRY, change.id, change.content),
        "contentLength": len(change.content),
        "topics": list(change.topics),
        "tags": [],
        "confidence": None,
        "author": None,
        "position": position,
        "items": [],
        "entries": [],
        "earlier": [],
    }
    match change:
        case AddFact():
            refs = dict.fromkeys((r.chat, r.item) for r in change.sources)
            row |= {"layer": "fact", "items": [{"chat": c, "item": i} for c, i in refs]}
        case AddObservation():
            ids = list(dict.fromkeys(change.source_entry_ids))
            row |= {"layer": "observation", "confidence": change.confidence, "entries": ids}
            row["earlier"] = [i for i in ids if i in earlier]
        case Remember():
            row |= {"layer": "pinned", "author": change.person_id}
            row["tags"] = ["from:" + change.person_id, "for:person:" + change.person_id, "org:" + change.org]
    return row


def _refused(problem: str | None) -> None:
    if problem is not None:
        raise Conflict(entries.REFUSALS[problem])


class _Step:
    """One apply_changes transaction: the lock is held; every check reads the latest state (C7)."""

    def __init__(
        self,
        tx: AsyncManagedTransaction,
        bot_id: str,
        version: int,
        cipher: Cipher,
        now: int,
        derived: dict[str, Derived],
    ) -> None:
        self.tx, self.bot_id, self.version, self.cipher, self.now = tx, bot_id, version, cipher, now
        self.derived = derived
        self.touched: list[str] = []
        self.order = 0
        #: New entries not written yet (ADD_ENTRIES rows) and their ids.
        self.pending: list[dict[str, Any]] = []
        self.pending_ids: set[str] = set()

    async def flush(self) -> None:
        """Write buffered new entries (before anything reads entries; the last ones with the log)."""
        if self.pending:
            _refused(
                await entries.add(
                    self.tx, bot_id=self.bot_id, version=self.version, adds=self.pending, now=self.now
                )
            )
            self.pending, self.pending_ids = [], set()

    def next_order_key(self) -> int:
        self.order += 1
        return self.version * ORDER_SLOTS + self.order

    def add(self, change: AddFact | AddObservation | Remember) -> None:
        self.order += 1
        self.pending.append(_new_entry(self.cipher, change, self.order, self.pending_ids, self.derived))
        self.pending_ids.add(change.id)
        self.touched.append(change.id)

    async def entry(self, entry_id: str) -> entries.EditedEntry:
        row = await entries.entry_for_edit(self.tx, bot_id=self.bot_id, id=entry_id)
        if row is None or row["status"] == "retracted":
            raise Conflict("no such entry")
        return row

    async def invalidate(self, c: Invalidate) -> None:
        row = await self.entry(c.entry_id)
        if row["status"] == "active":
            await entries.set_status(
                self.tx, bot_id=self.bot_id, id=c.entry_id, status="invalidated", now=self.now
            )
            self.touched.append(c.entry_id)

    async def set_topics(self, c: SetTopics) -> None:
        row = await self.entry(c.entry_id)
        tags = [t for t in row["tags"] if ":" in t] + list(c.topics)
        await entries.set_tags(self.tx, bot_id=self.bot_id, id=c.entry_id, tags=tags, now=self.now)
        self.touched.append(c.entry_id)

    async def rename_topic(self, c: RenameTopic) -> None:
        self.touched += await entries.rename_topic(
            self.tx, bot_id=self.bot_id, old=c.old, new=c.new, org=c.org, now=self.now
        )

    async def share(self, c: Share) -> None:
        row = await self.entry(c.entry_id)
        refused = await share_refusal(self.tx, self.bot_id, row, c.audience)
        if refused is not None:
            raise refused
        audience = list(dict.fromkeys(c.audience))
        tags = [t for t in row["tags"] if not t.startswith("for:")] + audience
        await entries.set_tags(self.tx, bot_id=self.bot_id, id=c.entry_id, tags=tags, now=self.now)
        self.touched.append(c.entry_id)

    async def revise(self, c: Revise) -> None:
        row = await self.entry(c.entry_id)
        if row["status"] != "active":
            raise Conflict("only active entries are revised")
        content = self.cipher.encrypt(Kind.ENTRY, c.entry_id, c.content)
        await entries.set_content(
            self.tx,
            bot_id=self.bot_id,
            id=c.entry_id,
            content=content,
            content_length=len(c.content),
            order_key=self.next_order_key(),
            now=self.now,
            derived=self.derived[c.entry_id].row,
        )
        self.touched.append(c.entry_id)

    async def forget(self, c: Forget) -> None:
        row = await self.entry(c.entry_id)
        behind = {t[5:] for t in row["tags"] if t.startswith("from:")}
        if row["layer"] == "pinned" and row["author"]:
            behind.add(row["author"])
        if behind == {c.person_id}:
            await entries.set_status(
                self.tx, bot_id=self.bot_id, id=c.entry_id, status="retracted", now=self.now
            )
        else:
            await entries.forget_for(
                self.tx, bot_id=self.bot_id, id=c.entry_id, person_id=c.person_id, now=self.now
            )
        await entries.count_take_back(self.tx, bot_id=self.bot_id)
        self.touched.append(c.entry_id)

    async def apply(self, change: MemoryChange) -> None:
        if isinstance(change, AddFact | AddObservation | Remember):
            self.add(change)
            return
        await self.flush()  # everything else reads and changes existing entries, maybe new ones
        match change:
            case Invalidate():
                await self.invalidate(change)
            case SetTopics():
                await self.set_topics(change)
            case RenameTopic():
                await self.rename_topic(change)
            case Share():
                await self.share(change)
            case Revise():
                await self.revise(change)
            case Forget():
                await self.forget(change)


async def share_refusal(
    tx: AsyncManagedTransaction, bot_id: str, row: entries.EditedEntry, audience: Sequence[str]
) -> BadInput | Conflict | None:
    """Why the entry ``row`` may not be shared with ``audience`` (None: it may): the audience is
    for:person:, for:channel: or for:bot tags; a remembered entry keeps its author alone; the
    audience's people are within every source's access rule (V6, V9). Checked by ``share``
    under the exclusive lock, and by a learning step before it commits (D9.21)."""
    shared = list(dict.fromkeys(audience))
    if not shared or not all(a == "for:bot" or _audience_id(a) is not None for a in shared):
        return BadInput("an audience is for:person:<id>, for:channel:<id> or for:bot", field="audience")
    if row["layer"] == "pinned" and shared != [f"for:person:{row['author']}"]:
        # Its rule is its author, whoever joins a channel or a grant later (seed 000: "keeps
        # its own access rule"); people now within the author would let later ones in.
        return Conflict("a remembered entry keeps its own access rule: its author alone (V6)")
    orgs = [t[4:] for t in row["tags"] if t.startswith("org:")]
    people = await purge_q.audience_people(tx, bot_id=bot_id, for_tags=shared, orgs=orgs)
    users = await purge_q.audience_people(tx, bot_id=bot_id, for_tags=["for:bot"], orgs=orgs)
    if people is not None and not people & (users or set()):
        # An empty or mistyped audience (a channel that does not exist, another organization's,
        # tags nobody meets at once, a person who no longer uses the Bot) is within every rule:
        # accepted, the entry was seen by nobody any more, its sharer included, and nobody was left
        # who could share it back or forget it. Said before the source rules: after them, another
        # organization's channel with members was "not within every source's rule" where an
        # unknown one admitted nobody, which told that it exists (D9.4).
        return Conflict("the new audience admits nobody who uses the Bot")
    basis = await access.share_basis(tx, bot_id=bot_id, id=row["id"])
    if basis is None or not basis["proved"]:
        return Conflict("an entry without provable sources is never widened (V9)")
    rules = sorted(set(basis["rules"]))
    allowed = await purge_q.rule_people(tx, rules=rules) + [{a} for a in set(basis["authors"])]
    if people is None or not allowed or any(not people <= admitted for admitted in allowed):
        return Conflict("the new audience is not within every source's access rule (V6)")
    return None


def _audience_id(tag: str) -> str | None:
    """The id of a ``for:person:`` or ``for:channel:`` tag, when well formed."""
    for prefix in ("for:person:", "for:channel:"):
        if tag.startswith(prefix):
            return tag[len(prefix) :] if ID_PATTERN.fullmatch(tag[len(prefix) :]) else None
    return None


async def first_refused_share(rt: Runtime, bot_id: str, shares: Sequence[Share]) -> int | None:
    """The place in ``shares`` of the first that the memory as it stands refuses
    (:func:`share_refusal`; or whose entry was retracted), read under the shared lock (C1); None
    when none is. A share of an entry not stored yet is the step's to check (a new fact within its
    own Chat's audience, ``learning.protocol.changes_from``); the commit checks every share again
    under the exclusive lock (C7)."""

    async def work(tx: AsyncManagedTransaction) -> int | None:
        await memory_q.shared_lock(tx, bot_id=bot_id)
        for n, c in enumerate(shares):
            row = await entries.entry_for_edit(tx, bot_id=bot_id, id=c.entry_id)
            if row is not None and (
                row["status"] == "retracted" or await share_refusal(tx, bot_id, row, c.audience) is not None
            ):
                return n
        return None

    return await read(rt.driver, work)


def _contents(changes: list[MemoryChange]) -> dict[str, str]:
    """The new texts of a change by entry id: new entries and revised ones."""
    return {
        (c.entry_id if isinstance(c, Revise) else c.id): c.content
        for c in changes
        if isinstance(c, AddFact | AddObservation | Remember | Revise)
    }


def _payload(changes: list[MemoryChange]) -> str:
    """The changes as JSON for the log row: kind and fields of each (what ``asdict`` gives, without
    its deep copies: a third of the time)."""
    plain = [{"kind": type(c).__name__, **{f.name: getattr(c, f.name) for f in fields(c)}} for c in changes]
    return json.dumps(plain, default=_item_ref)


def _item_ref(ref: ItemRef) -> dict[str, str]:
    return {"chat": ref.chat, "item": ref.item}


async def apply_changes(
    rt: Runtime,
    bot_id: str,
    changes: list[MemoryChange],
    actor: Actor,
    *,
    precheck: Any = None,
    person: tuple[str, str] | None = None,
    embedder: Embedder | None = None,
    key: Key | None = None,
    key_names: str | None = None,
) -> Applied:
    """Apply all ``changes`` or none, under the exclusive lock, with one log row (C2).

    ``precheck(tx)`` runs under the lock before anything is written (e.g. a visibility check
    of the entry a person edits, or a learning execution's compare-and-set). ``person`` (id,
    organization): a person's change, which needs them to use the Bot (D9.1) — read before
    anything else, and again under the lock (in the same statement when the change only adds
    entries); NotFound or Forbidden otherwise (``services.memory.require_use``).

    New content is made searchable in the same commit (design §10): its blind keywords, and its
    vector when ``embedder`` is given — embedded here, before the lock is taken.

    ``key``: the caller's idempotency key, claimed under the lock for the entry the change names
    (``key_names``) with the version (:class:`services.idempotency.Replay` when an earlier request
    claimed it).
    """
    if len(changes) > MAX_CHANGES:
        raise BadInput(f"at most {MAX_CHANGES} changes at once", field="changes")
    for change in changes:
        validate(change)
    if person is not None:
        # Before the key, any embedding and the lock: a Bot the person does not use was refused
        # only after them — its data key unwrapped, an embedding spent, its Memory locked
        # exclusively (holding its readers and writers) — so its answer's time told an existing
        # Bot from an unknown one (D9.4). Read again under the lock below: a grant may go.
        await require_use(rt, bot_id, *person)
    cipher = await cipher_of(rt, bot_id)
    change_id = new_id("chg")
    derived = await derive(cipher, embedder, _contents(changes), rt.settings.embedding_timeout_seconds)
    payload = cipher.encrypt(Kind.CHANGE, change_id, _payload(changes))

    async def work(tx: AsyncManagedTransaction) -> Applied:
        version = await memory_q.bump_version(tx, bot_id=bot_id)  # the exclusive lock first (C1)
        if version is None:
            raise NotFound("bot not found")
        # Its time under the lock, as its version: taken before the embedding (up to
        # ``embedding_timeout_seconds``), a change committed after a later one carried the earlier
        # time, and the log's times ran backwards as its versions went up.
        now = now_ms()
        if person is not None:
            await user_reader(tx, bot_id=bot_id, person_id=person[0], org=person[1])
        if key is not None:  # before the precheck: a first request's commit changes what it sees
            assert key_names is not None
            await idempotency.claim(tx, rt, key, resource_id=key_names, version=version)
        if precheck is not None:
            await precheck(tx)
        step = _Step(tx, bot_id, version, cipher, now, derived)
        for change in changes:
            await step.apply(change)
        touched = list(dict.fromkeys(step.touched))
        # The last new entries, the log row and the labels: one round trip.
        problem, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor=actor,
            entry_ids=touched,
            payload=payload,
            adds=step.pending,
        )
        _refused(problem)
        return Applied(version, tuple(touched), now, tuple(removed))

    adds = [c for c in changes if isinstance(c, AddFact | AddObservation | Remember)]
    if precheck is not None or key is not None or len(adds) < len(changes):
        applied = await write(rt.driver, work)
    else:  # only new entries: the whole change is one statement, one round trip
        rows: list[dict[str, Any]] = []
        ids: set[str] = set()
        for position, change in enumerate(adds, 1):
            rows.append(_new_entry(cipher, change, position, ids, derived))
            ids.add(change.id)
        touched = list(dict.fromkeys(c.id for c in adds))
        now = now_ms()  # after the embedding (the statement's wait for the lock still comes after)
        done = await changelog.add_only_change(
            rt.driver,
            id=change_id,
            bot_id=bot_id,
            at=now,
            actor=actor,
            entry_ids=touched,
            payload=payload,
            adds=rows,
            person=person,
        )
        if done is None:
            if person is not None:  # a grant gone since require_use: its error, as under a lock
                await require_use(rt, bot_id, *person)
            raise NotFound("bot not found")
        version, problem = done
        _refused(problem)
        applied = Applied(version, tuple(touched), now)
    await publish_change(rt, bot_id, applied)
    return applied


async def publish_change(rt: Runtime, bot_id: str, applied: Applied) -> None:
    """Tell every API process (Redis pub/sub) which entries changed or were hidden from someone:
    ids only, never content (E4). The change is committed: a lost message (Redis away) is logged,
    not raised, and every API process fills the gap from the change log — at its next event of
    the Bot, when its own Redis connection comes back, or at its next audit of the versions
    (``services.changefeed``, D9.24)."""
    if not applied.entry_ids and not applied.removed:
        return
    message = json.dumps(
        {
            "botId": bot_id,
            "version": applied.version,
            "ids": list(applied.entry_ids),
            "removed": list(applied.removed),
        }
    )
    if rt.quiet.skips("change"):
        return
    try:
        await rt.redis.publish(f"botmemory:changes:{bot_id}", message)
    except Exception as exc:  # the change stands; subscribers get it from the log
        rt.quiet.failed(exc)
        log.warning(
            "change %s of a Bot not announced (%s); subscribers catch up from the log",
            applied.version,
            type(exc).__name__,
        )


async def require_visible(tx: AsyncManagedTransaction, bot_id: str, reader: Reader, entry_id: str) -> None:
    """The entry must be for the caller now (under the lock); else the same 409 for all cases (D9.4)."""
    seen = await context_q.visible_ids(tx, bot_id=bot_id, ids=[entry_id], active_only=False, **reader.params)
    if entry_id not in seen:
        raise Conflict("this entry is not for you")
