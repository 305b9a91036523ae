"""The API server: ``python -m botmemory.serve [--host H] [--port P]`` runs uvicorn on the
settings' host and port (``BOTMEMORY_API_HOST``/``_PORT``) unless given.

Every place that starts the API (``make up``, the tests, the benchmark, the container) goes
through here, so they all run the same server options. WebSocket per-message deflate is off:
change events are small JSON documents written to many subscriptions, and compressing every
copy separately per connection cost more CPU than the rest of the fan-out together (measured
with ``make bench``; see bench/README.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn

from services.settings import load_settings


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
    )


if __name__ == "__main__":
    main()
