"""Print which top-level package imports which: ``python -m tools.layers`` (``make layers``).

The same graph import-linter checks (``lint-imports``, the layers contract in pyproject.toml),
printed per package so a review sees the direction at a glance. Needs the dev extra (grimp)."""

from __future__ import annotations

import grimp

PACKAGES = ("graph", "services", "learning", "schema", "resolvers", "botmemory", "tools")


def main() -> None:
    graph = grimp.build_graph(*PACKAGES)
    for importer in PACKAGES:
        imported = [
            p
            for p in PACKAGES
            if p != importer and graph.direct_import_exists(importer=importer, imported=p, as_packages=True)
        ]
        print(f"{importer:10} -> {', '.join(imported) or '-'}")


if __name__ == "__main__":
    main()
