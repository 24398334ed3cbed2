"""The offline analysis of completion events: `specdec report` (per-language speed and acceptance,
disparity across languages, RQ1 and RQ3), its tables and plots, `specdec study`'s study.json, study.md
and plots (study.py), and the report's timing benchmark.

It sits above the runtime: the language server never imports it, so its libraries (duckdb, pandas,
matplotlib, numpy) are the optional extra `analysis` rather than dependencies of every install.
"""

try:
    import duckdb  # noqa: F401
    import matplotlib  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401
except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"speccomplete.telemetry.analysis needs {e.name}: pip install 'speccomplete[analysis]'", name=e.name
    ) from e
