"""Service settings, read once at start-up from ``BOTMEMORY_*`` environment variables.

Secrets live in ``SecretStr`` so they never appear in a repr or a log line.
Locally (``env != production``) missing secrets are generated into ``data_dir``
on first start and read back afterwards; in production they must be given.
"""

from __future__ import annotations

import base64
import fcntl
import logging
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError


class ConfigurationError(RuntimeError):
    """The settings cannot start the service (message never holds a secret)."""


class ModelPrice(BaseModel):
    """Micro-USD per million prompt (``input``) and completion (``output``) tokens."""

    input: int = Field(ge=0)
    output: int = Field(ge=0)


#: What a learning job has past its steps' deadlines: the reads and the commit around a step.
JOB_MARGIN_SECONDS: Final = 60.0


class Settings(BaseSettings):
    #: An empty variable is an unset one: ``BOTMEMORY_PREVIOUS_MASTER_KEYS=`` (the old key
    #: dropped by blanking it, or a compose ``.env`` line) failed to parse as a list and ended
    #: every process at start.
    model_config = SettingsConfigDict(env_prefix="BOTMEMORY_", extra="ignore", env_ignore_empty=True)

    env: Literal["local", "test", "production"] = "local"
    data_dir: Path = Path(".data")

    neo4j_uri: str = "bolt://127.0.0.1:7687"
    neo4j_user: str = "neo4j"
    neo4j_password: SecretStr | None = None
    neo4j_bolt_port: int = Field(default=7687, ge=1, le=65535)
    #: Seconds a managed transaction is retried while Neo4j does not answer (a restart, a leader
    #: change) or on a deadlock, before the request is answered 503 UNAVAILABLE (an auto-commit
    #: statement has its own few attempts, ``graph.driver.autocommit``).
    neo4j_retry_seconds: float = Field(default=15.0, gt=0, le=600)
    #: Sizes as Java and Neo4j read them: a number and k, m or g (``1gb`` ended the launcher with
    #: the JVM's "A fatal exception has occurred", which named no setting).
    neo4j_heap: str = Field(default="1g", pattern=r"^[0-9]+[kKmMgG]?$")
    neo4j_pagecache: str = Field(default="512m", pattern=r"^[0-9]+[kKmMgG]?$")

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_port: int = Field(default=6379, ge=1, le=65535)
    #: Seconds a Redis command, or a connection to Redis, may take before it fails; the change and
    #: Turn feeds' listeners also ask a silent connection for an answer after this long and open a
    #: new one when none comes within it. Without it, a Redis that accepts connections and never
    #: answers (paused, or its address moved by a failover) held requests and feeds for ever.
    redis_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    #: How often an API process checks that the Bots its memoryChanges streams follow have no
    #: change it was never told of (an announcement lost with its writer or with Redis).
    change_audit_seconds: float = Field(default=10.0, gt=0)

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    #: Where a worker serves its Prometheus ``/metrics`` (0: not served).
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = Field(default=9464, ge=0, le=65535)

    master_key: SecretStr | None = Field(default=None, description="base64 of 32 random bytes")
    previous_master_keys: list[SecretStr] = Field(
        default_factory=list[SecretStr], description="older master keys still accepted while a rotation runs"
    )
    admin_token: SecretStr | None = None
    #: The bearer token the API's ``/metrics`` asks for; without one it answers nobody in
    #: production, and elsewhere only clients on this host that come through no proxy. Its counters move with what searches met, hidden
    #: entries included, so they are operators' data (services.auth.check_scraper).
    metrics_token: SecretStr | None = None

    openai_base_url: str | None = Field(default=None, validation_alias="OPENAI_BASE_URL")
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    #: Micro-USD per million tokens, per model: {"gpt-4o-mini": {"input": 150000, "output": 600000}}.
    #: A model missing here falls back to "*" if given; without a price a call's cost is unknown.
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict[str, ModelPrice])

    # Memory-Bot deadlines (D9.11) and the learning machinery (D9.9). Each is positive: a lease of
    # 0 renewed itself in a tight loop and let every sweep take a running step over, a sweep
    # interval of 0 swept without pause, no attempts called no model (all accepted before).
    answer_deadline_seconds: float = Field(default=15.0, gt=0)
    step_deadline_seconds: float = Field(default=120.0, gt=0)
    model_attempt_timeout_seconds: float = Field(default=60.0, gt=0)
    model_max_attempts: int = Field(default=3, ge=1)
    turn_idle_timeout_seconds: float = Field(default=600.0, gt=0)
    lease_seconds: float = Field(default=30.0, gt=0)
    #: A memory-Bot task slot (``concurrency``, D9.25) is a lease renewed every third of this;
    #: the slots of a killed process come back within it.
    slot_lease_seconds: float = Field(default=15.0, gt=0)
    sweep_interval_seconds: float = Field(default=2.0, gt=0)
    #: How long a request's idempotency key replays what it created (``services.idempotency``).
    idempotency_key_seconds: float = Field(default=86400.0, gt=0)
    requeue_after_seconds: float = Field(default=30.0, gt=0)
    answer_context_chars: int = Field(default=4000, ge=1)
    chat_deadline_seconds: float = Field(default=60.0, gt=0)
    runner_history_items: int = Field(default=20, ge=0)
    summary_threshold_chars: int = Field(default=20_000, ge=1)
    max_evidence_items: int = Field(default=200, ge=1)
    #: The most characters of Items one learning step or summary sends (its first Item whatever
    #: its size): bounded by count alone, 200 Items of 20,000 characters passed any model's
    #: context, the provider refused the same request every time, and the Chat learned no more.
    max_evidence_chars: int = Field(default=60_000, ge=1)
    max_model_answer_bytes: int = Field(default=1_000_000, ge=1)

    # Retrieval by meaning (DESIGN §10): "local" runs the shipped MiniLM in this process,
    # "openai" calls an OpenAI-compatible /v1/embeddings endpoint, "none" turns embedding off.
    embedder: Literal["local", "openai", "none"] = "local"
    #: The embeddings endpoint; None uses ``openai_base_url`` (one of them is required for "openai").
    embedding_base_url: str | None = None
    #: The embeddings model; required when ``embedder`` is "openai".
    embedding_model: str | None = None
    #: Requested vector size (the endpoint's ``dimensions``); required when ``embedder`` is
    #: "openai" (the size is stored with each vector).
    embedding_dimensions: int | None = Field(default=None, gt=0)
    #: The embeddings endpoint's key; None falls back to ``openai_api_key`` (OPENAI_API_KEY) when
    #: the endpoint is at the chat provider's origin (scheme, host, port), else no key is sent.
    embedding_api_key: SecretStr | None = None
    #: CPU threads of the local embedder (onnxruntime intra-op threads).
    embedding_threads: int = Field(default=1, ge=1)
    #: Threads of numpy's BLAS for the index's scans (services.vectorindex). One: OpenBLAS's idle
    #: workers spin on the cores after every call, and Neo4j on the same machine needs them
    #: (measured: search's p95 at 100k three times as long with two).
    index_threads: int = Field(default=1, ge=1)
    #: What the Bots' search indexes of one process may hold together, in MiB (~92 MB a 100k
    #: entries): past it the least recently searched are dropped and loaded again when searched.
    index_memory_mb: int = Field(default=1024, ge=1)
    #: Texts per embedder call (one ONNX run, or one /v1/embeddings request).
    embedding_batch: int = Field(default=64, ge=1)
    #: How long a search (and so an enrichment) waits for its query's vector before it searches by
    #: keywords alone: an embeddings endpoint that hangs must not hold them (a request's own
    #: timeout is ``model_attempt_timeout_seconds``, 60 s, and it is tried twice).
    query_embedding_timeout_seconds: float = Field(default=2.0, gt=0)
    #: How long a change waits for its new entries' vectors before it writes them with keywords
    #: only (the backfill embeds them later).
    embedding_timeout_seconds: float = Field(default=10.0, gt=0)
    #: Workers sweep for entries that lack keywords or a vector of the current embedder (after an
    #: upgrade, an embedder change or an outage) and backfill them in the background.
    backfill: bool = True
    #: How many Bots' backfills run at once (each embeds on ``embedding_threads``); the others wait
    #: for a lane (``services.jobs.start_backfills``). A sweep after an upgrade or an embedder
    #: change (every Bot due) queued a job for each at once, and learning steps waited behind
    #: thousands of them; one lane leaves the other cores to learning and the API.
    backfill_lanes: int = Field(default=1, ge=1)

    # Request limits (GraphQL and REST).
    max_query_depth: int = Field(default=12, ge=1)
    max_aliases: int = Field(default=30, ge=1)
    #: What one GraphQL operation's root fields may cost (``schema.cost``: a model call 50, a
    #: search, context or memory read 10, any other field 1).
    max_operation_cost: int = Field(default=100, ge=1)
    #: Operations running at once on one WebSocket (subscriptions, and queries or mutations not
    #: yet answered), and sockets one person (a platform token, the operator) holds open in one
    #: API process, whatever tokens they issued: each subscription is a subscriber every change is
    #: checked and executed for, so one client could otherwise hold thousands.
    max_socket_operations: int = Field(default=100, ge=1)
    max_sockets_per_person: int = Field(default=64, ge=1)
    #: ``max_sockets_per_person``'s old name, taken when that one is not set.
    max_sockets_per_token: int | None = Field(default=None, ge=1)
    #: How long an accepted WebSocket may wait for its ``connection_init`` before it is closed (4408).
    socket_init_seconds: float = Field(default=10.0, gt=0, le=60)
    max_query_tokens: int = Field(default=2000, ge=1)
    max_body_bytes: int = Field(default=1_000_000, ge=1)
    #: How long a request's body may take to arrive, from when its handler starts reading it, before
    #: it is answered 408 TOO_SLOW: without a bound, a client that promises more bytes than it sends
    #: holds its request (and a handler) for as long as its connection stays open.
    body_read_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    #: A request's URL (path and query string) and its headers, in bytes (414 and 431 past them).
    #: (A search's 2,000 characters of emoji are ~24,000 bytes percent-encoded.)
    max_url_bytes: int = Field(default=32_768, ge=256)
    max_header_bytes: int = Field(default=65_536, ge=1_024)
    max_text_chars: int = Field(default=20_000, ge=1)
    max_page_size: int = Field(default=200, ge=1)

    log_level: str = "INFO"

    @field_validator("log_level")
    @classmethod
    def _a_log_level(cls, level: str) -> str:
        """One of logging's levels, in any case (``verbose`` started the process and failed in
        ``logging`` with a traceback that did not name the setting)."""
        if level.upper() not in logging.getLevelNamesMapping():
            raise ValueError(f"a log level: {', '.join(logging.getLevelNamesMapping())}")
        return level.upper()

    @model_validator(mode="after")
    def _an_embeddings_endpoint_named_whole(self) -> Settings:
        """``embedder=openai`` needs its model, its size and an endpoint the operator named (its
        own, else ``OPENAI_BASE_URL``): checked here, before anything starts — found when the
        embedder was made, after the API had migrated the database — and memory text is never
        sent to a provider nobody named."""
        if self.embedder != "openai":
            return self
        missing = [
            name
            for name, value in (
                ("BOTMEMORY_EMBEDDING_MODEL", self.embedding_model),
                ("BOTMEMORY_EMBEDDING_DIMENSIONS", self.embedding_dimensions),
                (
                    "BOTMEMORY_EMBEDDING_BASE_URL (or OPENAI_BASE_URL)",
                    self.embedding_base_url or self.openai_base_url,
                ),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)} required when BOTMEMORY_EMBEDDER=openai")
        return self

    @model_validator(mode="after")
    def _socket_cap_by_its_old_name(self) -> Settings:
        """A deployment that set the socket cap by its old name keeps its cap."""
        if self.max_sockets_per_token is not None and "max_sockets_per_person" not in self.model_fields_set:
            self.max_sockets_per_person = self.max_sockets_per_token
        return self

    @model_validator(mode="after")
    def _addresses_follow_ports(self) -> Settings:
        """The local stack's Neo4j and Redis listen on ``neo4j_bolt_port`` and ``redis_port``;
        with only a port set, the processes connect there too. They connected to the default
        URI's port whatever the port said: ``BOTMEMORY_NEO4J_BOLT_PORT=7688 make up`` started
        Neo4j on 7688 and then waited for it on 7687."""
        if "neo4j_uri" not in self.model_fields_set and "neo4j_bolt_port" in self.model_fields_set:
            self.neo4j_uri = f"bolt://127.0.0.1:{self.neo4j_bolt_port}"
        if "redis_url" not in self.model_fields_set and "redis_port" in self.model_fields_set:
            self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        return self

    def resolved(self) -> Settings:
        """Fill missing local secrets from (or into) ``data_dir``; refuse in production."""
        updates: dict[str, SecretStr] = {}
        for name, path, make in (
            ("master_key", "master-key", lambda: base64.b64encode(secrets.token_bytes(32)).decode()),
            ("neo4j_password", "neo4j-password", lambda: secrets.token_urlsafe(24)),
            ("admin_token", "admin-token", lambda: "adm_" + secrets.token_urlsafe(32)),
        ):
            if getattr(self, name) is not None:
                continue
            if self.env == "production":
                raise ConfigurationError(
                    f"BOTMEMORY_{name.upper()} is required when BOTMEMORY_ENV=production"
                )
            updates[name] = SecretStr(read_or_create(self.data_dir / path, make))
        return self.model_copy(update=updates) if updates else self

    def job_seconds(self) -> float:
        """arq's timeout of a learning execution's job: two step deadlines and the margin. A job
        begins a step only while that step's deadline ends within the first two
        (``learning.executions.ExecutionRunner``), so the timeout never cancels a step half way
        (its model call unsaved, its cost uncounted)."""
        return 2 * self.step_deadline_seconds + JOB_MARGIN_SECONDS

    def stop_seconds(self) -> float:
        """How long a worker asked to stop (SIGTERM) waits for its running jobs: one step and the
        margin. A job begins no step once asked, so the step it is in ends, its model call saved
        and charged (cancelled halfway, the provider billed a call that was never counted, and
        the next epoch paid for it again)."""
        return self.step_deadline_seconds + JOB_MARGIN_SECONDS

    def master_key_bytes(self) -> bytes:
        if self.master_key is None:
            raise ConfigurationError("master key missing")
        return decode_key(self.master_key, "BOTMEMORY_MASTER_KEY")

    def previous_master_key_bytes(self) -> list[bytes]:
        keys = [decode_key(k, "BOTMEMORY_PREVIOUS_MASTER_KEYS") for k in self.previous_master_keys]
        previous_file = self.data_dir / "master-key.previous"
        if self.env != "production" and previous_file.exists():  # one key a line
            keys += [
                decode_key(SecretStr(k), "master-key.previous") for k in previous_file.read_text().split()
            ]
        return keys


