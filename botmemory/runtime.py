"""The long-lived dependencies of one process, built once at start-up and passed down."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arq.connections import ArqRedis
from neo4j import AsyncDriver

from botmemory.crypto import Cipher, Keyring, WrappedKey
from botmemory.settings import Settings

if TYPE_CHECKING:
    from botmemory.model import Gateway


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    driver: AsyncDriver
    redis: ArqRedis
    keyring: Keyring
    gateway: Gateway

    def cipher(self, bot_id: str, key_master: str, key_wrapped: bytes) -> Cipher:
        """The data-key cipher of one Bot (E1), from its wrapped key as read from the graph."""
        return self.keyring.cipher(bot_id, WrappedKey(key_master, bytes(key_wrapped)))


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the service's time unit)."""
    return time.time_ns() // 1_000_000
