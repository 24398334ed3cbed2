"""The real-editor tests' fixture: the editors setup-editors.sh installed (its editors.env)."""

from __future__ import annotations

import pytest
from editor_support import CACHE


@pytest.fixture(scope="session")
def editors() -> dict[str, str]:
    env_file = CACHE / "editors.env"
    if not env_file.exists():
        pytest.fail(f"{env_file} is missing: run clients/tests/setup-editors.sh first")
    return dict(line.split("=", 1) for line in env_file.read_text().split())
