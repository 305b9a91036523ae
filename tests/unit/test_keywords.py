"""Keyword tokens of any script and the blind index built from them (services/keywords.py;
DESIGN §10, E1)."""

from __future__ import annotations

import gc
import os
import re
import types

import pytest
import snowballstemmer
from hypothesis import given
from hypothesis import strategies as st

from services import keywords as keywords_module
from services.crypto import Cipher, Keyring
from services.keywords import STOPWORDS, blind_text, blind_tokens, tokens


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
    # Sorted: the counts BM25 needs, not the order of the words.
    assert stored.split() == sorted([cipher.blind("carolin"), cipher.blind("paint"), cipher.blind("paint")])
    assert blind_text(cipher, "Paintings by Caroline, painted") == stored
    assert blind_text(cipher, "painting") == blind_text(cipher, "paints")
    assert all(re.fullmatch(r"k[0-9a-f]{12}", t) for t in stored.split())
    assert "paint" not in stored
    assert "carolin" not in stored


def test_blind_text_differs_between_bots() -> None:
    text = "Caroline went to a LGBTQ support group"
    first, second = blind_text(_cipher("bot-a"), text), blind_text(_cipher("bot-b"), text)
    assert len(first.split()) == len(second.split()) == 5
    assert set(first.split()).isdisjoint(second.split())


def _held_by(root: object, words: tuple[str, ...]) -> list[str]:
    """The strings holding any of ``words`` reachable from ``root`` through the objects it refers
    to (other modules' objects left out, but not what this one's functions and classes reach)."""
    held: list[str] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        at = stack.pop()
        if id(at) in seen:
            continue
        seen.add(id(at))
        if isinstance(at, str):
            held += [at] if any(w in at for w in words) else []
        elif at is root or not isinstance(at, types.ModuleType):
            stack.extend(gc.get_referents(at))
    return held


def test_blinding_leaves_no_word_in_the_process() -> None:
    """E1's spirit in memory: keywording an entry or a query keeps no word of it after it returns
    — not in a cache (the blind tokens are found by a keyed hash), not in a stemmer's state (a
    Snowball stemmer holds the last word it stemmed) — while a word met again is served from the
    cache, the same token as before."""
    cipher = _cipher("bot-held")
    # Made at run time: the test's own source (held by linecache) must not spell them.
    words = tuple("".join(["qu", "ixotic", suffix]) for suffix in ("", "al", "ness"))
    stored = blind_text(cipher, " ".join(["Remember", words[0], "and", words[1]]))
    query = blind_tokens(cipher, " ".join(["Who", words[2]]), scope="r")
    stem = tokens(words[0])[0]  # after blinding: tokens() itself caches nothing either
    assert _held_by(keywords_module, (stem, *words)) == []
    assert blind_tokens(cipher, words[0], scope="r") == [cipher.blind(stem)]
    assert stored.split() == sorted([cipher.blind("rememb"), cipher.blind(stem), cipher.blind(stem)])
    assert query == [cipher.blind(tokens(words[2])[0])]
    assert _held_by(keywords_module, words) == []


