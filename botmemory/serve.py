"""The API server: ``python -m botmemory.serve`` runs uvicorn on the settings' host and port.

Every place that starts the API (``make up``, the tests, the benchmark, the container) goes
through here, so they all run the same server options. WebSocket per-message deflate is off:
change events are small JSON documents written to many subscriptions, and compressing every
copy separately per connection cost more CPU than the rest of the fan-out together (measured
with ``make bench``; see bench/README.md).
"""

from __future__ import annotations

import uvicorn

from botmemory.settings import load_settings


def main() -> None:
    settings = load_settings()
    uvicorn.run(
        "botmemory.app:create_app",
        factory=True,
        host=settings.api_host,
        port=settings.api_port,
        ws_per_message_deflate=False,
    )


if __name__ == "__main__":
    main()
