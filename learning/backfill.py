"""The backfill of retrieval's derived data (design §10): blind keywords first for every entry
that lacks them or holds those of an older tokenisation (``services.keywords.SCHEME``; no model:
a Bot's whole memory is keyword-searchable within seconds), then vectors of the current
embedder, in batches — embedded outside the memory lock, each batch written as one short change.
Progress lives in the graph (what still lacks keywords or a vector), so a killed run simply
starts again and does only what is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from graph import backfill as backfill_q
from graph.driver import read, write
from services import metrics
from services.crypto import Cipher, Kind
from services.derived import seal_vector
from services.embedding import Embedder, embed_each
from services.keywords import SCHEME, blind_text
from services.memory import cipher_of
from services.runtime import Runtime

#: Entries per batch: keywords only (cheap), and with embedding.
KEYWORD_BATCH: Final = 500
VECTOR_BATCH: Final = 64


@dataclass(frozen=True, slots=True)
class Progress:
    total: int
    embedded: int
    keyworded: int

    @property
    def done(self) -> bool:
        return self.embedded >= self.total and self.keyworded >= self.total


async def progress(rt: Runtime, bot_id: str, model: str) -> Progress:
    found = await read(
        rt.driver, lambda tx: backfill_q.progress(tx, bot_id=bot_id, model=model, scheme=SCHEME)
    )
    return Progress(found["total"], found["embedded"], found["keyworded"])


async def bots_to_backfill(rt: Runtime, embedder: Embedder | None, *, gauge: bool = True) -> list[str]:
    """Bots with entries lacking keywords (of the current tokenisation) or a vector of this
    embedder, as their Memory nodes record it (``graph.backfill.BOTS_DUE``: the entries are not
    read), in id order (the lanes go through them in it). ``gauge``: set
    ``botmemory_backfill_due_bots`` to their count (not for the keyword pass's own list)."""
    model = embedder.id if embedder is not None else None
    due = await read(rt.driver, lambda tx: backfill_q.bots_due(tx, model=model, scheme=SCHEME))
    if gauge:
        metrics.BACKFILL_DUE_BOTS.set(len(due))
    return sorted(due)


async def run(
    rt: Runtime,
    bot_id: str,
    embedder: Embedder | None,
    *,
    seconds: float | None = None,
    on_batch: Callable[[str, int], None] | None = None,
) -> bool:
    """Backfill one Bot: keywords for all, then vectors (with an embedder). Stops after about
    ``seconds`` (None: when done); True when nothing is left. ``on_batch(phase, n)`` reports
    progress: ``n`` entries written in phase ``keywords`` or ``vectors``. Raises
    EmbedderUnavailable when the embedder fails (what was written stays written: the next run
    goes on from there). A run that went through every entry with no change of the memory
    meanwhile records on the Memory that none lacks anything (the worker's sweep then passes the
    Bot by until a write leaves one without)."""
    started = time.monotonic()
    cipher = await cipher_of(rt, bot_id)  # NotFound for a Bot that does not exist
    vec_model = None if embedder is None else embedder.id
    began = await write(rt.driver, lambda tx: backfill_q.start(tx, bot_id=bot_id, model=vec_model))
    if began is None:
        return True  # the Bot is gone
    for model, batch in ((None, KEYWORD_BATCH), (vec_model, VECTOR_BATCH)):
        if batch == VECTOR_BATCH and embedder is None:
            break
        after = ""
        while True:
            if seconds is not None and time.monotonic() - started > seconds:
                return False
            found = await read(
                rt.driver,
                lambda tx, after=after, model=model, batch=batch: backfill_q.missing(
                    tx, bot_id=bot_id, model=model, scheme=SCHEME, after=after, limit=batch
                ),
            )
            if not found:
                break
            rows = await _derive(cipher, embedder if model else None, found)
            written = await write(
                rt.driver,
                lambda tx, rows=rows, model=model: backfill_q.write(
                    tx, bot_id=bot_id, batch=rows, model=model
                ),
            )
            if written is None:
                return True  # the Bot is gone
            phase = "vectors" if model else "keywords"
            metrics.BACKFILL_ENTRIES.labels(phase).inc(written)
            if on_batch is not None:
                on_batch(phase, written)
            after = found[-1]["id"]
    await write(
        rt.driver,
        lambda tx: backfill_q.mark_done(tx, bot_id=bot_id, began=began, model=vec_model, scheme=SCHEME),
    )
    return True


async def _derive(
    cipher: Cipher, embedder: Embedder | None, found: list[backfill_q.MissingRow]
) -> list[dict[str, Any]]:
    """Keywords (and sealed vectors with ``embedder``) of the entries read; EmbedderUnavailable
    when embedding failed."""
    texts = cipher.decrypt_all(Kind.ENTRY, [(f["id"], f["content"]) for f in found])
    # A text the embedder refuses alone gets no vector (its entry is found by keywords), and the
    # run goes on past it: a batch refused for one text stopped the Bot's backfill for good.
    vectors = [None] * len(texts) if embedder is None else await embed_each(embedder, texts)
    rows: list[dict[str, Any]] = []
    for i, (f, text) in enumerate(zip(found, texts, strict=True)):
        keywords = blind_text(cipher, text)
        held = f["kwBlind"]
        rows.append(
            {
                "id": f["id"],
                "contentLength": f["contentLength"],
                "orderKey": f["orderKey"],
                "kwBlind": keywords,
                "kwScheme": SCHEME,
                # Other tokens or counts (an index must read them again), not merely another order.
                "kwChanged": held is None or sorted(held.split()) != keywords.split(),
                "vec": None if vectors[i] is None else seal_vector(cipher, f["id"], vectors[i]),
                "vecModel": None if embedder is None or vectors[i] is None else embedder.id,
            }
        )
    return rows
