"""End-to-end fan-out of memory change events to open GraphQL subscriptions.

A real API process (uvicorn) holds the subscriptions; a separate client process holds the
1,000 graphql-transport-ws connections and timestamps every message it receives on the
machine-wide monotonic clock. The bench publishes a change event on Redis exactly as a writer
does after commit (``{botId, version, ids}``) and measures from the publish to the last
subscriber's message: pub/sub, the one batched visibility check, decryption, GraphQL execution,
JSON encoding and the WebSocket writes, with the client's reads running on the other core.

Run as ``python -m bench.fanout`` it is the client process: one JSON line on stdin with
``{"url", "subs": [{"token", "bot", "query"}]}``, then ``report`` lines, each answered with the
messages received since the last report, per event version: ``{version: [count, last]}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import websockets

ROOT = Path(__file__).resolve().parent.parent

#: What a client application typically asks for: every field of the changed entries.
SUBSCRIBE = (
    "subscription($b: ID!) { memoryChanges(botId: $b) { version entries { id layer content tags "
    "status confidence createdAt updatedAt invalidatedAt sources { chat item entry } } } }"
)


#: Versions of the bench's synthetic events: above any real one, within GraphQL's 32-bit Int.
VERSIONS = itertools.count(1_500_000_000)


def same_operation(i: int) -> str:
    """Every subscriber on the same operation text: one execution and encoding per event."""
    return SUBSCRIBE


def own_operation(i: int) -> str:
    """The same selection with its own text (a comment): no two subscribers share an execution."""
    return f"# subscriber {i}\n{SUBSCRIBE}"


@dataclass
class Clients:
    """The client process and its pipes."""

    proc: asyncio.subprocess.Process

    @classmethod
    async def open(cls, url: str, subs: list[dict[str, str]]) -> Clients:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.fanout",
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
        )
        clients = cls(proc)
        await clients._send({"url": url, "subs": subs})
        ready = await clients._receive(wait=300)
        if ready.get("ready") != len(subs):
            raise RuntimeError(f"the client process opened {ready} of {len(subs)} subscriptions")
        return clients

    async def _send(self, message: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        await self.proc.stdin.drain()

    async def _receive(self, wait: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), wait)
        if not line:
            raise RuntimeError("the client process ended")
        return cast(dict[str, Any], json.loads(line))

    async def report(self) -> dict[int, tuple[int, float]]:
        """Messages received since the last report, per version: (count, time of the last)."""
        await self._send("report")
        got = await self._receive(wait=60)
        return {int(v): (int(c), float(t)) for v, (c, t) in got.items()}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._send("quit")
            await asyncio.wait_for(self.proc.wait(), 30)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def wait_quiet(clients: Clients, version: int, quiet: float = 0.15) -> tuple[int, float]:
    """Wait until no message of ``version`` arrived for ``quiet`` seconds; its (count, last time)."""
    count, last, started = 0, 0.0, time.monotonic()
    while True:
        await asyncio.sleep(quiet)
        got = (await clients.report()).get(version)
        if got is None:
            if count or time.monotonic() - started > 2:
                return count, last
            continue
        count, last = count + got[0], max(last, got[1])


# --- the client process ------------------------------------------------------------------------


async def _client_main() -> None:
    loop = asyncio.get_running_loop()
    config = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    stats: dict[int, list[float]] = {}
    connections: list[Any] = []
    gate = asyncio.Semaphore(32)

    async def open_one(i: int, sub: dict[str, str]) -> None:
        async with gate:
            ws = await websockets.connect(
                config["url"],
                subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
                max_size=None,
                open_timeout=60,
            )
            await ws.send(
                json.dumps(
                    {"type": "connection_init", "payload": {"Authorization": f"Bearer {sub['token']}"}}
                )
            )
            ack = json.loads(await ws.recv())
            if ack.get("type") != "connection_ack":
                raise RuntimeError(f"subscription {i} was refused: {ack}")
            await ws.send(
                json.dumps(
                    {
                        "id": str(i),
                        "type": "subscribe",
                        "payload": {"query": sub["query"], "variables": {"b": sub["bot"]}},
                    }
                )
            )
            connections.append(ws)

    async def read(ws: Any) -> None:
        async for raw in ws:
            now = time.monotonic()
            # Only the version is read (a full JSON parse per message would take the CPU the
            # server's fan-out competes for on a 2-core machine).
            at = raw.find('"version":') if '"type":"next"' in raw[:80] else -1
            if at < 0:
                print(f"unexpected message: {raw[:300]!r}", file=sys.stderr)
                continue
            version = int(raw[at + 10 : raw.index(",", at)])
            entry = stats.setdefault(version, [0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], now)

    await asyncio.gather(*(open_one(i, s) for i, s in enumerate(config["subs"])))
    readers = [asyncio.create_task(read(ws)) for ws in connections]
    print(json.dumps({"ready": len(connections)}), flush=True)
    while True:
        command = json.loads(await loop.run_in_executor(None, sys.stdin.readline) or '"quit"')
        if command == "report":
            print(json.dumps({str(v): s for v, s in stats.items()}), flush=True)
            stats.clear()
        else:
            break
    for task in readers:
        task.cancel()
    await asyncio.gather(*(ws.close() for ws in connections), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(_client_main())
