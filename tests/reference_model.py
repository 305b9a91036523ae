"""An independent reference model of who sees which Bot-memory entry.

Written from the seed (``seeds/000_e6fcde1d31481dd4.txt``: "Entries and tags", "Who sees an
entry", "Read and change it") and the design (``docs/design.md``) §3, §4 (V1–V13) and §9 (D9.1–D9.4, D9.13) only.
It imports nothing from the project (stdlib only), so a bug in the service's Cypher cannot hide
in the oracle. ``tests/test_access_model.py`` drives the real service and this model with the
same operations and compares what every person sees after every step.

Vocabulary
- Organizations, people (each in exactly one organization), channels (one organization, a
  member set that can change), Bots (owner organization, linked organizations, per-person
  grants READ/WRITE).
- Chats: private (no channel), group (a channel) or review; an owner; the Chat's organization is
  the owner's. A Turn's actor is the person who speaks; each Turn adds one person-message Item.
- Entries: facts (sources = Items), observations (sources = entries), pinned (Remember) and
  legacy imports (no access proof). Status ``active`` / ``invalidated`` / ``retracted``.

Operations raise :class:`Refused` (with the error codes the service may answer) *before*
changing anything, so a refused operation leaves the model as it was.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

ACTIVE = "active"
INVALIDATED = "invalidated"
RETRACTED = "retracted"

#: A source chain deeper than this many SOURCE hops (down to Items) fails closed (D9.2).
MAX_HOPS = 8

#: Tags an observation inherits from each source (V12; D9.1 for ``for:``).
INHERITED = ("for:", "from:", "chat:", "channel:", "org:")
#: Tags a purge accepts (seed: "a from:, chat:, org: or channel: tag").
PURGEABLE = ("from:", "chat:", "org:", "channel:")

CONFLICT = "CONFLICT"
FORBIDDEN = "FORBIDDEN"
NOT_FOUND = "NOT_FOUND"
BAD_INPUT = "BAD_INPUT"
#: "You need read on the Bot": the service may say 403 or hide the Bot (404).
NO_READ = frozenset({FORBIDDEN, NOT_FOUND})


class Refused(Exception):
    """The operation must be refused; ``codes`` are the acceptable error codes."""

    def __init__(self, reason: str, codes: frozenset[str] | set[str] | str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.codes = frozenset({codes}) if isinstance(codes, str) else frozenset(codes)


@dataclass
class Channel:
    id: str
    org: str
    members: set[str] = field(default_factory=set[str])


@dataclass
class Bot:
    id: str
    owner: str
    linked: set[str] = field(default_factory=set[str])
    grants: dict[str, str] = field(default_factory=dict[str, str])  # person -> READ | WRITE


@dataclass
class Item:
    chat: str
    id: str
    actor: str
    has_text: bool = True


@dataclass
class Chat:
    id: str
    bot: str
    owner: str
    org: str
    channel: str | None
    review: bool
    items: dict[str, Item] = field(default_factory=dict[str, Item])


@dataclass
class Entry:
    id: str
    bot: str
    layer: str  # fact | observation | pinned
    tags: list[str]
    seq: int  # creation order (memory order: newest first after the pinned entries)
    status: str = ACTIVE
    item_sources: tuple[tuple[str, str], ...] = ()  # (chat, item) of a fact
    rules: tuple[tuple[str, str], ...] = ()  # (rule, org) saved per source Item at learning time
    entry_sources: tuple[str, ...] = ()  # entry ids of an observation
    excluded: set[str] = field(default_factory=set[str])  # people who forgot it (V11, D9.4)
    author: str | None = None  # pinned: the person who asked to remember
    legacy: bool = False  # imported without access proof (V9)

    def has_for(self) -> bool:
        return any(t.startswith("for:") for t in self.tags)


@dataclass(frozen=True)
class View:
    """What a reader gets for one entry (compared with the service's listing)."""

    id: str
    layer: str
    status: str
    tags: frozenset[str]
    sources: frozenset[tuple[str, ...]]  # ("item", chat, item) | ("entry", id)


def _dedup(tags: list[str]) -> list[str]:
    return list(dict.fromkeys(tags))


class Model:
    def __init__(self) -> None:
        self.orgs: set[str] = set()
        self.people: dict[str, str] = {}  # person -> organization
        self.channels: dict[str, Channel] = {}
        self.bots: dict[str, Bot] = {}
        self.chats: dict[str, Chat] = {}
        self.entries: dict[str, Entry] = {}  # present entries (purge removes them)
        self._seq = 0

    # Provisioning ---------------------------------------------------------------------------

    def add_org(self, org: str) -> None:
        self.orgs.add(org)

    def add_person(self, person: str, org: str) -> None:
        assert org in self.orgs
        self.people[person] = org

    def add_channel(self, channel: str, org: str, members: set[str]) -> None:
        assert all(self.people[m] == org for m in members)
        self.channels[channel] = Channel(channel, org, set(members))

    def set_members(self, channel: str, members: set[str]) -> None:
        c = self.channels[channel]
        assert all(self.people[m] == c.org for m in members)
        c.members = set(members)

    def add_bot(self, bot: str, owner: str) -> None:
        self.bots[bot] = Bot(bot, owner)

    def grant(self, bot: str, person: str, access: str) -> None:
        """Only people of an organization that owns or links the Bot get a grant (or lose one)."""
        b = self.bots[bot]
        if not self.bot_in_org(bot, self.people[person]):
            raise Refused("the person's organization neither owns nor links the Bot", FORBIDDEN)
        if access in ("READ", "WRITE"):
            b.grants[person] = access
        else:
            b.grants.pop(person, None)

    def link(self, bot: str, org: str) -> None:
        b = self.bots[bot]
        if org != b.owner:
            b.linked.add(org)

    # Who is who ------------------------------------------------------------------------------

    def bot_in_org(self, bot: str, org: str) -> bool:
        b = self.bots[bot]
        return org == b.owner or org in b.linked

    def uses_bot(self, person: str, bot: str) -> bool:
        """A READ or WRITE grant, and the Bot is owned by or linked into the person's organization (D9.1)."""
        return person in self.bots[bot].grants and self.bot_in_org(bot, self.people[person])

    def is_person_of_chat(self, person: str, chat: str) -> bool:
        """A private chat's owner; a group chat's current channel members (D9.6), its owner only
        while a member."""
        c = self.chats[chat]
        if c.channel is None:
            return person == c.owner
        return person in self.channels[c.channel].members

    def rule_admits(self, rule: str) -> set[str]:
        """The people an Item's saved rule admits now (V3): ``person:<u>`` or ``channel:<c>`` members."""
        kind, _, ref = rule.partition(":")
        if kind == "person":
            return {ref} if ref in self.people else set()
        if kind == "channel" and ref in self.channels:
            return set(self.channels[ref].members)
        return set()

    # Chats -----------------------------------------------------------------------------------

    def check_create_chat(self, bot: str, owner: str, channel: str | None) -> str:
        """Raises Refused, else returns the Chat's organization (the owner's)."""
        org = self.people[owner]
        if not self.bot_in_org(bot, org):
            raise Refused("the Bot is not in the owner's organization", NOT_FOUND)
        if owner not in self.bots[bot].grants:
            raise Refused("the owner has no grant on the Bot", NO_READ)
        if channel is not None:
            c = self.channels[channel]
            if c.org != org:
                raise Refused("the channel is in another organization", NOT_FOUND)
            if owner not in c.members:
                raise Refused("the owner is not a member of the channel", FORBIDDEN)
        return org

    def create_chat(self, chat: str, bot: str, owner: str, channel: str | None, review: bool) -> None:
        org = self.check_create_chat(bot, owner, channel)
        self.chats[chat] = Chat(chat, bot, owner, org, channel, review)

    def check_say(self, chat: str, actor: str) -> str:
        """A person's message as a Turn of ``actor``; returns the new Item's id (``i-N``)."""
        if not self.is_person_of_chat(actor, chat):
            raise Refused("the actor is not a person of this chat", NO_READ)
        return f"i-{len(self.chats[chat].items) + 1}"

    def say(self, chat: str, actor: str) -> str:
        item = self.check_say(chat, actor)
        self.chats[chat].items[item] = Item(chat, item, actor)
        return item

    def delete_chat_history(self, chat: str, person: str) -> int:
        """Items lose their content, keep ids and rules; memory stays (V13)."""
        c = self.chats[chat]
        if (
            not self.is_person_of_chat(person, chat) and person != c.owner
        ):  # an owner out of the channel still may
            raise Refused("not a person of the chat", NOT_FOUND)
        if person != c.owner:
            raise Refused("only the owner deletes the history", FORBIDDEN)
        for item in c.items.values():
            item.has_text = False
        return len(c.items)

    # Learning (the memory Bot's changes) --------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _entry_of(self, bot: str, entry_id: str) -> Entry:
        e = self.entries.get(entry_id)
        if e is None or e.bot != bot or e.status == RETRACTED:
            raise Refused("no such entry", CONFLICT)
        return e

    def add_fact(
        self, bot: str, entry_id: str, sources: list[tuple[str, str]], topics: tuple[str, ...] = ()
    ) -> None:
        """A fact is for the people who saw it happen (seed; V3): the person of the Turn in a private
        chat, the Channel in a group chat. Each Item's rule is saved with the fact."""
        if not sources:
            raise Refused("a fact needs sources", BAD_INPUT)
        tags: list[str] = []
        rules: list[tuple[str, str]] = []
        for chat_id, item_id in sources:
            chat = self.chats.get(chat_id)
            item = None if chat is None or chat.bot != bot else chat.items.get(item_id)
            if chat is None or item is None:
                raise Refused("the Item is not in this Bot's chats", CONFLICT)
            if chat.review:
                raise Refused("review chats are not evidence (D9.16)", CONFLICT)
            if not item.has_text:
                raise Refused("the Item's history was deleted", CONFLICT)
            rule = f"channel:{chat.channel}" if chat.channel is not None else f"person:{item.actor}"
            rules.append((rule, chat.org))
            tags += [f"from:{item.actor}", f"for:{rule}", f"org:{chat.org}", f"chat:{chat.id}"]
            if chat.channel is not None:
                tags.append(f"channel:{chat.channel}")
        self.entries[entry_id] = Entry(
            entry_id,
            bot,
            "fact",
            _dedup(tags + list(topics)),
            self._next_seq(),
            item_sources=tuple(sources),
            rules=tuple(rules),
        )

    def add_observation(self, bot: str, entry_id: str, source_ids: list[str]) -> None:
        """An observation rests on active entries with access proof (V5, V9); it carries the union
        of its sources' for:/from:/chat:/channel:/org: tags (V12, D9.1)."""
        ids = list(dict.fromkeys(source_ids))
        if not ids:
            raise Refused("an observation needs sources", BAD_INPUT)
        tags: list[str] = []
        for sid in ids:
            s = self.entries.get(sid)
            if s is None or s.bot != bot:
                raise Refused("a source entry does not exist", CONFLICT)
            if s.status != ACTIVE or s.legacy:
                raise Refused("sources must be active and proved", CONFLICT)
            tags += [t for t in s.tags if t.startswith(INHERITED)]
        self.entries[entry_id] = Entry(
            entry_id, bot, "observation", _dedup(tags), self._next_seq(), entry_sources=tuple(ids)
        )

    def invalidate(self, bot: str, entry_id: str) -> None:
        e = self._entry_of(bot, entry_id)
        if e.status == ACTIVE:
            e.status = INVALIDATED

    def set_topics(self, bot: str, entry_id: str, topics: tuple[str, ...]) -> None:
        """The memory Bot sets an entry's topics (V8): its OpenBot tags (with a colon) stay."""
        e = self._entry_of(bot, entry_id)
        e.tags = [t for t in e.tags if ":" in t] + list(topics)

    def rename_topic(self, bot: str, org: str, old: str, new: str) -> None:
        """Every entry of the Bot valid for learning in ``org`` (the step's organization) with topic
        ``old`` gets ``new`` instead (L4: all of them, not only the 300 shown; no other
        organization's entry, nor one the learning of ``org`` is not shown)."""
        for e in self.entries.values():
            if e.bot == bot and old in e.tags and self.valid_org(e) == org:
                e.tags = [t for t in e.tags if t not in (old, new)] + [new]

    def valid_org(self, e: Entry) -> str | None:
        """The organization whose learning is shown ``e`` (L4): the one organization its closure
        (it and every entry below it) names in ``org:`` tags and Item rules, when it is active
        with an access proof (V9, D9.2) and every entry of the closure has a ``for:`` tag (V1);
        None otherwise."""
        if e.status != ACTIVE or self.proof_missing(e):
            return None
        closure: dict[str, Entry] = {}
        queue: deque[str] = deque([e.id])
        while queue:
            x = self.entries[queue.popleft()]
            if x.id not in closure:
                closure[x.id] = x
                queue.extend(x.entry_sources)
        if not all(x.has_for() for x in closure.values()):
            return None
        orgs = {t[4:] for x in closure.values() for t in x.tags if t.startswith("org:")}
        orgs |= {o for x in closure.values() for _, o in x.rules}
        return orgs.pop() if len(orgs) == 1 else None

    def import_legacy(self, bot: str, entry_id: str, tags: list[str], layer: str = "fact") -> None:
        """Old memory without access proof: kept hidden (V9) — but a private pinned entry made with
        Remember (pinned; for one person of one organization, from that person) keeps its own
        rule while that person is in the organization: loaded as ``remember`` makes one."""
        fors = [t for t in tags if t.startswith("for:")]
        orgs = [t[4:] for t in tags if t.startswith("org:")]
        person = (
            fors[0][len("for:person:") :] if len(fors) == 1 and fors[0].startswith("for:person:") else None
        )
        others = [t for t in tags if ":" in t and not t.startswith(("for:", "org:"))]
        if (
            layer == "pinned"
            and person
            and len(orgs) == 1
            and self.people.get(person) == orgs[0]
            and others == [f"from:{person}"]
        ):
            own = [
                f"from:{person}",
                f"for:person:{person}",
                f"org:{orgs[0]}",
                *(t for t in tags if ":" not in t),
            ]
            self.entries[entry_id] = Entry(
                entry_id, bot, "pinned", _dedup(own), self._next_seq(), author=person
            )
            return
        self.entries[entry_id] = Entry(entry_id, bot, layer, _dedup(tags), self._next_seq(), legacy=True)

    # Sharing (V6, D9.3) -------------------------------------------------------------------------

    def audience_people(self, bot: str, audience: list[str], orgs: set[str]) -> set[str]:
        """The people a set of for: tags admits now (conjunctive, D9.1)."""
        result: set[str] | None = None
        for tag in audience:
            people: set[str] = set()
            if tag == "for:bot":
                people = {p for p in self.people if self.uses_bot(p, bot) and self.people[p] in orgs}
            elif tag.startswith("for:person:"):
                p = tag[len("for:person:") :]
                people = {p} if p in self.people else set[str]()
            else:
                c = self.channels.get(tag[len("for:channel:") :])
                people = set[str]() if c is None else set(c.members)
            result = people if result is None else result & people
        return result or set[str]()

    def admitted_sets(self, e: Entry) -> list[set[str]]:
        """For every access rule below the entry, the people it admits now (V6, D9.3).

        A fact's Items admit by their saved rule; a pinned entry keeps its own rule, its author
        (V9: "Remember entries keep their own rule").
        """
        sets: list[set[str]] = []
        seen: set[str] = set()
        queue: deque[str] = deque([e.id])
        while queue:
            x = self.entries.get(queue.popleft())
            if x is None or x.id in seen:
                continue
            seen.add(x.id)
            if x.layer == "fact":
                sets += [self.rule_admits(rule) for rule, _ in x.rules]
            elif x.layer == "pinned":
                sets.append({x.author} if x.author else set[str]())
            else:
                queue.extend(x.entry_sources)
        return sets

    def proof_missing(self, e: Entry) -> bool:
        """No access proof below the entry: legacy, a missing or inactive source, or too deep (V9, D9.2)."""
        if self.hops_below(e) > MAX_HOPS:
            return True
        seen: set[str] = set()
        queue: deque[str] = deque([e.id])
        while queue:
            entry_id = queue.popleft()
            x = self.entries.get(entry_id)
            if x is None or x.legacy or (x is not e and x.status != "active"):
                return True
            if x.id in seen:
                continue
            seen.add(x.id)
            queue.extend(x.entry_sources)
        return False

    def hops_below(self, e: Entry) -> int:
        """The longest SOURCE path from the entry down (to an Item, or to a pinned entry)."""
        if e.layer == "fact" or e.legacy:
            return 1 if e.layer == "fact" else 0
        if e.layer == "pinned":
            return 0
        below = [self.entries.get(s) for s in e.entry_sources]
        return 1 + max((self.hops_below(x) for x in below if x is not None), default=0)

    def check_share(
        self,
        bot: str,
        entry_id: str,
        audience: list[str],
        by: str | None = None,
    ) -> None:
        """Replace the for: tags, only if the new audience's people are within every rule below.

        ``by``: a person's ``shareEntry`` — they must see the entry and be one of its people.
        ``None``: the memory Bot's share tool (no person; ownership of the Bot grants nothing).
        """
        if by is not None:
            if not self.uses_bot(by, bot):
                raise Refused("no read on the Bot", NO_READ | {CONFLICT})
            if not self.sees(by, bot, entry_id):
                raise Refused("the entry is not for you", CONFLICT)
        e = self._entry_of(bot, entry_id)
        if by is not None and f"from:{by}" not in e.tags and e.author != by:
            raise Refused("only the people behind an entry share it", CONFLICT)
        aud = list(dict.fromkeys(audience))
        if not aud or not all(
            a == "for:bot" or re.fullmatch(r"for:(person|channel):[A-Za-z0-9][A-Za-z0-9_-]{0,99}", a)
            for a in aud
        ):
            raise Refused("bad audience", BAD_INPUT)
        if e.layer == "pinned" and aud != [f"for:person:{e.author}"]:
            raise Refused("a remembered entry keeps its own rule, its author (V6)", CONFLICT)
        orgs = {t[4:] for t in e.tags if t.startswith("org:")}
        if self.proof_missing(e):
            raise Refused("an entry without access proof is never widened (V9)", CONFLICT)
        people = self.audience_people(bot, aud, orgs)
        if not people & self.audience_people(bot, ["for:bot"], orgs):
            raise Refused("the audience admits nobody who uses the Bot", CONFLICT)
        admitted_sets = self.admitted_sets(e)
        if not admitted_sets or any(not people <= admitted for admitted in admitted_sets):
            raise Refused("the audience is wider than a source rule (V6)", CONFLICT)

    def share(self, bot: str, entry_id: str, audience: list[str], by: str | None = None) -> None:
        self.check_share(bot, entry_id, audience, by)
        self.replace_audience(entry_id, audience)

    def replace_audience(self, entry_id: str, audience: list[str]) -> None:
        e = self.entries[entry_id]
        e.tags = [t for t in e.tags if not t.startswith("for:")] + list(dict.fromkeys(audience))

    # A person's commands ---------------------------------------------------------------------------

    def check_remember(self, person: str, bot: str) -> None:
        if not self.uses_bot(person, bot):
            raise Refused("no read on the Bot", NO_READ)

    def remember(self, person: str, bot: str, entry_id: str, topics: tuple[str, ...] = ()) -> None:
        """A pinned entry only the person sees: for:person:me, from:me, org:<my org>."""
        self.check_remember(person, bot)
        org = self.people[person]
        tags = [f"from:{person}", f"for:person:{person}", f"org:{org}", *topics]
        self.entries[entry_id] = Entry(entry_id, bot, "pinned", _dedup(tags), self._next_seq(), author=person)

    def forget(self, person: str, bot: str, entry_id: str) -> str:
        """V11, D9.4. Returns ``retracted`` or ``excluded``."""
        if not self.uses_bot(person, bot):
            raise Refused("no read on the Bot", NO_READ | {CONFLICT})
        if not self.sees(person, bot, entry_id):
            raise Refused("this entry is not for you", CONFLICT)
        e = self.entries[entry_id]
        behind = {t[5:] for t in e.tags if t.startswith("from:")}
        if e.layer == "pinned" and e.author:
            behind.add(e.author)
        if behind == {person}:
            e.status = RETRACTED
            return "retracted"
        e.tags = [t for t in e.tags if t != f"from:{person}"]
        e.excluded.add(person)
        return "excluded"

    def purge(self, person: str, bot: str, tag: str) -> int:
        """Write on a Bot that is not linked: WRITE and member of the owner organization (D9.13)."""
        b = self.bots[bot]
        org = self.people[person]
        if not self.bot_in_org(bot, org):
            raise Refused("the Bot is not in your organization", NO_READ)
        if org != b.owner or b.grants.get(person) != "WRITE":
            raise Refused("you need write on a Bot that is not linked", FORBIDDEN)
        if not tag.startswith(PURGEABLE):
            raise Refused("purge takes a from:, chat:, org: or channel: tag", BAD_INPUT)
        doomed = [e.id for e in self.entries.values() if e.bot == bot and tag in e.tags]
        for entry_id in doomed:
            del self.entries[entry_id]
        return len(doomed)

    # Who sees an entry ------------------------------------------------------------------------------

    def _for_ok(self, tag: str, reader: str, bot: str) -> bool:
        if tag == "for:bot":
            return self.uses_bot(reader, bot)
        if tag.startswith("for:person:"):
            return tag[len("for:person:") :] == reader
        if tag.startswith("for:channel:"):
            c = self.channels.get(tag[len("for:channel:") :])
            return c is not None and reader in c.members
        return False

    def _proved(
        self, x: Entry | None, root: Entry, reader: str, bot: str, hops: int, group: Channel | None = None
    ) -> bool:
        """``x`` is ``hops`` SOURCE hops below ``root``; every entry down to the Items must pass.
        With ``group``, the reader is that group chat's channel itself (D9.22): it meets only
        ``for:channel:<it>``, ``for:bot`` and Items saved for the channel, in its organization,
        and no Forget names it."""
        if x is None or hops > MAX_HOPS:  # a missing source, or a chain deeper than the bound
            return False
        org = self.people[reader] if group is None else group.org
        if x.legacy:  # V9
            return False
        if x is not root and x.status != ACTIVE:  # V5
            return False
        if not x.has_for():  # V1
            return False
        for tag in x.tags:
            if tag.startswith("for:"):  # V2, D9.1
                meets = (
                    self._for_ok(tag, reader, bot)
                    if group is None
                    else tag in ("for:bot", f"for:channel:{group.id}")
                )
                if not meets:
                    return False
            if tag.startswith("org:") and tag != f"org:{org}":  # V2, V12
                return False
        if group is None and reader in x.excluded:  # V11, D9.4
            return False
        if x.layer == "pinned":
            return True
        if x.layer == "fact":
            if hops + 1 > MAX_HOPS or not x.rules:
                return False
            # V3: every Item's saved rule admits the reader, in the Item's organization.
            if group is not None:
                return all(rorg == org and rule == f"channel:{group.id}" for rule, rorg in x.rules)
            return all(rorg == org and reader in self.rule_admits(rule) for rule, rorg in x.rules)
        if not x.entry_sources:
            return False
        # V4: every source, recursively; loops cannot be created through the API.
        return all(
            self._proved(self.entries.get(s), root, reader, bot, hops + 1, group) for s in x.entry_sources
        )

    def entry_visible(self, reader: str, e: Entry) -> bool:
        return e.status != RETRACTED and self._proved(e, e, reader, e.bot, 0)

    def chat_sees(self, chat: str, e: Entry) -> bool:
        """Every reader of an answer in the Chat passes (D9.15): its owner in a private chat; in a
        group chat every current member of its channel and the group itself (D9.22) — none when
        the channel has no member. Each person reader must use the Bot (D9.1: reading the memory
        needs read on the Bot, in a chat too)."""
        c = self.chats[chat]
        if e.status == RETRACTED or e.bot != c.bot:
            return False
        if c.channel is None:
            return self.uses_bot(c.owner, c.bot) and self._proved(e, e, c.owner, c.bot, 0)
        group = self.channels[c.channel]
        return (
            bool(group.members)
            and all(self.uses_bot(m, c.bot) and self._proved(e, e, m, c.bot, 0) for m in group.members)
            and self._proved(e, e, "#group", c.bot, 0, group)
        )

    def pack_preferences(self, chat: str) -> list[str]:
        """contextPack's preferences (D9.17) before its cut: the Bot's active entries with the topic
        ``preferences`` that every reader of the Chat sees, in memory order."""
        bot = self.chats[chat].bot
        shown = [
            e
            for e in self.entries.values()
            if e.bot == bot and e.status == ACTIVE and "preferences" in e.tags and self.chat_sees(chat, e)
        ]
        shown.sort(key=lambda e: (e.layer != "pinned", -e.seq))
        return [e.id for e in shown]

    def sees(self, reader: str, bot: str, entry_id: str) -> bool:
        e = self.entries.get(entry_id)
        return e is not None and e.bot == bot and self.uses_bot(reader, bot) and self.entry_visible(reader, e)

    def visible(self, reader: str, bot: str) -> set[str] | None:
        """The ids the reader's listing returns (active + invalidated history); None = cannot read."""
        listing = self.listing(reader, bot)
        return None if listing is None else {v.id for v in listing}

    def listing(self, reader: str, bot: str) -> list[View] | None:
        """GET memory for ``reader`` in their organization, in memory order; None = no read on the Bot."""
        if not self.uses_bot(reader, bot):
            return None
        shown = [
            e
            for e in self.entries.values()
            if e.bot == bot and e.status in (ACTIVE, INVALIDATED) and self.entry_visible(reader, e)
        ]
        shown.sort(key=lambda e: (e.layer != "pinned", -e.seq))
        return [self.view(e) for e in shown]

    def view(self, e: Entry) -> View:
        sources: set[tuple[str, ...]] = {("item", c, i) for c, i in e.item_sources}
        sources |= {("entry", s) for s in e.entry_sources}
        return View(e.id, e.layer, e.status, frozenset(e.tags), frozenset(sources))
