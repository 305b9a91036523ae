"""Process logging: plain records, no request bodies, no content, no secrets."""

from __future__ import annotations

import logging


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The driver logs query parameters at DEBUG; keep it quiet whatever the level.
    logging.getLogger("neo4j").setLevel(logging.WARNING)
