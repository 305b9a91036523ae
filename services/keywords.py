"""Keywords for the blind index (DESIGN §10, E1): stemmed tokens, each stored and queried only
as the Bot's keyed hash (``Cipher.blind``).

A token is a run of ``[a-z0-9]`` in the lowercased text, without a possessive ``'s``, not a
stopword, reduced by the Snowball English stemmer, so "paints" and "painted" meet on "paint".
BM25 scoring only compares tokens for equality, so it ranks the hashes exactly as it would rank
the words. Neither the text nor a token is ever stored or logged.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Final, Protocol, cast

import snowballstemmer

from services.crypto import Cipher

_WORD: Final = re.compile(r"[a-z0-9]+")
_POSSESSIVE: Final = re.compile(r"['’]s\b")
_BLIND: Final = re.compile(r"k[0-9a-f]+")

_STOPWORDS_TEXT: Final = """a an the and or but if of to in on at by for with from as is are was were be been being am
    do does did doing have has had having i me my we our you your he him his she her it its they
    them their this that these those what which who whom whose when where why how there here than
    then so not no yes can could will would shall should may might must about into over after
    before up down out just also too very s t don didn doesn isn wasn any some all each both few
    more most other such only own same again further once during while until"""
#: Words too common to tell entries apart (their hashes would only add noise to BM25).
STOPWORDS: Final = frozenset(_STOPWORDS_TEXT.split())


class _Stemmer(Protocol):
    def stemWord(self, word: str) -> str: ...


_local = threading.local()


def _stemmer() -> _Stemmer:
    # A Snowball stemmer keeps its state on the instance: one per thread.
    stemmer = cast(_Stemmer | None, getattr(_local, "stemmer", None))
    if stemmer is None:
        stemmer = cast(_Stemmer, snowballstemmer.stemmer("english"))
        _local.stemmer = stemmer
    return stemmer


@functools.lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    return _stemmer().stemWord(word)


def tokens(text: str) -> list[str]:
    """The stemmed keyword tokens of ``text`` in order, repeats kept (BM25 counts them)."""
    words = _WORD.findall(_POSSESSIVE.sub(" ", text.lower()))
    return [_stem(w) for w in words if w not in STOPWORDS]


def blind_text(cipher: Cipher, text: str) -> str:
    """The stored keywords of a text (an entry's ``kwBlind``): its blind tokens joined by spaces."""
    return " ".join(cipher.blind(t) for t in tokens(text))


def blind_tokens(cipher: Cipher, text: str) -> list[str]:
    """The distinct blind tokens of a query's keywords, in order (empty: no keyword)."""
    blinded = list(dict.fromkeys(cipher.blind(t) for t in tokens(text)))
    assert all(_BLIND.fullmatch(b) for b in blinded), "a blind token is not [k0-9a-f]"
    return blinded
