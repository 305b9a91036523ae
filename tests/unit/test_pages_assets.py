"""Without the vendored files the pages answer 503 with what to run, never a blank page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from botmemory import pages, vendor


def test_missing_vendor_files_give_503_naming_make_assets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vendor, "VENDOR_DIR", tmp_path)
    assert set(vendor.missing_vendor_files()) == set(vendor.VENDOR_FILES)
    for page in ("graphiql.html", "explore.html", "docs.html"):  # /docs was a broken page
        response = pages.render(page)
        assert response.status_code == 503
        assert b"run `make assets`" in response.body


def test_pages_load_only_vendored_or_own_static_files() -> None:
    for page in ("graphiql.html", "explore.html", "docs.html"):
        html = (vendor.STATIC_DIR / page).read_text()
        assert "http://" not in html and "https://" not in html


def test_the_dockerfile_builds_the_assets_before_any_dependency_is_installed() -> None:
    """The Dockerfile runs ``python -m tools.assets --no-npm`` before ``pip install .``: the module
    imports with the standard library alone (it imported ``tools.stores``, which reads the
    settings with pydantic, and the image's build stopped there)."""
    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "Dockerfile").read_text()
    assert dockerfile.index("python -m tools.assets --no-npm") < dockerfile.index("pip install .")
    code = f"import sys; sys.path.insert(0, {str(root)!r}); import tools.assets"
    bare = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False
    )
    assert bare.returncode == 0, bare.stderr
