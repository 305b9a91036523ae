"""Running learning executions (L2–L5, C4–C7, D9.9–D9.12) and sweeping stuck ones.

A worker claims ``exec:<id>:<epoch>`` only while the execution is queued under that epoch, and
keeps a lease while it runs. Each step reads the evidence after the (Bot, Chat) read position
through the execution's Turn, asks the model (a saved ModelCall is reused instead of a new
call, C5), validates the whole answer (D9.10), and commits the memory change, the new read
position and — on the last step — the end of the execution in one transaction, as a
compare-and-set of the start position and the epoch (C4). Nothing here raises into arq: every
failure ends the execution safely with a code (never content) and the read position unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from neo4j import AsyncManagedTransaction
from redis.exceptions import RedisError

from graph import learning as learning_q
from graph import memorybot
from graph.driver import read, write
from graph.memory import shared_lock
from learning import protocol
from learning.gateway import (
    Call,
    Completion,
    Gateway,
    ModelUnavailable,
    Route,
    StepKey,
    current_period,
    request_hash,
)
from learning.prompts import system_prompt
from services import jobs, metrics, slots
from services.changes import AddFact, AddObservation, MemoryChange, Share
from services.crypto import Cipher, Kind
from services.datewords import day_of, said_minute
from services.errors import ServiceError, outage
from services.memorybot import load_route
from services.runtime import Runtime, now_ms
from services.tasks import cancel_and_wait
from services.writepath import apply_changes, first_refused_share

log = logging.getLogger("botmemory.learning")

CONTEXT_LIMIT = 300  # L4
#: What learningContext's entries may hold in all (characters of content) and how many topics it
#: lists (the most used): what every learning request of a Bot carries besides its evidence, kept
#: within what a model takes (with ``max_evidence_chars`` of evidence: ~70,000 tokens).
CONTEXT_CHARS = 200_000
CONTEXT_TOPICS = 1_000
#: Why a re-ask got no answer when the answer is not to blame (the provider down, no model, the
#: Bot's slots taken): the step fails and its evidence waits for a later execution (C6), as on
#: the first ask. Any other (a timeout, an answer too large or malformed) sets it aside (D9.21):
#: a message that sends the model astray must not stop the Chat's learning.
NOT_THE_ANSWERS = frozenset({"no_model", "budget_spent", "busy", "provider_error", "refused"})
#: An ask of a step the provider refused (a 400, 413 or 422; a re-ask too, whose request the
#: answer it corrects made longer): asked again with fewer Items, the one Item it refuses alone is
#: set aside; before, the step failed with the read position unchanged and every later execution
#: of the Chat sent the same request, refused for ever.
_REFUSED = "model:refused"
#: A call the provider answered, though with no usable answer: it took the request.
_ANSWERED = frozenset({"malformed", "too_large"})
#: How long a job waits for its Chat's step slot before it hands the execution on, and how long
#: the next job then waits in the queue. A job that waited out a step deadline (two minutes) held
#: one of its worker's job slots meanwhile: a Chat with ten Turns learning at once held all ten
#: and every other Chat's learning waited behind it.
SLOT_WAIT_SECONDS = 1.0
SLOT_RETRY_SECONDS = 2.0
#: How many times a job reads its inputs again and asks again after the commit refused an answer
#: while the memory moved (:class:`_Moved`): each is a model call, and under other Chats'
#: steady changes a refusal may come again on every read.
MOVED_REASKS = 2


class StepFailed(Exception):
    """A safe failure of a step: the execution ends ``failed`` with this code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class StepRefused(Exception):
    """Every answer of a step was refused (D9.21): its evidence is set aside with these codes."""

    def __init__(self, codes: list[str]) -> None:
        super().__init__(",".join(codes))
        self.codes = codes


class _Superseded(Exception):
    """Another epoch owns the execution now: stop without touching it."""


class _HandOn(Exception):
    """The execution goes on in a new job (a new epoch, queued at once): ``reason`` says why —
    ``slot`` (the Chat's step slot stayed busy as long as this job may wait), ``time`` (another
    step might not end within this job's time) or ``stopping`` (the worker was asked to stop)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Stale(Exception):
    """The read position moved since the step began: read the evidence again."""


class _Moved(Exception):
    """The commit refused the answer (``code``) and the memory changed since the step read its
    inputs: another change (another Chat's step, a person's) may have made the answer stale —
    an entry it observes on invalidated, one it edits retracted. Read the inputs again and ask
    again, at most MOVED_REASKS times a job; a refusal with nothing changed since fails as before."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _Smaller(Exception):
    """The next step of the job reads at most ``items`` Items: half as many when the provider
    refused a step's request (a 400, 413 or 422), so that the Item it refuses is found and set
    aside; a full step again once evidence was set aside."""

    def __init__(self, items: int) -> None:
        super().__init__(items)
        self.items = items


