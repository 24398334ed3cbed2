"""A first run converts its GGUF target before it can load it (decoder/models.py, convert_gguf): the editor
gets a progress bar with a percentage (`$/progress`) and the status notifications say it too."""

from __future__ import annotations

import os
import tempfile

import pytest
import pytest_lsp
from helpers.lsp import SERVER_COMMAND, initialize, make_client
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from speccomplete.harness.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.asyncio(loop_scope="module")

# a cache of its own, so the GGUF is converted in this test whatever ran before
CACHE = tempfile.mkdtemp(prefix="specdec-first-run-")


@pytest_lsp.fixture(
    scope="module",
    config=ClientServerConfig(
        server_command=SERVER_COMMAND, client_factory=make_client, server_env={**os.environ, "SPECDEC_CACHE": CACHE}
    ),
)
async def client(lsp_client: LanguageClient):
    gguf = write_tiny_gguf(os.path.join(CACHE, "gguf", "tiny.gguf"))
    await initialize(lsp_client, {"target": str(gguf), "draft": "ngram", "debounceMs": 0})
    yield
    await lsp_client.shutdown_session()


async def test_a_gguf_target_converts_once_with_a_percentage_bar(client: LanguageClient):
    reports = [r for values in client.progress_reports.values() for r in values]
    begin, middle, end = reports[0], reports[1:-1], reports[-1]
    assert isinstance(begin, types.WorkDoneProgressBegin) and begin.percentage == 0
    assert isinstance(end, types.WorkDoneProgressEnd) and end.message == "ready"
    percentages = [r.percentage for r in middle]
    assert middle and all(isinstance(r, types.WorkDoneProgressReport) for r in middle)
    assert percentages == sorted(percentages) and percentages[-1] == 100
    assert middle[0].message.startswith("converting tiny.gguf")

    loading = [s for s in client.statuses if s["state"] == "loading" and s["percentage"] is not None]
    assert loading and loading[-1]["percentage"] == 100 and "(100%)" in loading[-1]["message"]
    assert client.statuses[-1]["state"] == "ready" and client.statuses[-1]["percentage"] is None
    (converted,) = os.listdir(os.path.join(CACHE, "models"))  # one folder, named after the file
    assert converted.startswith("tiny-")
