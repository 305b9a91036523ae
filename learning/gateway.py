"""The memory Bot's model access (DESIGN §7): the ``openai`` client against any OpenAI-compatible
endpoint, the deployment-wide ``concurrency`` slots (D9.25), the budget (L6, D9.12) and the saved call log (C5).

Every call is saved encrypted (E1) with its attempts and the provider-confirmed usage; only
confirmed usage is charged, in micro-USD from the price table in settings; a call without usage
is recorded as unknown. Retries are ours (the client's are off) so each attempt is recorded and
all of them fit the caller's deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import httpx2
import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from redis.exceptions import RedisError

from graph import memorybot as memorybot_q
from graph.driver import read, save_within
from learning.embedders import make_embedder
from services import metrics, slots
from services.crypto import Cipher, Kind
from services.embedding import Embedder, EmbedderUnavailable
from services.ids import new_id
from services.memorybot import Route, current_period, periods
from services.runtime import now_ms
from services.settings import Settings
from services.validation import storable

if TYPE_CHECKING:
    from services.runtime import Runtime

log = logging.getLogger("learning.gateway")

#: The answer when no model can answer (no model, budget spent, deadline passed). It speaks
#: only of the work (D9.16).
FIXED_CALM_ANSWER = (
    "Thank you for telling me. Mistakes are part of the work. Tell the person plainly what "
    "happened, fix what you can, and carry on calmly."
)

_RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}
#: The provider refused the request itself (its size, its content — a content filter answers
#: 400): the same request is refused again, here or in any later execution (``refused``).
_REFUSED_STATUS = {400, 413, 422}
#: What a proxy before the provider answers when the provider did not answer it in time (or broke
#: off): the request may have been done, and billed.
_GATEWAY_STATUS = {502, 504}
#: How long past its deadline a call nobody waits for any more may take to be saved (shutdown
#: waits this long for the latest of them).
SAVE_SECONDS = 5.0


class _TooLarge(Exception):
    """The provider's answer passed the bytes a call may read (``_BoundedClient``); ``refused``:
    the body of a refusal (an HTTP error), which no usage was billed for."""

    def __init__(self, *, refused: bool = False) -> None:
        super().__init__()
        self.refused = refused


class _Capped(httpx2.AsyncByteStream):
    """A response body that stops at ``limit`` bytes (``_TooLarge``)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise _TooLarge
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _EventCapped(_Capped):
    """A streamed body none of whose events (up to the blank line that ends one) passes ``limit``
    bytes (``_TooLarge``): openai's reader keeps an event's lines until it ends, so one that never
    did was held whole until the attempt's timeout."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        since = 0  # bytes since the last event ended
        tail = b""  # the end of the last chunk, where an event's blank line may have begun
        async for chunk in self._inner:
            data = tail + chunk
            ends = [i + 2 for i in (data.rfind(b"\n\n"),) if i >= 0] + [
                i + 4 for i in (data.rfind(b"\r\n\r\n"),) if i >= 0
            ]
            since = len(data) - max(ends) if ends else since + len(chunk)
            if since > self._limit:
                raise _TooLarge
            tail = data[-3:]
            yield chunk


class _BoundedClient(openai.DefaultAsyncHttpxClient):
    """openai's own HTTP client (its connection limits, and proxies from the environment, which
    a transport of our own would have lost) that reads a whole answer only up to ``limit`` bytes
    as sent (``_TooLarge``), or as decoded when the provider compressed it anyway: read whole
    before its size was looked at, an answer of hundreds of MB was held several times over in
    memory, and a worker killed for it lost the call unsaved — a new epoch, the same answer,
    again. A streamed answer is read event by event, none past ``limit`` (``_EventCapped``), and
    ``Gateway._stream`` bounds what it keeps; a refusal's body (openai reads it whole) is read as a
    whole answer is."""

    def __init__(self, limit: int) -> None:
        super().__init__(headers={"Accept-Encoding": "identity"})
        self._limit = limit

    async def send(self, request: httpx2.Request, *, stream: bool = False, **kwargs: Any) -> httpx2.Response:
        response = await super().send(request, stream=True, **kwargs)
        if stream and response.status_code < 400:
            response.stream = _EventCapped(cast(httpx2.AsyncByteStream, response.stream), self._limit)
            return response
        try:
            if response.headers.get("content-encoding", "identity").lower() in ("", "identity"):
                response.stream = _Capped(cast(httpx2.AsyncByteStream, response.stream), self._limit)
                await response.aread()
                return response
            body = bytearray()
            async for piece in response.aiter_bytes():  # decoded: a small body may grow a thousandfold
                body += piece
                if len(body) > self._limit:
                    raise _TooLarge
            headers = [
                (k, v)
                for k, v in response.headers.multi_items()
                if k.lower() not in ("content-encoding", "content-length")
            ]
            await response.aclose()
            return httpx2.Response(
                response.status_code,
                headers=headers,
                content=bytes(body),
                request=request,
                extensions=response.extensions,
            )
        except _TooLarge:
            await response.aclose()
            raise _TooLarge(refused=response.status_code >= 400) from None
        except BaseException:
            await response.aclose()
            raise


def _too_large(exc: BaseException) -> _TooLarge | None:
    """``exc``, or what raised it, when it is an answer past its bytes (the client wraps what its
    transport raises as a connection error)."""
    for raised in (exc, exc.__cause__):
        if isinstance(raised, _TooLarge):
            return raised
    return None


class _Unfinished(Exception):
    """A streamed answer ended without a finish reason: cut short (the connection closed, or the
    provider stopped sending), not an answer."""


class ModelUnavailable(Exception):
    """No usable answer; ``code`` says why (never content): no_model, budget_spent, busy,
    deadline, timeout, provider_error, refused (a 400, 413 or 422: the request itself), malformed,
    too_large."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Completion:
    call_id: str
    text: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: tuple[int, int] | None

    def json(self) -> str:
        return json.dumps(
            {
                "text": self.text,
                "toolCalls": [[c.id, c.name, c.arguments] for c in self.tool_calls],
                "usage": self.usage,
            }
        )

    @classmethod
    def from_json(cls, call_id: str, raw: str) -> Completion:
        data = json.loads(raw)
        usage = data.get("usage")
        return cls(
            call_id,
            data.get("text"),
            tuple(ToolCall(i, n, a) for i, n, a in data.get("toolCalls", [])),
            None if usage is None else (int(usage[0]), int(usage[1])),
        )


