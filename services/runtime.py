"""The long-lived dependencies of one process, built once at start-up and passed down."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from arq.connections import ArqRedis
from neo4j import AsyncDriver

from services.crypto import Cipher, Keyring, WrappedKey
from services.embedding import QueryVectors
from services.kept import keep_newest
from services.redisquiet import QuietRedis
from services.settings import Settings
from services.vectorindex import VectorIndexes


class LineLengths:
    """How long a line of ``context`` has been, per reader of a Bot (``services.retrieval.reader_scope``),
    as this process returned them: a moving mean that sizes
    the first page of context's statement (only speed depends on it) and how many entries
    ``context(query)`` asks for (which ones fill its budget may)."""

    #: Answers with fewer lines say too little about the next one.
    MIN_LINES = 4
    #: Bots whose mean is kept (the least recently observed is dropped first).
    KEPT = 65_536

    def __init__(self) -> None:
        self._mean: dict[str, float] = {}

    def mean(self, bot_id: str) -> float | None:
        return self._mean.get(bot_id)

    def observe(self, bot_id: str, characters: int, lines: int) -> None:
        """An answer of ``lines`` lines that took ``characters`` (newlines included)."""
        if lines < self.MIN_LINES:
            return
        seen, before = characters / lines, self._mean.get(bot_id)
        keep_newest(self._mean, bot_id, seen if before is None else before + (seen - before) / 4, self.KEPT)


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    driver: AsyncDriver
    redis: ArqRedis
    keyring: Keyring
    #: Best-effort Redis calls skip Redis while it does not answer.
    quiet: QuietRedis
    line_lengths: LineLengths = field(default_factory=LineLengths)
    vectors: VectorIndexes = field(default_factory=VectorIndexes)
    query_vectors: QueryVectors = field(default_factory=QueryVectors)

    def cipher(self, bot_id: str, key_master: str, key_wrapped: bytes) -> Cipher:
        """The data-key cipher of one Bot (E1), from its wrapped key as read from the graph."""
        return self.keyring.cipher(bot_id, WrappedKey(key_master, bytes(key_wrapped)))


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the service's time unit)."""
    return time.time_ns() // 1_000_000
