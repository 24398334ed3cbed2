"""The report's statistics agree with the one definition of each number (speccomplete.metrics)."""

import duckdb
import numpy as np
import pandas as pd
import pytest

from speccomplete.metrics import percentile
from speccomplete.telemetry.analysis.statistics import bootstrap, ci


@pytest.mark.parametrize("q", [2.5, 50, 95, 97.5])
def test_percentile_is_numpys_and_duckdbs_linear_interpolation(q):
    values = np.random.default_rng(0).lognormal(5, 1, size=101).tolist()
    query = f"SELECT quantile_cont(v, {q / 100}) FROM (SELECT unnest(?) AS v)"
    duck = duckdb.connect().execute(query, [values]).fetchone()[0]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert percentile(values, q) == pytest.approx(duck, rel=1e-12)
    assert percentile(np.array(values), q) == percentile(values, q)
    assert percentile([], q) is None


def test_ci_ignores_replicates_that_are_not_finite():
    samples = np.array([np.nan, *range(1, 41), np.inf])
    assert ci(samples) == (percentile(range(1, 41), 2.5), percentile(range(1, 41), 97.5))
    assert ci(np.array([np.nan])) == (None, None)


def test_a_replicate_that_drew_no_case_has_no_alpha():
    """One case: every replicate that drew it has the case's α̂; one that drew none has NaN, not 0."""
    blocks = pd.DataFrame(
        {
            "config": ["c"],
            "language": ["python"],
            "block": ["py-0"],
            "acc": [3.0],
            "rej": [1.0],
            "sp_tokens": [10.0],
            "sp_ms": [500.0],
            "ar_tokens": [10.0],
            "ar_ms": [1000.0],
        }
    )
    alpha = bootstrap(blocks, reps=200, seed=0)["c"].alpha["python"]
    drawn = np.isfinite(alpha)
    assert 0 < drawn.sum() < 200  # Poisson(1) weights are 0 about a third of the time
    assert np.all(alpha[drawn] == 0.75)