def decode_key(value: SecretStr, name: str) -> bytes:
    """A master key: base64 of exactly 32 bytes."""
    try:
        key = base64.b64decode(value.get_secret_value(), validate=True)
    except ValueError as exc:
        raise ConfigurationError(f"{name} is not valid base64") from exc
    if len(key) != 32:
        raise ConfigurationError(f"{name} must decode to 32 bytes")
    return key


def read_or_create(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path``, made at the first start. The file appears whole or not at all
    (:func:`write_secret`): the API and a worker starting together on a fresh
    data dir read a file the other had created but not yet written — an empty key — and a start
    killed in between left an empty file for good, which is made again (nothing can have used it).
    Starters take turns on the directory (``flock``): two that found the same empty file each made
    a key, and the second's unlink removed the first's, which went on using a key no file held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        if path.exists():
            value = path.read_text().strip()
            if value:
                return value
            path.unlink()
        value = make()
        write_secret(path, value)
        return value
    finally:
        os.close(directory)  # and its lock


def write_secret(path: Path, value: str) -> None:
    """``value`` into ``path``, whole or not at all and readable by its owner only from the first
    byte: written aside (0600), synced, then renamed over it (``rotate-master-key --generate``
    wrote its key files in place, truncated first, with the umask's mode until a chmod)."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def parse_settings() -> Settings:
    """The settings as the environment gives them, local secrets not filled in. A value of the
    wrong shape is named by its setting and the rule it breaks, never quoted: pydantic's error
    quotes the input, and a secret of the wrong shape (``BOTMEMORY_PREVIOUS_MASTER_KEYS`` as one
    JSON string instead of a list, or a bare key) is checked as its shape before it is a secret,
    so the start-up traceback held the key."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False, include_context=False)
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
    except SettingsError as exc:  # a list or map that is not JSON (its cause holds the value)
        named = re.search(r'field "(\w+)"', str(exc))
        setting = f"BOTMEMORY_{named.group(1).upper()}" if named else "a list or map setting"
        raise ConfigurationError(
            f'invalid settings: {setting} is not JSON (a list: ["...", ...]; a map: {{...}})'
        ) from None


def load_settings() -> Settings:
    """Build the one settings object of a process (:func:`parse_settings`, then the local
    secrets from the data dir)."""
    return parse_settings().resolved()
