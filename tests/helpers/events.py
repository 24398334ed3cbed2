"""Event files read back as the analysis reads them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from speccomplete.telemetry.analysis.read import connect


def read_events(paths: Sequence[str | Path]) -> pd.DataFrame:
    """All completion events as a pandas DataFrame, latest outcome joined (see `connect`)."""
    return connect(paths).execute("SELECT * FROM events").df()
