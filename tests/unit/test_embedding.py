"""Embedders and the stored vector form (learning/embedders.py, services/embedding.py; DESIGN §10).

The local embedder is the real shipped MiniLM; the OpenAI-compatible one talks through the real
``openai`` client to a small ``/v1/embeddings`` server started here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from pydantic import SecretStr

import learning.embedders
from learning.embedders import LocalMiniLM, OpenAIEmbedder, make_embedder
from services.embedding import (
    EmbedderUnavailable,
    QueryVectors,
    decode_vector,
    decode_vectors,
    encode_vector,
)
from services.settings import ConfigurationError, Settings

FACT = "Caroline went to a LGBTQ support group"
QUESTION = "What did Caroline attend?"
OTHER = "Melanie painted a sunrise"
TEXTS = [
    FACT,
    QUESTION,
    OTHER,
    "Melanie ran a charity race for mental health last Saturday.",
    "Caroline is researching adoption agencies.",
    "hi",
    "",
    "A much longer text about a camping trip in the mountains with the kids, a fire, marshmallows and "
    "a night sky full of stars that they watched until late. " * 20,
    "Jon lost his job as a banker and opened a dance studio.",
    "Gina's clothing store got a new shipment.",
]


@pytest.fixture(scope="module")
def minilm() -> LocalMiniLM:
    return LocalMiniLM(batch=4)


@pytest.fixture(scope="module")
async def vectors(minilm: LocalMiniLM) -> npt.NDArray[np.float32]:
    return await minilm.embed(TEXTS)


def _restored(raw: bytes) -> npt.NDArray[np.float32]:
    q, scale = decode_vector(raw)
    return q.astype(np.float32) * np.float32(scale)


async def test_local_vectors_are_normalised(minilm: LocalMiniLM, vectors: npt.NDArray[np.float32]) -> None:
    assert minilm.id == "local:all-MiniLM-L6-v2-int8"
    assert vectors.shape == (len(TEXTS), minilm.dims) == (len(TEXTS), 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert (await minilm.embed([])).shape == (0, 384)


async def test_local_ranks_the_relevant_fact_first(vectors: npt.NDArray[np.float32]) -> None:
    fact, question, other = vectors[0], vectors[1], vectors[2]
    assert float(fact @ question) > float(other @ question) + 0.2
    assert float(fact @ question) > float(fact @ other) + 0.2


async def test_a_batch_equals_one_by_one(minilm: LocalMiniLM, vectors: npt.NDArray[np.float32]) -> None:
    single = np.concatenate([await minilm.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(vectors, single, atol=1e-5)


async def test_a_wrong_model_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learning.embedders, "MODEL_SHA256", "0" * 64)
    embedder = LocalMiniLM()
    for _ in range(2):
        with pytest.raises(EmbedderUnavailable) as caught:
            await embedder.embed([FACT])
        assert caught.value.code == "model_mismatch"


def test_stored_vector_layout() -> None:
    vector = np.array([0.5, -0.25, 0.0, 0.125], dtype=np.float32)
    raw = encode_vector(vector)
    assert len(raw) == 4 + 4
    assert np.frombuffer(raw[:4], dtype="<f4")[0] == np.float32(0.5 / 127)
    assert np.frombuffer(raw[4:], dtype=np.int8).tolist() == [127, -64, 0, 32]
    q, _ = decode_vector(encode_vector(np.zeros(4, dtype=np.float32)))
    assert q.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="non-finite"):
        encode_vector(np.array([np.nan, 1.0], dtype=np.float32))


def test_quantisation_keeps_cosines(vectors: npt.NDArray[np.float32]) -> None:
    restored = np.stack([_restored(encode_vector(v)) for v in vectors])
    restored /= np.linalg.norm(restored, axis=1, keepdims=True)
    assert float(np.abs((restored * vectors).sum(axis=1) - 1.0).max()) < 0.01
    assert float(np.abs(restored @ restored.T - vectors @ vectors.T).max()) < 0.01


def test_decode_vectors_matches_decode_vector(vectors: npt.NDArray[np.float32]) -> None:
    raws = [encode_vector(v) for v in vectors]
    matrix, scales = decode_vectors(raws, 384)
    assert matrix.shape == (len(raws), 384)
    assert matrix.dtype == np.int8
    assert scales.shape == (len(raws),)
    assert scales.dtype == np.float32
    for row, raw in enumerate(raws):
        q, scale = decode_vector(raw)
        assert np.array_equal(matrix[row], q)
        assert scales[row] == np.float32(scale)
    empty, no_scales = decode_vectors([], 384)
    assert empty.shape == (0, 384)
    assert no_scales.shape == (0,)
    with pytest.raises(ValueError, match="384"):
        decode_vectors([*raws, raws[0][:-1]], 384)


def test_make_embedder_follows_the_settings() -> None:
    assert make_embedder(Settings(embedder="none")) is None
    local = make_embedder(Settings(embedder="local", embedding_threads=2, embedding_batch=8))
    assert isinstance(local, LocalMiniLM)
    # Settings made in code that skip the settings' own check (Settings.model_construct) are
    # refused by the embedder too.
    for partial in (
        Settings.model_construct(embedder="openai", embedding_dimensions=8),
        Settings.model_construct(embedder="openai", embedding_model="m"),
    ):
        with pytest.raises(ConfigurationError, match="EMBEDDING_MODEL, _EMBEDDING_DIMENSIONS"):
            make_embedder(partial)


class _EmbeddingsHandler(BaseHTTPRequestHandler):
    """``POST /v1/embeddings``: text i becomes ``[len(text), i_in_request + 1, 1, 0, …]`` (not
    normalised), listed in reverse order. Model "broken" answers 400 (a refused input), "missing"
    404, "short" a vector too short."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server: _Server = self.server  # type: ignore[assignment]
        server.requests.append({**body, "authorization": self.headers.get("Authorization")})
        if body["model"] == "broken":
            self._send(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
            return
        if body["model"] == "missing":
            self._send(404, {"error": {"message": "no such model", "type": "invalid_request_error"}})
            return
        dims = body["dimensions"] - (1 if body["model"] == "short" else 0)
        data: list[dict[str, Any]] = []
        for i, text in enumerate(body["input"]):
            vector = [0.0] * dims
            vector[:3] = [float(len(text)), float(i + 1), 1.0]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        usage = {"prompt_tokens": 1, "total_tokens": 1}
        self._send(200, {"object": "list", "model": body["model"], "data": data[::-1], "usage": usage})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class _Server(ThreadingHTTPServer):
    requests: list[dict[str, Any]]


@pytest.fixture
def embeddings_server() -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _EmbeddingsHandler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _openai_settings(server: _Server, model: str) -> Settings:
    return Settings(
        embedder="openai",
        embedding_base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
        embedding_model=model,
        embedding_dimensions=8,
        embedding_api_key=SecretStr("sk-embed"),
        openai_api_key=SecretStr("sk-chat"),
        embedding_batch=3,
        model_attempt_timeout_seconds=5.0,
    )


async def test_openai_embedder_batches_and_normalises(embeddings_server: _Server) -> None:
    embedder = make_embedder(_openai_settings(embeddings_server, "test-embed"))
    assert isinstance(embedder, OpenAIEmbedder)
    texts = ["a", "bb", "", "dddd", "eeeee", "ffffff", "g"]
    try:
        got = await embedder.embed(texts)
    finally:
        await embedder.aclose()
    assert embedder.id == "openai:test-embed:8"
    assert embedder.dims == 8
    assert got.shape == (7, 8)
    assert got.dtype == np.float32
    expected = np.zeros((7, 8), dtype=np.float32)
    expected[:, :3] = [(len(t) or 1, i % 3 + 1, 1.0) for i, t in enumerate(texts)]  # "" is sent as " "
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    requests = embeddings_server.requests
    assert [len(r["input"]) for r in requests] == [3, 3, 1]
    sent_as = {(r["model"], r["dimensions"], r["encoding_format"]) for r in requests}
    assert sent_as == {("test-embed", 8, "float")}
    assert {r["authorization"] for r in requests} == {"Bearer sk-embed"}


@pytest.mark.parametrize(
    ("chat_provider", "sent"),
    [
        (None, "Bearer none"),  # the chat provider is OpenAI's own API: another host
        ("http://10.0.0.9:{port}/v1", "Bearer none"),  # another host, the same port
        ("http://127.0.0.1:1/v1", "Bearer none"),  # the same host, another port
        ("HTTP://127.0.0.1:{port}/other", "Bearer sk-chat"),  # the same origin
    ],
)
async def test_the_chat_providers_key_goes_to_its_own_origin_only(
    embeddings_server: _Server, chat_provider: str | None, sent: str
) -> None:
    """Without an embeddings key of its own, an embeddings endpoint was sent OPENAI_API_KEY
    wherever it was: another vendor's host got the chat provider's credential with every
    embedding. The fallback holds only at the chat provider's origin (scheme, host, port)."""
    port = embeddings_server.server_address[1]
    settings = _openai_settings(embeddings_server, "test-embed").model_copy(
        update={
            "embedding_api_key": None,
            "openai_base_url": None if chat_provider is None else chat_provider.format(port=port),
        }
    )
    embedder = make_embedder(settings)
    assert isinstance(embedder, OpenAIEmbedder)
    try:
        await embedder.embed(["a"])
    finally:
        await embedder.aclose()
    assert [r["authorization"] for r in embeddings_server.requests] == [sent]


@pytest.mark.parametrize(
    ("model", "code"), [("broken", "refused"), ("missing", "provider_error"), ("short", "malformed")]
)
async def test_openai_failures_carry_a_code_only(
    embeddings_server: _Server, caplog: pytest.LogCaptureFixture, model: str, code: str
) -> None:
    embedder = OpenAIEmbedder(_openai_settings(embeddings_server, model))
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(EmbedderUnavailable) as caught:
            await embedder.embed(["the secret fact"])
    finally:
        await embedder.aclose()
    assert caught.value.code == code
    assert "secret" not in str(caught.value)
    assert "secret" not in caplog.text


async def test_openai_unreachable_is_a_provider_error() -> None:
    settings = Settings(
        embedder="openai",
        embedding_base_url="http://127.0.0.1:9/v1",
        embedding_model="m",
        embedding_dimensions=8,
        model_attempt_timeout_seconds=2.0,
    )
    embedder = OpenAIEmbedder(settings)
    try:
        with pytest.raises(EmbedderUnavailable) as caught:
            await embedder.embed(["x"])
    finally:
        await embedder.aclose()
    assert caught.value.code == "provider_error"


def test_kept_query_vectors_are_found_by_a_keyed_digest_of_the_text_never_a_plain_one() -> None:
    """A query's vector is kept by a digest of its words under the process's own key: one found
    in a dump of the process confirms no guess of what was asked (a plain digest would)."""
    kept = QueryVectors()
    vector = np.ones(4, np.float32)
    kept.put("bot|keys", "model", "when is Ann's surgery", vector)
    [(scope, model, digest)] = list(kept._kept)  # pyright: ignore[reportPrivateUsage]
    assert (scope, model) == ("bot|keys", "model")
    assert digest != hashlib.blake2b(b"when is Ann's surgery", digest_size=16).digest()
    assert kept.get("bot|keys", "model", "when is Ann's surgery") is vector
    assert kept.get("bot|keys", "model", "when is Bob's surgery") is None
