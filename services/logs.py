"""Process logging: plain records, no request bodies, no query strings, no content, no secrets."""

from __future__ import annotations

import asyncio
import logging


class DropQueryString(logging.Filter):
    """Uvicorn's access log prints the full path, and its WebSocket handshake lines (on its error
    logger, at INFO) the path with the query string; query strings may carry caller data (a client
    that puts its token in the socket's URL), so cut them."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], args[2].split("?", 1)[0], args[3], args[4])
        elif isinstance(args, tuple) and len(args) >= 2 and '"WebSocket %s"' in str(record.msg):
            record.args = (args[0], str(args[1]).split("?", 1)[0], *args[2:])
        return True


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet_libraries()
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropQueryString) for f in logger.filters):
            logger.addFilter(DropQueryString())


def quiet_libraries() -> None:
    """The driver logs query parameters at DEBUG, and the HTTP clients (ours, and those under the
    openai client) log request URLs — an endpoint may carry credentials — and at DEBUG bodies:
    they log warnings only."""
    for name in ("neo4j", "httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _awaiting(awaitable: object) -> list[str]:
    """Where a suspended coroutine waits, outermost first: ``file:line function`` down its chain of
    awaits (coroutines, async generators, generator-based awaitables), never a local's value."""
    where: list[str] = []
    while awaitable is not None and len(where) < 64:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        frame = frame or getattr(awaitable, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            place = "/".join(code.co_filename.split("/")[-2:])
            where.append(f"{place}:{frame.f_lineno} {code.co_name}")
        awaitable = (
            getattr(awaitable, "cr_await", None)
            or getattr(awaitable, "ag_await", None)
            or getattr(awaitable, "gi_yieldfrom", None)
        )
    return where


def log_tasks(logger: logging.Logger) -> None:
    """Log every task of the running loop and where it waits (``kill -USR1`` of a worker): what a
    process that seems stuck is waiting on, without a debugger. Code positions only, no content."""
    tasks = asyncio.all_tasks()
    logger.warning("tasks: %d", len(tasks))
    for task in sorted(tasks, key=lambda t: t.get_name()):
        logger.warning("task %s waits at %s", task.get_name(), " > ".join(_awaiting(task.get_coro())) or "?")
    logger.warning("tasks: end")
