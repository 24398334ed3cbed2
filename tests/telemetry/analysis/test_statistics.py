"""The report's statistics agree with the one definition of each number (speccomplete.metrics)."""

import duckdb
import numpy as np
import pandas as pd
import pytest

from speccomplete.metrics import acceptance_rate, percentile, speedup
from speccomplete.telemetry.analysis.statistics import bootstrap, ci, mean_abs_dev, u_p_value


@pytest.mark.parametrize("q", [2.5, 50, 95, 97.5])
def test_percentile_is_numpys_and_duckdbs_linear_interpolation(q):
    values = np.random.default_rng(0).lognormal(5, 1, size=101).tolist()
    query = f"SELECT quantile_cont(v, {q / 100}) FROM (SELECT unnest(?) AS v)"
    duck = duckdb.connect().execute(query, [values]).fetchone()[0]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert percentile(values, q) == pytest.approx(duck, rel=1e-12)
    assert percentile(np.array(values), q) == percentile(values, q)
    assert percentile([], q) is None


def test_speedup_is_the_ratio_of_tokens_per_second_and_undefined_without_time_or_ar_tokens():
    assert speedup(20, 500, 10, 1000) == 4.0 and speedup(0, 500, 10, 1000) == 0.0
    assert speedup(20, 0, 10, 1000) is None and speedup(20, 500, 10, 0) is None and speedup(20, 500, 0, 1000) is None


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


LANGUAGES = ("python", "rust", "lua", "zig")


def _drafting_blocks(alphas: dict[str, float], cases: int, rng: np.random.Generator) -> pd.DataFrame:
    """A case per block: 10 rounds of up to 4 drafted tokens, each accepted with its language's α."""
    rows = []
    for language, alpha in alphas.items():
        for i in range(cases):
            accepted = np.cumprod(rng.random((10, 4)) < alpha, axis=1).sum(axis=1)
            rows.append(
                {
                    "config": "c",
                    "language": language,
                    "block": f"{language}-{i}",
                    "acc": float(accepted.sum()),
                    "rej": float((accepted < 4).sum()),
                    **dict.fromkeys(["sp_tokens", "sp_ms", "ar_tokens", "ar_ms"], 1.0),
                }
            )
    return pd.DataFrame(rows)


def _u_p(blocks: pd.DataFrame, seed: int) -> float | None:
    sums = blocks.groupby("language")[["acc", "rej"]].sum()
    point = {language: acceptance_rate(row.acc, row.rej) for language, row in sums.iterrows()}
    members = sorted(point)
    observed = float(mean_abs_dev(np.array([point[m] for m in members])))
    return u_p_value(members, point, bootstrap(blocks, reps=400, seed=seed)["c"].alpha, observed)


def test_u_p_tells_languages_that_differ_from_noise():
    """Equal acceptance: U > 0 from noise alone, and U_p about uniform (rarely below 0.05). Acceptance 0.65 to
    0.9: U_p near 0 every time."""
    rng = np.random.default_rng(0)
    equal = np.array([_u_p(_drafting_blocks(dict.fromkeys(LANGUAGES, 0.8), 20, rng), seed) for seed in range(40)])
    differ = [_u_p(_drafting_blocks(dict(zip(LANGUAGES, (0.65, 0.75, 0.85, 0.9))), 20, rng), s) for s in range(10)]
    assert np.mean(equal < 0.05) <= 0.15 and 0.3 < np.mean(equal) < 0.7
    assert max(differ) < 0.01
