"""Prometheus metrics of the process (served at ``/metrics``). Labels never carry content or ids."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECRYPTIONS = Counter("botmemory_decryptions_total", "Ciphertexts decrypted, by record kind", ["kind"])
REQUESTS = Counter(
    "botmemory_requests_total", "API requests, by surface and outcome code", ["surface", "code"]
)
REQUEST_SECONDS = Histogram("botmemory_request_seconds", "API request latency", ["surface"])
MODEL_CALLS = Counter(
    "botmemory_model_calls_total", "Memory-Bot model calls, by task and outcome", ["task", "status"]
)
MODEL_SECONDS = Histogram(
    "botmemory_model_call_seconds", "Memory-Bot model call time, retries included", ["task"]
)
MODEL_COST = Counter("botmemory_model_cost_micros_total", "Confirmed model cost, micro-USD", ["task"])
EXECUTIONS = Counter(
    "botmemory_learning_executions_total", "Learning execution epochs, by how they ended", ["outcome"]
)
CONFIDE_ANSWERS = Counter("botmemory_confide_answers_total", "Confide answers, by who answered", ["by"])
ENRICHMENTS = Counter(
    "botmemory_enrichments_total", "Turn inputs, by what the memory Bot did with them", ["outcome"]
)
SUBSCRIPTION_EXECUTIONS = Counter(
    "botmemory_subscription_executions_total",
    "Subscription events executed, once per event and distinct operation (shared by its subscribers)",
)
SUBSCRIPTION_ENCODINGS = Counter(
    "botmemory_subscription_encodings_total", "Shared subscription payloads serialised to JSON"
)
SUBSCRIPTION_MESSAGES = Counter(
    "botmemory_subscription_messages_total", "Subscription messages sent with a shared payload"
)
STEP_REFUSALS = Counter(
    "botmemory_learning_refusals_total",
    "Model answers of a learning step refused by the protocol, by rule code and what followed"
    " (reasked: asked again with the violation; set_aside: the evidence range was set aside)",
    ["code", "then"],
)
SUBSCRIPTIONS_OPENED = Counter(
    "botmemory_subscriptions_opened_total",
    "Subscriptions registered with this process's hubs (the subscriber gets every later event)",
    ["feed"],
)
CHANGE_CATCH_UPS = Counter(
    "botmemory_change_catch_ups_total",
    "Times this process read missed change events from the change log (D9.24), by cause",
    ["cause"],
)
SEARCH_INDEX_BYTES = Gauge(
    "botmemory_search_index_bytes",
    "About what the Bots' search indexes of this process hold in memory (bounded by index_memory_mb)",
)
SEARCH_INDEX_EVICTIONS = Counter(
    "botmemory_search_index_evictions_total",
    "Bots' search indexes dropped by this process to stay within index_memory_mb (loaded again when"
    " next searched)",
)
