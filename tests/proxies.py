"""A TCP proxy in front of the real Neo4j that a test cuts: an outage made for real."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class CuttableProxy:
    """A TCP proxy in front of the real Neo4j that can be cut: then its open connections are
    closed and new ones refused (as when Neo4j stops), until it listens again on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
