"""Embeddings as the services layer sees them (DESIGN §10): the ``Embedder`` protocol that
``learning.embedders`` implements, and the stored form of a vector.

A stored vector is int8 with one float32 scale: ``scale = max|v| / 127``, ``q = round(v / scale)``
clipped to ±127, serialised as the little-endian float32 scale followed by the int8 values
(``dims + 4`` bytes). It is encrypted (``Kind.ENTRY_VECTOR``, E1) before it leaves the process.
A decoded vector is used as ``q * scale``; for cosine ranking of L2-normalised vectors the int8
dot product times the scale is enough.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Sequence
from typing import Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from services import metrics
from services.kept import keep_newest

_SCALE: Final = np.dtype("<f4")
_SCALE_BYTES: Final = 4
_QMAX: Final = 127.0
T = TypeVar("T")

#: The code of a request the embeddings endpoint answered as invalid.
REFUSED: Final = "refused"
#: What tells a refused text from an endpoint that refuses every request (``embed_each``).
PROBE: Final = "ok"


class EmbedderUnavailable(Exception):
    """No vectors; ``code`` says why (never content): model_mismatch, model_missing, no_model,
    timeout, provider_error, malformed, refused (the endpoint answered the request as invalid:
    one of its texts, perhaps, see :func:`embed_each`)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Embedder(Protocol):
    """Turns texts into L2-normalised vectors of one fixed size."""

    @property
    def id(self) -> str:
        """Stored with each vector: a vector of another embedder is never compared with it."""
        ...

    @property
    def dims(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Shape ``(len(texts), dims)``, each row of length 1. Raises EmbedderUnavailable."""
        ...

    async def aclose(self) -> None: ...


async def embed_within(embedder: Embedder, texts: Sequence[str], seconds: float) -> npt.NDArray[np.float32]:
    """``embedder.embed(texts)``, waited for ``seconds`` at most: an embeddings endpoint that hangs
    raises EmbedderUnavailable("timeout") then, as one that fails raises its own code."""
    return await _within(seconds, embedder.embed(texts))


async def _within(seconds: float | None, work: Awaitable[T]) -> T:
    """``work``, waited for ``seconds`` at most (None: no bound): EmbedderUnavailable("timeout")."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise EmbedderUnavailable("timeout") from None


async def embed_each(
    embedder: Embedder, texts: Sequence[str], seconds: float | None = None
) -> list[npt.NDArray[np.float32] | None]:
    """A vector for each text, or None for a text the embedder refuses: a request refused
    (``refused``: an endpoint answering 400/413/422, as self-hosted ones do for a text over their
    model's limit) is first told apart from an endpoint that refuses every request (a wrong model
    or size) by one request of a short fixed text (``PROBE``); that refused too, it raises
    ``refused`` as any other failure raises its code. Otherwise the batch is halved until the
    refused texts stand alone, so one text no longer costs a whole change or backfill batch its
    vectors (the backfill stopped at it for good). ``seconds`` bounds it all."""
    refused = 0
    probed = False

    async def part(chunk: Sequence[str]) -> list[npt.NDArray[np.float32] | None]:
        nonlocal refused, probed
        try:
            return list(await embedder.embed(chunk))
        except EmbedderUnavailable as exc:
            if exc.code != REFUSED:
                raise
            if not probed:
                await embedder.embed([PROBE])  # refused too: the endpoint's fault, not a text's
                probed = True
            if len(chunk) == 1:
                refused += 1
                return [None]
            half = len(chunk) // 2
            return await part(chunk[:half]) + await part(chunk[half:])

    vectors = await _within(seconds, part(list(texts)))
    metrics.EMBEDDINGS_REFUSED.inc(refused)
    return vectors


def encode_vector(vector: npt.NDArray[np.float32]) -> bytes:
    """The stored form of one vector: float32 scale (little-endian), then the int8 values."""
    v = np.asarray(vector, dtype=np.float32).ravel()
    if not np.isfinite(v).all():
        raise ValueError("vector has a non-finite value")
    top = float(np.abs(v).max()) if v.size else 0.0
    scale = top / _QMAX if top > 0.0 else 1.0
    q = np.clip(np.rint(v / scale), -_QMAX, _QMAX).astype(np.int8)
    return np.array([scale], dtype=_SCALE).tobytes() + q.tobytes()


def decode_vector(raw: bytes) -> tuple[npt.NDArray[np.int8], float]:
    """The int8 values and the scale of one stored vector."""
    if len(raw) <= _SCALE_BYTES:
        raise ValueError("stored vector too short")
    scale = float(np.frombuffer(raw, dtype=_SCALE, count=1)[0])
    return np.frombuffer(raw, dtype=np.int8, offset=_SCALE_BYTES), scale


def decode_vectors(raws: Sequence[bytes], dims: int) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Many stored vectors of ``dims`` values at once: an ``(n, dims)`` int8 matrix and the
    ``(n,)`` float32 scales. Raises ValueError when a vector has another size."""
    width = dims + _SCALE_BYTES
    if any(len(raw) != width for raw in raws):
        raise ValueError(f"stored vector is not {dims} values")
    rows = np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), width)
    scales = rows[:, :_SCALE_BYTES].copy().view(_SCALE).ravel().astype(np.float32)
    return np.ascontiguousarray(rows[:, _SCALE_BYTES:]).view(np.int8), scales


class QueryVectors:
    """The vectors of the queries this process embedded last, by who asked (``scope``: a Bot and
    a reader's keys), embedder and a keyed digest of the text (never the text itself), the least
    recently used dropped first. A person's message is often a query twice — the enrichment of
    their Turn, then ``contextPack`` for the same message — and with an embeddings endpoint each
    embedding is a round trip. Kept for everyone alike, the time of a search told whether anyone
    on this process had lately asked exactly that (another organization's person too)."""

    #: Queries kept (a 384-dimension vector and its key: ~1.7 kB each, ~7 MB in all).
    KEPT: Final = 4096

    def __init__(self, most: int = KEPT) -> None:
        self._kept: dict[tuple[str, str, bytes], npt.NDArray[np.float32]] = {}
        self._most = most

    def get(self, scope: str, model: str, text: str) -> npt.NDArray[np.float32] | None:
        key = (scope, model, _digest(text))
        found = self._kept.get(key)
        if found is not None:
            keep_newest(self._kept, key, found, self._most)
        return found

    def put(self, scope: str, model: str, text: str, vector: npt.NDArray[np.float32]) -> None:
        keep_newest(self._kept, (scope, model, _digest(text)), vector, self._most)


#: The key of the queries' digests, the process's own: a digest found in a dump of its memory
#: confirms no guess of what someone asked.
_DIGEST_KEY: Final = secrets.token_bytes(32)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, key=_DIGEST_KEY).digest()
