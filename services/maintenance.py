"""Operator changes outside the write path's checks of callers and the model: loading legacy
entries (V9) and recomputing every label of a Bot. Each is one change of the Bot's memory, with
its own version and log row (actor ``promotion`` or ``system``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from neo4j import AsyncManagedTransaction

from graph import changelog, entries, identity
from graph import memory as memory_q
from graph.driver import read, write
from services.changes import (
    MAX_TOPICS,
    AddFact,
    AddObservation,
    Applied,
    Invalidate,
    ItemRef,
    MemoryChange,
    check_content,
    check_topics,
)
from services.crypto import Cipher, Kind
from services.derived import derive
from services.embedding import Embedder
from services.errors import BadInput, Conflict, NotFound
from services.ids import new_id
from services.memory import cipher_of
from services.runtime import Runtime, now_ms
from services.writepath import ORDER_SLOTS, apply_changes, publish_change

#: The longest tag a legacy line may carry (an id tag of ours is at most ~112 characters).
MAX_LEGACY_TAG_CHARS: Final = 200


def check_legacy_tag(tag: str) -> str:
    """A legacy entry's tag: 1 to ``MAX_LEGACY_TAG_CHARS`` characters, none of them a control
    character (a NUL is stored by nothing)."""
    if not tag.strip() or len(tag) > MAX_LEGACY_TAG_CHARS:
        raise BadInput(f"a tag is 1 to {MAX_LEGACY_TAG_CHARS} characters", field="tags")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in tag):
        raise BadInput("a tag contains a control character", field="tags")
    return tag


#: The layers a legacy entry may be of.
LEGACY_LAYERS: Final = ("fact", "observation", "pinned")


def check_legacy_layer(layer: str) -> str:
    """A legacy entry's layer: one of ``LEGACY_LAYERS``; another is refused, not read as a fact."""
    if layer not in LEGACY_LAYERS:
        raise BadInput(f"layer is {', '.join(LEGACY_LAYERS[:-1])} or {LEGACY_LAYERS[-1]}", field="layer")
    return layer


@dataclass(frozen=True, slots=True)
class LegacyEntry:
    """An entry from an older version without access proof (V9)."""

    content: str
    tags: tuple[str, ...]
    layer: str = "fact"
    id: str = field(default_factory=lambda: new_id("mem"))

    def remembered_by(self) -> tuple[str, str] | None:
        """(person, organization) when this is a private pinned entry made with Remember: a pinned
        entry for one person alone, of one organization, from that person (Remember's own tags,
        ``from:``, ``for:person:`` and ``org:``, each once, and valid topics). Seed 000: it "keeps
        its own access rule"."""
        if self.layer != "pinned":
            return None
        fors = [t for t in self.tags if t.startswith("for:")]
        orgs = [t[4:] for t in self.tags if t.startswith("org:")]
        if len(fors) != 1 or not fors[0].startswith("for:person:") or len(orgs) != 1:
            return None
        person = fors[0][len("for:person:") :]
        others = [t for t in self.tags if ":" in t and not t.startswith(("for:", "org:"))]
        if not person or not orgs[0] or others != ["from:" + person]:
            return None  # Remember writes from: its author, once; without it, someone else wrote it
        try:
            check_topics(tuple(t for t in self.tags if ":" not in t))
        except BadInput:
            return None  # topics Remember could not have given (V8)
        return person, orgs[0]


#: The most entries one import loads: it is one change, written in one transaction, its entries
#: numbered within its version (``ORDER_SLOTS``); the CLI refuses a larger file at the line past it.
MAX_LEGACY_ENTRIES: Final = 10_000
#: The most tags one legacy entry keeps.
MAX_LEGACY_TAGS: Final = 100


