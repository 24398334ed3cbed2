"""The bench's text: the table written beside the JSON and printed at the end (per language, per
method, the bound, threads, follow-up, steady state), and one case's line for the log as the bench goes."""

from __future__ import annotations

from ..lib.facts import cpu_line
from .records import CaseRuns


def case_line(result: CaseRuns) -> str:
    """One case's times, for the log as the bench goes: a run cut short by a timeout still says them."""
    runs = " ".join(f"{name} {run.seconds * 1000:.0f}ms/{run.token_count}" for name, run in result.runs.items())
    return f"case {result.case.id}: {runs}"


def format_table(data: dict) -> str:
    cols = [
        ("lang", 11),
        ("n", 3),
        ("AR t/s", 8),
        ("spec t/s", 9),
        ("xAR", 6),
        ("xAR dec", 8),
        ("HF asst", 8),
        ("xHF", 6),
        ("HF grdy", 8),
        ("alpha", 6),
        ("mdl α", 6),
        ("acc/rd", 6),
        ("lookup", 6),
        ("same", 5),
    ]
    lines = [
        f"device={data['device']} dtype={data['dtype']} host={data['host']} date={data['date']}"
        + (f" cpu={cpu_line(data['device_facts'])}" if "device_facts" in data else ""),
        f"target={data['target']} draft={data['draft']} gamma={data['gamma']} steps={data.get('steps', 'eager')} "
        f"max_new_tokens={data['max_new_tokens']} cases={data['cases']} assisted={data['assisted_method']}",
        " ".join(name.rjust(w) for name, w in cols),
    ]
    if data.get("steady_state") is False:  # said first as well as last: no one reads these times unwarned
        lines.insert(2, steady_state_line(data))

    def fmt(value, width, digits=2):
        if value is None:
            return "-".rjust(width)
        if isinstance(value, bool):
            return ("yes" if value else "NO").rjust(width)
        return f"{value:.{digits}f}".rjust(width)

    rows = list(data["languages"].items()) + [("OVERALL", data["overall"])]
    for name, r in rows:
        lines.append(
            " ".join(
                [
                    name.rjust(11),
                    str(r["cases"]).rjust(3),
                    fmt(r["ar_tokens_per_s"], 8, 1),
                    fmt(r["spec_tokens_per_s"], 9, 1),
                    fmt(r["speedup_vs_ar"], 6),
                    fmt(r["decode_speedup_vs_ar"], 8),
                    fmt(r["assisted_tokens_per_s"], 8, 1),
                    fmt(r["speedup_vs_assisted"], 6),
                    fmt(r["hf_greedy_tokens_per_s"], 8, 1),
                    fmt(r["alpha"], 6),
                    fmt(r["model_alpha"], 6),
                    fmt(r["mean_accepted"], 6),
                    fmt(r["lookup_share"], 6),
                    fmt(r["identical_to_ar"], 5),
                ]
            )
        )
    med, low = data["median_over_languages"], data["min_over_languages"]
    lines.append(
        "median over code languages: "
        + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
        + f"; slowest language: {low['speedup_vs_ar']:.2f}x end to end, {low['decode_speedup_vs_ar']:.2f}x decode"
    )
    lines.append("")
    lines.append(
        f"{'method':>22} {'t/s':>7} {'dec t/s':>8} {'vs ar':>6} {'model α':>7} {'acc/rd':>6} {'rows/rd':>7} "
        f"{'draft ms':>8} {'verify ms':>9} {'same':>5}  what"
    )
    for name, m in data["methods"].items():
        lines.append(
            f"{name:>22} {m['tokens_per_s']:7.1f} {fmt(m['decode_tokens_per_s'], 8, 1)} "
            f"{m['vs_ar']:6.2f} {fmt(m.get('model_alpha'), 7)} {fmt(m.get('mean_accepted'), 6)} "
            f"{fmt(m.get('drafted_per_round'), 7)} {fmt(m.get('draft_ms_per_round'), 8, 1)} "
            f"{fmt(m.get('verify_ms_per_round'), 9, 1)} {fmt(m['identical_to_ar'], 5)}  "
            f"{data['methods_doc'].get(name, '')}"
        )
    if data.get("bandwidth_bound"):
        b = data["bandwidth_bound"]
        lines.append(
            f"{'bandwidth bound':>22} {b['bound_tokens_per_s']:7.1f} {'':8} {'':6} {'':7} {'':5}  "
            f"{b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token at {b['bandwidth_gb_per_s']:.1f} GB/s; "
            f"our AR decodes at {b['ar_fraction_of_bound']:.2f} of it"
        )
    if data.get("threads"):
        lines.append(
            "requests by the fewest CPU threads they ran with: "
            + "; ".join(
                f"{name} " + ", ".join(f"{count} on {n}" for n, count in counts.items())
                for name, counts in data["threads"].items()
            )
        )
    if data.get("followup"):
        f = data["followup"]
        lines.append(
            f"follow-up request (first 8 tokens accepted), median time to first token: "
            f"warm {f['warm']:.0f} ms ({f['warm_prefilled_tokens']:.0f} tokens prefilled) vs "
            f"cold {f['cold']:.0f} ms ({f['cold_prefilled_tokens']:.0f})"
        )
    if "steady_state" in data:
        lines.append(steady_state_line(data))
    return "\n".join(lines)


def steady_state_line(data: dict) -> str:
    """The table's last line: quiet when nothing was recorded inside a timed run, loud when something was."""
    counts = data["recordings"]
    inside = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts["in_timed_runs"].items())
    if data["steady_state"]:
        return f"steady state: nothing recorded or compiled inside the timed runs ({inside})"
    cases = ", ".join(counts["cases_recording"])
    return (
        f"!!! NOT STEADY STATE: graphs were recorded or compiled inside the timed runs ({inside}; cases {cases}): "
        "those cases' times include the recording !!!"
    )
