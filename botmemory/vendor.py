"""The vendored browser files the pages load from ``/static/vendor`` (built by ``make assets``).

Stdlib only: the asset build (``tools.assets``) reads this list before the package is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
VENDOR_DIR: Final = STATIC_DIR / "vendor"

#: ``vendor/<target>`` ← ``web/node_modules/<source>`` (versions pinned in web/package-lock.json).
VENDOR_FILES: Final[dict[str, str]] = {
    "react/react.production.min.js": "react/umd/react.production.min.js",
    "react-dom/react-dom.production.min.js": "react-dom/umd/react-dom.production.min.js",
    "graphiql/graphiql.min.js": "graphiql/graphiql.min.js",
    "graphiql/graphiql.min.css": "graphiql/graphiql.min.css",
    "cytoscape/cytoscape.min.js": "cytoscape/dist/cytoscape.min.js",
    "swagger-ui/swagger-ui-bundle.js": "swagger-ui-dist/swagger-ui-bundle.js",
    "swagger-ui/swagger-ui.css": "swagger-ui-dist/swagger-ui.css",
    "react/LICENSE": "react/LICENSE",
    "react-dom/LICENSE": "react-dom/LICENSE",
    "graphiql/LICENSE": "graphiql/LICENSE",
    "cytoscape/LICENSE": "cytoscape/LICENSE",
    "swagger-ui/LICENSE": "swagger-ui-dist/LICENSE",
}


def missing_vendor_files() -> list[str]:
    """The vendored files that are not there (run ``make assets``)."""
    return [name for name in VENDOR_FILES if not (VENDOR_DIR / name).is_file()]
