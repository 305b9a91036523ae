"""A LoCoMo conversation replayed through the public GraphQL and REST API, as a platform and its
people would: both speakers are people of one Organization with a Bot whose memory uses the
scripted model; every dialog turn is a Turn started with its speaker's own token, completed by the
platform; the platform's Bot confides on a session's last turn so that one learning execution
covers the session, and the next session starts only once that execution's facts are in the
memory log. Then speaker A asks the questions in a private chat.

Modes: ``group`` (one group chat of a channel holding both) and ``leak-check`` (each speaker in
their own private chat, so what is learned from one is private to that person).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from eval.dataset import Conversation, DialogTurn, Observation, Question, Session
from eval.scoring import Learned
from eval.scripted import MODEL, Expected, Offer, Plan, ScriptedModel, plan
from tests.client import Api
from tests.model_server import Recorded

ORG_PREFIX: Final = "botmemory-eval-"
CONFESSION: Final = "I listened and answered as well as I could."
#: A learning step may take the step deadline (2 min by default) and its retries.
LEARN_TIMEOUT: Final = 180.0
POLL_SECONDS: Final = 0.02

UPDATE_ORG: Final = (
    "mutation($o: ID!, $m: String) { updateOrganization(id: $o, botMemory: true, botMemoryModel: $m) { id } }"
)
#: A dialog turn, said when its session took place (the platform imports a history: D9.31).
START_TURN: Final = "mutation($c: ID!, $t: String!, $s: Long) { startTurn(chatId: $c, input: $t, saidAt: $s) { id sequence } }"
CONFIDE: Final = "mutation($t: ID!, $x: String!) { confide(turnId: $t, text: $x) { answer } }"
COMPLETE: Final = "mutation($t: ID!) { completeTurn(turnId: $t) { id } }"
MESSAGES: Final = "query($c: ID!, $l: Int!, $s: Int!) { chat(id: $c) { messages(limit: $l, skip: $s) { id turnId kind text } } }"
LOG: Final = "query($b: ID!) { memoryLog(botId: $b, limit: 50) { version changes { version actor ids } } }"
SEARCH: Final = (
    "query($b: ID!, $q: String!, $l: Int) { search(botId: $b, query: $q, limit: $l) { score entry { id } } }"
)


SEARCH_LIMIT: Final = 10
SEARCH_LIMIT_LEAK_CHECK: Final = 100


class ReplayError(RuntimeError):
    """The API did not behave as the replay relies on (numbering, learning)."""


@dataclass
class ChatRecord:
    """One chat of the replay and the dialog turn behind each of its Items."""

    id: str
    reader: str  # the speaker whose token reads it
    items: dict[str, DialogTurn] = field(default_factory=dict[str, DialogTurn])  # i-N → turn
    turn_ids: dict[str, str] = field(default_factory=dict[str, str])  # i-N → Turn id
    count: int = 0  # Items so far


@dataclass
class Stage:
    """What was provisioned for one conversation."""

    conversation: Conversation
    mode: str
    org: str
    bot: str
    tokens: dict[str, str]  # speaker → person token
    platform: str
    chats: dict[str, ChatRecord]  # "group" or a speaker's name → chat; "questions" → A's questions
    #: leak-check: every rewrite and confide request the asker's chat caused during the replay
    #: (what memory reached A's chat while B's entries were being written).
    replay_requests: list[Recorded] = field(default_factory=list[Recorded])

    @property
    def asker(self) -> str:
        return self.conversation.speaker_a

    def foreign_chats(self) -> frozenset[str]:
        """Chats whose Items the asker cannot see (B's private chat in leak-check)."""
        return frozenset(c.id for c in self.chats.values() if c.reader != self.asker)


@dataclass
class ReplayStats:
    sessions: int = 0
    turns: int = 0
    observations: int = 0
    facts: int = 0
    partial: int = 0  # facts citing only some of their evidence turns
    skipped: int = 0  # observations none of whose evidence turns was in a chat's evidence
    entries: int = 0
    foreign_entries: int = 0  # learned from a chat the asker is not in (leak-check: B's)
    foreign_listed: int = 0  # of those, listed to the asker by GET memory (must be 0)
    foreign_replayed: int = 0  # of those, in a rewrite or confide request of A's chat (must be 0)
    replay_requests: int = 0  # the rewrite and confide requests of A's chat checked for them
    replay_seconds: float = 0.0
    learn_wait_seconds: float = 0.0
    question_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Asked:
    question: Question
    offered: tuple[Offer, ...]
    search: tuple[str, ...] | None


Progress = Callable[[str], None]


@dataclass
class Replayer:
    api: Api
    model: ScriptedModel
    tag: str  # makes the Organization names unique
    progress: Progress
    search_error: str | None = None  # set once ``search`` failed; later questions skip it

    async def provision(self, conversation: Conversation, mode: str) -> Stage:
        api = self.api
        org = await api.organization(f"{ORG_PREFIX}{self.tag}-{conversation.name}-{mode}")
        await api.admin(UPDATE_ORG, {"o": org, "m": MODEL})
        bot = await api.bot(org, "locomo-bot")
        people: dict[str, str] = {}
        tokens: dict[str, str] = {}
        for name in (conversation.speaker_a, conversation.speaker_b):
            people[name], tokens[name] = await api.person(org, name)
            await api.grant(bot, people[name])
        platform = await api.platform_token(org)
        a, b = conversation.speaker_a, conversation.speaker_b
        chats: dict[str, ChatRecord] = {}
        if mode == "group":
            channel = await api.channel(org, [people[a], people[b]])
            chats["group"] = ChatRecord(await api.chat(tokens[a], bot, channel), a)
        else:
            for name in (a, b):
                chats[name] = ChatRecord(await api.chat(tokens[name], bot), name)
        chats["questions"] = ChatRecord(await api.chat(tokens[a], bot), a)
        return Stage(conversation, mode, org, bot, tokens, platform, chats)

    async def replay(self, stage: Stage) -> ReplayStats:
        """Every session in order; each waits for its learning before the next starts."""
        conv = stage.conversation
        stats = ReplayStats(sessions=len(conv.sessions), turns=conv.turns)
        observations = {s.number: s.observations for s in conv.sessions}
        started = time.perf_counter()
        for session in conv.sessions:
            t = time.perf_counter()
            plans: list[Plan] = []
            if stage.mode == "group":
                passes = [(stage.chats["group"], list(session.turns))]
            else:
                passes = [
                    (stage.chats[n], [x for x in session.turns if x.speaker == n])
                    for n in (conv.speaker_a, conv.speaker_b)
                ]
            for chat, turns in passes:
                if turns:
                    plans.append(await self._session(stage, chat, session, turns, observations, stats))
            learned = {f.content for p in plans for f in p.facts}
            stats.observations += len(session.observations)
            stats.facts += sum(len(p.facts) for p in plans)
            stats.partial += sum(1 for p in plans for f in p.facts if f.partial)
            stats.skipped += sum(1 for o in session.observations if o.sentence not in learned)
            self.progress(
                f"{conv.name} session {session.number}/{len(conv.sessions)}: {len(session.turns)} turns, "
                f"{sum(len(p.facts) for p in plans)} facts in {time.perf_counter() - t:.1f} s"
            )
        stats.replay_seconds = time.perf_counter() - started
        return stats

    async def _session(
        self,
        stage: Stage,
        chat: ChatRecord,
        session: Session,
        turns: list[DialogTurn],
        observations: dict[int, tuple[Observation, ...]],
        stats: ReplayStats,
    ) -> Plan:
        """The turns of one session in one chat, a confide on the last, then its learning."""
        api = self.api
        version = await self._version(stage, chat.reader)
        first = chat.count
        mark = self.model.mark()
        answers = 0
        for n, turn in enumerate(turns):
            # The session's time, a second apart turn by turn (None: the session has no date).
            said_at = None if session.said_at is None else session.said_at + n * 1000
            data = await api.gql(
                START_TURN, {"c": chat.id, "t": turn.text, "s": said_at}, stage.tokens[turn.speaker]
            )
            turn_id = str(data["startTurn"]["id"])
            chat.count += 1
            item = f"i-{chat.count}"
            chat.items[item], chat.turn_ids[item] = turn, turn_id
            if n == len(turns) - 1:
                self.model.expect(Expected(dict(chat.items), observations))
                answers = self.model.learn_answers()
                await api.gql(CONFIDE, {"t": turn_id, "x": CONFESSION}, stage.platform)
            await api.gql(COMPLETE, {"t": turn_id}, stage.platform)
        if stage.mode == "leak-check" and chat.reader == stage.asker:
            # Each pass runs alone (the other chat's learning is waited for), so the rewrites and
            # the confide since the mark are this chat's; summaries are written in the background.
            stage.replay_requests += self.model.requests(mark, ("rewrite", "confide"))
        new = [f"i-{k}" for k in range(first + 1, chat.count + 1)]
        await self._verify(stage, chat, new)
        expected = plan(session.observations, {chat.items[i].dia_id: i for i in new})
        t = time.perf_counter()
        await self._wait_learned(stage, chat, version, len(expected.facts), answers)
        stats.learn_wait_seconds += time.perf_counter() - t
        if self.model.mismatches:
            raise ReplayError(f"learning evidence is not the replayed turns: {self.model.mismatches[:5]}")
        return expected

    async def _verify(self, stage: Stage, chat: ChatRecord, new: list[str]) -> None:
        """The Items are numbered as assumed: i-N is the N-th startTurn's input (startTurn returns
        no Item id, so the chat's messages are read back)."""
        data = await self.api.gql(
            MESSAGES, {"c": chat.id, "l": len(new), "s": chat.count - len(new)}, stage.tokens[chat.reader]
        )
        got = [(m["id"], m["turnId"], m["kind"], m["text"]) for m in data["chat"]["messages"]]
        want = [(i, chat.turn_ids[i], "PERSON_MESSAGE", chat.items[i].text) for i in new]
        if got != want:
            differ = [(g, w) for g, w in zip(got, want, strict=False) if g != w]
            first = (
                f"got {differ[0][0]}, want {differ[0][1]}"
                if differ
                else f"{len(got)} Items for {len(want)} turns"
            )
            raise ReplayError(f"chat {chat.id}: Item numbering differs from the replay: {first}")

    async def _version(self, stage: Stage, reader: str) -> int:
        data = await self.api.gql(LOG, {"b": stage.bot}, stage.tokens[reader])
        return int(data["memoryLog"]["version"])

    async def _wait_learned(
        self, stage: Stage, chat: ChatRecord, version: int, expected: int, answers: int
    ) -> None:
        """Until the learning step was answered and its ``expected`` facts are in the memory log."""
        deadline = time.monotonic() + LEARN_TIMEOUT
        seen = 0
        while True:
            if self.model.learn_answers() > answers:
                if expected == 0:
                    return
                data = await self.api.gql(LOG, {"b": stage.bot}, stage.tokens[chat.reader])
                changes: list[dict[str, Any]] = data["memoryLog"]["changes"]
                seen = sum(
                    len(c["ids"])
                    for c in changes
                    if int(c["version"]) > version and c["actor"] == "memory_bot"
                )
                if seen >= expected:
                    return
            if time.monotonic() > deadline:
                raise ReplayError(
                    f"chat {chat.id}: {seen} of {expected} facts in the memory log after {LEARN_TIMEOUT:.0f} s "
                    f"(learning answers: {self.model.learn_answers() - answers}); see the worker log"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def entries(self, stage: Stage) -> tuple[dict[str, Learned], dict[str, set[str]]]:
        """Every entry learned (as its people list them) and the ids each speaker may see."""
        by_chat = {c.id: c for c in stage.chats.values()}
        learned: dict[str, Learned] = {}
        visible: dict[str, set[str]] = {}
        for name, token in stage.tokens.items():
            response = await self.api.http.get(
                f"/v1/bots/{stage.bot}/memory", headers={"Authorization": f"Bearer {token}"}
            )
            response.raise_for_status()
            body: dict[str, Any] = response.json()
            visible[name] = set()
            for e in body["entries"]:
                sources: list[dict[str, Any]] = e.get("sources") or []
                chats = {str(s.get("chat")) for s in sources}
                evidence = {
                    by_chat[str(s["chat"])].items[str(s["item"])].dia_id
                    for s in sources
                    if s.get("chat") in by_chat and s.get("item") in by_chat[str(s["chat"])].items
                }
                learned[str(e["id"])] = Learned(
                    str(e["id"]),
                    str(e["content"]),
                    frozenset(chats),
                    frozenset(evidence),
                    e.get("status") == "active",
                )
                visible[name].add(str(e["id"]))
        return learned, visible

    async def ask(self, stage: Stage, questions: list[Question]) -> list[Asked]:
        """Each question as a Turn of A's private chat (the offered entries are read from the
        rewrite request it causes), then ``search`` as A."""
        chat = stage.chats["questions"]
        token = stage.tokens[stage.asker]
        asked: list[Asked] = []
        for n, q in enumerate(questions, 1):
            mark = self.model.mark()
            data = await self.api.gql(START_TURN, {"c": chat.id, "t": q.text}, token)
            offered = self.model.offered(mark, q.text)
            await self.api.gql(COMPLETE, {"t": data["startTurn"]["id"]}, stage.platform)
            asked.append(Asked(q, offered, await self._search(stage, q.text)))
            if n % 50 == 0:
                self.progress(f"{stage.conversation.name}: {n}/{len(questions)} questions asked")
        return asked

    async def _search(self, stage: Stage, text: str) -> tuple[str, ...] | None:
        """``search`` as A: 10 hits, or in leak-check the API's most (100), so that more of what A
        could find is checked (recall@5 and @10 read its first ten)."""
        if self.search_error is not None:
            return None
        limit = SEARCH_LIMIT_LEAK_CHECK if stage.mode == "leak-check" else SEARCH_LIMIT
        body = await self.api.raw(SEARCH, {"b": stage.bot, "q": text, "l": limit}, stage.tokens[stage.asker])
        errors: list[dict[str, Any]] = body.get("errors") or []
        if errors:
            first = errors[0]
            extensions: dict[str, Any] = first.get("extensions") or {}
            code = extensions.get("code")
            self.search_error = f"{first.get('message')}" + (f" ({code})" if code else "")
            self.progress(f"search is not available, reported as n/a: {self.search_error}")
            return None
        return tuple(str(h["entry"]["id"]) for h in body["data"]["search"])
