"""The README's quickstart (issue 18), executed as written: its bash blocks run in order against
the real stack, with the offline model stub answering every model call."""

from __future__ import annotations

import asyncio
import os
import re
import shutil

import pytest

from tests.client import Api
from tests.conftest import ROOT, ApiProcess
from tools.model_server import ModelServer
from tools.model_stub import install

README = ROOT / "README.md"


def quickstart() -> str:
    """The bash blocks between the quickstart markers, in order."""
    text = README.read_text()
    part = text.split("<!-- quickstart:begin -->", 1)[1].split("<!-- quickstart:end -->", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", part, flags=re.S)
    assert len(blocks) >= 6
    return "\n".join(blocks)


@pytest.mark.usefixtures("learning_worker")
async def test_the_readme_quickstart_runs_end_to_end(
    api: Api, api_process: ApiProcess, model_server: ModelServer
) -> None:
    assert shutil.which("jq") and shutil.which("curl"), (
        "the quickstart needs jq and curl (.ci/run installs them)"
    )
    install(model_server)  # the offline stub, as `make up` runs it without OPENAI_BASE_URL
    env = {**os.environ, "API": api_process.url, "ADMIN": api.admin_token}
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        quickstart(),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out_bytes, err_bytes = await asyncio.wait_for(process.communicate(), timeout=240)
    out, err = out_bytes.decode(), err_bytes.decode()
    print(out)
    assert process.returncode == 0, err
    assert err == ""  # no step complains (leaving the subscription's loop closes it at once)
    # Step 2 learned Ann's sentence in the third person; step 3 found it by meaning and remembered.
    assert '"content": "Loves sailing on Lake Geneva."' in out, out
    assert '"layer": "fact"' in out
    # Step 4: the subscription replayed the learned fact and then the remembered entry.
    assert re.search(r"version \d+ \['Loves sailing on Lake Geneva.'\]", out), out
    assert re.search(r"version \d+ \['Ann prefers answers in French.'\]", out), out
    # Step 5: the access proof names Ann's own atoms.
    assert '"summary":' in out and '"rule": "PERSON"' in out, out
