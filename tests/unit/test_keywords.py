"""Keyword tokens and the blind index built from them (services/keywords.py; DESIGN §10, E1)."""

from __future__ import annotations

import os
import re

from services.crypto import Cipher, Keyring
from services.keywords import blind_text, blind_tokens, tokens


def _cipher(bot_id: str) -> Cipher:
    keyring = Keyring(os.urandom(32))
    return keyring.cipher(bot_id, keyring.new_data_key(bot_id))


def test_tokens_stem_and_drop_stopwords() -> None:
    assert tokens("Caroline's paintings were painted here") == ["carolin", "paint", "paint"]
    assert tokens("She is running; he RUNS. They ran!") == ["run", "run", "ran"]
    assert tokens("Melanie’s sunrise, 7 May 2023") == ["melani", "sunris", "7", "2023"]
    assert tokens("LGBTQ support-group") == ["lgbtq", "support", "group"]


def test_tokens_keep_order_and_repeats() -> None:
    assert tokens("dog cat dog") == ["dog", "cat", "dog"]
    assert tokens("it is what it is") == []
    assert tokens("") == []


def test_blind_text_matches_equal_stems_and_hides_words() -> None:
    cipher = _cipher("bot-kw")
    stored = blind_text(cipher, "Caroline's paintings were painted")
    assert stored.split() == [cipher.blind("carolin"), cipher.blind("paint"), cipher.blind("paint")]
    assert blind_text(cipher, "painting") == blind_text(cipher, "paints")
    assert all(re.fullmatch(r"k[0-9a-f]{12}", t) for t in stored.split())
    assert "paint" not in stored
    assert "carolin" not in stored


def test_blind_text_differs_between_bots() -> None:
    text = "Caroline went to a LGBTQ support group"
    first, second = blind_text(_cipher("bot-a"), text), blind_text(_cipher("bot-b"), text)
    assert len(first.split()) == len(second.split()) == 5
    assert set(first.split()).isdisjoint(second.split())


def test_blind_tokens_are_the_distinct_tokens() -> None:
    cipher = _cipher("bot-q")
    query = blind_tokens(cipher, "Paint, painted, painting: what did Caroline paint?")
    assert query == [cipher.blind("paint"), cipher.blind("carolin")]
    assert blind_tokens(cipher, "What is it?") == []
    assert blind_text(cipher, "What is it?") == ""
