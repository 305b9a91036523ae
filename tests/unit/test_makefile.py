"""The Makefile installs again when what it installs changed or the last install did not finish
(``make -n``: what make would run, nothing run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def would_run(*args: str) -> str:
    done = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout


@pytest.mark.parametrize("changed", ["pyproject.toml", "client/pyproject.toml", "web/package-lock.json"])
def test_a_changed_dependency_list_installs_again_before_the_tests(changed: str) -> None:
    """``make up`` and ``make test`` installed only when ``.venv/bin/python`` was missing: a
    dependency a pull added was never installed, and an install cut short (a network error on a
    fresh machine) left every later target failing on an import."""
    assert "pip install" in would_run("-W", changed, "test-unit")
    assert "pip install" in would_run("-W", changed, "up")


def test_an_install_that_finished_is_not_run_again() -> None:
    stamp = ROOT / ".venv" / ".installed"
    if not stamp.exists():
        pytest.skip("no finished install in this checkout")
    newest = max(
        (ROOT / f).stat().st_mtime
        for f in ("pyproject.toml", "client/pyproject.toml", "web/package-lock.json")
    )
    if stamp.stat().st_mtime < newest:
        pytest.skip("this checkout's install is older than its dependency lists")
    assert "pip install" not in would_run("test-unit")