@dataclass(frozen=True, slots=True)
class _Inputs:
    chat: memorybot.RouteChat
    route: Route
    start: int
    found: list[learning_q.EvidenceMap]
    #: What the Bot confided during the Turns of ``found`` (where to look, never a source).
    confided: list[learning_q.ConfidedMap]
    entries: list[learning_q.LearnedEntry]
    topics: list[learning_q.TopicCount]
    spent: int | None
    saved: list[memorybot.SavedCall]
    #: The Memory's purges (and take-backs) when the learningContext was read (COMMIT_STEP: stale
    #: after another).
    purges: int
    #: The memory version the learningContext was read at (a commit refused after it moved reads
    #: the inputs again: :class:`_Moved`).
    version: int


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    bot_id: str
    chat_id: str
    turn_seq: int
    epoch: int


def _confided(
    cipher: Cipher, confided: list[learning_q.ConfidedMap], chunk: list[learning_q.EvidenceMap]
) -> Iterator[protocol.Confided]:
    """What the Bot confided during the Turns of ``chunk``, each with the ids of the chunk's Items
    of its Turn that still have their words, decrypted one at a time as they are taken (the
    request takes them only as far as it holds, ``protocol.within_confided``)."""
    during: dict[int, list[str]] = {}
    for item in chunk:
        if item["text"] is not None:
            during.setdefault(item["turnSeq"], []).append(item["id"])
    for c in confided:
        if c["turnSeq"] in during:
            text = cipher.decrypt(Kind.CONFESSION, c["id"], c["text"])
            yield protocol.Confided(tuple(during[c["turnSeq"]]), text)


def _speaker(item: learning_q.EvidenceMap) -> str:
    kind = item["kind"]
    if kind == "PERSON_MESSAGE":
        return "person:" + str(item.get("speakerId"))
    if kind == "TOOL_RESULT":
        return "app:" + str(item.get("app"))
    if kind == "NOTICE":
        return "notice"
    return "bot"


