"""The memory Bot's settings (C3, D9.13), its route (whose model and budget a task uses, L6), and
the Chat owner's confessions (D9.6)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Generic, Literal, TypeVar, cast

from neo4j import AsyncManagedTransaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from graph import chats as chats_q
from graph import conversation as conversation_q
from graph import memorybot as memorybot_q
from graph import sweeps as sweeps_q
from graph.context import visible_ids
from graph.driver import autocommit, read, write
from graph.memory import shared_lock
from services import memory
from services.auth import require_person
from services.commands import require_owner_writer
from services.crypto import Cipher, Kind
from services.domain import Principal
from services.errors import BadInput, Conflict, NotFound, ServiceError, unavailable
from services.jobs import enqueue_executions
from services.runtime import Runtime, now_ms
from services.validation import check_id, check_page, check_text, refusal

MAX_INSTRUCTIONS = 8000

log = logging.getLogger("botmemory.memorybot")


MAX_CONCURRENCY = 1000


class ReviewChat(ServiceError):
    """Review chats have no confide, no enrichment and no learning (D9.16)."""

    code = "REVIEW_CHAT"
    status = 409


@dataclass(frozen=True, slots=True)
class Budget:
    period: str
    limit_micros: int


@dataclass(frozen=True, slots=True)
class MemoryBotSettings:
    version: int
    instructions: str | None
    concurrency: int | None
    budget: Budget | None
    spent_micros: int | None = None
    unknown_calls: int | None = None

    @classmethod
    def of(cls, row: memorybot_q.SettingsMap, spent: tuple[int, int] | None = None) -> MemoryBotSettings:
        budget = None
        if row["budgetPeriod"] is not None and row["budgetLimitMicros"] is not None:
            budget = Budget(row["budgetPeriod"], int(row["budgetLimitMicros"]))
        return cls(
            int(row["settingsVersion"]),
            row.get("instructions"),
            row.get("concurrency"),
            budget,
            None if spent is None else spent[0],
            None if spent is None else spent[1],
        )


async def get_settings(rt: Runtime, principal: Principal, bot_id: str) -> MemoryBotSettings:
    """Reading needs write on a Bot that is not linked (C3, D9.13)."""
    check_id(bot_id, "botId")

    async def work(tx: AsyncManagedTransaction) -> MemoryBotSettings:
        await require_owner_writer(tx, principal, bot_id)
        row = await memorybot_q.settings(tx, bot_id=bot_id)
        if row is None:
            raise NotFound("bot not found")
        spent = None
        if row["budgetPeriod"] is not None:
            period = current_period(row["budgetPeriod"], now_ms())
            spent = await memorybot_q.spent(tx, bot_id=bot_id, period=period)
        return MemoryBotSettings.of(row, spent)

    return await read(rt.driver, work)


class BudgetPatch(BaseModel):
    """A budget in a settings PATCH: a UTC period and its limit in micro-USD (L6)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    period: Literal["day", "month"]
    limit_micros: int = Field(alias="limitMicros", ge=0, lt=2**62)


class SettingsPatch(BaseModel):
    """The memory-Bot settings PATCH (C3, D9.13): ``expected`` = the settings' own version; a field
    left out stays as it is, a null one removes the limit or the instructions. One model for REST
    (the JSON body, validated by the REST edge) and GraphQL (:meth:`checked`, the typed arguments)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    expected: int = Field(ge=0, lt=2**63)  # a 64-bit version: a larger one is no version (422)
    instructions: str | None = None
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)
    budget: BudgetPatch | None = None

    @field_validator("instructions")
    @classmethod
    def _instructions(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None  # blank instructions are none
        return check_text(value, "instructions", limit=MAX_INSTRUCTIONS)

    @classmethod
    def of_body(cls, body: dict[str, Any]) -> SettingsPatch:
        """The PATCH from a JSON body; BadInput names the first refused field."""
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            raise refusal(exc) from None

    @classmethod
    def checked(cls, **fields: Any) -> SettingsPatch:
        """The PATCH from typed arguments (only those given); BadInput as :meth:`of_body`."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise refusal(exc) from None

    def values(self) -> dict[str, Any]:
        """The graph properties of the fields the PATCH names (absent = unchanged, null = none)."""
        named = self.model_fields_set
        values: dict[str, Any] = {k: getattr(self, k) for k in ("instructions", "concurrency") if k in named}
        if "budget" in named:
            values["budgetPeriod"] = None if self.budget is None else self.budget.period
            values["budgetLimitMicros"] = None if self.budget is None else self.budget.limit_micros
        return values


