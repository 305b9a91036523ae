"""Envelope encryption at rest (E1): AES-256-GCM, one data key per Bot wrapped by the master key.

A ciphertext is ``version(1) | nonce(12) | ciphertext+tag``, stored as its base64 text (a
``Sealed`` string): Neo4j hands a string property back to a driver in a fraction of the time it
takes for the same bytes as a byte array (measured: 55 ciphertexts of 300 bytes, 0.6 ms as
strings vs 16 ms as byte arrays — the byte array goes out a byte at a time), which is most of
a ranked read's cost. Records written before as byte arrays still open. Its associated data is
``kind:record_id``, so a ciphertext copied onto another record (or another kind of
record) fails to decrypt. Data keys are wrapped with the master key and tagged with the
master key's fingerprint; rotation re-wraps data keys and never touches content.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from prometheus_client import Counter

from services import metrics
from services.kept import keep_newest

_VERSION = b"\x01"
#: Bots whose cipher a process keeps (the least recently used is dropped first).
CIPHERS_KEPT: Final = 65_536
_NONCE_BYTES = 12

#: A ciphertext as stored: the base64 text of ``version | nonce | ciphertext+tag``.
Sealed = str
#: What a read hands to ``decrypt``: a ``Sealed`` text, or the raw bytes of a record stored
#: before ciphertexts were stored as text.
Stored = str | bytes


class Kind(StrEnum):
    """What a ciphertext is: part of its associated data (``kind:record_id``, E1), so a ciphertext
    moved onto another kind of record fails to open. The one list of them; a value never changes."""

    DATA_KEY = "data-key"
    ENTRY = "entry"
    ITEM = "item"
    CHANGE = "change"
    CONFESSION = "confession"
    CONFESSION_ANSWER = "confession-answer"
    ENRICHMENT = "enrichment"
    ENRICHMENT_ORIGINAL = "enrichment-original"
    CHAT_SUMMARY = "chat-summary"
    MODEL_REQUEST = "model-request"
    MODEL_RESULT = "model-result"
    #: An entry's embedding (id = entry id): the bytes of ``services.embedding.encode_vector``.
    ENTRY_VECTOR = "entry-vector"
    #: Keyed digests of a person's input (the rewrite cache), not a ciphertext.
    INPUT_DIGEST = "input"
    #: Keyed digests of a request sent with an idempotency key (``services.idempotency``).
    REQUEST_DIGEST = "request"


class DecryptionError(Exception):
    """A ciphertext does not belong to this record, or its key is unknown."""


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A Bot data key as stored in the graph: the master key's fingerprint and the wrapped bytes."""

    master_id: str
    wrapped: bytes


def fingerprint(master_key: bytes) -> str:
    """A non-secret id of a master key (first 16 hex chars of SHA-256 over a label and the key)."""
    return hashlib.sha256(b"botmemory-master-key:" + master_key).hexdigest()[:16]


def _aad(kind: Kind, record_id: str) -> bytes:
    return f"{kind}:{record_id}".encode()


class Keyring:
    """The master keys a process knows: the current one, and older ones during a rotation."""

    def __init__(self, current: bytes, previous: Iterable[bytes] = ()) -> None:
        self._current_id = fingerprint(current)
        self._masters = {fingerprint(k): AESGCM(k) for k in (current, *previous)}
        self._digest_keys = {
            fingerprint(k): hashlib.sha256(b"botmemory-service-digest:" + k).digest()
            for k in (current, *previous)
        }
        # A Bot's data key never changes (rotation only re-wraps it), so its cipher is cached per
        # Bot: the CIPHERS_KEPT most recently used (a Bot dropped is unwrapped again when needed).
        self._data_keys: dict[str, Cipher] = {}

    @property
    def current_id(self) -> str:
        return self._current_id

    @property
    def known_ids(self) -> list[str]:
        """The names of every master key this keyring holds (the current one first)."""
        return [self._current_id, *(k for k in self._masters if k != self._current_id)]

    def digest(self, kind: Kind, text: str, master_id: str | None = None) -> str | None:
        """A keyed digest (HMAC-SHA256) of what belongs to no one Bot, under a key derived from the
        master key ``master_id`` (the current one by default); None when that key is not known."""
        key = self._digest_keys.get(master_id or self._current_id)
        if key is None:
            return None
        return hmac.new(key, f"{kind}:{text}".encode(), hashlib.sha256).hexdigest()

    def new_data_key(self, bot_id: str) -> WrappedKey:
        """Make a fresh data key for a Bot, wrapped by the current master key."""
        return self.wrap(bot_id, AESGCM.generate_key(bit_length=256))

    def wrap(self, bot_id: str, data_key: bytes) -> WrappedKey:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._masters[self._current_id].encrypt(nonce, data_key, _aad(Kind.DATA_KEY, bot_id))
        return WrappedKey(self._current_id, _VERSION + nonce + sealed)

    def unwrap(self, bot_id: str, key: WrappedKey) -> bytes:
        master = self._masters.get(key.master_id)
        if master is None:
            raise DecryptionError("data key is wrapped by an unknown master key")
        return _open(master, key.wrapped, _aad(Kind.DATA_KEY, bot_id))

    def rewrap(self, bot_id: str, key: WrappedKey) -> WrappedKey:
        """Wrap the same data key with the current master key (rotation; content is untouched)."""
        if key.master_id == self._current_id:
            return key
        return self.wrap(bot_id, self.unwrap(bot_id, key))

    def cached(self, bot_id: str) -> Cipher | None:
        """The Bot's cipher if its data key was unwrapped before and is still kept (data keys
        never change)."""
        cipher = self._data_keys.get(bot_id)
        if cipher is not None:
            keep_newest(self._data_keys, bot_id, cipher, CIPHERS_KEPT)
        return cipher

    def cipher(self, bot_id: str, key: WrappedKey) -> Cipher:
        cipher = self.cached(bot_id)
        if cipher is None:
            data_key = self.unwrap(bot_id, key)
            cipher = Cipher(
                AESGCM(data_key),
                hashlib.sha256(b"botmemory-digest:" + data_key).digest(),
                hashlib.sha256(b"botmemory-blind-index:" + data_key).digest(),
            )
            keep_newest(self._data_keys, bot_id, cipher, CIPHERS_KEPT)
        return cipher


