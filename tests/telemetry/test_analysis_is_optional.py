"""The analysis (duckdb, pandas, matplotlib) is an optional extra the language server does without.

Each check runs in a fresh interpreter: this test session has long since imported all of them.
"""

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_server_imports_no_analysis_library():
    result = _run(
        "import sys\n"
        "import speccomplete.server.lsp\n"
        "print(sorted(m for m in ('duckdb', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_analysis_without_its_extra_names_the_install_command():
    result = _run(
        "import sys\nsys.modules['duckdb'] = None  # as if not installed\nimport speccomplete.telemetry.analysis.report"
    )
    assert result.returncode != 0
    assert "speccomplete.telemetry.analysis needs duckdb: pip install 'speccomplete[analysis]'" in result.stderr
