"""study.md: study.json's tables (per language, per group, U, paired and RQ3) as Markdown, each estimate with
its 95% interval in brackets."""

from __future__ import annotations

from .markdown import fmt


def cell(estimate: dict | None) -> str:
    """An estimate as "value [lo, hi]", "–" where there is none."""
    if not estimate or estimate.get("value") is None:
        return "–"
    text = fmt(estimate["value"])
    return text + (f" [{fmt(estimate['lo'])}, {fmt(estimate['hi'])}]" if estimate.get("lo") is not None else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (
        ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        + ["| " + " | ".join(row) + " |" for row in rows]
        + [""]
    )


def study_markdown(data: dict) -> str:
    """study.md: the per-language, per-group, U, paired and RQ3 tables of study.json, with n and CIs."""
    md = [
        "# Disparity study",
        "",
        f"{data['cases']} cases; target `{data.get('target')}` on {data.get('device')}; γ policy "
        f"`{data.get('gamma')}`; {data.get('max_new_tokens')} tokens a block; made {data['made']}.",
        f"Reproduce: `{data['command']}`." if data.get("command") else "",
        "",
        "Definitions: " + " ".join(f"{name}: {text}." for name, text in data["definitions"].items() if name != "U"),
        "",
    ]
    metrics = ["alpha", "alpha_all", "mean_accepted", "speedup", "decode_speedup", "line_latency_ms"]
    titles = ["α̂ (draft's own)", "α̂ (all)", "τ", "speedup", "decode speedup", "line ms"]
    for draft, entry in data["drafts"].items():
        md += [f"## {draft}", "", "### Per language", ""]
        md += table(
            ["language", "group", "n", *titles],
            [
                [lang, row["group"] or "-", str(row["n"]), *(cell(row.get(m)) for m in metrics)]
                for lang, row in entry["languages"].items()
            ],
        )
        md += ["### Per group", ""]
        md += table(
            ["group", "n", *titles],
            [[g, str(row["n"]), *(cell(row.get(m)) for m in metrics)] for g, row in entry["groups"].items()],
        )
        md += ["### Unfairness U (of the draft's own α̂)", ""]
        md += table(
            ["group", "langs", "U", "U_p", "CV speedup", "slowest", "fastest"],
            [
                [
                    g,
                    str(row["languages"]),
                    cell({"value": row["U"], "lo": row["U_lo"], "hi": row["U_hi"]}),
                    cell({"value": row.get("U_p")}),
                    cell({"value": row["speedup_cv"], "lo": row["speedup_cv_lo"], "hi": row["speedup_cv_hi"]}),
                    str(row["slowest"] or "–"),
                    str(row["fastest"] or "–"),
                ]
                for g, row in entry.get("disparity", {}).items()
            ],
        )
    paired = data.get("paired", {})
    if paired.get("drafts"):
        md += [f"## Each draft against `{paired['base']}`, paired", ""]
        md += table(
            ["draft", "group", f"speedup over {paired['base']}", "decode speedup"],
            [
                [config, group, cell(row["speedup"]), cell(row["decode_speedup"])]
                for config, by_group in paired["drafts"].items()
                for group, row in by_group.items()
            ],
        )
    if data.get("ar"):
        md += ["## AR", ""]
        md += table(
            ["language", "n", "tok/s", "line ms"],
            [
                [lang, str(row["n"]), cell(row.get("tokens_per_s")), cell(row.get("line_latency_ms"))]
                for lang, row in data["ar"]["languages"].items()
            ],
        )
    if data["rq3"]:
        md += ["## RQ3: fixed γ × temperature", ""]
        md += table(
            ["draft", "group", "T", "γ", "n", "α̂ (draft's own)", "speedup", "decode speedup"],
            [
                [r["draft"], r["group"], f"{r['temperature']:g}", str(r["gamma"]), str(r["n"])]
                + [cell(r["alpha"]), cell(r["speedup"]), cell(r["decode_speedup"])]
                for r in data["rq3"]
            ],
        )
    md += ["## Plots", ""] + [f"![{p}]({p})" for p in data.get("plots", [])] + [""]
    md += ["U: " + data["definitions"]["U"], ""]
    return "\n".join(md)
