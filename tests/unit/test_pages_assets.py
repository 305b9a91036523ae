"""Without the vendored files the pages answer 503 with what to run, never a blank page."""

from __future__ import annotations

from pathlib import Path

import pytest

from botmemory import pages, vendor


def test_missing_vendor_files_give_503_naming_make_assets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vendor, "VENDOR_DIR", tmp_path)
    assert set(vendor.missing_vendor_files()) == set(vendor.VENDOR_FILES)
    for page in ("graphiql.html", "explore.html"):
        response = pages.render(page)
        assert response.status_code == 503
        assert b"run `make assets`" in response.body


def test_pages_load_only_vendored_or_own_static_files() -> None:
    for page in ("graphiql.html", "explore.html"):
        html = (vendor.STATIC_DIR / page).read_text()
        assert "http://" not in html and "https://" not in html