async def import_legacy(
    rt: Runtime, bot_id: str, legacy: list[LegacyEntry], embedder: Embedder | None = None
) -> Applied:
    """Load legacy entries: kept hidden, out of learning, never widened (V9); logged as ``promotion``.

    They keep their tags but get no SOURCE edges; a declared source count they cannot meet
    (and the legacy flag) makes the visibility check fail closed for them and anything above.
    A private pinned entry made with Remember (``LegacyEntry.remembered_by``), of a person who is
    still in that organization, keeps its own access rule instead: it is loaded as Remember makes
    one, its author's alone (seed 000, V9).
    """
    if len(legacy) > MAX_LEGACY_ENTRIES:
        raise BadInput(f"at most {MAX_LEGACY_ENTRIES:,} entries in one import", field="entries")
    if any(len(entry.tags) > MAX_LEGACY_TAGS for entry in legacy):
        raise BadInput(f"at most {MAX_LEGACY_TAGS} tags an entry", field="tags")
    cipher = await cipher_of(rt, bot_id)
    change_id, now = new_id("chg"), now_ms()
    for entry in legacy:
        check_content(entry.content)
        check_legacy_layer(entry.layer)
    # The keywords and vectors of those that may keep their rule (``embedder``: the CLI's, as the
    # write path embeds), so they are found by words and by meaning from the commit; hidden ones
    # get theirs from the backfill.
    keywords = await derive(
        cipher,
        embedder,
        {e.id: e.content for e in legacy if e.remembered_by()},
        rt.settings.embedding_timeout_seconds,
    )

    async def work(tx: AsyncManagedTransaction) -> Applied:
        version = await memory_q.bump_version(tx, bot_id=bot_id)
        if version is None:
            raise NotFound("bot not found")
        claims = {entry.id: entry.remembered_by() for entry in legacy}
        members = {
            pair
            for pair in set(claims.values())
            if pair is not None
            and await identity.count_people_in_org(tx, person_ids=[pair[0]], organization_id=pair[1])
        }
        rows = [
            _legacy_row(cipher, entry, version * ORDER_SLOTS + position, claims[entry.id], members)
            | (keywords[entry.id].row if entry.id in keywords and claims[entry.id] in members else {})
            for position, entry in enumerate(legacy, 1)
        ]
        await entries.create_legacy(tx, bot_id=bot_id, rows=rows, now=now)
        ids = [entry.id for entry in legacy]
        payload = cipher.encrypt(Kind.CHANGE, change_id, json.dumps({"kind": "import", "count": len(legacy)}))
        _, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor="promotion",
            entry_ids=ids,
            payload=payload,
        )
        return Applied(version, tuple(ids), now, tuple(removed))

    applied = await write(rt.driver, work)
    # Announced like every change (ids only, E4): each process's view of the memory version moves
    # on, though nobody may see these entries (V9).
    await publish_change(rt, bot_id, applied)
    return applied


def _legacy_row(
    cipher: Cipher,
    entry: LegacyEntry,
    order_key: int,
    claim: tuple[str, str] | None,
    members: set[tuple[str, str]],
) -> dict[str, Any]:
    """CREATE_LEGACY's row of ``entry``: hidden (V9), or remembered by a person still in the
    organization its tags name — then tagged as Remember tags, with its author and no source."""
    row: dict[str, Any] = {
        "id": entry.id,
        "layer": entry.layer,
        "content": cipher.encrypt(Kind.ENTRY, entry.id, entry.content),
        "contentLength": len(entry.content),
        "tags": list(entry.tags),
        "orderKey": order_key,
        "author": None,
        "sourceCount": 1,
        "legacy": True,
    }
    if claim is not None and claim in members:
        person, org = claim
        topics = [t for t in entry.tags if ":" not in t]
        tags = ["from:" + person, "for:person:" + person, "org:" + org, *topics]
        row |= {"tags": list(dict.fromkeys(tags)), "author": person, "sourceCount": 0, "legacy": False}
    return row


@dataclass(frozen=True, slots=True)
class Rebuild:
    """A legacy entry rebuilt from sources whose access can be checked (seed 000, V9): the Items it
    rests on (a fact) or the entries (an observation, with its ``confidence``)."""

    id: str
    sources: tuple[ItemRef, ...] = ()
    source_entry_ids: tuple[str, ...] = ()
    confidence: float | None = None


#: The most legacy entries one rebuild takes (each is two changes of one transaction).
MAX_REBUILDS: Final = 1_000


