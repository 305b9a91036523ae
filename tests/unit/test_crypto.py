"""Envelope encryption (services/crypto.py, E1): the stored format, associated data binding a
ciphertext to its kind and record, data keys wrapped per Bot, and master-key rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from services import crypto
from services.crypto import Cipher, DecryptionError, Keyring, Kind, WrappedKey, fingerprint

#: Every Kind as stored: a value is part of the associated data of data already at rest, so a
#: changed value makes those ciphertexts unreadable. Add new kinds here; never edit a value.
KIND_VALUES = {
    "DATA_KEY": "data-key",
    "ENTRY": "entry",
    "ITEM": "item",
    "CHANGE": "change",
    "CONFESSION": "confession",
    "CONFESSION_ANSWER": "confession-answer",
    "ENRICHMENT": "enrichment",
    "ENRICHMENT_ORIGINAL": "enrichment-original",
    "CHAT_SUMMARY": "chat-summary",
    "MODEL_REQUEST": "model-request",
    "MODEL_RESULT": "model-result",
    "ENTRY_VECTOR": "entry-vector",
    "INPUT_DIGEST": "input",
    "REQUEST_DIGEST": "request",
}

K1, K2, K3 = (bytes([n]) * 32 for n in (1, 2, 3))
DATA_KEY = bytes(range(32))
BOT = "bot_a"


def cipher_of(keyring: Keyring, bot: str = BOT) -> Cipher:
    return keyring.cipher(bot, keyring.new_data_key(bot))


CIPHER = cipher_of(Keyring(K1))


def test_kind_values_never_change() -> None:
    assert {k.name: k.value for k in Kind} == KIND_VALUES
    assert len(Kind.__members__) == len(KIND_VALUES)  # no alias hides a duplicated value


def test_stored_format_is_version_nonce_and_gcm_over_kind_and_record_id() -> None:
    """A ciphertext written by hand in the documented format opens: the format of data at rest."""
    keyring = Keyring(K1)
    cipher = keyring.cipher(BOT, keyring.wrap(BOT, DATA_KEY))
    nonce = b"\x07" * 12
    blob = b"\x01" + nonce + AESGCM(DATA_KEY).encrypt(nonce, "héllo".encode(), b"entry:mem_1")
    assert cipher.decrypt(Kind.ENTRY, "mem_1", blob) == "héllo"
    assert cipher.decrypt(Kind.ENTRY, "mem_1", base64.b64encode(blob).decode()) == "héllo"
    sealed = cipher.encrypt(Kind.ENTRY, "mem_1", "héllo")  # stored as the blob's base64 text
    mine = base64.b64decode(sealed, validate=True)
    assert mine[:1] == b"\x01" and len(mine) == 1 + 12 + len("héllo".encode()) + 16
    assert AESGCM(DATA_KEY).decrypt(mine[1:13], mine[13:], b"entry:mem_1") == "héllo".encode()


def test_wrapped_data_key_format_and_master_fingerprint() -> None:
    wrapped = Keyring(K1).wrap(BOT, DATA_KEY)
    assert wrapped.master_id == hashlib.sha256(b"botmemory-master-key:" + K1).hexdigest()[:16]
    assert wrapped.master_id == fingerprint(K1) != fingerprint(K2)
    blob = wrapped.wrapped
    assert blob[:1] == b"\x01"
    assert AESGCM(K1).decrypt(blob[1:13], blob[13:], f"data-key:{BOT}".encode()) == DATA_KEY


@given(kind=st.sampled_from(list(Kind)), record=st.text(min_size=1, max_size=40), text=st.text(max_size=200))
def test_round_trip(kind: Kind, record: str, text: str) -> None:
    blob = CIPHER.encrypt(kind, record, text)
    assert CIPHER.decrypt(kind, record, blob) == text
    assert CIPHER.decrypt_all(kind, [(record, blob), (record, blob)]) == [text, text]


def test_the_same_text_encrypts_differently_each_time() -> None:
    assert CIPHER.encrypt(Kind.ITEM, "i-1", "same") != CIPHER.encrypt(Kind.ITEM, "i-1", "same")


def test_a_ciphertext_moved_to_another_record_kind_or_bot_fails() -> None:
    blob = CIPHER.encrypt(Kind.ENTRY, "mem_1", "secret")
    with pytest.raises(DecryptionError):
        CIPHER.decrypt(Kind.ENTRY, "mem_2", blob)
    with pytest.raises(DecryptionError):
        CIPHER.decrypt(Kind.ITEM, "mem_1", blob)
    with pytest.raises(DecryptionError):
        cipher_of(Keyring(K1), "bot_b").decrypt(Kind.ENTRY, "mem_1", blob)
    with pytest.raises(DecryptionError):  # the decrypt_all path checks every record
        CIPHER.decrypt_all(Kind.ENTRY, [("mem_1", blob), ("mem_2", blob)])


@pytest.mark.parametrize("position", [0, 1, 12, 13, -1])
def test_a_tampered_or_truncated_ciphertext_fails(position: int) -> None:
    blob = bytearray(base64.b64decode(CIPHER.encrypt(Kind.CHANGE, "v1", "payload")))
    blob[position] ^= 0x01
    with pytest.raises(DecryptionError):
        CIPHER.decrypt(Kind.CHANGE, "v1", bytes(blob))
    with pytest.raises(DecryptionError):
        CIPHER.decrypt(Kind.CHANGE, "v1", base64.b64encode(blob).decode())


@pytest.mark.parametrize(
    "blob",
    [b"", b"\x01", b"\x01" + b"\x00" * 27, b"\x02" + b"\x00" * 40, "", "not base64!", "AQ==", "A" * 41],
)
def test_malformed_ciphertexts_are_decryption_errors(blob: str | bytes) -> None:
    with pytest.raises(DecryptionError):
        CIPHER.decrypt(Kind.ITEM, "i-1", blob)


def test_a_wrapped_key_is_bound_to_its_bot_and_master() -> None:
    keyring = Keyring(K1)
    wrapped = keyring.wrap(BOT, DATA_KEY)
    assert keyring.unwrap(BOT, wrapped) == DATA_KEY
    with pytest.raises(DecryptionError):
        keyring.unwrap("bot_b", wrapped)
    with pytest.raises(DecryptionError, match="unknown master"):
        Keyring(K2).unwrap(BOT, wrapped)
    with pytest.raises(DecryptionError):  # a key claiming the right master but sealed by another
        keyring.unwrap(BOT, WrappedKey(wrapped.master_id, Keyring(K2).wrap(BOT, DATA_KEY).wrapped))


def test_rotation_rewraps_data_keys_and_keeps_old_ciphertexts_readable() -> None:
    old = Keyring(K1)
    wrapped = old.new_data_key(BOT)
    blob = old.cipher(BOT, wrapped).encrypt(Kind.ENTRY, "mem_1", "kept")

    rotating = Keyring(K2, [K1])
    assert rotating.current_id == fingerprint(K2)
    assert rotating.cipher(BOT, wrapped).decrypt(Kind.ENTRY, "mem_1", blob) == "kept"
    rewrapped = rotating.rewrap(BOT, wrapped)
    assert rewrapped.master_id == fingerprint(K2) != wrapped.master_id
    assert rotating.unwrap(BOT, rewrapped) == old.unwrap(BOT, wrapped)
    assert rotating.rewrap(BOT, rewrapped) is rewrapped  # already current: untouched

    after = Keyring(K2)  # the old master key is gone; content was never re-encrypted
    assert after.cipher(BOT, rewrapped).decrypt(Kind.ENTRY, "mem_1", blob) == "kept"
    with pytest.raises(DecryptionError):
        after.unwrap(BOT, wrapped)
    with pytest.raises(DecryptionError):
        Keyring(K3, [K2]).rewrap(BOT, wrapped)  # a key of a master no longer known


def test_data_keys_are_fresh_per_bot() -> None:
    keyring = Keyring(K1)
    assert keyring.unwrap(BOT, keyring.new_data_key(BOT)) != keyring.unwrap(BOT, keyring.new_data_key(BOT))
    assert len(keyring.unwrap(BOT, keyring.new_data_key(BOT))) == 32


def test_cipher_is_cached_per_bot() -> None:
    keyring = Keyring(K1)
    assert keyring.cached(BOT) is None
    cipher = keyring.cipher(BOT, keyring.wrap(BOT, DATA_KEY))
    assert keyring.cached(BOT) is cipher
    assert keyring.cached("bot_b") is None


def test_digest_is_a_keyed_hmac_per_bot_and_kind() -> None:
    keyring = Keyring(K1)
    cipher = keyring.cipher(BOT, keyring.wrap(BOT, DATA_KEY))
    digest_key = hashlib.sha256(b"botmemory-digest:" + DATA_KEY).digest()
    expected = hmac.new(digest_key, b"input:hello", hashlib.sha256).hexdigest()
    assert cipher.digest(Kind.INPUT_DIGEST, "hello") == expected  # stored digests stay findable
    assert cipher.digest(Kind.INPUT_DIGEST, "hello") != cipher.digest(Kind.ENTRY, "hello")
    other = Keyring(K1).cipher("bot_b", Keyring(K1).wrap("bot_b", os.urandom(32)))
    assert other.digest(Kind.INPUT_DIGEST, "hello") != expected
    assert hashlib.sha256(b"input:hello").hexdigest() != expected  # not a plain hash


def test_ciphers_kept_are_the_most_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process keeps the ciphers of the CIPHERS_KEPT most recently used Bots; a Bot dropped is
    unwrapped again when next needed, to the same cipher's effect."""
    monkeypatch.setattr(crypto, "CIPHERS_KEPT", 2)
    keyring = Keyring(K1)
    wrapped = {bot: keyring.wrap(bot, DATA_KEY) for bot in ("a", "b", "c")}
    first = keyring.cipher("a", wrapped["a"])
    sealed = first.encrypt(Kind.ENTRY, "e1", "text")
    keyring.cipher("b", wrapped["b"])
    assert keyring.cached("a") is first  # a used again: b is now the oldest
    keyring.cipher("c", wrapped["c"])
    assert keyring.cached("b") is None
    keyring.cipher("b", wrapped["b"])  # a is the oldest now: dropped
    assert keyring.cached("a") is None
    assert keyring.cipher("a", wrapped["a"]).decrypt(Kind.ENTRY, "e1", sealed) == "text"