class ExecutionRunner:
    """Runs executions in one worker process."""

    def __init__(
        self, rt: Runtime, gateway: Gateway, worker_id: str, stopping: asyncio.Event | None = None
    ) -> None:
        self.rt, self.gateway, self.worker_id = rt, gateway, worker_id
        #: Set when the worker is asked to stop: no job begins another step (``Settings.stop_seconds``).
        self.stopping = stopping or asyncio.Event()

    async def run(self, execution_id: str, epoch: int) -> str:
        """Run one epoch of an execution; returns how it ended (for logs and tests)."""
        now = now_ms()
        lease_ms = int(self.rt.settings.lease_seconds * 1000)
        row = await write(
            self.rt.driver,
            lambda tx: learning_q.claim(
                tx, id=execution_id, epoch=epoch, worker=self.worker_id, now=now, lease_ms=lease_ms
            ),
        )
        if row is None:
            return "not_queued"
        x = Claimed(row["id"], row["botId"], row["chatId"], int(row["turnSeq"]), int(row["epoch"]))
        keeper = asyncio.create_task(self._keep_lease(x))
        try:
            return await self._run(x, time.monotonic())
        except _HandOn as handed:
            queued = await write(
                self.rt.driver, lambda tx: learning_q.requeue(tx, id=x.id, epoch=x.epoch, now=now_ms())
            )
            # Lost: the sweeper sends it again. Waiting for a slot, it waits in the queue.
            later = SLOT_RETRY_SECONDS if handed.reason == "slot" else 0.0
            await jobs.enqueue_executions(self.rt, queued, defer_seconds=later)
            log.info("execution %s goes on in a new job (%s)", x.id, handed.reason)
            return "handed_on:" + handed.reason
        except StepFailed as failure:
            await self._finish(x, "failed", failure.code)
            log.info("execution %s failed safely: %s", x.id, failure.code)
            return "failed:" + failure.code
        except _Superseded:
            return "superseded"
        except Exception as exc:  # never raise into arq (D9.9); record a code, never content
            if outage(exc):
                # Neo4j or Redis away past the driver's retries (a failover, a restart, a commit
                # whose connection dropped): not a failure of the step. Raised to the job, which
                # logs it; the lease lapses and the sweeper queues the execution again (C4, C6).
                raise
            code = "internal:" + type(exc).__name__
            with contextlib.suppress(Exception):
                await self._finish(x, "failed", code)
            log.error("execution %s failed: %s", x.id, code)
            return "failed:" + code
        finally:
            await cancel_and_wait(keeper)

    async def _keep_lease(self, x: Claimed) -> None:
        interval = self.rt.settings.lease_seconds / 3
        lease_ms = int(self.rt.settings.lease_seconds * 1000)
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                if not await write(
                    self.rt.driver,
                    lambda tx: learning_q.renew_lease(tx, id=x.id, epoch=x.epoch, lease_ms=lease_ms),
                ):
                    return

    async def _finish(self, x: Claimed, status: str, error: str | None) -> None:
        await write(
            self.rt.driver,
            lambda tx: learning_q.finish(
                tx, id=x.id, epoch=x.epoch, status=status, error=error, now=now_ms()
            ),
        )

    async def _inputs(self, x: Claimed) -> _Inputs:
        """Everything a step reads, in one transaction: the route (botMemory and the model read
        again now, L5, D9.12), the learningContext under the shared lock (C1, L4), the read
        position, the evidence after it, the spend of the period and the saved results (C5)."""
        limit = self.rt.settings.max_evidence_items

        async def work(tx: AsyncManagedTransaction) -> _Inputs:
            version = await shared_lock(tx, bot_id=x.bot_id)  # the first statement of a read (C1, D9.8)
            chat, route = await load_route(self.rt, tx, x.chat_id)
            context = await learning_q.learning_context(
                tx,
                bot_id=x.bot_id,
                org=route.org,
                limit=CONTEXT_LIMIT,
                chars=CONTEXT_CHARS,
                topics=CONTEXT_TOPICS,
            )
            start = await learning_q.position(tx, bot_id=x.bot_id, chat_id=x.chat_id)
            found = await learning_q.evidence(tx, chat_id=x.chat_id, after=start, limit=limit + 1)
            spent = None
            if route.budget_period is not None and route.budget_limit is not None:
                period = current_period(route.budget_period, now_ms())
                spent = (await memorybot.spent(tx, bot_id=x.bot_id, period=period))[0]
            saved = await memorybot.saved_step_results(tx, execution_id=x.id, step=start)
            entries, topics = context["entries"], context["topics"]
            return _Inputs(
                chat,
                route,
                start,
                found["items"],
                found["confided"],
                entries,
                topics,
                spent,
                saved,
                context["purges"],
                version or 0,
            )

        return await read(self.rt.driver, work)

    async def _run(self, x: Claimed, began: float) -> str:
        """Step after step until the execution ends. A step begins only within the job's first
        step deadline (its wait for the slot counted), so it ends within ``Settings.job_seconds``; past it,
        the execution goes on in a new job (a run of many steps — evidence piled up while the
        budget was spent — was cancelled by arq's timeout mid-call)."""
        step_seconds = self.rt.settings.step_deadline_seconds
        items = self.rt.settings.max_evidence_items
        moved = 0
        while True:
            if self.stopping.is_set():
                raise _HandOn("stopping")
            if time.monotonic() - began > step_seconds:
                raise _HandOn("time")
            release = await self._one_step_at_a_time(
                x, min(began + step_seconds, time.monotonic() + SLOT_WAIT_SECONDS)
            )
            try:
                ended = await self._step_once(x, items)
            except _Smaller as smaller:
                items, ended = smaller.items, None
            except _Moved as refused:
                moved += 1
                if moved > MOVED_REASKS:
                    raise StepFailed("rejected:" + refused.code) from None
                ended = None
            finally:
                await release()
            if ended is not None:
                return ended

    async def _one_step_at_a_time(self, x: Claimed, deadline: float) -> Callable[[], Awaitable[None]]:
        """Wait until ``deadline`` for the Chat's one learning-step slot (a lease in Redis, like a
        task slot, D9.25). Executions of one Chat's Turns that run at once read the same evidence
        after the same read position: each would ask the model and pay for it, and all answers but
        the first to commit would be thrown away (C4). Held, an execution reads its inputs, asks
        and commits; the next one then reads on from the position it left. Still busy at the
        deadline (SLOT_WAIT_SECONDS), the execution goes on in a new job that waits
        SLOT_RETRY_SECONDS in the queue, its worker's job slot free meanwhile (it ended
        ``learning_busy``, its Turn's evidence unlearned until the Chat confided again). Without
        Redis, steps go on unserialised (the compare-and-set still applies each evidence once)."""
        settings = self.rt.settings
        try:
            return await slots.take_key(
                self.rt.redis,
                slots.step_key_of(x.bot_id, x.chat_id),
                1,
                deadline,
                settings.lease_seconds,
            )
        except slots.Busy:
            raise _HandOn("slot") from None
        except RedisError as exc:
            log.warning(
                "learning steps of a chat not serialised: Redis is not answering (%s)", type(exc).__name__
            )
            return slots.nothing_held

    async def _step_once(self, x: Claimed, limit: int) -> str | None:
        """One pass of the execution: its inputs read, one step of at most ``limit`` Items asked
        and committed. Returns how the execution ended, or None when it goes on (more evidence, or
        a stale commit read again); raises _Smaller when the provider refused the request."""
        inputs = await self._inputs(x)
        route, start = inputs.route, inputs.start
        skip = inputs.chat["review"] or not route.bot_memory or route.model is None
        through: list[learning_q.EvidenceMap] = []
        for item in inputs.found:
            if item["turnSeq"] > x.turn_seq:
                break  # the execution reads through its own Turn only (L2)
            through.append(item)
        chunk = protocol.within_chars(through[:limit], self.rt.settings.max_evidence_chars)
        more = len(through) > len(chunk)
        end = chunk[-1]["seq"] if chunk else start
        final_status = "skipped" if skip else "done"  # such evidence is never learned (L5)
        # Evidence whose history was deleted has no words left to learn from (D9.23): read past it
        # without asking the model about nothing.
        if not chunk or skip or all(i["text"] is None for i in chunk):
            try:
                await self._commit(x, inputs, [], start, end, final=not more, status=final_status, learned=0)
            except _Stale:
                return None
            return None if more else final_status
        try:
            deadline = time.monotonic() + self.rt.settings.step_deadline_seconds
            try:
                changes, call_id = await self._step(x, inputs, chunk, deadline)
            except StepFailed as failed:
                if failed.code != _REFUSED:
                    raise
                if len(chunk) > 1:  # find the Item it refuses: half as many at a time
                    raise _Smaller(len(chunk) // 2) from None
                accepted = await self._accepted_without(x, inputs, deadline)
                if accepted is None:
                    await self._finish(x, "budget", None)  # waits, not lost (L6)
                    return "budget"
                if not accepted:
                    raise  # it refuses any request (its settings, our key): not the Item's doing
                raise StepRefused([_REFUSED]) from None
        except StepRefused as refused:  # D9.21: set aside, never learned; read on past it
            aside = f"{start + 1}-{end}:{','.join(refused.codes)}"
            try:
                await self._commit(
                    x, inputs, [], start, end, final=not more, status="done", learned=0, aside=aside
                )
            except _Stale:
                return None
            log.info("execution %s set evidence aside: %s", x.id, aside)
            if more:  # what a refusal made smaller is behind: full steps again
                raise _Smaller(self.rt.settings.max_evidence_items) from None
            return "done"
        if call_id is None:
            await self._finish(x, "budget", None)  # waits, not lost (L6)
            return "budget"
        try:
            await self._commit(
                x,
                inputs,
                changes,
                start,
                end,
                final=not more,
                status="done",
                learned=len(changes),
            )
        except _Stale:
            return None
        return None if more else "done"

    async def _accepted_without(self, x: Claimed, inputs: _Inputs, deadline: float) -> bool | None:
        """Whether the provider takes the step's request without its evidence, within the step's
        ``deadline``: True, and the single Item it refused (a content filter) is set aside
        (D9.21); False when it refuses that too (not the Item's doing: the step fails, the Item
        waits for a later execution, C6); None when the budget is spent (the step waits for it,
        L6). Any other failure (the provider down, the Bot's slots taken) fails the step with
        its own code, the Item kept."""
        route = inputs.route
        if await self.gateway.budget_spent(self.rt, route):
            return None
        kept = [_kept(route.cipher, e) for e in inputs.entries]
        body = protocol.request_body(system_prompt(protocol.LEARN_SYSTEM, route), [], kept, inputs.topics)
        digest = request_hash(route.cipher, {"model": route.model, **body})
        key = StepKey(digest, x.id, x.epoch, inputs.start)
        try:
            await self._ask(route, body, deadline, key, inputs.entries)
        except ModelUnavailable as exc:
            if exc.code == "budget_spent":  # spent by others while it waited for a slot
                return None
            if "model:" + exc.code == _REFUSED:
                return False
            if exc.code in _ANSWERED:  # it took the request; its answer does not matter here
                return True
            raise StepFailed("model:" + exc.code) from None
        return True

    async def _step(
        self, x: Claimed, inputs: _Inputs, chunk: list[learning_q.EvidenceMap], deadline: float
    ) -> tuple[list[MemoryChange], str | None]:
        """One model step within the step ``deadline`` (C6), its answer checked whole (D9.10).
        No call id back = the budget is spent and no saved result could be reused."""
        route, start, entries = inputs.route, inputs.start, inputs.entries
        cipher = route.cipher
        evidence = {
            i["id"]: protocol.EvidenceItem(
                i["id"],
                i["kind"],
                _speaker(i),
                cipher.decrypt(Kind.ITEM, i["uid"], i["text"]),
                said_minute(i["saidAt"], i["timeZone"]),
            )
            for i in chunk
            if i["text"] is not None
        }
        kept = [_kept(cipher, e) for e in entries]
        body = protocol.request_body(
            system_prompt(protocol.LEARN_SYSTEM, route),
            list(evidence.values()),
            kept,
            inputs.topics,
            _confided(cipher, inputs.confided, chunk),
        )
        refusals: list[str] = []
        for attempt in range(1 + protocol.MAX_REASKS):
            key = StepKey(request_hash(cipher, {"model": route.model, **body}), x.id, x.epoch, start)
            saved = next((c for c in inputs.saved if c["requestHash"] == key.request_hash), None)
            if saved is not None:  # a re-ask's answer is saved under its own request, too (C5)
                completion = Completion.from_json(
                    saved["id"], cipher.decrypt(Kind.MODEL_RESULT, saved["id"], saved["result"])
                )
            elif (
                attempt == 0
                and inputs.spent is not None
                and route.budget_limit is not None
                and inputs.spent >= route.budget_limit
            ) or (attempt > 0 and await self.gateway.budget_spent(self.rt, route)):
                # A re-ask is a call too: spent (by the answer it corrects, or by others), the step
                # waits for the budget like one that never began (L6; re-asks were not checked).
                return [], None
            else:
                try:
                    completion = await self._ask(route, body, deadline, key, entries)
                except ModelUnavailable as exc:
                    if exc.code == "budget_spent":  # spent by others while it waited for a slot
                        return [], None
                    if refusals and "model:" + exc.code == _REFUSED and len(chunk) == 1:
                        # A re-ask of one Item refused: the first ask was taken, so the request
                        # grown by the answer it corrects is to blame, not the provider.
                        raise StepRefused([*refusals, "reask:refused"]) from None
                    if not refusals or exc.code in NOT_THE_ANSWERS:
                        raise StepFailed("model:" + exc.code) from None
                    raise StepRefused([*refusals, "reask:" + exc.code]) from None
            if time.monotonic() > deadline:
                raise (
                    StepFailed("step_timeout") if not refusals else StepRefused([*refusals, "reask:timeout"])
                )
            try:
                changes = protocol.changes_from(
                    completion.tool_calls,
                    chat_id=x.chat_id,
                    evidence=evidence,
                    context_ids={e["id"] for e in entries},
                    org=inputs.route.org,
                    own_audience=_own_audience(inputs.chat),
                )
                await _check_shares(self.rt, x.bot_id, completion.tool_calls, changes)
                return changes, completion.call_id
            except protocol.Violation as violation:
                refusals.append(f"policy:{violation.code}:{violation.path}")
                last = attempt == protocol.MAX_REASKS
                metrics.STEP_REFUSALS.labels(
                    code=violation.code, then="set_aside" if last else "reasked"
                ).inc()
                body = protocol.reask_body(body, completion.text, completion.tool_calls, violation)
        raise StepRefused(refusals)

    async def _ask(
        self,
        route: Route,
        body: dict[str, Any],
        deadline: float,
        key: StepKey,
        entries: list[learning_q.LearnedEntry],
    ) -> Completion:
        """One model call of a step under the concurrency limit (D9.25; ungated while Redis is
        away, as the Chat's step slot) and the step deadline."""
        call = Call("learn", body, deadline, step=key, entry_ids=tuple(e["id"] for e in entries))
        return await self.gateway.complete(self.rt, route, call, gate=True, ungated_without_redis=True)

    async def _commit(
        self,
        x: Claimed,
        inputs: _Inputs,
        changes: list[MemoryChange],
        start: int,
        end: int,
        *,
        final: bool,
        status: str,
        learned: int,
        aside: str | None = None,
    ) -> None:
        """Memory change + read position + execution end in one transaction, as a CAS (C4) of the
        start position and of the Chat's history the evidence was read from (``inputs``: a
        deletion since, D9.23, reads the evidence again, without the deleted words); ``aside``:
        the range and codes of evidence set aside (D9.21)."""
        produced = [c.id for c in changes if isinstance(c, AddFact | AddObservation)]

        async def cas(tx: AsyncManagedTransaction) -> None:
            result = await learning_q.commit_step(
                tx,
                id=x.id,
                epoch=x.epoch,
                start=start,
                end=end,
                final=final,
                status=status,
                learned=learned,
                now=now_ms(),
                history_epoch=inputs.chat.get("historyEpoch", 0),
                # A commit that changes the memory is stale after a purge since its inputs were read:
                # its answer may restate a purged entry of the learningContext as a new one, or
                # edit one that is gone (D9.20).
                purges=inputs.purges if changes else None,
                produced=produced,
                set_aside=aside,
            )
            if not result["mine"]:
                raise _Superseded()
            if not result["fresh"]:
                raise _Stale()

        if not changes:
            await write(self.rt.driver, cas)
            return
        try:
            await apply_changes(
                self.rt, x.bot_id, changes, "memory_bot", precheck=cas, embedder=self.gateway.embedder
            )
        except ServiceError as exc:  # the latest source state refused it (C7, V6): nothing applied
            if await self._version(x) != inputs.version:
                raise _Moved(exc.code) from None
            raise StepFailed("rejected:" + exc.code) from None

    async def _version(self, x: Claimed) -> int | None:
        return await read(self.rt.driver, lambda tx: shared_lock(tx, bot_id=x.bot_id))


def _own_audience(chat: Mapping[str, Any]) -> frozenset[str]:
    """The audience a Chat's own words have: its channel's (a group chat), else its owner's."""
    channel = chat.get("channelId")
    return frozenset({f"for:channel:{channel}"} if channel else {f"for:person:{chat['ownerId']}"})


async def _check_shares(
    rt: Runtime, bot_id: str, calls: tuple[protocol.ToolCall, ...], changes: list[MemoryChange]
) -> None:
    """A ``share`` the memory as it stands refuses (V6, V9) is the answer's violation, asked
    again and then set aside like any other (D9.21): refused only by the commit, it ended the
    execution failed with the read position unchanged, and every later execution of the Chat
    read the same evidence, got the same share and failed again — the Chat learned nothing
    more. The commit still checks every share under the exclusive lock (C7)."""
    shares = [c for c in changes if isinstance(c, Share)]
    if not shares:
        return
    refused = await first_refused_share(rt, bot_id, shares)
    if refused is not None:
        at = [n for n, call in enumerate(calls) if call.name == "share"][refused]
        raise protocol.Violation("share_outside_sources", f"tool_calls[{at}].audience")


def _kept(cipher: Cipher, entry: learning_q.LearnedEntry) -> dict[str, Any]:
    """An entry as the model sees it: id, layer, text, topics, audience and the day it was said
    (D9.31; never provenance)."""
    tags = entry["tags"]
    kept: dict[str, Any] = {
        "id": entry["id"],
        "layer": entry["layer"],
        "content": cipher.decrypt(Kind.ENTRY, entry["id"], entry["content"]),
        "topics": [t for t in tags if ":" not in t],
        "audience": [t for t in tags if t.startswith("for:")],
        "said": day_of(entry["saidAt"]).isoformat(),
    }
    if entry.get("confidence") is not None:
        kept["confidence"] = entry["confidence"]
    return kept
