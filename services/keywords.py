"""Keywords for the blind index (DESIGN §10, E1): tokens of any script, each stored and queried
only as the Bot's keyed hash (``Cipher.blind``).

The text is normalised (NFKC: full-width forms and ligatures become plain letters and digits),
case-folded, and its Latin, Greek and Cyrillic accents are dropped, so "José", "JOSE" and "jose"
meet, as do "Zoë" and "Zoe". A word is a run of letters, digits and the marks of its script (a
Devanagari or Arabic word keeps its vowel signs), without a possessive ``'s``. Scripts written
without spaces become overlapping pairs: a run of Han, kana or Hangul its pairs of characters (one
character alone stays one token), as Lucene's CJK analyser does ("小白" in a query meets
"我的狗叫小白"); a run of Thai, Lao, Myanmar or Khmer its pairs of clusters, a letter with the
marks on it ("สมชาย" meets "ฉันชื่อสมชาย"; a dictionary segmenter would cut words, and none is in
the stack). Other words are tokens unless they are English stopwords, reduced by the Snowball
stemmer of their script's main language: ASCII words by the English one, so "paints" and
"painted" meet on "paint"; Cyrillic by the Russian one ("Анны" and "Анна" meet), Greek, Arabic,
Armenian, Devanagari (Hindi) and Tamil by theirs; the rest are kept whole (a Latin word with a
letter that does not fold to ASCII, such as "Søren": its language is anyone's guess).

Text of ASCII alone gives the tokens it gave before any of this (scheme 1: runs of ``[a-z0-9]``);
entries keyworded by an older :data:`SCHEME` are keyworded again by the backfill. An entry's
blind tokens are stored sorted (scheme 1 stored them in the text's order). BM25 scoring
only compares tokens for equality, so it ranks the hashes exactly as it would rank the words.
Neither the text nor a token is ever stored or logged, nor kept in memory past the call that
keywords it (the cache of blind tokens is keyed by keyed hashes).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
import threading
import unicodedata
from typing import Final, Protocol, cast

from services.crypto import Cipher
from services.kept import keep_newest

#: The tokenisation entries' keywords were made by (``kwScheme``): 1 read ``[a-z0-9]`` runs only
#: (a word of another script had no token; "José" gave "jos") and stored the blind tokens in the
#: text's order; 2 reads every script and stores them sorted; 3 also pairs the clusters of Thai,
#: Lao, Myanmar and Khmer runs (2 kept such a run, often a whole sentence, as one token).
SCHEME: Final = 3

_WORD: Final = re.compile(r"[a-z0-9]+")
_POSSESSIVE: Final = re.compile(r"['’]s\b")
_BLIND: Final = re.compile(r"k[0-9a-f]+")
#: The accents of Latin, Greek and Cyrillic letters once decomposed (Combining Diacritical Marks).
_ACCENTS: Final = re.compile("[\u0300-\u036f]")
#: Han (with its extensions and compatibility ideographs), hiragana, katakana, Hangul syllables
#: and jamo: written without spaces between words.
#: Thai, Lao, Myanmar and Khmer: also written without spaces, with marks on their letters.
_UNSPACED: Final = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
_CJK: Final = (
    "\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\U00020000-\U0003134f"
)

_STOPWORDS_TEXT: Final = """a an the and or but if of to in on at by for with from as is are was were be been being am
    do does did doing have has had having i me my we our you your he him his she her it its they
    them their this that these those what which who whom whose when where why how there here than
    then so not no yes can could will would shall should may might must about into over after
    before up down out just also too very s t don didn doesn isn wasn any some all each both few
    more most other such only own same again further once during while until"""
#: Words too common to tell entries apart (their hashes would only add noise to BM25).
STOPWORDS: Final = frozenset(_STOPWORDS_TEXT.split())


#: The Snowball stemmer of a script's main language, by the first word of its letters' Unicode
#: names (a word's script is its first letter's).
_STEMMED_SCRIPTS: Final = {
    "CYRILLIC": "russian",
    "GREEK": "greek",
    "ARABIC": "arabic",
    "ARMENIAN": "armenian",
    "DEVANAGARI": "hindi",
    "TAMIL": "tamil",
}


class _Stemmer(Protocol):
    def stemWord(self, word: str) -> str: ...
    def set_current(self, value: str) -> None: ...


_local = threading.local()


def _stemmer(language: str) -> _Stemmer:
    # A Snowball stemmer keeps its state on the instance: one per language and thread. Always the
    # pure Python one, whose only state is the word at hand (``snowballstemmer.stemmer`` hands out
    # PyStemmer's when that is installed, which keeps the words it stemmed in a cache of its own).
    stemmers = cast(dict[str, _Stemmer] | None, getattr(_local, "stemmers", None))
    if stemmers is None:
        stemmers = _local.stemmers = {}
    stemmer = stemmers.get(language)
    if stemmer is None:
        module = importlib.import_module(f"snowballstemmer.{language}_stemmer")
        stemmer = stemmers[language] = cast(_Stemmer, getattr(module, f"{language.capitalize()}Stemmer")())
    return stemmer


def _stem(unit: str) -> str:
    """A unit's token: an ASCII word by the English stemmer, a word of a stemmed script by its
    language's, anything else (a pair, a word of another script) whole. The stemmer is left
    holding no word."""
    language = (
        "english" if unit.isascii() else _STEMMED_SCRIPTS.get(unicodedata.name(unit[0], "").partition(" ")[0])
    )
    if language is None:
        return unit
    stemmer = _stemmer(language)
    try:
        return stemmer.stemWord(unit)
    finally:
        stemmer.set_current("")


#: The blind tokens of the units blinded last, each found by its Bot's keyed hash of who asked
#: and the unit (``Cipher.cache_key``): a unit is stemmed (~22 µs an English word) and hashed once
#: per asker while it stays here, and nothing here holds a word — a cache of every tenant's words
#: would outlive the requests that brought them. Kept per asker, as ``QueryVectors`` is: a query's
#: time tells no reader whether someone else asked or wrote its words lately. The oldest go
#: first, one at a time.
_BLINDED: dict[bytes, str] = {}
_BLINDED_MAX: Final = 65_536
_BLINDED_LOCK: Final = threading.Lock()
#: The asker that keywords entries (their writers and the backfill share it).
ENTRIES: Final = "\0entries"


def _blinded(cipher: Cipher, text: str, scope: str) -> list[str]:
    """The blind tokens of ``text``'s keywords in order, repeats kept, cached for ``scope``."""
    found: list[str] = []
    for unit in _units(text):
        key = cipher.cache_key(f"{scope}\0{unit}")
        with _BLINDED_LOCK:
            token = _BLINDED.get(key)
        if token is None:
            token = cipher.blind(_stem(unit))
            with _BLINDED_LOCK:
                keep_newest(_BLINDED, key, token, _BLINDED_MAX)
        found.append(token)
    return found