@dataclass(frozen=True, slots=True)
class StepKey:
    """Identifies a model step's saved call: recovery reuses it (C5). Its request's keyed digest;
    for a learning step, also its execution, epoch and step (D9.9; a summary is found by its
    request in its Chat)."""

    request_hash: str
    execution_id: str | None = None
    epoch: int | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as its caller asks for it (:meth:`Gateway.complete`): ``task`` names it in
    the call log; ``body`` is the chat-completions request without ``model``; its retries end at
    ``deadline`` (``time.monotonic``); ``step`` finds it again for recovery (C5); ``stream``
    streams its text to ``on_text`` as it arrives; ``entry_ids`` are the entries whose content it
    embeds (a purge of any of them removes the saved texts, D9.20); ``charge=False`` records the
    cost on the call without counting it against the memory Bot's budget (the Bot's own chat
    model); ``save_by`` (``time.monotonic``) bounds the wait to save it with its texts, for an
    answer someone waits on (past it, the call is saved without them: ``graph.driver.save_within``)."""

    task: str
    body: dict[str, Any]
    deadline: float
    step: StepKey | None = None
    stream: bool = False
    entry_ids: tuple[str, ...] = ()
    on_text: Callable[[str], Awaitable[None]] | None = None
    charge: bool = True
    save_by: float | None = None


def request_hash(cipher: Cipher, body: dict[str, Any]) -> str:
    """What finds a model step's saved call again (C5): a keyed digest of its canonical request
    under the Bot's data key (E1: equal inputs are found by HMAC, never by a plain hash — SHA-256 of
    the request let anyone holding the store test a guessed message against it)."""
    return cipher.digest(Kind.MODEL_REQUEST, json.dumps(body, sort_keys=True))


def _tokens(usage: object) -> tuple[int, int] | None:
    """A response's usage as (prompt, completion) tokens, or None — unknown, as when a provider
    gives none — unless both are whole numbers of at least 0: the client does not check what a
    provider sends, and a null or a string raised past the save (the call neither saved nor
    charged), a negative count lowered the budget's spend."""
    prompt, completion = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    counts = (prompt, completion)
    if all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return cast(tuple[int, int], counts)
    return None


