#!/usr/bin/env bash
# The real-editor tests (slow: real models in code-server and Neovim), run by .ci/run after the
# unit tests. Installs the pinned editors (cached outside the repo), packages the VS Code
# extension (with the speccomplete wheel it carries), then runs clients/tests/test_editors.py,
# test_vscode_install.py and test_neovim_install.py. Needs .venv from .ci/setup.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash clients/tests/setup-editors.sh
(cd clients/vscode && npm ci --no-audit --no-fund --loglevel=error && npm run --silent package)
.venv/bin/python -m pytest -q -p no:cacheprovider clients/tests "$@"
