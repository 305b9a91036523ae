"""Process logging: plain records, no request bodies, no query strings, no content, no secrets."""

from __future__ import annotations

import logging


class DropQueryString(logging.Filter):
    """Uvicorn's access log prints the full path; query strings may carry caller data, so cut them."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], args[2].split("?", 1)[0], args[3], args[4])
        return True


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # The driver logs query parameters at DEBUG, and the HTTP clients under the openai client log
    # request URLs (an endpoint may carry credentials) and at DEBUG bodies: keep them quiet.
    for name in ("neo4j", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, DropQueryString) for f in access.filters):
        access.addFilter(DropQueryString())