def parse_patch(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``expected`` plus the fields to change (absent = unchanged, null = none) as graph properties."""
    patch = SettingsPatch.of_body(body)
    return patch.expected, patch.values()


def check_priced(rt: Runtime, models: list[str]) -> None:
    """A budget is counted from the price of each model call (L6): refuse one that no price could
    count (D9.25) — with no price for a model its calls cost "unknown", so the budget would
    never bind, silently."""
    missing = unpriced(rt, models)
    if missing:
        raise BadInput(
            f"no price for model {missing[0]} in BOTMEMORY_MODEL_PRICES: a budget could not be counted",
            field="budget",
        )


def unpriced(rt: Runtime, models: list[str]) -> list[str]:
    """The models no price in ``BOTMEMORY_MODEL_PRICES`` (or ``*``) counts."""
    prices = rt.settings.model_prices
    return sorted(m for m in models if m not in prices and "*" not in prices)


async def budget_state(rt: Runtime) -> str:
    """For ``/healthz`` (D9.25): ``none`` (no Bot has a budget), ``counted`` (every budgeted Bot's
    models have a price), or ``unpriced`` (the price table lost a model after a budget was set:
    those budgets cannot bind until a price is given)."""
    if "*" in rt.settings.model_prices:
        return "counted"
    budgets, models = await read(rt.driver, memorybot_q.budgeted_models)
    if not budgets:
        return "none"
    return "unpriced" if unpriced(rt, models) else "counted"


async def update_settings(
    rt: Runtime, principal: Principal, bot_id: str, patch: SettingsPatch
) -> MemoryBotSettings:
    """PATCH with ``expected`` = the settings' own version (C3, D9.13); 409 on a mismatch.

    A budget change releases executions that waited for budget when it is no longer spent.
    """
    check_id(bot_id, "botId")
    expected, values = patch.expected, patch.values()

    async def work(tx: AsyncManagedTransaction) -> memorybot_q.SettingsMap:
        await require_owner_writer(tx, principal, bot_id)  # before the lock: a stranger waits for none
        # Checked again under the lock: a write grant taken away while the change waited for it
        # (behind a long commit) let the change through after the removal. (A grant set takes no
        # Memory lock: one taken away between this check and the commit, milliseconds, is not
        # seen.)
        await memorybot_q.lock_settings(tx, bot_id=bot_id)
        await require_owner_writer(tx, principal, bot_id)
        if values.get("budgetLimitMicros") is not None:
            check_priced(rt, await memorybot_q.bot_models(tx, bot_id=bot_id))
        updated = await memorybot_q.update_settings(tx, bot_id=bot_id, expected=expected, values=values)
        if updated is None:
            raise NotFound("bot not found")
        matches, row = updated
        if not matches:
            raise Conflict(f"the settings changed (version {row['settingsVersion']}); read them again")
        return row

    row = await write(rt.driver, work)
    settings = MemoryBotSettings.of(row)
    if "budgetPeriod" in values:
        try:
            await release_budget_waiting(rt, bot_id, settings)
        except Exception as exc:  # Neo4j or Redis away: the change is saved, its answer is given
            # (a 503 here was sent again with the old version, and refused 409); the sweeper
            # releases what waited for budget in its next round
            if unavailable(exc) is None:
                raise
            log.warning("executions waiting for budget were not released (%s)", type(exc).__name__)
    return settings


#: Executions waiting for budget released at once (the longest waiting first); the worker's sweep
#: releases the rest, this many a round.
RELEASE_BATCH: Final = 500


async def release_budget_waiting(rt: Runtime, bot_id: str, settings: MemoryBotSettings) -> int:
    """Executions that waited for budget run again once it is not spent (D9.12), at most
    RELEASE_BATCH of them (the rest in the next sweeps)."""
    if settings.budget is not None:
        period = current_period(settings.budget.period, now_ms())
        micros, _ = await read(rt.driver, lambda tx: memorybot_q.spent(tx, bot_id=bot_id, period=period))
        if micros >= settings.budget.limit_micros:
            return 0
    queued = await write(
        rt.driver,
        lambda tx: sweeps_q.release_budget(tx, bot_id=bot_id, now=now_ms(), limit=RELEASE_BATCH),
    )
    await enqueue_executions(rt, queued)
    return len(queued)


async def load_route(
    rt: Runtime, tx: AsyncManagedTransaction, chat_id: str
) -> tuple[memorybot_q.RouteChat, Route]:
    """The Chat and its route: the Chat's organization's model and switch (L5, L6), read now."""
    row = await memorybot_q.chat_route(tx, chat_id=chat_id)
    if row is None:
        raise NotFound("chat not found")
    return row["chat"], route_of(rt, row)


async def route_and_reader(
    rt: Runtime, chat_id: str, org: str | None = None
) -> tuple[memorybot_q.RouteChat, Route, memory.Reader | None]:
    """The Chat, its route and every reader of an answer in it (None when it has none, D9.15),
    read now in one auto-commit statement. With ``org``, a Chat of another organization is
    NOT_FOUND before anything is made of it (its Bot's data key is not unwrapped, D9.4)."""
    row = await autocommit(rt.driver, lambda s: conversation_q.route_readers(s, chat_id=chat_id))
    if row is None or (org is not None and row["chat"]["organizationId"] != org):
        raise NotFound("chat not found")
    return row["chat"], route_of(rt, row), reader_of(row)


def reader_of(row: conversation_q.RouteReadersRow) -> memory.Reader | None:
    """The readers ROUTE_READERS (or PACK_HEAD) read, as one Reader; None when the Chat has none."""
    readers, org = row["readers"], row["org"]
    return None if readers is None or org is None else memory.Reader(org, tuple(readers))


def route_of(rt: Runtime, row: memorybot_q.RouteRow) -> Route:
    """The route of a Chat as CHAT_ROUTE reads it."""
    s = row["settings"]
    chat = row["chat"]
    return Route(
        bot_id=chat["botId"],
        org=chat["organizationId"],
        model=row["model"],
        bot_memory=bool(row["botMemory"]),
        instructions=s.get("instructions"),
        concurrency=s.get("concurrency"),
        budget_period=s.get("budgetPeriod"),
        budget_limit=s.get("budgetLimitMicros"),
        cipher=rt.cipher(chat["botId"], row["keyMaster"], row["keyWrapped"]),
        chat_id=chat["id"],
        history_epoch=chat.get("historyEpoch", 0),
    )


@dataclass(frozen=True, slots=True)
class Confession:
    id: str
    turn_id: str
    #: None once the Chat's history was deleted (V13).
    text: str | None
    answer: str | None
    entry_ids: tuple[str, ...]
    answered_by: str | None
    created_at: int


#: A record of a Chat (a confession, an enrichment, an execution) as its statement returns it.
Rec = TypeVar("Rec", bound=Mapping[str, object])


@dataclass(frozen=True, slots=True)
class OwnerRecords(Generic[Rec]):
    """A Chat owner's records that used entries, with the entries the owner may see now."""

    cipher: Cipher
    records: list[Rec]
    visible: set[str]
    #: How many records the Chat has in all (the pages' total).
    total: int

    def shown(self, record: Rec) -> tuple[str, ...] | None:
        """The record's entry ids when every one is still visible to the owner (D9.6), and every
        entry its text may draw on (a rewrite's: every entry it was sent), else None."""
        ids = tuple(cast(list[str], record.get("usedEntryIds") or []))
        return ids if set(ids) | set(_drawn_on(record)) <= self.visible else None


def _drawn_on(record: Mapping[str, object]) -> list[str]:
    """The entries a record shows something of: those its text says it used, a rewrite's sent
    ones, and those a learning execution added (its count of them)."""
    named = ("usedEntryIds", "sentEntryIds", "producedIds")
    return [i for key in named for i in cast(list[str], record.get(key) or [])]


#: One page of a Chat's records (tx, chat, skip, limit), and how many it has in all.
RecordList = Callable[[AsyncManagedTransaction, str, int, int], Awaitable[tuple[list[Rec], int]]]


async def owner_records(
    rt: Runtime, principal: Principal, chat_id: str, fetch: RecordList[Rec], *, limit: int, skip: int
) -> OwnerRecords[Rec]:
    """The one read behind the confessions and enrichments routes: the Chat's owner only, the
    records and, in the same transaction under the shared lock, which entries they used the owner
    may still see (the one visibility check, V10)."""
    person_id = require_person(principal)
    check_id(chat_id, "chatId")
    limit, skip = check_page(limit, skip, max_limit=rt.settings.max_page_size)

    async def owned(tx: AsyncManagedTransaction) -> chats_q.ChatForRow:
        row = await chats_q.chat_for(tx, chat_id=chat_id, person_id=person_id)
        if row is None or not row["isPerson"] or row["chat"]["ownerId"] != person_id:
            raise NotFound("chat not found")
        return row

    async def work(tx: AsyncManagedTransaction) -> tuple[chats_q.ChatForRow, list[Rec], int, set[str]]:
        row = await owned(tx)
        chat = row["chat"]
        await shared_lock(tx, bot_id=chat["botId"])
        found, total = await fetch(tx, chat_id, skip, limit)
        used = sorted({str(i) for f in found for i in _drawn_on(f)})
        seen: set[str] = set()
        if used:
            reader = await memory.person_reader(
                tx, bot_id=chat["botId"], person_id=person_id, org=chat["organizationId"]
            )
            if reader is not None:
                seen = await visible_ids(
                    tx,
                    bot_id=chat["botId"],
                    org=chat["organizationId"],
                    readers=[reader],
                    ids=used,
                    active_only=True,
                )
        # Checked again once read (as contextPack and a chat's meta): the records read may have
        # been written after the caller stopped being one of the Chat's people.
        await owned(tx)
        return row, found, total, seen

    row, found, total, seen = await read(rt.driver, work)
    cipher = rt.cipher(row["chat"]["botId"], row["keyMaster"], row["keyWrapped"])
    return OwnerRecords(cipher, found, seen, total)


async def confessions(
    rt: Runtime, principal: Principal, chat_id: str, *, limit: int = 50, skip: int = 0
) -> tuple[list[Confession], int]:
    """The Chat owner's view (D9.6): an answer whose entries are no longer all visible to the
    owner is withheld (only the confession's own text is returned). One page, oldest first, and
    how many there are."""

    async def fetch(
        tx: AsyncManagedTransaction, chat: str, skip: int, limit: int
    ) -> tuple[list[memorybot_q.ConfessionNode], int]:
        return await memorybot_q.list_confessions(tx, chat_id=chat, skip=skip, limit=limit)

    view = await owner_records(rt, principal, chat_id, fetch, limit=limit, skip=skip)
    cipher = view.cipher
    out: list[Confession] = []
    for f in view.records:
        ids = view.shown(f)
        sealed, text = f.get("answer"), f.get("text")
        shown = sealed is not None and ids is not None
        out.append(
            Confession(
                f["id"],
                f["turnId"],
                None if text is None else cipher.decrypt(Kind.CONFESSION, f["id"], text),
                cipher.decrypt(Kind.CONFESSION_ANSWER, f["id"], sealed)
                if sealed is not None and shown
                else None,
                ids if ids is not None and shown else (),
                f.get("answeredBy"),
                f["createdAt"],
            )
        )
    return out, view.total


@dataclass(frozen=True, slots=True)
class Route:
    """Whose model and money a task uses, read when the task runs: the Chat's organization (L6)."""

    bot_id: str
    org: str
    model: str | None
    bot_memory: bool
    instructions: str | None
    concurrency: int | None
    budget_period: str | None
    budget_limit: int | None
    cipher: Cipher
    #: The Chat the task runs for: saved model calls record it, so deleting its history finds them
    #: (D9.23). None for a call that belongs to no Chat.
    chat_id: str | None = None
    #: The Chat's ``historyEpoch`` when the task began: what it saves after a deletion of the
    #: history meanwhile keeps none of the words (D9.23).
    history_epoch: int = 0


def periods(at_ms: int) -> tuple[str, str]:
    """The UTC day and month of a time (budget periods, D9.12)."""
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    return f"day:{at:%Y-%m-%d}", f"month:{at:%Y-%m}"


def current_period(period: str, at_ms: int) -> str:
    day, month = periods(at_ms)
    return day if period == "day" else month