def tokens(text: str) -> list[str]:
    """The keyword tokens of ``text`` in order, repeats kept (BM25 counts them)."""
    return [_stem(unit) for unit in _units(text)]


def _units(text: str) -> list[str]:
    """What ``text``'s tokens are made of, in order: its words but stopwords, and its pairs, each
    before stemming."""
    if text.isascii():  # the common case, and scheme 1's tokens exactly
        return [w for w in _WORD.findall(_POSSESSIVE.sub(" ", text.lower())) if w not in STOPWORDS]
    text = unicodedata.normalize("NFKC", text).casefold()
    if text.isascii():  # full-width letters, ligatures: what their plain forms give
        return _units(text)
    folded = unicodedata.normalize("NFC", _ACCENTS.sub("", unicodedata.normalize("NFKD", text)))
    found: list[str] = []
    for cjk, unspaced, word in _runs().findall(_POSSESSIVE.sub(" ", folded)):
        if cjk:
            found += _pairs(list(cjk))
        elif unspaced:
            found += _pairs(_clusters(unspaced))
        elif word not in STOPWORDS:
            found.append(word)
    return found


def _pairs(units: list[str]) -> list[str]:
    """The overlapping pairs of ``units`` (one unit alone stays one token)."""
    return units if len(units) == 1 else [units[i] + units[i + 1] for i in range(len(units) - 1)]


def _clusters(word: str) -> list[str]:
    """``word`` cut before every character that is not a mark (each letter with its marks)."""
    cut: list[str] = []
    for char in word:
        if cut and unicodedata.category(char)[0] == "M":
            cut[-1] += char
        else:
            cut.append(char)
    return cut


@functools.cache
def _runs() -> re.Pattern[str]:
    """Runs of Han, kana or Hangul (first group), of Thai, Lao, Myanmar or Khmer with their marks
    (second), and of letters, digits and marks of any other script (third). Made when first
    needed (listing the marks takes ~10 ms): marks lie below U+20000 and in plane 14 only (its
    variation selectors)."""
    marks: list[str] = []
    start = last = -1
    for code in itertools.chain(range(0x300, 0x20000), range(0xE0000, 0xE1000)):
        if unicodedata.category(chr(code))[0] == "M":
            start = code if start < 0 else start
            last = code
        elif start >= 0:
            marks.append(f"{re.escape(chr(start))}-{re.escape(chr(last))}")
            start = -1
    mark = f"[{''.join(marks)}]"
    other = f"(?:[^\\W_]|{mark})"
    unspaced = f"(?:[{_UNSPACED}]|{mark})"
    return re.compile(f"([{_CJK}]+)|((?=[{_UNSPACED}]){unspaced}+)|((?:(?![{_CJK}{_UNSPACED}]){other})+)")


def blind_text(cipher: Cipher, text: str) -> str:
    """The stored keywords of a text (an entry's ``kwBlind``): its blind tokens, sorted, joined by
    spaces. BM25 needs each token's count, not the order of the words: stored in the text's order,
    a sequence of keyed hashes would hand whoever reads the store the language's word order (or,
    for Han, the chain of overlapping pairs) to decode them by."""
    return " ".join(sorted(_blinded(cipher, text, ENTRIES)))


def blind_tokens(cipher: Cipher, text: str, *, scope: str) -> list[str]:
    """The distinct blind tokens of a query's keywords, in order (empty: no keyword); ``scope``:
    who asks (``services.search.reader_scope``: a reader of the Bot)."""
    blinded = list(dict.fromkeys(_blinded(cipher, text, scope)))
    assert all(_BLIND.fullmatch(b) for b in blinded), "a blind token is not [k0-9a-f]"
    return blinded
