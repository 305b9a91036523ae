"""Headless Chromium driven over the Chrome DevTools Protocol (the `websockets` client), for the
page tests: navigate, evaluate JavaScript, wait for a condition, record request hosts, screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection

ARTIFACTS = Path(__file__).resolve().parent.parent / ".data" / "artifacts"


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert found, "chromium is missing: apt-get install -y chromium (.ci/run installs it)"
    return found


class Page:
    """One tab: CDP commands, console errors and every requested URL's host."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.hosts: set[str] = set()
        self.errors: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message: dict[str, Any] = json.loads(raw)
            if "id" in message and message["id"] in self.pending:
                self.pending.pop(message["id"]).set_result(message)
            elif message.get("method") == "Network.requestWillBeSent":
                url: str = message["params"]["request"]["url"]
                self.hosts.add(urlsplit(url).hostname or "")
            elif message.get("method") == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(message["params"]["exceptionDetails"])[:500])
            elif message.get("method") == "Log.entryAdded" and message["params"]["entry"]["level"] == "error":
                self.errors.append(message["params"]["entry"].get("text", "")[:500])

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[ident] = future
        await self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 30)
        assert "error" not in reply, reply
        return reply["result"]

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def js(self, expression: str) -> Any:
        """The value of ``expression`` (promises awaited); a thrown error fails the test."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def wait_for(self, expression: str, within: float = 20) -> Any:
        """Poll until ``expression`` is truthy (a condition on the page, not a delay); its value."""
        async with asyncio.timeout(within):
            while True:
                with contextlib.suppress(AssertionError):
                    value = await self.js(expression)
                    if value:
                        return value
                await asyncio.sleep(0.1)

    async def type_into(self, selector: str, text: str) -> None:
        """Focus an element and type as a user would (key events through the browser)."""
        await self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = await self.send("Page.captureScreenshot", format="png")
        path = ARTIFACTS / name
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextlib.asynccontextmanager
async def browser_page(width: int = 1400, height: int = 900) -> AsyncGenerator[Page]:
    """A fresh headless Chromium (own profile, no network beyond what the page asks) and one tab."""
    # Chromium's helper processes may still write to the profile as it exits: cleanup is best effort.
    with tempfile.TemporaryDirectory(prefix="bm-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, waited on without blocking
            [
                chromium_path(),
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            async with asyncio.timeout(30):
                while not port_file.is_file() or not port_file.read_text().strip():
                    assert proc.poll() is None, "chromium exited at start"
                    await asyncio.sleep(0.1)
            port = port_file.read_text().split()[0]
            targets = await asyncio.to_thread(_targets, int(port))
            page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with websockets.connect(page_ws, max_size=64 * 2**20) as ws:
                page = Page(ws)
                for domain in ("Page.enable", "Network.enable", "Runtime.enable", "Log.enable"):
                    await page.send(domain)
                await page.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                                deviceScaleFactor=1, mobile=False)  # fmt: skip
                try:
                    yield page
                finally:
                    page.reader.cancel()
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _targets(port: int) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
        targets: list[dict[str, Any]] = json.load(response)
        return targets
