"""Byte ciphertexts and blind keywords of a Bot's cipher (services/crypto.py; E1, E2, DESIGN §10)."""

from __future__ import annotations

import base64
import os
import re

import pytest
from prometheus_client import REGISTRY

from services.crypto import Cipher, DecryptionError, Keyring, Kind


def _cipher(bot_id: str) -> Cipher:
    keyring = Keyring(os.urandom(32))
    return keyring.cipher(bot_id, keyring.new_data_key(bot_id))


def _decryptions(kind: Kind) -> float:
    return REGISTRY.get_sample_value("botmemory_decryptions_total", {"kind": kind.value}) or 0.0


def test_bytes_round_trip_and_are_counted() -> None:
    cipher = _cipher("bot-bytes")
    data = bytes(range(256)) * 3
    blob = cipher.encrypt_bytes(Kind.ENTRY_VECTOR, "e-1", data)
    assert data not in base64.b64decode(blob)
    before = _decryptions(Kind.ENTRY_VECTOR)
    assert cipher.decrypt_bytes(Kind.ENTRY_VECTOR, "e-1", blob) == data
    empty = cipher.encrypt_bytes(Kind.ENTRY_VECTOR, "e-2", b"")
    assert cipher.decrypt_bytes(Kind.ENTRY_VECTOR, "e-2", empty) == b""
    assert _decryptions(Kind.ENTRY_VECTOR) == before + 2


def test_bytes_are_bound_to_their_kind_and_record() -> None:
    cipher = _cipher("bot-bound")
    blob = cipher.encrypt_bytes(Kind.ENTRY_VECTOR, "e-1", b"vector")
    with pytest.raises(DecryptionError):
        cipher.decrypt_bytes(Kind.ENTRY_VECTOR, "e-2", blob)
    with pytest.raises(DecryptionError):
        cipher.decrypt_bytes(Kind.ENTRY, "e-1", blob)
    with pytest.raises(DecryptionError):
        _cipher("bot-bound").decrypt_bytes(Kind.ENTRY_VECTOR, "e-1", blob)  # another data key


def test_text_and_bytes_share_one_format() -> None:
    cipher = _cipher("bot-format")
    text = cipher.encrypt(Kind.ENTRY_VECTOR, "e-1", "héllo")
    assert cipher.decrypt_bytes(Kind.ENTRY_VECTOR, "e-1", text) == "héllo".encode()
    data = cipher.encrypt_bytes(Kind.ENTRY_VECTOR, "e-1", b"ok")
    assert cipher.decrypt(Kind.ENTRY_VECTOR, "e-1", data) == "ok"


def test_decrypt_bytes_all_counts_once_per_record() -> None:
    cipher = _cipher("bot-all")
    ids = [f"e-{i}" for i in range(5)]
    records = [(r, cipher.encrypt_bytes(Kind.ENTRY_VECTOR, r, bytes([i]) * 8)) for i, r in enumerate(ids)]
    before = _decryptions(Kind.ENTRY_VECTOR)
    assert cipher.decrypt_bytes_all(Kind.ENTRY_VECTOR, records) == [bytes([i]) * 8 for i in range(5)]
    assert _decryptions(Kind.ENTRY_VECTOR) == before + 5
    with pytest.raises(DecryptionError):
        cipher.decrypt_bytes_all(Kind.ENTRY_VECTOR, [("e-0", records[1][1])])


def test_blind_tokens_are_keyed_per_bot() -> None:
    first, second = _cipher("bot-one"), _cipher("bot-two")
    token = first.blind("paint")
    assert re.fullmatch(r"k[0-9a-f]{12}", token)
    assert first.blind("paint") == token
    assert first.blind("painter") != token
    assert second.blind("paint") != token
    assert "paint" not in token
