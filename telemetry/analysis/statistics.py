"""The report's statistics: a Poisson bootstrap of cases within each language, 95% intervals, and
the disparity across the languages of a group (U, its test against noise U_p, the spread of speedup), base vs
tuned draft.

α̂ and speed-up of a replicate and the interval bounds are speccomplete.metrics's acceptance_rate, speedup and
percentile.
α̂'s sums (queries.prepare) hold only events that recorded every drafting round, so a backend that
reports totals (llama.cpp) or nothing (vLLM) has no α̂ and no U, only its speedup disparity.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from speccomplete.metrics import acceptance_rate, percentile, speedup

from .groups import group_members

U_DEFINITION = (
    "U is the mean absolute deviation, across the languages T of a group, of the per-language "
    "per-token acceptance α̂_T: U = (1/|G|) Σ_T |α̂_T − ᾱ|, with ᾱ = (1/|G|) Σ_T α̂_T (every language "
    "weighs the same). Sandler et al. 2025 define unfairness as the dispersion across tasks of the "
    "draft's fitness to the target, fitness being cross-entropy based. Events carry acceptance, not "
    "the two models' distributions, so α̂_T stands in for fitness: α = Σ_x min(p, q) = 1 − TV(p, q) "
    "falls as the draft fits the target worse. The mean absolute deviation is in α's own units "
    "(U = 0.05 means a typical language sits 5 points of acceptance away from the group mean) and "
    "is less dominated by a single outlier language than the standard deviation, which is also "
    "given (U_std, population form). Sampling noise alone spreads the languages' α̂, so U is above 0 even "
    "where every language has the same α, and U's bootstrap interval can lie above U itself (each "
    "replicate adds its own noise). U_p says whether the spread is more than noise: the share of "
    "bootstrap replicates, each language's re-centred on its own α̂ (so no language truly differs), "
    "whose U is at least the observed U (a bootstrap test of equal acceptance, Hall & Wilson 1991). "
    "U_p below 0.05: the languages' acceptance differs."
)


@dataclass
class Replicates:
    """Bootstrap replicates per language of one configuration: arrays of shape (B,)."""

    alpha: dict[str, np.ndarray]
    speedup: dict[str, np.ndarray]


def bootstrap(blocks: pd.DataFrame, reps: int, seed: int) -> dict[str, Replicates]:
    """Poisson bootstrap of cases within each language, `reps` replicates per configuration (resampled_sums)."""
    out: dict[str, Replicates] = {}
    columns = ["acc", "rej", "sp_tokens", "sp_ms", "ar_tokens", "ar_ms"]
    for (config, language), sums in resampled_sums(blocks, columns, reps, seed).items():
        replicates = out.setdefault(config, Replicates({}, {}))
        replicates.alpha[language] = np.array(
            [acceptance_rate(accepted, rejected) for accepted, rejected in sums[:, :2].tolist()], dtype=float
        )
        replicates.speedup[language] = np.array([speedup(*times) for times in sums[:, 2:].tolist()], dtype=float)
    return out


def resampled_sums(blocks: pd.DataFrame, columns: list[str], reps: int, seed: int) -> dict[tuple[str, str], np.ndarray]:
    """(config, language) -> the sums of `columns` in each of `reps` Poisson-bootstrap replicates, (reps, len(columns)).

    `blocks` has a row per config, language and block (a case, or a hashed block of cases) with those
    columns. Each block gets a Poisson(1) weight per replicate, the standard large-sample stand-in for
    multinomial resampling (Hanley & MacGibbon 2006). The weights belong to the block, not to a
    configuration, so configurations over the same cases are resampled alike: paired differences.
    """
    out = {}
    for language, rows in blocks.groupby("language", sort=False):
        codes, names = pd.factorize(rows.block, sort=True)
        rng = np.random.default_rng([seed, zlib.crc32(language.encode())])
        weights = rng.poisson(1.0, size=(reps, len(names))).astype(float)
        values = rows[columns].to_numpy(dtype=float)
        for config, index in rows.groupby("config", sort=False).indices.items():
            out[(config, language)] = weights[:, codes[index]] @ values[index]
    return out


def ci(samples: np.ndarray) -> tuple[float | None, float | None]:
    """The 95% percentile interval of the finite replicates; (None, None) when there are none."""
    finite = np.sort(samples[np.isfinite(samples)]).tolist()  # percentile's own sort is then one pass
    if not finite:
        return None, None
    return percentile(finite, 2.5), percentile(finite, 97.5)


def mean_abs_dev(values: np.ndarray, axis=-1) -> np.ndarray:
    return np.mean(np.abs(values - np.mean(values, axis=axis, keepdims=True)), axis=axis)


def coefficient_of_variation(values: np.ndarray, axis=-1) -> np.ndarray:
    """Population std / mean (ddof = 0), across languages."""
    return np.std(values, axis=axis) / np.mean(values, axis=axis)


def disparity(langs: pd.DataFrame, replicates: dict[str, Replicates], groups: dict[str, list[str]]) -> pd.DataFrame:
    """Per configuration and group: U (and U_std), max/min speedup and CV of speedup, with 95% CIs."""
    rows = []
    for config, frame in langs[~langs.is_ar].groupby("config", sort=False):
        point_alpha = dict(zip(frame.language, frame.alpha))
        point_speedup = dict(zip(frame.language, frame.speedup))
        reps = replicates[config]
        for group, members in group_members(groups, list(frame.language)).items():
            with_alpha = [m for m in members if np.isfinite(point_alpha[m])]
            with_speedup = [m for m in members if np.isfinite(point_speedup[m])]
            row = {
                "config": config,
                **_config_columns(frame),
                "group": group,
                "languages": len(members),
                "language_list": ",".join(members),
            }
            row |= _stat("U", mean_abs_dev, with_alpha, point_alpha, reps.alpha)
            row["U_p"] = u_p_value(with_alpha, point_alpha, reps.alpha, row["U"])
            row |= _stat("U_std", np.std, with_alpha, point_alpha, reps.alpha)
            row |= _stat("alpha_min", np.min, with_alpha, point_alpha, reps.alpha, minimum=1)
            row |= _stat("alpha_max", np.max, with_alpha, point_alpha, reps.alpha, minimum=1)
            row |= _stat("speedup_min", np.min, with_speedup, point_speedup, reps.speedup, minimum=1)
            row |= _stat("speedup_max", np.max, with_speedup, point_speedup, reps.speedup, minimum=1)
            row |= _stat("speedup_cv", coefficient_of_variation, with_speedup, point_speedup, reps.speedup)
            if with_speedup:
                row["slowest"] = min(with_speedup, key=lambda m: point_speedup[m])
                row["fastest"] = max(with_speedup, key=lambda m: point_speedup[m])
            rows.append(row)
    return pd.DataFrame(rows)


def u_p_value(members, point, replicates, observed: float | None) -> float | None:
    """The share of null replicates whose U is at least `observed`: each language's replicates re-centred on its
    own point α̂ (U is a dispersion, so the shared centre does not matter) give U's spread from noise alone."""
    if observed is None or len(members) < 2:
        return None
    null = mean_abs_dev(np.stack([replicates[m] - point[m] for m in members], axis=-1), axis=-1)
    null = null[np.isfinite(null)]
    return float(np.mean(null >= observed)) if len(null) else None


