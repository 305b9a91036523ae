"""The API server: ``python -m botmemory.serve [--host H] [--port P]`` runs uvicorn on the
settings' host and port (``BOTMEMORY_API_HOST``/``_PORT``) unless given.

Every place that starts the API (``make up``, the tests, the benchmark, the container) goes
through here, so they all run the same server options. WebSocket per-message deflate is off:
change events are small JSON documents written to many subscriptions, and compressing every
copy separately per connection cost more CPU than the rest of the fan-out together (measured
with ``make bench``; see bench/README.md). An idle kept-alive connection stays open for
KEEP_ALIVE_SECONDS, longer than clients and proxies keep theirs (httpx 5 s, nginx and most load
balancers 60–75 s): with uvicorn's default of 5 s the server closed connections that a client
was reusing at that moment, which the client saw as a reset (``httpx.ReadError`` in
``make test-deep``, twice in a row on 2026-12-05).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn

from services.settings import load_settings

#: Seconds an idle kept-alive connection stays open: above the clients' and proxies' own idle
#: limits, so that the client, not the server, closes an idle connection.
KEEP_ALIVE_SECONDS = 75


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_settings()
    parser = argparse.ArgumentParser(prog="python -m botmemory.serve", description="Run the API server.")
    parser.add_argument("--host", default=settings.api_host)
    parser.add_argument("--port", type=int, default=settings.api_port)
    args = parser.parse_args(argv)
    uvicorn.run(
        "botmemory.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        ws_per_message_deflate=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        ws_max_size=settings.max_body_bytes,  # a WebSocket message is held to the HTTP body limit
    )


if __name__ == "__main__":
    main()
