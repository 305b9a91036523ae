"""The browser pages: GraphiQL at GET /graphql and the memory explorer at /explore, on vendored
assets served from /static (``make assets``); no page loads anything from another host."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from botmemory.vendor import STATIC_DIR, VENDOR_DIR, missing_vendor_files

#: Only this origin: the pages work offline and a token typed into them goes nowhere else — its
#: sockets too ('self' covers ws: and wss: of this host, CSP level 3; ``ws: wss:`` let a script
#: that got in send the token to a socket of any host).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)
_VENDOR_CACHE = "public, max-age=31536000, immutable"


class Static(StaticFiles):
    """``botmemory/static``; vendor files are cached for a year (the pages add ``?v=<stamp>``)."""

    def file_response(
        self, full_path: str | object, stat_result: object, scope: Scope, status_code: int = 200
    ) -> Response:  # type: ignore[override]
        if str(full_path).endswith(".html"):
            # A page is served rendered (``render``): raw, its assets' ``?v=__V__`` never changed
            # between releases, so a year-long cached vendor file was never fetched again.
            return PlainTextResponse("Not Found", status_code=404)
        response = super().file_response(full_path, stat_result, scope, status_code)  # type: ignore[arg-type]
        vendor = (
            str(scope.get("path", "")).removeprefix(str(scope.get("root_path", ""))).startswith("/vendor/")
        )
        response.headers["Cache-Control"] = _VENDOR_CACHE if vendor else "no-cache"
        # The pages' own files too: no script of another origin, never framed.
        response.headers["Content-Security-Policy"] = CSP
        return response


def static_files() -> Static:
    return Static(directory=STATIC_DIR, check_dir=False)


def render(name: str) -> Response:
    """A page of ``botmemory/static``, or 503 with what to run when the vendor files are missing."""
    missing = missing_vendor_files()
    if missing:
        return PlainTextResponse(
            f"The browser assets are missing ({len(missing)} files): run `make assets`.\n", status_code=503
        )
    stamp = (VENDOR_DIR / ".stamp").read_text().strip()[:12] if (VENDOR_DIR / ".stamp").is_file() else "0"
    html = (STATIC_DIR / name).read_text().replace("__V__", stamp)
    return HTMLResponse(html, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


async def explore(request: Request) -> Response:
    return render("explore.html")
