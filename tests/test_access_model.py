"""Stateful property test: the service's visibility equals the seed-derived reference model.

A Hypothesis ``RuleBasedStateMachine`` provisions a small fresh world per example (≤2
organizations, ≤4 people, ≤2 channels, ≤2 Bots), then runs random steps against the real
service — GraphQL provisioning and chats, the memory Bot's ``apply_changes`` (facts,
observations, invalidation, share, set_topics, rename_topic), legacy imports, REST Remember/Forget/purge, GraphQL
shareEntry and deleteChatHistory, channel membership, grants and links — and the same steps
against :mod:`tests.reference_model` (stdlib only, written from the seed and DESIGN §3, §4, §9).

After every step, every person's listing of every Bot (service layer ``list_entries``) must
equal the model's: ids in memory order, layer, status, tags and sources. Refusals must be
predicted (with an acceptable error code) and leave everything unchanged. At the end of each
example the REST and GraphQL listings of every person are compared as well, the REST
listing walked in pages of 2 (``?limit=2&after=``), the REST listing filtered by each topic and
some OpenBot tags of the Bot's entries (``?tags=``), and
``contextPack``'s preferences (the ``:Preference`` label, D9.17) in each private Chat and each
group chat, built for the Chat's audience (every current member and the group itself, D9.15,
D9.22; the model's ``chat_sees``).

``tests/test_search_access.py`` runs a subclass that plants words in the entries (``content``)
and checks ``search`` against the same model.

The regression tests at the end pin down disagreements this machine found (a pinned entry
listed with a null source; a share check that ignored pinned sources and the depth bound).

Hypothesis machines are synchronous: the machine runs in a worker thread and submits every
coroutine to the session event loop (where the ``api``/``runtime`` fixtures live).

Scale with ``BOTMEMORY_HYPOTHESIS_EXAMPLES`` (default 15) and ``BOTMEMORY_HYPOTHESIS_STEPS``
(default 25); e.g. 200 × 40 takes about 7 minutes and finds rarer interleavings (share, then a
membership change; for:bot across linked organizations). Run with ``-s`` for step statistics.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from services import conversation
from services.changes import (
    AddFact,
    AddObservation,
    Invalidate,
    ItemRef,
    MemoryChange,
    RenameTopic,
    SetTopics,
    Share,
)
from services.domain import Principal
from services.errors import Conflict, ServiceError
from services.maintenance import LegacyEntry, import_legacy
from services.memory import Entry, list_entries
from services.runtime import Runtime
from services.writepath import apply_changes
from tests.client import Api, GraphQLErrors, make_world
from tests.memory_helpers import command, said
from tests.reference_model import Model, Refused, View

EXAMPLES = int(os.environ.get("BOTMEMORY_HYPOTHESIS_EXAMPLES", "15"))
STEPS = int(os.environ.get("BOTMEMORY_HYPOTHESIS_STEPS", "25"))
#: ``BOTMEMORY_HYPOTHESIS_SHRINK=0`` reports the first failing example unshrunk (fast triage).
SHRINK = os.environ.get("BOTMEMORY_HYPOTHESIS_SHRINK", "1") != "0"
MAX_ENTRIES = 12
#: The topics the machine gives, sets and renames (``preferences`` is contextPack's, D9.17).
TOPICS = ("travel", "preferences", "work")
MAX_CHATS = 6
UNKNOWN_ENTRY = "mem_" + "0" * 32

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound="AccessMachine")

idx = st.integers(min_value=0, max_value=31)


def pick(values: list[T], i: int) -> T:
    return values[i % len(values)]


def pick_recent(values: list[T], i: int) -> T:
    """Like :func:`pick`, counting from the newest (shrinks towards the newest)."""
    return values[-1 - i % len(values)]


@dataclass
class Bridge:
    """Runs coroutines of the session event loop from the machine's worker thread."""

    api: Api
    runtime: Runtime
    loop: asyncio.AbstractEventLoop
    stats: dict[str, int] = field(default_factory=dict[str, int])
    seconds: dict[str, float] = field(default_factory=dict[str, float])

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def count(self, key: str, seconds: float = 0.0) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds


def step(fn: Callable[Concatenate[M, P], None]) -> Callable[Concatenate[M, P], None]:
    """Mark the machine dirty while a step runs, so teardown skips its HTTP check after a failure."""

    @functools.wraps(fn)
    def wrapper(self: M, *args: P.args, **kwargs: P.kwargs) -> None:
        self.clean = False
        started = time.monotonic()
        fn(self, *args, **kwargs)
        self.bridge.count("steps")
        self.bridge.count(fn.__name__, time.monotonic() - started)
        self.clean = True

    return wrapper


def service_view(entry: Entry) -> View:
    sources: set[tuple[str, ...]] = set()
    for s in entry.sources:
        if "entry" in s:
            sources.add(("entry", s["entry"]))
        else:
            sources.add(("item", s["chat"], s["item"]))
    return View(entry.id, entry.layer, entry.status, frozenset(entry.tags), frozenset(sources))


def json_view(entry: dict[str, Any]) -> View:
    sources: set[tuple[str, ...]] = set()
    for s in entry["sources"]:
        if s.get("entry"):
            sources.add(("entry", s["entry"]))
        else:
            sources.add(("item", s["chat"], s["item"]))
    return View(entry["id"], entry["layer"], entry["status"], frozenset(entry["tags"]), frozenset(sources))


async def _code_of(coro: Coroutine[Any, Any, Any]) -> tuple[Any, str | None]:
    """Run a service call; its result, or the stable error code it raised."""
    try:
        return await coro, None
    except ServiceError as exc:
        return None, exc.code
    except GraphQLErrors as exc:
        return None, exc.codes[0] if exc.codes else "UNKNOWN"


MEMORY_QUERY = (
    "query($b: ID!) { memory(botId: $b) { entries { id layer status tags sources { chat item entry } } } }"
)
SHARE_MUTATION = (
    "mutation($b: ID!, $id: ID!, $a: [String!]!) { shareEntry(botId: $b, id: $id, audience: $a) { version } }"
)