async def rebuild_legacy(
    rt: Runtime, bot_id: str, rebuilds: list[Rebuild], embedder: Embedder | None = None
) -> tuple[Applied, dict[str, str]]:
    """Rebuild legacy entries from sources whose access can be checked (seed 000: "The entry can
    become visible only after it is rebuilt from sources whose access can be checked"): each
    becomes a new entry with its content and topics, resting on the sources given — a fact on
    Items of this Bot's chats, an observation on active entries with access proof — whose
    ``for:`` and provenance tags come from those sources as the memory Bot's do (never wider than
    they prove, V9), and the legacy entry is invalidated, in one change logged as ``promotion``
    (C2). Every source is checked under the lock as the write path checks the memory Bot's
    (ADD_ENTRIES); anything refused refuses all. Returns the change and each legacy id's new id."""
    if not 1 <= len(rebuilds) <= MAX_REBUILDS:
        raise BadInput(f"rebuild 1 to {MAX_REBUILDS:,} entries at once", field="entries")
    ids = [r.id for r in rebuilds]
    if len(set(ids)) != len(ids):
        raise BadInput("an entry is named twice", field="id")
    for r in rebuilds:
        if bool(r.sources) == bool(r.source_entry_ids):
            raise BadInput(
                "name the Items a fact rests on, or the entries of an observation", field="sources"
            )
    cipher = await cipher_of(rt, bot_id)
    found = await read(rt.driver, lambda tx: entries.legacy_entries(tx, bot_id=bot_id, ids=ids))
    for entry in found:
        _rebuildable(entry)
    changes: list[MemoryChange] = []
    made: dict[str, str] = {}
    for r, entry in zip(rebuilds, found, strict=True):
        assert entry["content"] is not None
        assert entry["tags"] is not None
        content = cipher.decrypt(Kind.ENTRY, r.id, entry["content"])
        topics = _topics_of(entry["tags"])
        new: AddFact | AddObservation
        if r.sources:
            new = AddFact(content=content, sources=r.sources, topics=topics)
        else:
            new = AddObservation(
                content=content,
                source_entry_ids=r.source_entry_ids,
                confidence=1.0 if r.confidence is None else r.confidence,
                topics=topics,
            )
        changes += [new, Invalidate(r.id)]
        made[r.id] = new.id

    async def still_legacy(tx: AsyncManagedTransaction) -> None:
        for r, entry in zip(rebuilds, await entries.legacy_entries(tx, bot_id=bot_id, ids=ids), strict=True):
            _rebuildable(entry)  # under the lock: rebuilt, purged or invalidated meanwhile
            await _no_wider(tx, bot_id, r, entry)

    applied = await apply_changes(rt, bot_id, changes, "promotion", precheck=still_legacy, embedder=embedder)
    return applied, made


async def _no_wider(
    tx: AsyncManagedTransaction, bot_id: str, r: Rebuild, entry: entries.LegacyEntryMap
) -> None:
    """The rebuilt entry gives old memory no wider audience (seed 000): every ``for:`` tag of the
    legacy entry but ``for:bot`` (the Bot's people, whom every audience is within) is among those
    its sources give it (``for:`` tags are all required, so more of them narrow it)."""
    refs = [{"chat": s.chat, "item": s.item} for s in r.sources]
    proved = await entries.source_audience(tx, bot_id=bot_id, refs=refs, entry_ids=list(r.source_entry_ids))
    wider = sorted(
        t for t in entry["tags"] or [] if t.startswith("for:") and t != "for:bot" and t not in proved
    )
    if wider:
        raise Conflict(
            f"the sources of {r.id} do not keep its audience ({', '.join(wider)}): rebuilt on them it "
            "would be shown more widely than it was"
        )


def _topics_of(tags: list[str]) -> tuple[str, ...]:
    """The legacy tags that are topics as the memory Bot's are (V8), the first MAX_TOPICS: an older
    version's others (a colon tag, another form) are not carried over."""
    topics: list[str] = []
    for tag in tags:
        try:
            topics += check_topics((tag,))
        except BadInput:
            continue
    return tuple(dict.fromkeys(topics))[:MAX_TOPICS]


def _rebuildable(entry: entries.LegacyEntryMap) -> None:
    if not entry["found"]:
        raise NotFound(f"no entry {entry['id']} of this Bot")
    if not entry["legacy"] or entry["status"] != "active":
        raise Conflict(f"{entry['id']} is not a legacy entry waiting to be rebuilt")


async def relabel_all(rt: Runtime, bot_id: str) -> int:
    """Recompute every label of a Bot from the path query (after manual surgery on the graph), as
    a change of actor ``system``: its log row names what the new labels hide from someone (D9.24)."""
    change_id, now = new_id("chg"), now_ms()

    async def work(tx: AsyncManagedTransaction) -> tuple[int, Applied]:
        version = await memory_q.bump_version(tx, bot_id=bot_id)
        if version is None:
            raise NotFound("bot not found")
        ids = await entries.all_ids(tx, bot_id=bot_id)
        _, removed = await changelog.log_change(
            tx,
            id=change_id,
            bot_id=bot_id,
            version=version,
            at=now,
            actor="system",
            entry_ids=[],
            payload=None,
            relabel=ids,
        )
        return len(ids), Applied(version, (), now, tuple(removed))

    count, applied = await write(rt.driver, work)
    await publish_change(rt, bot_id, applied)
    return count