class Cipher:
    """Encrypts and decrypts the records of one Bot with its data key, and keyed digests."""

    def __init__(self, aes: AESGCM, digest_key: bytes, blind_key: bytes) -> None:
        self._aes = aes
        self._digest_key = digest_key
        self._blind_key = blind_key
        self._cache_key = hashlib.sha256(b"botmemory-keyword-cache:" + blind_key).digest()

    def digest(self, kind: Kind, text: str) -> str:
        """A keyed digest (HMAC-SHA256) to find equal texts without storing them (no dictionary attack)."""
        return hmac.new(self._digest_key, f"{kind}:{text}".encode(), hashlib.sha256).hexdigest()

    def blind(self, token: str) -> str:
        """One keyword of the per-Bot blind index (DESIGN §10): ``k`` and 12 hex characters of an
        HMAC-SHA256 under a key of its own, so Lucene's whitespace analyzer keeps it one token and
        it never reads as a word. Equal tokens give equal outputs within one Bot only."""
        return "k" + hmac.new(self._blind_key, token.encode(), hashlib.sha256).hexdigest()[:12]

    def cache_key(self, text: str) -> bytes:
        """What a process's cache finds a word's blind token by (``services.keywords``): a keyed
        BLAKE2b of who asked and the word under a key of its own, so the cache holds no word and
        two Bots' words never meet in it."""
        return hashlib.blake2b(text.encode(), key=self._cache_key, digest_size=16).digest()

    def encrypt(self, kind: Kind, record_id: str, plaintext: str) -> Sealed:
        return self.encrypt_bytes(kind, record_id, plaintext.encode())

    def decrypt(self, kind: Kind, record_id: str, blob: Stored) -> str:
        _decryptions(kind).inc()
        return _open(self._aes, blob, _aad(kind, record_id)).decode()

    def decrypt_all(self, kind: Kind, records: Sequence[tuple[str, Stored]]) -> list[str]:
        """``decrypt`` of many (record id, ciphertext) of one kind, counted at once."""
        _decryptions(kind).inc(len(records))
        return [_open(self._aes, blob, _aad(kind, record_id)).decode() for record_id, blob in records]

    def encrypt_bytes(self, kind: Kind, record_id: str, data: bytes) -> Sealed:
        """``encrypt`` of bytes (same format and associated data)."""
        nonce = os.urandom(_NONCE_BYTES)
        blob = _VERSION + nonce + self._aes.encrypt(nonce, data, _aad(kind, record_id))
        return base64.b64encode(blob).decode("ascii")

    def decrypt_bytes(self, kind: Kind, record_id: str, blob: Stored) -> bytes:
        """``decrypt`` to bytes, counted like every decryption (E2)."""
        _decryptions(kind).inc()
        return _open(self._aes, blob, _aad(kind, record_id))

    def decrypt_bytes_all(self, kind: Kind, records: Sequence[tuple[str, Stored]]) -> list[bytes]:
        """``decrypt_bytes`` of many (record id, ciphertext) of one kind, counted at once."""
        _decryptions(kind).inc(len(records))
        return [_open(self._aes, blob, _aad(kind, record_id)) for record_id, blob in records]


@functools.cache
def _decryptions(kind: Kind) -> Counter:
    """The decryption counter of one record kind (looked up once: ``labels`` costs more than ``inc``)."""
    return metrics.DECRYPTIONS.labels(kind=kind)


def _open(aes: AESGCM, stored: Stored, aad: bytes) -> bytes:
    if isinstance(stored, bytes):
        blob = stored
    else:
        try:
            blob = base64.b64decode(stored, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise DecryptionError("unknown ciphertext format") from exc
    if blob[:1] != _VERSION or len(blob) < 1 + _NONCE_BYTES + 16:
        raise DecryptionError("unknown ciphertext format")
    try:
        return aes.decrypt(blob[1 : 1 + _NONCE_BYTES], blob[1 + _NONCE_BYTES :], aad)
    except InvalidTag as exc:
        raise DecryptionError("ciphertext does not match its record") from exc
