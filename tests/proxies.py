"""TCP proxies in front of the real Neo4j or Redis that a test cuts or silences: an outage made
for real."""

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


class SilentProxy:
    """A TCP proxy in front of the real Redis or Neo4j that can fall silent: then it forwards
    nothing on any connection, in either direction, and closes none, while it still accepts new
    ones (a paused server's kernel does); once heard again, new connections are forwarded, while
    those of the silence stay silent for good (as after a failover). ``asked``: the connections on
    which a client sent something (a command, a new connection's handshake) that the silence
    swallowed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.silences = 0
        #: Connections accepted while silent (each one an attempt its client made meanwhile).
        self.unheard = 0
        self.asked = 0
        self.silent = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def fall_silent(self) -> None:
        self.silent = True
        self.silences += 1

    def hear_again(self) -> None:
        self.silent = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        if self.silent:
            self.unheard += 1
            if await reader.read(1):
                self.asked += 1
            return  # accepted, never answered
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.append(up_writer)
        opened_in = self.silences

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, asking: bool) -> None:
            while data := await source.read(65536):
                if self.silences != opened_in:
                    self.asked += asking
                    await asyncio.Event().wait()  # this connection went silent: for good
                sink.write(data)
                await sink.drain()

        for source, sink, asking in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(pipe(source, sink, asking))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


def through_proxy(proxy_port: int, env: dict[str, str]) -> dict[str, str]:
    """``env`` for an API or worker process whose Neo4j is reached through a proxy on
    ``proxy_port``, its transactions retried for 1 s (the 15 s default is waited out by a test)."""
    return {
        **env,
        "BOTMEMORY_NEO4J_URI": f"bolt://127.0.0.1:{proxy_port}",
        "BOTMEMORY_NEO4J_RETRY_SECONDS": "1",
    }