class AccessMachine(RuleBasedStateMachine):
    bridge: ClassVar[Bridge]

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        #: Entries loaded by import-legacy (an old private pinned one has keywords, no vector yet).
        self.imported: set[str] = set()
        self.ready = False
        self.clean = True
        self.orgs: list[str] = []
        self.people: list[str] = []
        self.tokens: dict[str, str] = {}
        self.channels: list[str] = []
        self.bots: list[str] = []
        self.chats: list[str] = []
        self.items: list[tuple[str, str]] = []  # (chat, item) of every person message
        self.entry_ids: list[str] = [UNKNOWN_ENTRY]  # every id ever used, purged ones included
        self.entry_bot: dict[str, str] = {}
        self.created = 0
        self.names: dict[str, str] = {}
        self.counters: dict[str, int] = {}
        self.contents: dict[str, str] = {}  # the content of every entry ever created

    # Helpers -----------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.bridge.run(coro)

    def label(self, real: str, prefix: str) -> None:
        """A short name (p0, chat1, e3, …) for notes and failure messages."""
        n = self.counters.get(prefix, 0)
        self.counters[prefix] = n + 1
        self.names[real] = f"{prefix}{n}"

    def describe(self, text: str) -> str:
        for real, short in sorted(self.names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(real, short)
        return text

    def say(self, text: str) -> None:
        note(self.describe(text))

    def expect(self, op: str, what: str, predicted: Refused | None, code: str | None) -> None:
        """The service refused exactly when the model did, with an acceptable code."""
        self.bridge.count(f"{op}: " + (f"refused, {predicted.reason}" if predicted else "accepted"))
        if predicted is None:
            assert code is None, self.describe(f"{what}: the model accepts it, the service answered {code}")
        else:
            assert code is not None, self.describe(
                f"{what}: the model refuses it ({predicted.reason}), the service accepted it"
            )
            assert code in predicted.codes, self.describe(
                f"{what}: refused with {code}, expected one of {sorted(predicted.codes)} ({predicted.reason})"
            )

    def principal(self, person: str) -> Principal:
        return Principal("person", token_id=None, person_id=person, organization_id=self.model.people[person])

    def headers(self, person: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[person]}"}

    # Argument choice. The model's state only steers choices towards interesting cases (an
    # entry that exists, a person behind it); every outcome is still checked against the service.

    def pick_entry(self, i: int) -> str:
        """Mostly a present entry (newest first); one in eight any id ever used (purged, unknown)."""
        present = [e for e in self.entry_ids if e in self.model.entries]
        if i % 8 == 7 or not present:
            return pick_recent(self.entry_ids, i // 8)
        return pick_recent(present, i)

    def pick_seen_entry(self, i: int) -> str:
        """Mostly an entry that someone sees now (newest first), else :meth:`pick_entry`."""
        m = self.model
        seen = [
            e
            for e in self.entry_ids
            if e in m.entries and any(m.sees(p, m.entries[e].bot, e) for p in self.people)
        ]
        if i % 8 == 7 or not seen:
            return self.pick_entry(i // 8)
        return pick_recent(seen, i)

    def pick_person_for(self, entry_id: str, i: int, *, behind: bool) -> str:
        """Mostly someone who sees the entry (and, with ``behind``, is one of its people)."""
        e = self.model.entries.get(entry_id)
        candidates: list[str] = []
        if e is not None and i % 4 != 3:
            candidates = [p for p in self.people if self.model.sees(p, e.bot, entry_id)]
            if behind:
                candidates = [p for p in candidates if f"from:{p}" in e.tags or e.author == p] or candidates
        return pick(candidates, i) if candidates else pick(self.people, i // 4)

    def audience(self, entry_id: str, picks: list[int]) -> list[str]:
        """for: tags, those near the entry first (its own, its people, its channels), then any."""
        e = self.model.entries.get(entry_id)
        near: list[str] = []
        if e is not None:
            near += [t for t in e.tags if t.startswith("for:")]
            near += [f"for:person:{t[5:]}" for t in e.tags if t.startswith("from:")]
            near += [f"for:channel:{t[8:]}" for t in e.tags if t.startswith("channel:")]
        options = list(
            dict.fromkeys(
                near
                + ["for:bot"]
                + [f"for:person:{p}" for p in self.people]
                + [f"for:channel:{c}" for c in self.channels]
            )
        )
        return list(dict.fromkeys(pick(options, i) for i in picks))

    def content(self, text: str) -> str:
        """The content of a new entry (a subclass may plant words in it)."""
        return text

    def new_entry(self, entry_id: str, bot: str, content: str) -> None:
        self.entry_ids.append(entry_id)
        self.entry_bot[entry_id] = bot
        self.contents[entry_id] = content
        self.label(entry_id, "e")
        self.created += 1

    def bot_of_entry(self, entry_id: str, wrong: int) -> str:
        """The entry's own Bot, or (rarely, when asked) another one."""
        bot = self.entry_bot.get(entry_id, self.bots[0])
        if wrong == 9 and len(self.bots) > 1:
            bot = next(b for b in self.bots if b != bot)
        return bot

    async def _apply(self, bot: str, changes: list[MemoryChange]) -> None:
        await apply_changes(self.bridge.runtime, bot, changes, "memory_bot")

    # The world ----------------------------------------------------------------------------------

    @initialize(data=st.data())
    def world(self, data: st.DataObject) -> None:
        started = time.monotonic()
        api, m = self.bridge.api, self.model
        n_orgs = data.draw(st.integers(1, 2), label="organizations")
        for _ in range(n_orgs):
            org = self.run(api.organization("org"))
            m.add_org(org)
            self.orgs.append(org)
            self.label(org, "org")
        n_people = data.draw(st.integers(2, 4), label="people")
        for n in range(n_people):
            org = self.orgs[0] if n == 0 else data.draw(st.sampled_from(self.orgs), label=f"org of p{n}")
            person, token = self.run(api.person(org, f"p{n}"))
            m.add_person(person, org)
            self.people.append(person)
            self.tokens[person] = token
            self.label(person, "p")
        n_bots = data.draw(st.integers(1, 2), label="bots")
        for n in range(n_bots):
            owner = (
                self.orgs[0] if n == 0 else data.draw(st.sampled_from(self.orgs), label=f"owner of bot{n}")
            )
            bot = self.run(api.bot(owner, f"bot{n}"))
            m.add_bot(bot, owner)
            self.bots.append(bot)
            self.label(bot, "bot")
            for org in self.orgs:
                if org != owner and data.draw(st.booleans(), label=f"link bot{n}"):
                    self.run(self._link(bot, org))
            for person in self.people:
                if not m.bot_in_org(bot, m.people[person]):
                    continue
                access = data.draw(st.sampled_from(["WRITE", "READ", "WRITE", "NONE"]), label="grant")
                if access != "NONE":
                    self.run(api.grant(bot, person, access))
                    m.grant(bot, person, access)
        n_channels = data.draw(st.integers(1, 2), label="channels")
        for n in range(n_channels):
            org = self.orgs[0] if n == 0 else data.draw(st.sampled_from(self.orgs), label=f"org of ch{n}")
            of_org = [p for p in self.people if m.people[p] == org]
            # Draw who is left out (shrinks towards everyone of the organization as a member).
            left_out = (
                data.draw(st.lists(st.sampled_from(of_org), unique=True), label="not members")
                if of_org
                else []
            )
            members = [p for p in of_org if p not in left_out]
            channel = self.run(api.channel(org, members))
            m.add_channel(channel, org, set(members))
            self.channels.append(channel)
            self.label(channel, "ch")
        self.say(
            f"world: people {[(p, m.people[p]) for p in self.people]}, "
            f"bots {[(b, m.bots[b].owner, sorted(m.bots[b].linked), m.bots[b].grants) for b in self.bots]}, "
            f"channels {[(c, m.channels[c].org, sorted(m.channels[c].members)) for c in self.channels]}"
        )
        # A few valid Chats with messages, so that the steps start with evidence to learn from
        # (the steps also try invalid Chats and speakers).
        for _ in range(data.draw(st.integers(1, 3), label="chats")):
            bot = data.draw(st.sampled_from(self.bots), label="chat bot")
            owners = [p for p in self.people if m.uses_bot(p, bot)]
            if not owners:
                continue
            owner = data.draw(st.sampled_from(owners), label="chat owner")
            kind = data.draw(st.sampled_from(["group", "private", "review"]), label="chat kind")
            groups = [c for c in self.channels if owner in m.channels[c].members]
            channel = (
                data.draw(st.sampled_from(groups), label="channel") if kind == "group" and groups else None
            )
            self._create_chat(owner, bot, "private" if kind == "group" and channel is None else kind, channel)
        for chat in list(self.chats):
            speakers = [p for p in self.people if m.is_person_of_chat(p, chat)]
            for _ in range(data.draw(st.integers(1, 2), label="messages")):
                item = self._say(chat, data.draw(st.sampled_from(speakers), label="speaker"))
                if item is not None and data.draw(st.booleans(), label="learn a fact"):
                    self._fact(m.chats[chat].bot, [(chat, item)], None)
        for _ in range(data.draw(st.integers(0, 2), label="observations")):
            present = [e for e in self.entry_ids if e in m.entries]
            if present:
                sources = data.draw(st.lists(st.sampled_from(present), min_size=1, max_size=2, unique=True))
                self._observe(self.entry_bot[sources[0]], sources)
        self.ready = True
        self.bridge.count("world", time.monotonic() - started)

    async def _link(self, bot: str, org: str) -> None:
        await self.bridge.api.admin(
            "mutation($b: ID!, $o: ID!) { linkBot(botId: $b, organizationId: $o) { id } }",
            {"b": bot, "o": org},
        )
        self.model.link(bot, org)

    # Provisioning steps ----------------------------------------------------------------------------

    def _set_members(self, c: str, chosen: list[str]) -> None:
        self.say(f"setChannelMembers {c} {chosen}")
        self.run(
            self.bridge.api.admin(
                "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
                {"c": c, "m": chosen},
            )
        )
        self.model.set_members(c, set(chosen))

    def _grant(self, b: str, p: str, access: str) -> None:
        predicted: Refused | None = None
        try:
            self.model.grant(b, p, access)
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self.bridge.api.grant(b, p, access)))
        self.expect("grant", self.describe(f"grantBot {b} {p} {access}"), predicted, code)
        self.say(f"grantBot {b} {p} {access} -> {code or 'ok'}")

    @rule(
        kind=st.sampled_from(["members", "grant", "link"]),
        a=idx,
        b=idx,
        access=st.sampled_from(["WRITE", "READ", "NONE"]),
        members=st.lists(idx, max_size=4),
    )
    @step
    def admin_change(self, kind: str, a: int, b: int, access: str, members: list[int]) -> None:
        """Channel membership, a grant or a link changes (the operator's side)."""
        if kind == "members":
            c = pick(self.channels, a)
            of_org = [p for p in self.people if self.model.people[p] == self.model.channels[c].org]
            self._set_members(c, sorted({pick(of_org, i) for i in members}) if of_org else [])
        elif kind == "grant":
            self._grant(pick(self.bots, a), pick(self.people, b), access)
        else:
            bot = pick(self.bots, a)
            others = [o for o in self.orgs if o != self.model.bots[bot].owner]
            if others:
                o = pick(others, b)
                self.say(f"linkBot {bot} {o}")
                self.run(self._link(bot, o))

    # Chats ------------------------------------------------------------------------------------------

    def _create_chat(self, p: str, b: str, kind: str, ch: str | None) -> None:
        predicted: Refused | None = None
        try:
            self.model.check_create_chat(b, p, ch)
        except Refused as r:
            predicted = r
        chat, code = self.run(
            _code_of(self.bridge.api.chat(self.tokens[p], b, channel=ch, review=kind == "review"))
        )
        self.expect(
            "create chat", self.describe(f"createChat {kind} by {p} on {b} channel {ch}"), predicted, code
        )
        if chat is not None:
            self.model.create_chat(chat, b, p, ch, kind == "review")
            self.chats.append(chat)
            self.label(chat, "chat")
            self.say(f"createChat {chat} ({kind}) by {p} on {b} channel {ch}")

    @precondition(lambda self: len(self.chats) < MAX_CHATS)
    @rule(owner=idx, bot=idx, kind=st.sampled_from(["group", "private", "review"]), channel=idx)
    @step
    def create_chat(self, owner: int, bot: int, kind: str, channel: int) -> None:
        p, b = pick(self.people, owner), pick(self.bots, bot)
        self._create_chat(p, b, kind, pick(self.channels, channel) if kind == "group" else None)

    def _say(self, chat: str, actor: str) -> str | None:
        predicted: Refused | None = None
        expected_item = None
        try:
            expected_item = self.model.check_say(chat, actor)
        except Refused as r:
            predicted = r
        got, code = self.run(_code_of(said(self.bridge.api, self.tokens[actor], chat, "a message")))
        self.expect("say", self.describe(f"{actor} says in {chat}"), predicted, code)
        if got is None:
            return None
        assert got == (chat, expected_item), (got, expected_item)
        item = self.model.say(chat, actor)
        self.items.append((chat, item))
        self.say(f"{actor} says {item} in {chat}")
        return item

    def _fact(self, bot: str, refs: list[tuple[str, str]], topic: str | None) -> None:
        """A fact from ``refs``, with ``topic`` if any."""
        topics = () if topic is None else (topic,)
        change = AddFact(
            content=self.content("a fact"), sources=tuple(ItemRef(c, i) for c, i in refs), topics=topics
        )
        predicted: Refused | None = None
        try:
            self.model.add_fact(bot, change.id, refs, topics)
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self._apply(bot, [change])))
        self.expect("fact", self.describe(f"add_fact {change.id} on {bot} from {refs}"), predicted, code)
        if code is None:
            self.new_entry(change.id, bot, change.content)
            self.say(f"add_fact {change.id} on {bot} from {refs} -> {self.model.entries[change.id].tags}")

    @precondition(lambda self: self.chats)
    @rule(chat=idx, actor=idx, learn=st.booleans(), topic=st.sampled_from((None, "preferences")))
    @step
    def say_something(self, chat: int, actor: int, learn: bool, topic: str | None) -> None:
        """A person's message in a Chat; the memory Bot may learn a fact from it at once (in a
        group chat, one for the group: what its contextPack may hold, D9.22)."""
        c = pick(self.chats, chat)
        # Mostly one of the Chat's people (few are, in a group chat), sometimes anyone (refused).
        its = [p for p in self.people if self.model.is_person_of_chat(p, c)]
        item = self._say(c, pick(its, actor) if its and actor % 4 != 3 else pick(self.people, actor // 4))
        if learn and item is not None and self.created < MAX_ENTRIES:
            self._fact(self.model.chats[c].bot, [(c, item)], topic)

    @precondition(
        lambda self: self.created < MAX_ENTRIES and any(self.model.chats[c].channel for c, _ in self.items)
    )
    @rule(item=idx)
    @step
    def learn_group_preference(self, item: int) -> None:
        """A preference learned from a message of a group chat: for the group (D9.22), so its
        contextPack holds it while every member and the group may see it."""
        ref = pick_recent([(c, i) for c, i in self.items if self.model.chats[c].channel], item)
        self._fact(self.model.chats[ref[0]].bot, [ref], "preferences")

    @precondition(lambda self: self.items and self.created < MAX_ENTRIES)
    @rule(
        bot=idx,
        sources=st.lists(idx, min_size=1, max_size=2),
        topic=st.sampled_from((None, "travel", "preferences")),
    )
    @step
    def learn_fact(self, bot: int, sources: list[int], topic: str | None) -> None:
        """A fact from one or two Items, possibly of different Chats (or, rarely, of another Bot)."""
        refs = list(dict.fromkeys(pick_recent(self.items, i) for i in sources))
        b = self.model.chats[refs[0][0]].bot if bot % 8 else pick(self.bots, bot // 8)
        self._fact(b, refs, topic)

    @precondition(lambda self: self.chats)
    @rule(chat=idx, person=idx)
    @step
    def delete_chat_history(self, chat: int, person: int) -> None:
        c = pick(self.chats, chat)
        p = self.model.chats[c].owner if person % 4 else pick(self.people, person // 4)
        predicted: Refused | None = None
        expected = None
        try:
            expected = self.model.delete_chat_history(c, p)
        except Refused as r:
            predicted = r
        got, code = self.run(
            _code_of(
                self.bridge.api.gql(
                    "mutation($c: ID!) { deleteChatHistory(chatId: $c) { items } }", {"c": c}, self.tokens[p]
                )
            )
        )
        self.expect("delete history", self.describe(f"deleteChatHistory {c} by {p}"), predicted, code)
        if got is not None:
            assert got["deleteChatHistory"]["items"] == expected
            self.say(f"deleteChatHistory {c} by {p}")

    # The memory Bot's changes -------------------------------------------------------------------

    def _observe(self, bot: str, ids: list[str]) -> None:
        change = AddObservation(
            content=self.content("an observation"), source_entry_ids=tuple(ids), confidence=0.5
        )
        predicted: Refused | None = None
        try:
            self.model.add_observation(bot, change.id, ids)
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self._apply(bot, [change])))
        self.expect(
            "observation", self.describe(f"add_observation {change.id} on {bot} from {ids}"), predicted, code
        )
        if code is None:
            self.new_entry(change.id, bot, change.content)
            self.say(
                f"add_observation {change.id} on {bot} from {ids} -> {self.model.entries[change.id].tags}"
            )

    @precondition(lambda self: len(self.entry_ids) > 1 and self.created < MAX_ENTRIES)
    @rule(sources=st.lists(idx, min_size=1, max_size=3), wrong=st.integers(0, 9))
    @step
    def observe(self, sources: list[int], wrong: int) -> None:
        """An observation over one to three entries (any status, possibly purged or of another Bot)."""
        ids = list(dict.fromkeys(self.pick_entry(i) for i in sources))
        self._observe(self.bot_of_entry(ids[0], wrong), ids)

    @precondition(lambda self: len(self.entry_ids) > 1 and self.created < MAX_ENTRIES)
    @rule(also=st.lists(idx, max_size=1))
    @step
    def deepen(self, also: list[int]) -> None:
        """An observation over the newest entry (plus maybe one more): builds source chains (D9.2)."""
        newest = self.entry_ids[-1]
        ids = list(dict.fromkeys([newest, *(self.pick_entry(i) for i in also)]))
        self._observe(self.bot_of_entry(newest, 0), ids)

    @precondition(lambda self: len(self.entry_ids) > 1 and self.created < MAX_ENTRIES)
    @rule(levels=st.integers(2, 9), batch=st.booleans())
    @step
    def chain(self, levels: int, batch: bool) -> None:
        """A chain of observations over the newest entry, one above the other (D9.2: 8 hops).

        ``batch``: all in one ``apply_changes`` call (each cites the one added just before it in the
        same step; all or nothing), else one call each.
        """
        levels = max(1, min(levels, MAX_ENTRIES + 2 - self.created))
        base = self.entry_ids[-1]
        bot = self.bot_of_entry(base, 0)
        if not batch:
            for _ in range(levels):
                before = self.created
                self._observe(bot, [self.entry_ids[-1]])
                if self.created == before:
                    return
            return
        changes: list[AddObservation] = []
        below = base
        for n in range(levels):
            changes.append(
                AddObservation(content=self.content(f"level {n}"), source_entry_ids=(below,), confidence=0.5)
            )
            below = changes[-1].id
        predicted: Refused | None = None
        try:
            self.model.add_observation(bot, changes[0].id, [base])
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self._apply(bot, list[MemoryChange](changes))))
        self.expect(
            "observation chain", self.describe(f"{levels} observations above {base} at once"), predicted, code
        )
        if code is None:
            self.new_entry(changes[0].id, bot, changes[0].content)
            for prev, change in itertools.pairwise(changes):
                self.model.add_observation(bot, change.id, [prev.id])
                self.new_entry(change.id, bot, change.content)
            self.say(f"{levels} observations above {base} at once: {[c.id for c in changes]}")

    @rule(entry=idx, wrong=st.integers(0, 9))
    @step
    def invalidate(self, entry: int, wrong: int) -> None:
        e = self.pick_entry(entry)
        bot = self.bot_of_entry(e, wrong)
        predicted: Refused | None = None
        try:
            self.model.invalidate(bot, e)
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self._apply(bot, [Invalidate(e)])))
        self.expect("invalidate", self.describe(f"invalidate {e} on {bot}"), predicted, code)
        self.say(f"invalidate {e} on {bot} -> {code or 'ok'}")

    @rule(entry=idx, audience=st.lists(idx, min_size=1, max_size=2), wrong=st.integers(0, 9))
    @step
    def share_by_memory_bot(self, entry: int, audience: list[int], wrong: int) -> None:
        e = self.pick_entry(entry)
        bot = self.bot_of_entry(e, wrong)
        aud = self.audience(e, audience)
        _, code = self.run(_code_of(self._apply(bot, [Share(e, tuple(aud))])))
        self._shared(
            "share (memory Bot)", f"memory Bot shares {e} on {bot} with {aud}", bot, e, aud, None, code
        )

    def _shared(
        self, op: str, what: str, bot: str, e: str, aud: list[str], by: str | None, code: str | None
    ) -> None:
        """Check a share's outcome (V6, D9.3) and apply it to the model."""
        m = self.model
        predicted: Refused | None = None
        try:
            m.check_share(bot, e, aud, by)
        except Refused as r:
            predicted = r
        self.expect(op, self.describe(what), predicted, code)
        if code is None:
            m.replace_audience(e, aud)
        self.say(f"{what} -> {code or 'ok'}")

    @rule(
        entry=idx, topics=st.lists(st.sampled_from(TOPICS), max_size=2, unique=True), wrong=st.integers(0, 9)
    )
    @step
    def set_topics(self, entry: int, topics: list[str], wrong: int) -> None:
        """The memory Bot's ``set_topics``: never who sees the entry, always what ``?tags=`` finds."""
        e = self.pick_entry(entry)
        bot = self.bot_of_entry(e, wrong)
        predicted: Refused | None = None
        try:
            self.model.set_topics(bot, e, tuple(topics))
        except Refused as r:
            predicted = r
        _, code = self.run(_code_of(self._apply(bot, [SetTopics(e, tuple(topics))])))
        self.expect("set topics", self.describe(f"set_topics {e} on {bot} to {topics}"), predicted, code)
        self.say(f"set_topics {e} on {bot} to {topics} -> {code or 'ok'}")

    @rule(bot=idx, org=idx, old=st.sampled_from(TOPICS), new=st.sampled_from(TOPICS))
    @step
    def rename_topic(self, bot: int, org: int, old: str, new: str) -> None:
        """The memory Bot's ``rename_topic`` in a step of ``org``'s learning: over every entry of
        the Bot with the topic valid for learning in that organization, no other (L4)."""
        b, o = pick(self.bots, bot), pick(self.orgs, org)
        self.model.rename_topic(b, o, old, new)
        _, code = self.run(_code_of(self._apply(b, [RenameTopic(old, new, o)])))
        said = f"rename_topic {old} -> {new} on {b} in {o}"
        self.expect("rename topic", self.describe(said), None, code)
        self.say(said)

    @precondition(lambda self: self.created < MAX_ENTRIES)
    @rule(bot=idx, tags=st.sampled_from(["person", "bot", "channel"]), person=idx, pinned=st.booleans())
    @step
    def import_legacy_entry(self, bot: int, tags: str, person: int, pinned: bool) -> None:
        """Old memory: hidden (V9), but an old private pinned entry made with Remember ("person",
        pinned) keeps its own rule (seed 000)."""
        b, p = pick(self.bots, bot), pick(self.people, person)
        org = self.model.people[p]
        chosen = {
            "person": [f"for:person:{p}", f"from:{p}", f"org:{org}"],
            "bot": ["for:bot", f"org:{org}"],
            "channel": [f"for:channel:{self.channels[0]}", f"channel:{self.channels[0]}", f"org:{org}"],
        }[tags]
        layer = "pinned" if pinned else "fact"
        legacy = LegacyEntry(content=self.content("old memory"), tags=tuple(chosen), layer=layer)
        self.run(import_legacy(self.bridge.runtime, b, [legacy]))
        self.imported.add(legacy.id)
        self.model.import_legacy(b, legacy.id, chosen, layer)
        self.new_entry(legacy.id, b, legacy.content)
        self.say(f"import legacy {layer} {legacy.id} on {b} with {chosen}")

    # A person's commands -----------------------------------------------------------------------------

    @precondition(lambda self: self.created < MAX_ENTRIES)
    @rule(person=idx, bot=idx, topic=st.booleans())
    @step
    def remember(self, person: int, bot: int, topic: bool) -> None:
        b = pick(self.bots, bot)
        users = [x for x in self.people if self.model.uses_bot(x, b)]
        p = pick(users, person) if users and person % 4 != 3 else pick(self.people, person // 4)
        topics = ["preferences"] if topic else []
        content = self.content("remember me")
        predicted: Refused | None = None
        try:
            self.model.check_remember(p, b)
        except Refused as r:
            predicted = r
        response = self.run(
            command(
                self.bridge.api,
                self.tokens[p],
                b,
                {"_tag": "Remember", "content": content, "tags": topics},
            )
        )
        code = None if response.status_code == 201 else response.json()["error"]["code"]
        self.expect("remember", self.describe(f"{p} remembers on {b}"), predicted, code)
        if code is None:
            entry_id = response.json()["entry"]["id"]
            self.model.remember(p, b, entry_id, tuple(topics))
            self.new_entry(entry_id, b, content)
            self.say(f"{p} remembers {entry_id} on {b}")

    @rule(person=idx, entry=idx, wrong=st.integers(0, 9), not_alone=st.booleans())
    @step
    def forget(self, person: int, entry: int, wrong: int, not_alone: bool) -> None:
        """Forget (V11, D9.4); ``not_alone`` prefers a reader who is not the only person behind it."""
        e = self.pick_seen_entry(entry)
        p = self.pick_person_for(e, person, behind=False)
        x = self.model.entries.get(e)
        if not_alone and x is not None:
            behind = {t[5:] for t in x.tags if t.startswith("from:")} | (
                {x.author} if x.author else set[str]()
            )
            others = [q for q in self.people if self.model.sees(q, x.bot, e) and behind != {q}]
            p = pick(others, person) if others else p
        bot = self.bot_of_entry(e, wrong)
        predicted: Refused | None = None
        outcome = "refused"
        try:
            outcome = self.model.forget(p, bot, e)
        except Refused as r:
            predicted = r
        response = self.run(command(self.bridge.api, self.tokens[p], bot, {"_tag": "Forget", "id": e}))
        code = None if response.status_code == 200 else response.json()["error"]["code"]
        self.expect("forget", self.describe(f"{p} forgets {e} on {bot}"), predicted, code)
        self.say(f"{p} forgets {e} on {bot} -> {outcome}")
        if code is None:
            self.bridge.count(f"forget: {outcome}")

    @rule(person=idx, entry=idx, audience=st.lists(idx, min_size=1, max_size=2), wrong=st.integers(0, 9))
    @step
    def share_by_person(self, person: int, entry: int, audience: list[int], wrong: int) -> None:
        e = self.pick_seen_entry(entry)
        p = self.pick_person_for(e, person, behind=True)
        bot = self.bot_of_entry(e, wrong)
        aud = self.audience(e, audience)
        _, code = self.run(
            _code_of(self.bridge.api.gql(SHARE_MUTATION, {"b": bot, "id": e, "a": aud}, self.tokens[p]))
        )
        self._shared("share (person)", f"{p} shares {e} on {bot} with {aud}", bot, e, aud, p, code)

    @rule(person=idx, bot=idx, tag=idx)
    @step
    def purge(self, person: int, bot: int, tag: int) -> None:
        b = pick(self.bots, bot)
        m = self.model
        writers = [
            x for x in self.people if m.people[x] == m.bots[b].owner and m.bots[b].grants.get(x) == "WRITE"
        ]
        p = pick(writers, person) if writers and person % 4 != 3 else pick(self.people, person // 4)
        present = sorted(
            {
                t
                for e in self.model.entries.values()
                if e.bot == b
                for t in e.tags
                if t.startswith(("from:", "chat:", "org:", "channel:"))
            }
        )
        known = (
            [f"chat:{c}" for c in self.chats]
            + [f"from:{x}" for x in self.people]
            + [f"org:{o}" for o in self.orgs]
        )
        t = pick(present or known, tag) if tag % 4 else pick(known, tag // 4)
        predicted: Refused | None = None
        expected = None
        try:
            expected = self.model.purge(p, b, t)
        except Refused as r:
            predicted = r
        response = self.run(
            self.bridge.api.http.post(f"/v1/bots/{b}/memory/purge", json={"tag": t}, headers=self.headers(p))
        )
        code = None if response.status_code == 200 else response.json()["error"]["code"]
        self.expect("purge", self.describe(f"{p} purges {t} on {b}"), predicted, code)
        if code is None:
            assert response.json() == {"removed": expected}, self.describe(
                f"purge {t}: {response.json()} != {expected}"
            )
        self.say(f"{p} purges {t} on {b} -> {code or expected}")

    # Checks --------------------------------------------------------------------------------------------

    async def _service_listings(self) -> list[tuple[str, str, list[View] | None]]:
        async def one(person: str, bot: str) -> tuple[str, str, list[View] | None]:
            found, code = await _code_of(list_entries(self.bridge.runtime, self.principal(person), bot, []))
            if code is not None:
                assert code in ("FORBIDDEN", "NOT_FOUND"), code
                return person, bot, None
            return person, bot, [service_view(e) for e in found[0]]

        return list(await asyncio.gather(*(one(p, b) for p in self.people for b in self.bots)))

    def compare(
        self, where: str, person: str, bot: str, got: list[View] | None, tag: str | None = None
    ) -> None:
        """``got`` against the model's listing (only its entries with ``tag``, when given)."""
        expected = self.model.listing(person, bot)
        if expected is not None and tag is not None:
            expected = [v for v in expected if tag in v.tags]
        if expected is None or got is None:
            assert expected == got, self.describe(
                f"{where}: {person} on {bot}: readable by the model {expected is not None}, by the service {got is not None}"
            )
            return
        exp_ids, got_ids = [v.id for v in expected], [v.id for v in got]
        if set(exp_ids) != set(got_ids):
            raise AssertionError(
                self.describe(
                    f"{where}: {person} on {bot} sees {got_ids}; the model says {exp_ids} "
                    f"(missing {sorted(set(exp_ids) - set(got_ids))}, extra {sorted(set(got_ids) - set(exp_ids))})"
                )
            )
        for e, g in zip(expected, got, strict=True):
            if e.id == g.id:
                assert e == g, self.describe(
                    f"{where}: {person} on {bot}: entry differs\nmodel   {e}\nservice {g}"
                )
        assert exp_ids == got_ids, self.describe(
            f"{where}: {person} on {bot}: memory order {got_ids} != {exp_ids}"
        )

    @invariant()
    def listings_match_the_model(self) -> None:
        if not self.ready:
            return
        self.clean = False
        started = time.monotonic()
        for person, bot, got in self.run(self._service_listings()):
            self.compare("list_entries", person, bot, got)
        self.bridge.count("invariant", time.monotonic() - started)
        if any(self.model.hops_below(e) > 8 for e in self.model.entries.values()):
            self.bridge.count("states with a chain deeper than 8 hops")
        self.clean = True

    async def _http_listings(self) -> list[tuple[str, str, str, list[View] | None]]:
        api = self.bridge.api

        async def rest(person: str, bot: str) -> tuple[str, str, str, list[View] | None]:
            response = await api.http.get(f"/v1/bots/{bot}/memory", headers=self.headers(person))
            if response.status_code in (403, 404):
                return "REST", person, bot, None
            assert response.status_code == 200, response.text
            return "REST", person, bot, [json_view(e) for e in response.json()["entries"]]

        async def gql(person: str, bot: str) -> tuple[str, str, str, list[View] | None]:
            body = await api.raw(MEMORY_QUERY, {"b": bot}, self.tokens[person])
            if body.get("errors"):
                codes = [e.get("extensions", {}).get("code") for e in body["errors"]]
                assert set(codes) <= {"FORBIDDEN", "NOT_FOUND"}, codes
                return "GraphQL", person, bot, None
            return "GraphQL", person, bot, [json_view(e) for e in body["data"]["memory"]["entries"]]

        async def pages(person: str, bot: str) -> tuple[str, str, str, list[View] | None]:
            """The same listing walked in pages of 2 (``?limit=2&after=``)."""
            views: list[View] = []
            params = {"limit": "2"}
            while True:
                response = await api.http.get(
                    f"/v1/bots/{bot}/memory", params=params, headers=self.headers(person)
                )
                if response.status_code in (403, 404):
                    return "REST pages", person, bot, None
                assert response.status_code == 200, response.text
                body = response.json()
                views += [json_view(e) for e in body["entries"]]
                if body["next"] is None:
                    return "REST pages", person, bot, views
                params = {"limit": "2", "after": body["next"]}

        calls = [f(p, b) for p in self.people for b in self.bots for f in (rest, gql, pages)]
        return list(await asyncio.gather(*calls))

    def filter_tags(self, bot: str) -> list[str]:
        """Every topic and a few OpenBot tags (``for:``, ``from:``, ``chat:``…) the Bot's entries
        carry, whoever sees them."""
        tags = sorted({t for e in self.model.entries.values() if e.bot == bot for t in e.tags})
        system = [t for t in tags if ":" in t]
        return [t for t in tags if ":" not in t] + system[:: max(1, len(system) // 3)][:4]

    async def _tagged_listings(self) -> list[tuple[str, str, str, list[View] | None]]:
        """GET memory?tags=<tag>, per person, Bot and tag."""
        api = self.bridge.api

        async def rest(person: str, bot: str, tag: str) -> tuple[str, str, str, list[View] | None]:
            response = await api.http.get(
                f"/v1/bots/{bot}/memory", params={"tags": tag}, headers=self.headers(person)
            )
            if response.status_code in (403, 404):
                return tag, person, bot, None
            assert response.status_code == 200, response.text
            return tag, person, bot, [json_view(e) for e in response.json()["entries"]]

        calls = [rest(p, b, t) for p in self.people for b in self.bots for t in self.filter_tags(b)]
        return list(await asyncio.gather(*calls))

    async def _packs(self) -> list[tuple[str, str, list[str]]]:
        """contextPack's preferences (``:Preference``, D9.17) in each private Chat whose owner uses
        the Bot and each group chat (for its audience: every current member and the group, D9.15,
        D9.22), as one of its people reads them: (chat, caller, ids)."""
        api, m = self.bridge.api, self.model

        async def one(chat: str, caller: str) -> tuple[str, str, list[str]]:
            response = await api.http.get(f"/v1/chats/{chat}/context", headers=self.headers(caller))
            assert response.status_code == 200, response.text
            return chat, caller, [p["id"] for p in response.json()["preferences"]]

        callers: list[tuple[str, str]] = []
        for c in self.chats:
            chat = m.chats[c]
            if chat.review:
                continue
            if chat.channel is None:
                if m.uses_bot(chat.owner, chat.bot):
                    callers.append((c, chat.owner))
                continue
            people = sorted(p for p in self.people if m.is_person_of_chat(p, c))
            if people:
                callers.append((c, people[0]))
        return list(await asyncio.gather(*(one(c, p) for c, p in callers)))

    def check_http(self) -> None:
        for where, person, bot, got in self.run(self._http_listings()):
            self.compare(where, person, bot, got)
        for tag, person, bot, got in self.run(self._tagged_listings()):
            self.compare(f"REST ?tags={tag}", person, bot, got, tag)
        for chat, caller, got in self.run(self._packs()):
            want = self.model.pack_preferences(chat)
            assert got == want[: conversation.MAX_PREFERENCES], self.describe(
                f"contextPack of {chat} called by {caller}: preferences {got}, the model says {want}"
            )
            kind = "group " if self.model.chats[chat].channel else ""
            self.bridge.count(f"{kind}contextPack {'with' if want else 'without'} preferences")

    def teardown(self) -> None:
        if self.ready and self.clean:
            self.check_http()
            self.bridge.count("examples")


@pytest.mark.timeout(max(600, EXAMPLES * STEPS * 2))
async def test_visibility_matches_the_reference_model(api: Api, runtime: Runtime) -> None:
    bridge = Bridge(api, runtime, asyncio.get_running_loop())
    AccessMachine.bridge = bridge
    await run_machine(AccessMachine, EXAMPLES, "access model")


def machine_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        phases=tuple(Phase) if SHRINK else tuple(p for p in Phase if p is not Phase.shrink),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


async def run_machine(machine: type[AccessMachine], examples: int, title: str) -> None:
    """Run the machine (its ``bridge`` set) in a worker thread; print step statistics (``-s``)."""
    started = time.monotonic()
    await asyncio.to_thread(run_state_machine_as_test, machine, settings=machine_settings(examples))
    print(f"\n{title}: {time.monotonic() - started:.1f}s")
    for key, n in sorted(machine.bridge.stats.items()):
        print(f"  {key:28} {n:5}  {machine.bridge.seconds.get(key, 0.0):7.2f}s")


async def test_pinned_entry_lists_no_sources(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "Call me Annie", "tags": []}
    )
    assert response.status_code == 201
    listed = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert [e["sources"] for e in listed.json()["entries"]] == [[]]


async def test_share_observation_over_pinned_within_its_author(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "I'm vegan", "tags": []}
    )
    pinned = response.json()["entry"]["id"]
    above = AddObservation(content="cook vegan food for Ann", source_entry_ids=(pinned,), confidence=0.9)
    await apply_changes(runtime, w.bot, [above], "memory_bot")
    # The pinned source's rule is its author (V9), so Ann's own audience passes every source rule (V6).
    shared = await apply_changes(
        runtime, w.bot, [Share(above.id, (f"for:person:{w.people['ann']}",))], "memory_bot"
    )
    assert shared.entry_ids == (above.id,)
    records, _, _ = await runtime.driver.execute_query(
        "MATCH (e:Entry {id: $id}) RETURN e.tags AS tags", id=above.id
    )
    assert f"for:person:{w.people['ann']}" in records[0]["tags"]
    # And Ann still sees it: the share widened nothing past its pinned source.
    listed = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert above.id in [e["id"] for e in listed.json()["entries"]]


async def test_share_observation_past_its_pinned_source_is_refused(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann", "bob"), channel=("ann", "bob"))
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "I'm vegan", "tags": []}
    )
    pinned = response.json()["entry"]["id"]
    group = await api.chat(w.tokens["ann"], w.bot, channel=w.channel)
    _, item = await said(api, w.tokens["bob"], group, "team dinner on Friday")
    dinner = AddFact(content="team dinner on Friday", sources=(ItemRef(group, item),))
    above = AddObservation(content="book a vegan place", source_entry_ids=(pinned, dinner.id), confidence=0.9)
    await apply_changes(runtime, w.bot, [dinner, above], "memory_bot")
    # Bob is not admitted by Ann's pinned entry: the channel is wider than that source's rule (V6).
    with pytest.raises(Conflict):
        await apply_changes(runtime, w.bot, [Share(above.id, (f"for:channel:{w.channel}",))], "memory_bot")


async def test_a_remembered_entry_is_never_shared_past_its_author(api: Api, runtime: Runtime) -> None:
    """A pinned entry keeps its own rule, its author (seed 000, V6): the model may not move it to a
    channel of which its author is, for now, the only member — Bob, joining later, would see it."""
    w = await make_world(api, ("ann", "bob"))
    alone = await api.channel(w.org, [w.people["ann"]])
    response = await command(
        api, w.tokens["ann"], w.bot, {"_tag": "Remember", "content": "my salary is 90k", "tags": []}
    )
    pinned = response.json()["entry"]["id"]
    with pytest.raises(Conflict):
        await apply_changes(runtime, w.bot, [Share(pinned, (f"for:channel:{alone}",))], "memory_bot")
    own = await apply_changes(
        runtime, w.bot, [Share(pinned, (f"for:person:{w.people['ann']}",))], "memory_bot"
    )
    assert own.entry_ids == (pinned,)
    await api.admin(
        "mutation($c: ID!, $m: [ID!]!) { setChannelMembers(channelId: $c, memberIds: $m) { id } }",
        {"c": alone, "m": [w.people["ann"], w.people["bob"]]},
    )
    listed = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['bob']}"}
    )
    assert listed.status_code == 200 and pinned not in [e["id"] for e in listed.json()["entries"]]


async def test_share_of_an_entry_deeper_than_the_bound_fails_closed(api: Api, runtime: Runtime) -> None:
    w = await make_world(api, ("ann",))
    chat = await api.chat(w.tokens["ann"], w.bot)
    _, item = await said(api, w.tokens["ann"], chat, "I like tea")
    base = AddFact(content="likes tea", sources=(ItemRef(chat, item),))
    chain: list[MemoryChange] = [base]
    below = base.id
    for n in range(8):  # the top observation is 9 hops above the Item by its longest path
        above = AddObservation(content=f"level {n + 1}", source_entry_ids=(below, base.id), confidence=0.5)
        chain.append(above)
        below = above.id
    await apply_changes(runtime, w.bot, chain, "memory_bot")
    listed = await api.http.get(
        f"/v1/bots/{w.bot}/memory", headers={"Authorization": f"Bearer {w.tokens['ann']}"}
    )
    assert below not in {e["id"] for e in listed.json()["entries"]}  # hidden: the chain is too deep
    with pytest.raises(Conflict):
        await apply_changes(runtime, w.bot, [Share(below, (f"for:person:{w.people['ann']}",))], "memory_bot")
