"""Memory change events for subscribers of one API process (``memoryChanges``, V10, E4, D9.24).

Writers publish ``{botId, version, ids, removed}`` on Redis after commit (ids only). Each API
process listens once; per event it runs one batched visibility check for all its local
subscribers of that Bot (current membership, live token), decrypts the union of what anyone may
see once, and hands each subscriber the same immutable entry objects, with the ids the change
hid from it (its label before the change admitted the subscriber, its label after does not).

Nothing is lost to Redis: pub/sub only says "look". The hub keeps, per Bot with local
subscribers, the last version it considered; an event past a gap, every reconnection of its
Redis connection, and an audit every ``change_audit_seconds`` (a change whose announcement never
came: its writer killed between the commit and the publish, or Redis away then) first read what
it missed from the change log (the same check per row). One Bot's deliveries and catch-ups take
turns (a per-Bot lock): two that overlapped read the log from the same version and handed the
same changes out twice. A subscriber that reconnects passes ``after`` (the last version it saw)
and gets the log from there before the live events (:meth:`ChangeHub.replay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from neo4j import AsyncManagedTransaction

from graph import bots as bots_q
from graph import changefeed
from graph.driver import autocommit, read
from services import metrics, pubsub, turnfeed
from services.memory import Entry, decrypt_entry
from services.runtime import Runtime, now_ms
from services.tasks import cancel_and_wait

log = logging.getLogger("services.changefeed")

CHANNEL_PATTERN = "botmemory:changes:*"


#: Log rows read per statement when catching up or replaying.
LOG_PAGE = 200
#: Replays' pages read at once in a process: ``memoryChanges(after: 0)`` replays the whole log,
#: page by page, each change checked for its subscriber, and a token may hold thousands of
#: subscriptions; past this many the others wait their turn, a page at a time (never refused: a
#: reconnecting client that saw nothing for long is far behind through no doing of its own).
REPLAY_READS = 4
#: Of those, the pages one person's replays read at once: their other replays wait behind them,
#: not in the process's queue, so a person who replays on many streams delays another's replay by
#: a few pages, never by all of theirs (in one queue, first come first served, a thousand replays
#: of one person would each take a turn before anyone else's next page).
REPLAY_READS_PER_READER = 2
#: A Bot whose change could not be delivered is caught up from the log after this pause, doubled
#: while it fails, up to the longest.
RETRY_FIRST_SECONDS, RETRY_LONGEST_SECONDS = 0.5, 60.0


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class ChangeEvent:
    """One event for every local subscriber with the same visible entries and removals (compared
    by identity: the transport keys its once-per-event work on it, see ``schema.fanout``)."""

    version: int
    entries: tuple[Entry, ...]
    #: Entries the change hid from these subscribers, who saw them before it (ids only).
    removed: tuple[str, ...] = ()


@dataclass(eq=False, slots=True)
class Subscriber:
    key: str
    bot_id: str
    person_id: str
    org: str
    token_id: str
    #: Who reads: one visibility check per distinct identity, however many streams it holds.
    identity: str = field(init=False)
    #: Set when its queue overflowed: the stream ends (None) instead of skipping an event.
    too_slow: bool = False
    queue: asyncio.Queue[ChangeEvent | None] = field(
        default_factory=lambda: asyncio.Queue[ChangeEvent | None](100)
    )

    def __post_init__(self) -> None:
        self.identity = f"{self.person_id}|{self.org}|{self.token_id}"


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """The end of a replay: every change up to ``version`` was considered."""

    version: int


#: Per identity: the event, or None = end its subscriptions (token revoked or read on the Bot
#: lost); absent = nothing to send.
Outcome = dict[str, ChangeEvent | None]


def _identities(local: Sequence[Subscriber]) -> list[dict[str, str]]:
    """The distinct identities of ``local`` as the delivery statement checks them (``$subs``)."""
    return [
        {"key": k, "person": s.person_id, "org": s.org, "token": s.token_id}
        for k, s in {s.identity: s for s in local}.items()
    ]


class ChangeHub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.subscribers: dict[str, dict[str, Subscriber]] = {}
        #: Per Bot with local subscribers: the last version this process considered.
        self.versions: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._counter = 0
        self.ready = asyncio.Event()
        #: Per Bot whose change could not be delivered: the task that catches it up later.
        self._retrying: dict[str, asyncio.Task[None]] = {}
        self._access_task: asyncio.Task[None] | None = None
        self.access_ready = asyncio.Event()
        self._audit_task: asyncio.Task[None] | None = None
        #: Per Bot with local subscribers: its deliveries and catch-ups take turns.
        self._turns: dict[str, asyncio.Lock] = {}
        self._replays = asyncio.Semaphore(REPLAY_READS)
        #: Per person replaying here: their turns of REPLAY_READS_PER_READER, and how many of their
        #: replays hold or wait for one.
        self._readers: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    def _turn(self, bot_id: str) -> asyncio.Lock:
        return self._turns.setdefault(bot_id, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def _replay_page(self, sub: Subscriber) -> AsyncGenerator[None]:
        """A turn to read one page of a replay: one of its reader's REPLAY_READS_PER_READER, then
        one of the process's REPLAY_READS."""
        reader = sub.person_id
        turns, users = self._readers.setdefault(reader, (asyncio.Semaphore(REPLAY_READS_PER_READER), [0]))
        users[0] += 1
        try:
            async with turns, self._replays:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._readers[reader]

    async def start(self) -> None:
        self._task = asyncio.create_task(
            pubsub.listen(
                self.rt.redis,
                CHANNEL_PATTERN,
                self.deliver,
                self.ready,
                self.reconnected,
                silence=self.rt.settings.redis_timeout_seconds,
            ),
            name="changefeed",
        )
        self._access_task = asyncio.create_task(
            pubsub.listen(
                self.rt.redis,
                turnfeed.ACCESS_CHANNEL,
                self.access_changed,
                self.access_ready,
                self._access_resubscribed,
                silence=self.rt.settings.redis_timeout_seconds,
            ),
            name="changefeed-access",
        )
        self._audit_task = asyncio.create_task(self._audit(), name="changefeed-audit")

    async def _audit(self) -> None:
        """Every ``change_audit_seconds``, the Bots with local subscribers whose memory moved past
        the version this process considered catch up: an announcement that never came (its
        writer killed after the commit, Redis away then) was noticed only at the Bot's next
        change, so on a quiet Bot a Forget never reached an open stream."""
        while True:
            await asyncio.sleep(self.rt.settings.change_audit_seconds)
            try:
                await self.check_versions("audit")
            except Exception as exc:  # the next round tries again
                log.warning("the change feed's audit failed (%s)", type(exc).__name__)

    async def access_changed(self, _message: dict[str, Any]) -> None:
        """Who may follow a Bot may have changed (a token revoked, a grant or a channel's members
        set, announced by ``turnfeed.announce_access_change``): each Bot's local subscribers are
        checked again, and a stream that lost access ends (UNAUTHENTICATED) now — it was checked
        only when the Bot next changed, so on a quiet Bot a revoked token's stream stayed open."""
        for bot_id in list(self.subscribers):
            local = list(self.subscribers.get(bot_id, {}).values())
            if not local:
                continue
            subs = _identities(local)
            now = now_ms()
            found = await autocommit(
                self.rt.driver,
                lambda session, b=bot_id, subs=subs, now=now: changefeed.deliveries(
                    session, bot_id=b, ids=[], versions=[], subs=subs, now=now
                ),
            )
            self._hand_out(local, {s.identity: None for s in local if s.identity not in found.visible})

    async def _access_resubscribed(self) -> None:
        """After every (re)subscription to the access channel: a change of access announced while
        the connection was away is lost, so every stream here is checked again (a revoked token's
        stream on a quiet Bot stayed open until the Bot next changed)."""
        try:
            await self.access_changed({})
        except Exception as exc:  # each stream is still checked at its Bot's next change
            log.warning(
                "the change streams were not checked again after a reconnect (%s)", type(exc).__name__
            )

    async def stop(self) -> None:
        for task in [self._task, self._access_task, self._audit_task, *self._retrying.values()]:
            if task is not None:
                await cancel_and_wait(task)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, bot_id: str, person_id: str, org: str, token_id: str
    ) -> AsyncGenerator[Subscriber]:
        self._counter += 1
        sub = Subscriber(f"s{self._counter}", bot_id, person_id, org, token_id)
        base: int | None = None
        if bot_id not in self.versions:  # from here on, a missed event is noticed
            # Read before the subscriber counts, and nothing awaited between: a change committed
            # once it counts is past this version (delivered live, or from the log after a gap).
            # Read after it, a change committed in between would count as considered, never sent.
            current = await read(self.rt.driver, lambda tx: changefeed.versions(tx, bot_ids=[bot_id]))
            base = current.get(bot_id)
        self.subscribers.setdefault(bot_id, {})[sub.key] = sub
        try:
            if base is not None:
                self.versions.setdefault(bot_id, base)
            metrics.SUBSCRIPTIONS_OPENED.labels("memoryChanges").inc()
            yield sub
        finally:
            subs = self.subscribers.get(bot_id, {})
            subs.pop(sub.key, None)
            if not subs:
                self.subscribers.pop(bot_id, None)
                self.versions.pop(bot_id, None)
                turn = self._turns.get(bot_id)
                if turn is not None and not turn.locked():  # held: a delivery or catch-up of
                    # before is still in it, and a new subscriber's work must wait for it
                    del self._turns[bot_id]

    async def deliver(self, event: dict[str, Any]) -> None:
        """:meth:`_deliver`; one that fails leaves its Bot's last version where it was and catches
        that Bot up from the log later (:meth:`_later`), while other Bots' events go on. Events
        of a Bot without local subscribers are dropped before a turn is made for it (one kept for
        every Bot of the deployment that ever changed)."""
        bot_id = str(event.get("botId", ""))
        if bot_id not in self.subscribers:
            return
        try:
            async with self._turn(bot_id):
                await self._deliver(event)
        except Exception as exc:
            log.warning("a change was not delivered (%s); its Bot catches up later", type(exc).__name__)
            if bot_id in self.versions:
                self._later(bot_id)

    def _later(self, bot_id: str) -> None:
        """Catch the Bot up from the log after a pause, doubling up to a minute while it fails and
        while it has local subscribers (one such task per Bot)."""
        if bot_id in self._retrying:
            return

        async def retry() -> None:
            pause = RETRY_FIRST_SECONDS
            try:
                while bot_id in self.subscribers:
                    await asyncio.sleep(pause)
                    try:
                        await self.catch_up(bot_id)
                        return
                    except Exception as exc:
                        log.warning("a Bot's changes could not be caught up (%s)", type(exc).__name__)
                        pause = min(pause * 2, RETRY_LONGEST_SECONDS)
            finally:
                self._retrying.pop(bot_id, None)

        self._retrying[bot_id] = asyncio.create_task(retry(), name="changefeed-retry")

    async def _deliver(self, event: dict[str, Any]) -> None:
        """One batched check per event for every local subscriber of the Bot; an event past a gap
        first delivers what was missed, from the log (D9.24)."""
        bot_id, version = str(event["botId"]), int(event["version"])
        if bot_id not in self.subscribers:
            return
        known = self.versions.get(bot_id)
        if known is not None and version <= known:
            return  # considered already (caught up from the log, or a late duplicate)
        if known is not None and version > known + 1:
            metrics.CHANGE_CATCH_UPS.labels("gap").inc()
            await self._catch_up(bot_id)
            if version <= self.versions.get(bot_id, version - 1):
                return
        ids = [str(i) for i in event["ids"]]
        removed = [str(i) for i in event.get("removed", [])]
        local = list(self.subscribers.get(bot_id, {}).values())
        if local:
            change: changefeed.ChangedIds = {"version": version, "ids": ids}
            outcomes = await self._check(bot_id, local, [change], [version] if removed else [])
            self._hand_out(local, outcomes.get(version, {}))
        if bot_id in self.subscribers:
            self.versions[bot_id] = max(version, self.versions.get(bot_id, version))

    async def reconnected(self) -> None:
        """After the Redis connection came back: every Bot with local subscribers catches up."""
        await self.check_versions("reconnect")

    async def check_versions(self, why: str) -> None:
        """Every Bot with local subscribers whose memory is past the version this process
        considered catches up (one read for all of them). A Bot whose catch-up fails catches up
        later (:meth:`_later`) while the others go on: raised here, one Bot that could not be
        delivered (an entry that does not decrypt) ended every reconnect's catch-up before the
        Bots after it, and the listener, reconnecting again and again, handled no event at all."""
        bots = [b for b in self.subscribers if b in self.versions]
        if not bots:
            return
        current = await read(self.rt.driver, lambda tx: changefeed.versions(tx, bot_ids=bots))
        for bot_id in bots:
            if bot_id in self._retrying:  # it catches up on its own, pausing longer each time
                continue
            if current.get(bot_id, 0) > self.versions.get(bot_id, current.get(bot_id, 0)):
                metrics.CHANGE_CATCH_UPS.labels(why).inc()
                try:
                    await self.catch_up(bot_id)
                except Exception as exc:
                    log.warning("a Bot's changes could not be caught up (%s); later", type(exc).__name__)
                    self._later(bot_id)

    async def catch_up(self, bot_id: str) -> None:
        """Deliver, from the log, every change after the last version this process considered
        (in the Bot's turn)."""
        async with self._turn(bot_id):
            await self._catch_up(bot_id)

    async def _catch_up(self, bot_id: str) -> None:
        while bot_id in self.versions and bot_id in self.subscribers:
            local = list(self.subscribers[bot_id].values())
            after = self.versions[bot_id]
            page = await self._from_log(bot_id, local, after)
            if page is None:
                return
            memory_version, outcomes = page
            for version in sorted(outcomes):
                self._hand_out(local, outcomes[version])
            full = len(outcomes) == LOG_PAGE  # more rows may follow the page: go on from its last
            if bot_id in self.versions:  # never back (a subscriber's registration may have read on)
                reached = max(outcomes) if full else memory_version
                self.versions[bot_id] = max(reached, self.versions[bot_id])
            if not full:
                return

    async def replay(self, sub: Subscriber, after: int) -> AsyncIterator[ChangeEvent | CaughtUp | None]:
        """The changes after version ``after`` for one subscriber (registered already), read from
        the log oldest first (a reconnecting client's ``memoryChanges(after:)``), then
        :class:`CaughtUp` with the version reached: live events at or below it are already
        covered, and every later one reaches ``sub``. None: access lost.

        Then it reads on to the version the hub considered, taken in the Bot's turn (while the
        hub considers nothing of it; from then on it hands every version to ``sub`` too): a
        catch-up of the hub's (a gap, a reconnect, the audit) that took its subscribers before
        ``sub`` was registered, and whose read came after the replay's, handed the versions past
        the replay's end to the others only and moved past them, so ``sub`` had neither (a
        reconnecting client missed a change, and was not told). Nothing is read in the turn."""
        reached: int | None = None  # the version the hub considered, once taken
        while True:
            async with self._replay_page(sub):
                page = await self._from_log(sub.bot_id, [sub], after)
            if page is None:
                return
            memory_version, outcomes = page
            for version in sorted(v for v in outcomes if reached is None or v <= reached):
                outcome = outcomes[version]
                if sub.identity in outcome:
                    yield outcome[sub.identity]
            if len(outcomes) == LOG_PAGE and (reached is None or max(outcomes) < reached):
                after = max(outcomes)
                continue
            if reached is None:
                after = memory_version
                async with self._turn(sub.bot_id):
                    reached = self.versions.get(sub.bot_id, after)
                if reached > after:
                    continue  # the rows up to it: the hub gave them to its subscribers of before
            yield CaughtUp(max(after, reached))
            return

    async def _from_log(
        self, bot_id: str, local: list[Subscriber], after: int
    ) -> tuple[int, dict[int, Outcome]] | None:
        """The next page of log rows after ``after``, each checked for ``local`` like a live event,
        in one read transaction: (memory version, outcome per row version)."""
        page = await read(
            self.rt.driver, lambda tx: changefeed.log_after(tx, bot_id=bot_id, after=after, limit=LOG_PAGE)
        )
        if page is None:
            return None
        memory_version, rows = page
        if not rows:
            return memory_version, {}
        versions = [int(row["version"]) for row in rows if row["removed"]]
        outcomes = await self._check(bot_id, local, rows, versions)
        return memory_version, {int(row["version"]): outcomes.get(int(row["version"]), {}) for row in rows}

    async def _check(
        self,
        bot_id: str,
        local: list[Subscriber],
        changes: Sequence[changefeed.ChangedIds],
        versions: list[int],
    ) -> dict[int, Outcome]:
        """One batched check for ``local`` (once per distinct identity) of the changed entries of
        ``changes`` (``{version, ids}``: the live event or log rows) and of the removals of the
        changes ``versions`` (those that hid something), split per change."""
        ids = sorted({str(i) for change in changes for i in change["ids"]})
        identities = {s.identity: s for s in local}
        subs = _identities(local)
        now = now_ms()
        cipher = self.rt.keyring.cached(bot_id)

        async def work(tx: AsyncManagedTransaction) -> tuple[changefeed.Found, Any]:
            found = await changefeed.deliveries(
                tx, bot_id=bot_id, ids=ids, versions=versions, subs=subs, now=now
            )
            return found, await bots_q.bot_key(tx, id=bot_id)

        if cipher is not None:  # one statement, the shared lock at its head (C1): auto-commit
            found = await autocommit(
                self.rt.driver,
                lambda session: changefeed.deliveries(
                    session, bot_id=bot_id, ids=ids, versions=versions, subs=subs, now=now
                ),
            )
        else:  # the Bot's key too: both in one explicit transaction
            found, key = await read(self.rt.driver, work)
            if key is None:
                return {}
            cipher = self.rt.cipher(bot_id, key["master"], key["wrapped"])
        decrypted = {row["id"]: decrypt_entry(cipher, row) for row in found.entries}  # once per event
        outcomes: dict[int, Outcome] = {}
        for change in changes:
            row_ids = set(change["ids"])
            version = int(change["version"])
            outcome: Outcome = {}
            events: dict[tuple[tuple[str, ...], tuple[str, ...]], ChangeEvent] = {}
            for ident in identities:
                seen = found.visible.get(ident)
                if seen is None:
                    outcome[ident] = None
                    continue
                gone = tuple(sorted(i for v, i in found.removed.get(ident, []) if v == version))
                visible = tuple(sorted(i for i in seen if i in decrypted and i in row_ids and i not in gone))
                if visible or gone:
                    shape = (visible, gone)
                    if shape not in events:
                        events[shape] = ChangeEvent(version, tuple(decrypted[i] for i in visible), gone)
                    outcome[ident] = events[shape]
            outcomes[version] = outcome
        return outcomes

    @staticmethod
    def _hand_out(local: list[Subscriber], outcome: Outcome) -> None:
        for sub in local:
            if sub.identity in outcome:
                pubsub.offer(sub, outcome[sub.identity])
