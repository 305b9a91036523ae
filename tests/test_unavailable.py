"""Neo4j out of reach: a request is answered 503 UNAVAILABLE with ``Retry-After`` (REST) or
``extensions.code`` UNAVAILABLE (GraphQL), says what to do and names no host, and once Neo4j is
back the same process answers again. Before, the caller got 500 INTERNAL, which says "our bug"
and that sending the request again will not help."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from services.settings import Settings
from tests.client import Api, bearer, make_world
from tests.conftest import ApiProcess
from tests.waiting import until


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


async def test_neo4j_out_of_reach_is_unavailable_and_the_process_answers_once_it_is_back(
    api: Api, settings: Settings, service_env: dict[str, str]
) -> None:
    proxy = CuttableProxy(settings.neo4j_bolt_port)
    await proxy.listen()
    env = {
        **service_env,
        "BOTMEMORY_NEO4J_URI": f"bolt://127.0.0.1:{proxy.port}",
        "BOTMEMORY_NEO4J_RETRY_SECONDS": "1",
    }
    log_path = settings.data_dir / "logs" / "pytest-api-neo4j-cut.log"
    # Started on a thread: the proxy forwards on this event loop, which waits for it meanwhile.
    cut_off = await asyncio.to_thread(ApiProcess, settings, log_path, env)
    offset = log_path.stat().st_size
    try:
        w = await make_world(api, ("ann",))
        ann = bearer(w.tokens["ann"])
        memory = f"/v1/bots/{w.bot}/memory"
        remember: dict[str, Any] = {"command": {"_tag": "Remember", "content": "Call me Annie", "tags": []}}
        async with httpx.AsyncClient(base_url=cut_off.url, timeout=60) as http:
            assert (await http.get(memory, headers=ann)).status_code == 200
            await proxy.cut()
            for method, body in (("GET", None), ("POST", remember)):
                down = await http.request(method, memory, json=body, headers=ann)
                assert down.status_code == 503, down.text
                assert down.headers["retry-after"] == "1"
                error = down.json()["error"]
                assert error["code"] == "UNAVAILABLE" and "try again" in error["message"], error
                assert "127.0.0.1" not in down.text and str(proxy.port) not in down.text
            answer = await http.post(
                "/graphql",
                json={
                    "query": "query($b: ID!) { memory(botId: $b) { entries { id } } }",
                    "variables": {"b": w.bot},
                },
                headers=ann,
            )
            [error] = answer.json()["errors"]
            assert error["extensions"] == {"code": "UNAVAILABLE"}, error
            assert "127.0.0.1" not in answer.text and str(proxy.port) not in answer.text
            await proxy.listen()

            async def back() -> bool:
                return (await http.get(memory, headers=ann)).status_code == 200

            await until(back, "the process never answered again once Neo4j was back", within=30)
        logged = log_path.read_bytes()[offset:]
        assert b"unavailable on GET" in logged and b"internal error" not in logged
    finally:
        await asyncio.to_thread(cut_off.stop)
        await proxy.cut()