def test_a_readers_words_are_cached_for_that_reader_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word one reader asked (or an entry held) is blinded again for another reader: what the
    cache holds, so how long a query takes, tells no reader what others asked or wrote lately."""
    cipher = _cipher("bot-scoped")
    cached: dict[bytes, str] = {}
    monkeypatch.setattr(keywords_module, "_BLINDED", cached)
    blind_text(cipher, "lighthouse keepers")
    before = 2
    assert len(cached) == before
    first = blind_tokens(cipher, "lighthouse keepers", scope="reader-a")
    assert len(cached) == before + 2
    assert blind_tokens(cipher, "keepers of the lighthouse", scope="reader-a") == first[::-1]
    assert len(cached) == before + 2  # the same reader again: served from the cache
    assert blind_tokens(cipher, "lighthouse keepers", scope="reader-b") == first
    assert len(cached) == before + 4


def test_blind_tokens_are_the_distinct_tokens() -> None:
    cipher = _cipher("bot-q")
    query = blind_tokens(cipher, "Paint, painted, painting: what did Caroline paint?", scope="r")
    assert query == [cipher.blind("paint"), cipher.blind("carolin")]
    assert blind_tokens(cipher, "What is it?", scope="r") == []
    assert blind_text(cipher, "What is it?") == ""


def scheme_1_tokens(text: str) -> list[str]:
    """The tokens of scheme 1, written out independently: runs of [a-z0-9] of the lowercased
    text without possessives, stopwords dropped, Snowball English stems."""
    stemmer = snowballstemmer.stemmer("english")
    words = re.findall(r"[a-z0-9]+", re.sub(r"['’]s\b", " ", text.lower()))
    return [stemmer.stemWord(w) for w in words if w not in STOPWORDS]


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_ascii_text_keeps_the_tokens_of_scheme_1(text: str) -> None:
    """Entries of ASCII text keyworded before scheme 2 need nothing again (the backfill rewrites
    only what changed)."""
    assert tokens(text) == scheme_1_tokens(text)


def test_accents_and_case_fold_so_names_meet_however_typed() -> None:
    assert tokens("José Müller went to the café") == ["jose", "muller", "went", "cafe"]
    assert tokens("Zoë") == tokens("ZOE") == tokens("zoe") == ["zoe"]
    assert tokens("Björk’s songs") == ["bjork", "song"]  # a possessive, and an English stem
    assert tokens("naïve résumé") == tokens("naive resume")
    assert tokens("STRASSE") == tokens("straße")
    assert tokens("ＡＢＣ１２３ ﬁle") == ["abc123", "file"]  # full-width forms and ligatures


def test_words_of_every_script_are_tokens_stemmed_by_their_scripts_language() -> None:
    assert tokens("Шарик, моя собака") == ["шарик", "мо", "собак"]
    assert tokens("ШАРИКА") == tokens("шарику") == ["шарик"]  # Russian cases meet
    assert tokens("Анны") == tokens("Анна")
    assert tokens("Ο Γιώργος") == tokens("ο γιωργος")  # accents and the final sigma fold
    assert tokens("Γιώργου") == tokens("Γιώργος")
    assert tokens("مرحبا بالعالم") == tokens("مرحبا العالم")
    # A Devanagari word keeps its vowel signs and virama (marks): one token, not its consonants.
    assert tokens("हिन्दी भाषा") == ["हिन्द", "भाष"]
    # A Latin letter that does not fold to ASCII: no language to stem by.
    assert tokens("Søren’s books") == ["søren", "book"]


def test_han_kana_and_hangul_become_pairs_of_characters() -> None:
    assert tokens("我的狗叫小白") == ["我的", "的狗", "狗叫", "叫小", "小白"]
    assert tokens("小白") == ["小白"]
    assert tokens("狗") == ["狗"]
    assert tokens("iPhone15を買った") == ["iphone15", "を買", "買っ", "った"]
    assert tokens("서울에서 만나요") == ["서울", "울에", "에서", "만나", "나요"]


def test_thai_lao_myanmar_and_khmer_runs_become_pairs_of_clusters() -> None:
    """Written without spaces too: each letter keeps the marks on it (a Thai vowel above or below,
    a tone mark, a Khmer subscript sign), and a run becomes its overlapping pairs of them."""
    assert tokens("สมชาย") == ["สม", "มช", "ชา", "าย"]
    assert tokens("ฉันชื่อสมชาย")[:3] == ["ฉัน", "นชื่", "ชื่อ"]  # ั and ื ่ stay on their letters
    assert tokens("iPhoneของฉัน") == ["iphon", "ขอ", "อง", "งฉั", "ฉัน"]  # a Latin word apart
    assert tokens("ខ្ញុំ") == ["ខ្ញុំ"]  # two clusters: one pair
    assert tokens("ສະບາຍດີ") == ["ສະ", "ະບ", "ບາ", "າຍ", "ຍດີ"]


def test_a_query_in_any_script_meets_the_entry_that_holds_its_words() -> None:
    cipher = _cipher("bot-scripts")
    pairs = [
        ("Мою собаку зовут Шарик", "Шарик"),
        ("我的狗叫小白，它三岁了", "小白"),
        ("Meeting José at the Café Müller", "jose cafe muller"),
        ("東京で寿司を食べた", "寿司"),
        ("แอนพบสมชายที่ตลาด", "สมชาย"),
    ]
    for entry, query in pairs:
        stored = set(blind_text(cipher, entry).split())
        wanted = blind_tokens(cipher, query, scope="r")
        assert wanted and set(wanted) <= stored, (entry, query)
