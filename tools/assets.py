"""Build the vendored browser files: ``python -m tools.assets`` (``make assets``, run by ``make install``).

Installs the exact versions of ``web/package-lock.json`` with ``npm ci --prefix web`` and copies
the files the pages load (``botmemory.vendor.VENDOR_FILES``) to ``botmemory/static/vendor``.
Nothing is fetched at run time. A stamp (the lock file's hash and the file list) makes a second
run a no-op while the copies are current. ``--no-npm`` copies from an existing
``web/node_modules`` (the Dockerfile's node stage).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from botmemory.vendor import VENDOR_DIR, VENDOR_FILES, missing_vendor_files

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
STAMP = VENDOR_DIR / ".stamp"


def wanted_stamp() -> str:
    lock = (WEB / "package-lock.json").read_bytes()
    listing = json.dumps(VENDOR_FILES, sort_keys=True).encode()
    return hashlib.sha256(lock + b"\0" + listing).hexdigest()


def is_current() -> bool:
    return STAMP.is_file() and STAMP.read_text().strip() == wanted_stamp() and not missing_vendor_files()


def build(*, run_npm: bool = True) -> None:
    if run_npm:
        if shutil.which("npm") is None:
            # Here, not at the top: the Dockerfile runs this module before the package's
            # dependencies are installed (tools.stores reads the settings, with pydantic).
            from tools.stores import apt_install

            apt_install("npm", ["nodejs", "npm"])
        if shutil.which("npm") is None:
            raise SystemExit("assets: npm is still missing after apt-get install nodejs npm")
        subprocess.run(
            ["npm", "ci", "--prefix", str(WEB), "--no-audit", "--no-fund", "--ignore-scripts"], check=True
        )
    modules = WEB / "node_modules"
    absent = [src for src in VENDOR_FILES.values() if not (modules / src).is_file()]
    if absent:
        raise SystemExit(f"assets: not in web/node_modules: {', '.join(absent)}")
    if VENDOR_DIR.exists():
        shutil.rmtree(VENDOR_DIR)
    for target, source in VENDOR_FILES.items():
        (VENDOR_DIR / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(modules / source, VENDOR_DIR / target)
    STAMP.write_text(wanted_stamp() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.assets", description=__doc__)
    parser.add_argument("--no-npm", action="store_true", help="copy from an existing web/node_modules")
    parser.add_argument("--force", action="store_true", help="rebuild even when the copies are current")
    args = parser.parse_args(argv)
    if not args.force and is_current():
        print(f"assets: current ({VENDOR_DIR.relative_to(ROOT)})")
        return 0
    build(run_npm=not args.no_npm)
    print(f"assets: {len(VENDOR_FILES)} files in {VENDOR_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
