"""Prometheus metrics of the process (served at ``/metrics``). Labels never carry content or ids."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DECRYPTIONS = Counter("botmemory_decryptions_total", "Ciphertexts decrypted, by record kind", ["kind"])
REQUESTS = Counter(
    "botmemory_requests_total", "API requests, by surface and outcome code", ["surface", "code"]
)
REQUEST_SECONDS = Histogram("botmemory_request_seconds", "API request latency", ["surface"])