def _stat(name, fn, members, point, replicates, minimum: int = 2) -> dict:
    """fn over the members' point values, and its 95% CI over the bootstrap replicates."""
    if len(members) < minimum:
        return {name: None, f"{name}_lo": None, f"{name}_hi": None}
    value = float(fn(np.array([point[m] for m in members])))
    lo, hi = ci(fn(np.stack([replicates[m] for m in members], axis=-1), axis=-1))
    return {name: value, f"{name}_lo": lo, f"{name}_hi": hi}


def _config_columns(frame: pd.DataFrame) -> dict:
    first = frame.iloc[0]
    return {
        "target": first.target,
        "draft": first.draft,
        "gamma": first.gamma,
        "temperature": first.temperature,
        "backend": first.backend,
    }


def u_replicates(langs: pd.DataFrame, replicates: dict[str, Replicates], groups: dict[str, list[str]]) -> dict:
    """(config, group) -> U bootstrap replicates, for paired Δ U intervals."""
    out = {}
    for config, frame in langs[~langs.is_ar].groupby("config", sort=False):
        point = dict(zip(frame.language, frame.alpha))
        for group, members in group_members(groups, list(frame.language)).items():
            members = [m for m in members if np.isfinite(point[m])]
            if len(members) >= 2:
                out[(config, group)] = mean_abs_dev(np.stack([replicates[config].alpha[m] for m in members], axis=-1))
    return out


def delta_disparity(disp: pd.DataFrame, replicates_u: dict, pair: tuple[str, str]) -> pd.DataFrame:
    """Base vs tuned U per group, for each (target, γ, T, backend) both drafts were run with: a draft
    is compared with itself on the same backend only."""
    base, tuned = pair
    rows = []
    keyed = disp.set_index(["draft", "target", "gamma", "temperature", "backend", "group"], drop=False)
    for (_, target, gamma, temperature, backend, group), b in keyed.loc[keyed.draft == base].iterrows():
        key = (tuned, target, gamma, temperature, backend, group)
        if key not in keyed.index:
            continue
        t = keyed.loc[key]
        row = {
            "target": target,
            "gamma": gamma,
            "temperature": temperature,
            "backend": backend,
            "group": group,
            "languages": b.languages,
            "base": base,
            "tuned": tuned,
            "U_base": b.U,
            "U_tuned": t.U,
            "speedup_cv_base": b.speedup_cv,
            "speedup_cv_tuned": t.speedup_cv,
        }
        if b.U is not None and t.U is not None and pd.notna(b.U) and pd.notna(t.U):
            row["delta_U"] = t.U - b.U
            row["delta_U_pct"] = 100 * (t.U - b.U) / b.U if b.U else None
            none = np.array([])
            diffs = replicates_u.get((t.config, group), none) - replicates_u.get((b.config, group), none)
            row["delta_U_lo"], row["delta_U_hi"] = ci(diffs) if len(diffs) else (None, None)
        rows.append(row)
    return pd.DataFrame(rows)
