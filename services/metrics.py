"""Prometheus metrics of the process (served at ``/metrics``). Labels never carry content or ids."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECRYPTIONS = Counter("botmemory_decryptions_total", "Ciphertexts decrypted, by record kind", ["kind"])
REDIS_SKIPPED = Counter(
    "botmemory_redis_skipped_total",
    "Best-effort Redis calls skipped while Redis did not answer (services.redisquiet), by kind",
    ["kind"],
)
REDIS_UNANSWERED = Gauge(
    "botmemory_redis_unanswered",
    "1 while this process skips best-effort Redis calls: Redis did not answer one and no probe since",
)
FEED_INTERRUPTIONS = Counter(
    "botmemory_feed_interruptions_total",
    "Times a feed's Redis listener lost its connection or failed to make one, by channel pattern",
    ["pattern"],
)
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
SEARCH_STATEMENTS = Counter(
    "botmemory_search_statements_total",
    "Search statements (search, context(query)) run by this process, by what followed: answered"
    " (the result), caught_up (the index lacked what was stamped since and ranked again), lost"
    " (candidates were not at their node ids), further (too few passed: the walk went further)",
    ["outcome"],
)
SEARCH_CANDIDATES = Counter(
    "botmemory_search_candidates_total",
    "Candidates the search statements walked, by whether they passed the visibility check",
    ["result"],
)
SEARCH_INDEX_LOAD_SECONDS = Histogram(
    "botmemory_search_index_load_seconds",
    "Loads of a Bot's search index into this process (its first search, or after an eviction)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SEARCH_INDEX_CAUGHT_UP = Counter(
    "botmemory_search_index_caught_up_total",
    "Entries whose derived data (keywords, vector, audience key) a loaded search index read again"
    " after a change",
)
QUERY_EMBEDDING_FAILURES = Counter(
    "botmemory_query_embedding_failures_total",
    "Queries searched by keywords alone because their embedding failed, by code",
    ["code"],
)
EMBEDDINGS_REFUSED = Counter(
    "botmemory_embeddings_refused_total",
    "Entry texts the embedder refused alone (its endpoint answered the request as invalid, e.g. a"
    " text over its model's limit): the entry is found by keywords only",
)
WORKER_PULSE = Gauge(
    "botmemory_worker_pulse_timestamp_seconds",
    "Unix time at which this worker's event loop last beat (every 10 s, also while it finishes its"
    " jobs to stop); its Docker health check reads it",
)
BACKFILL_DUE_BOTS = Gauge(
    "botmemory_backfill_due_bots",
    "Bots whose entries the last backfill sweep found lacking keywords or vectors (worker)",
)
BACKFILL_ENTRIES = Counter(
    "botmemory_backfill_entries_total",
    "Entries the backfill wrote keywords (phase keywords) or vectors (phase vectors) of",
    ["phase"],
)