def _text(value: object) -> str:
    """A field of a tool call as the protocol gives it, a string; anything else (null, an object)
    is empty — its arguments then fail to parse, a violation of the answer as any malformed one."""
    return value if isinstance(value, str) else ""


def cost_micros(settings: Settings, model: str, usage: tuple[int, int] | None) -> int | None:
    """Confirmed cost from the price table; None when usage or the price is unknown."""
    price = settings.model_prices.get(model) or settings.model_prices.get("*")
    if usage is None or price is None:
        return None
    return math.ceil((usage[0] * price.input + usage[1] * price.output) / 1_000_000)


class Gateway:
    """One per process: the client and the concurrency gates of the Bots it serves."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: AsyncOpenAI | None = None
        if settings.openai_base_url:
            key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "none"
            # A whole answer's body holds its envelope beside the answer: twice the answer's
            # limit and some (the answer itself is held to it once read, ``complete``).
            self._client = AsyncOpenAI(
                base_url=settings.openai_base_url,
                api_key=key,
                max_retries=0,
                timeout=settings.model_attempt_timeout_seconds,
                http_client=_BoundedClient(2 * settings.max_model_answer_bytes + 65_536),
            )
        #: The embedder of this process (design §10): vectors of new entries and of queries.
        self.embedder: Embedder | None = make_embedder(settings)
        #: Calls whose caller was cancelled, running to their deadlines to be saved (``complete``),
        #: with the time (``time.monotonic``) by which each is saved.
        self._unwaited: dict[asyncio.Task[Completion], float] = {}

    async def warm_up(self) -> None:
        """Load the embedder's model now, so the first Turn does not wait for it (its deadline
        counts from arrival, D9.11); a failure is logged and left to the first real call."""
        if self.embedder is None:
            return
        try:
            await self.embedder.embed(["ready"])
        except EmbedderUnavailable as exc:
            log.warning("the embedder is not ready (%s); search falls back to keywords", exc.code)

    async def close(self) -> None:
        if self._unwaited:  # saved and charged before the client and the store go
            latest = max(self._unwaited.values())
            await asyncio.wait(set(self._unwaited), timeout=max(latest - time.monotonic(), 0.0))
            for call in list(self._unwaited):
                call.cancel()
                log.warning("a model call nobody waited for was cut off at shutdown")
        if self._client is not None:
            await self._client.close()
        if self.embedder is not None:
            await self.embedder.aclose()

    async def __aenter__(self) -> Gateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def acquire(
        self, rt: Runtime, route: Route, deadline: float, *, ungated_without_redis: bool = False
    ) -> Callable[[], Awaitable[None]]:
        """Wait until ``deadline`` for a free memory-Bot task slot of the Bot, counted across every
        process of the deployment (``concurrency``, D9.25: leases in Redis); returns the release.
        Raises ModelUnavailable("budget_spent") when the budget is spent once the slot is held,
        ModelUnavailable("busy") at the deadline, and without Redis unless
        ``ungated_without_redis``: then the call goes on without a slot (a learning step, which
        would otherwise end failed for good, its evidence learned only if the Chat confided
        again; an answer someone waits for gets the calm one at once instead)."""
        if route.concurrency is None:
            return slots.nothing_held
        if rt.quiet.skips("slot"):
            if ungated_without_redis:
                return slots.nothing_held
            raise ModelUnavailable("busy")
        try:
            release = await slots.take(
                rt.redis, route.bot_id, route.concurrency, deadline, rt.settings.slot_lease_seconds
            )
        except slots.Busy:
            raise ModelUnavailable("busy") from None
        except RedisError as exc:
            rt.quiet.failed(exc)
            log.warning("no task slot: Redis is not answering (%s)", type(exc).__name__)
            if ungated_without_redis:
                return slots.nothing_held
            raise ModelUnavailable("busy") from None
        # The budget again, with the slot held (D9.12): checked only before the wait, every call
        # that waited for a slot while others spent the budget was made anyway — five confide
        # answers with two slots and a budget of one call paid for five. Checked here, the calls
        # that overshoot a spent budget are at most the ``concurrency`` ones in flight.
        try:
            spent = await self.budget_spent(rt, route)
        except BaseException:
            await release()
            raise
        if spent:
            await release()
            raise ModelUnavailable("budget_spent")
        return release

    async def budget_spent(self, rt: Runtime, route: Route) -> bool:
        """Spent = confirmed cost in the current UTC period ≥ the limit (L6)."""
        if route.budget_period is None or route.budget_limit is None:
            return False
        period = current_period(route.budget_period, now_ms())
        micros, _ = await read(
            rt.driver, lambda tx: memorybot_q.spent(tx, bot_id=route.bot_id, period=period)
        )
        return micros >= route.budget_limit

    async def complete(
        self,
        rt: Runtime,
        route: Route,
        call: Call,
        *,
        gate: bool = False,
        ungated_without_redis: bool = False,
    ) -> Completion:
        """:meth:`_complete`, within one of the Bot's task slots when ``gate`` (:meth:`acquire`,
        ``ungated_without_redis`` passed on), held until the call is saved.

        Once the request is sent, the caller's cancel (a client that ended its operation or closed
        its socket, a shutdown) no longer reaches the call: it runs to its deadline, keeps its
        slot, and is saved and charged, its text shown to nobody. A cancel mid-call left it
        neither saved nor charged, though the provider billed it (C5, L6), and a slot given back
        by its caller let calls nobody counted run beside the Bot's ``concurrency``. Cancelled
        while it waits for a slot, nothing was sent, and it ends."""
        abandoned = False
        sent = False
        on_text = call.on_text

        async def to_caller(text: str) -> None:
            if not abandoned and on_text is not None:
                await on_text(text)

        async def gated() -> Completion:
            nonlocal sent
            release = (
                await self.acquire(rt, route, call.deadline, ungated_without_redis=ungated_without_redis)
                if gate
                else slots.nothing_held
            )
            try:
                sent = True
                return await self._complete(
                    rt, route, replace(call, on_text=None if on_text is None else to_caller)
                )
            finally:
                await release()

        running = asyncio.create_task(gated())
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if not sent:
                running.cancel()
            abandoned = True
            self._unwaited[running] = call.deadline + SAVE_SECONDS
            running.add_done_callback(self._settled)
            raise

    def _settled(self, call: asyncio.Task[Completion]) -> None:
        """A call nobody waits for any more ended (saved; a model failure was logged with it)."""
        self._unwaited.pop(call, None)
        if call.cancelled():
            return
        failure = call.exception()
        if failure is not None and not isinstance(failure, ModelUnavailable):
            log.warning("a model call nobody waited for failed: %s", type(failure).__name__)

    async def _complete(self, rt: Runtime, route: Route, call: Call) -> Completion:
        """One model call with retries until its deadline, saved with its attempts. Raises
        ModelUnavailable."""
        if route.model is None or self._client is None:
            raise ModelUnavailable("no_model")
        task, deadline, on_text = call.task, call.deadline, call.on_text
        request = {"model": route.model, **call.body}
        began = time.monotonic()
        attempts: list[str] = []
        call_id = new_id("call")
        result: Completion | None = None
        failure = "deadline"
        shown = False  # text of an attempt reached on_text: asking again would show it twice
        # Attempts that may have reached the provider and got no answer (it may have billed them).
        unanswered = 0

        async def relay(text: str) -> None:
            nonlocal shown
            shown = True
            assert on_text is not None
            await on_text(text)

        for attempt in range(self.settings.model_max_attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0.05:
                break
            started = time.monotonic()
            try:
                async with asyncio.timeout(remaining):
                    result = await self._once(
                        call_id, task, request, call.stream, remaining, None if on_text is None else relay
                    )
                attempts.append(f"ok:{_ms(started)}ms")
                break
            except (TimeoutError, openai.APITimeoutError) as exc:
                failure = "timeout"
                unanswered += not _unsent(exc)
                attempts.append(f"{'unsent' if _unsent(exc) else 'timeout'}:{_ms(started)}ms")
            except (_TooLarge, openai.APIConnectionError) as exc:
                big = _too_large(exc)
                if big is None:
                    failure = "provider_error"
                    unanswered += not _unsent(exc)
                    attempts.append(f"{'unsent' if _unsent(exc) else 'connection'}:{_ms(started)}ms")
                else:  # the same answer again would be as large: not asked again
                    failure = "provider_error" if big.refused else "too_large"
                    attempts.append(f"too_large:{_ms(started)}ms")
                    break
            except openai.APIStatusError as exc:
                failure = "refused" if exc.status_code in _REFUSED_STATUS else "provider_error"
                unanswered += exc.status_code in _GATEWAY_STATUS  # a proxy before it gave up
                attempts.append(f"status-{exc.status_code}:{_ms(started)}ms")
                if exc.status_code not in _RETRYABLE_STATUS:
                    break
            except openai.APIError:  # e.g. an error event in a stream: INTERNAL before, unsaved
                failure = "provider_error"
                unanswered += 1
                attempts.append(f"error:{_ms(started)}ms")
            except _Unfinished:
                failure = "provider_error"
                unanswered += 1
                attempts.append(f"unfinished:{_ms(started)}ms")
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
                failure = "malformed"
                attempts.append(f"malformed:{_ms(started)}ms")
                break
            if shown:
                break  # what was shown cannot be taken back: the caller says the answer failed
            backoff = min(0.2 * 2**attempt, 2.0)
            if deadline - time.monotonic() <= backoff:
                break
            await asyncio.sleep(backoff)
        status = "ok"
        result_json: str | None = None
        if result is None:
            status = failure
        else:
            result_json = result.json()
            if len(result_json) > self.settings.max_model_answer_bytes:
                status, result_json = "too_large", None
        cost = await self._save(
            rt, route, call_id, call, request, result, result_json, status, attempts, unanswered
        )
        metrics.MODEL_CALLS.labels(task=task, status=status).inc()
        metrics.MODEL_SECONDS.labels(task=task).observe(time.monotonic() - began)
        if cost:
            metrics.MODEL_COST.labels(task=task).inc(cost)
        if result is None or result_json is None:
            log.warning("model call %s for %s failed: %s (%s)", call_id, task, status, ",".join(attempts))
            raise ModelUnavailable(status)
        return result

    async def _once(
        self,
        call_id: str,
        task: str,
        request: dict[str, Any],
        stream: bool,
        budget: float,
        on_text: Callable[[str], Awaitable[None]] | None,
    ) -> Completion:
        assert self._client is not None
        timeout = min(budget, self.settings.model_attempt_timeout_seconds)
        headers = {"X-Botmemory-Task": task}
        if stream:
            return await self._stream(call_id, request, headers, timeout, on_text)
        response = cast(
            ChatCompletion,
            await self._client.chat.completions.create(**request, extra_headers=headers, timeout=timeout),
        )
        message = response.choices[0].message
        calls = tuple(
            ToolCall(_text(c.id), _text(c.function.name), _text(c.function.arguments))
            for c in (message.tool_calls or [])
            if c.type == "function"
        )
        content = message.content
        return Completion(
            call_id,
            storable(content) if isinstance(content, str) else None,
            calls,
            _tokens(response.usage),
        )

    async def _stream(
        self,
        call_id: str,
        request: dict[str, Any],
        headers: dict[str, str],
        seconds: float,
        on_text: Callable[[str], Awaitable[None]] | None,
    ) -> Completion:
        """A streamed call that asks for usage (``include_usage``, D9.12); what it keeps (text,
        tool-call names and arguments, and some for each call) is held to the answer's limit."""
        assert self._client is not None
        stream = await self._client.chat.completions.create(
            **request,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
            timeout=seconds,
        )
        text: list[str] = []
        calls: dict[int, list[str]] = {}
        usage: tuple[int, int] | None = None
        finished = False
        kept = 0
        try:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = _tokens(chunk.usage)
                for choice in chunk.choices:
                    finished = finished or choice.finish_reason is not None
                    delta = choice.delta
                    if isinstance(delta.content, str) and delta.content:
                        piece = storable(delta.content)
                        kept += len(piece)
                        text.append(piece)
                        if on_text is not None and piece:
                            await on_text(piece)
                    for tc in delta.tool_calls or []:
                        if tc.index not in calls:
                            kept += 64  # a call of its own, however small
                        slot = calls.setdefault(tc.index, ["", "", ""])
                        if tc.id:
                            slot[0] = _text(tc.id)
                        if tc.function and tc.function.name:
                            slot[1] += _text(tc.function.name)
                            kept += len(_text(tc.function.name))
                        if tc.function and tc.function.arguments:
                            slot[2] += _text(tc.function.arguments)
                            kept += len(_text(tc.function.arguments))
                if kept > self.settings.max_model_answer_bytes:
                    raise _TooLarge  # the answer would be refused whole: not read on
        finally:
            await stream.close()  # cut short, its connection stayed open until collected
        if not finished:
            raise _Unfinished  # cut short: its text so far was never a whole answer
        tool_calls = tuple(ToolCall(i, n, a) for _, (i, n, a) in sorted(calls.items()))
        return Completion(call_id, "".join(text) if text else None, tool_calls, usage)

    async def _save(
        self,
        rt: Runtime,
        route: Route,
        call_id: str,
        call: Call,
        request: dict[str, Any],
        result: Completion | None,
        result_json: str | None,
        status: str,
        attempts: list[str],
        unanswered: int = 0,
    ) -> int | None:
        """The call, encrypted (E1), and its confirmed cost (L6) in one transaction; the cost.
        ``unanswered``: its attempts that may have reached the provider and got no answer."""
        step = call.step
        usage = None if result is None else result.usage
        cost = None if result is None else cost_micros(self.settings, str(request["model"]), usage)
        # A call that answered is charged for its confirmed usage; one whose answer came but could
        # not be used (past its bytes, or malformed) was billed too: counted, as a call of unknown
        # cost when its usage could not be read (it was not counted at all, L6).
        answered = result is not None or status in ("too_large", "malformed")
        # So is every attempt that may have reached the provider and got no answer (cut by its
        # timeout, its connection lost, a stream cut short, a proxy before it giving up): the
        # provider may have billed it; missing usage is recorded as unknown (the seed), in the
        # spend's unknownCalls (which, having no price, the budget does not compare).
        calls = int(answered) + unanswered
        now = now_ms()
        fields: dict[str, Any] = {
            "id": call_id,
            "botId": route.bot_id,
            "chatId": route.chat_id,
            "historyEpoch": route.history_epoch,
            "org": route.org,
            "task": call.task,
            "model": request["model"],
            "executionId": None if step is None else step.execution_id,
            "epoch": None if step is None else step.epoch,
            "step": None if step is None else step.step,
            "requestHash": None if step is None else step.request_hash,
            "entryIds": list(call.entry_ids),
            "request": route.cipher.encrypt(Kind.MODEL_REQUEST, call_id, json.dumps(request)),
            "result": None
            if result_json is None
            else route.cipher.encrypt(Kind.MODEL_RESULT, call_id, result_json),
            "status": status,  # ok, or why not: a failure, or too_large (answered, not reusable)
            "attempts": len(attempts),
            "attemptLog": attempts,
            "usageKnown": usage is not None,
            "promptTokens": None if usage is None else usage[0],
            "completionTokens": None if usage is None else usage[1],
            "costMicros": cost,
            "at": now,
            "periods": list(periods(now)),
            "charged": calls > 0 and call.charge,
            "calls": calls,
            "unknownCalls": unanswered + int(answered and cost is None),
        }
        await save_within(
            rt.driver,
            None if call.save_by is None else call.save_by - time.monotonic(),
            lambda with_text: lambda tx: memorybot_q.save_model_call(tx, with_text=with_text, **fields),
        )
        return cost


def _unsent(exc: BaseException) -> bool:
    """Whether a failed attempt never reached the provider: no connection could be made (or taken
    from the pool) in time."""
    return isinstance(exc.__cause__, httpx2.ConnectError | httpx2.ConnectTimeout | httpx2.PoolTimeout)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
