"""What is derived from an entry's text so that it can be found by meaning (design §10): its
keywords as blind tokens (keyed hashes, never words) and its vector, sealed like content (E1).

Both are made before a change takes the memory lock (embedding is model work, C1) and written
with the entry in the same commit, so an entry is searchable from the commit that creates it.
Without an embedder, or when it fails, the entry is written with its keywords only; the backfill
embeds it later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from services.crypto import Cipher, Kind, Sealed
from services.embedding import Embedder, EmbedderUnavailable, embed_each, encode_vector
from services.keywords import SCHEME, blind_text

log = logging.getLogger("botmemory.derived")


@dataclass(frozen=True, slots=True)
class Derived:
    kw_blind: str
    vec: Sealed | None
    vec_model: str | None

    @property
    def row(self) -> dict[str, Any]:
        """The entry properties (``kwBlind`` and the ``kwScheme`` that made it, ``vec``,
        ``vecModel``) as a statement takes them."""
        return {"kwBlind": self.kw_blind, "kwScheme": SCHEME, "vec": self.vec, "vecModel": self.vec_model}


async def derive(
    cipher: Cipher, embedder: Embedder | None, texts: dict[str, str], seconds: float
) -> dict[str, Derived]:
    """Keywords and sealed vectors of ``texts`` (entry id → text), in one embedding batch; no
    vectors when the embedder fails or takes longer than ``seconds``, none for a text it refuses
    alone (:func:`services.embedding.embed_each`)."""
    if not texts:
        return {}
    vectors: list[Any] = [None] * len(texts)
    if embedder is not None:
        try:
            vectors = await embed_each(embedder, list(texts.values()), seconds)
        except EmbedderUnavailable as exc:
            log.warning("embedding failed (%s); the backfill embeds these entries later", exc.code)
    derived: dict[str, Derived] = {}
    for (entry_id, text), vector in zip(texts.items(), vectors, strict=True):
        model = None if vector is None or embedder is None else embedder.id
        sealed = None if model is None else seal_vector(cipher, entry_id, vector)
        derived[entry_id] = Derived(blind_text(cipher, text), sealed, model)
    return derived


def seal_vector(cipher: Cipher, entry_id: str, vector: Any) -> Sealed:
    """An entry's vector as stored: quantised, then encrypted bound to the entry (E1)."""
    return cipher.encrypt_bytes(Kind.ENTRY_VECTOR, entry_id, encode_vector(vector))
