"""Real-editor tests: the shipped clients in code-server (VS Code) and headless Neovim 0.7.2, 0.10, 0.11.4 and 0.12,
against the real server with the real default models.

Slow (model load, CPU decoding), so outside the fast suite (pytest's testpaths is tests/);
clients/tests/run.sh installs the editors (setup-editors.sh), packages the extension and runs this.
Each editor driver accepts a completion and writes what it inserted to result.json; here we check
it is exactly the text the server sent (telemetry events carry it: the tests opt in to text) and
that telemetry recorded the completion as accepted. Failure artifacts (screenshots, server and
editor logs) go to $SPECDEC_EDITOR_ARTIFACTS (default out/editor-tests/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from editor_support import ARTIFACTS, REPO, TIMEOUT_S, VSIX, run_node, save_artifacts

SPECDEC = REPO / ".venv" / "bin" / "specdec"


def accepted_events(events_path: Path) -> list[dict]:
    """Events whose latest outcome record says accepted (the join telemetry's analysis makes)."""
    records = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    events = {r["request_id"]: r for r in records if r.get("record") != "outcome"}
    latest: dict[str, dict] = {}
    for r in records:
        if r.get("record") == "outcome":
            latest[r["request_id"]] = r
    return [events[rid] for rid, r in latest.items() if r["outcome"] == "accepted" and rid in events]


def check_accepted(work: Path, cases: list[dict], languages: list[str]) -> None:
    events_path = work / "events.jsonl"
    assert events_path.exists(), "the server wrote no telemetry"
    accepted = accepted_events(events_path)
    for case, language in zip(cases, languages, strict=True):
        # a bracket case's item replaces the auto-closed closers it retypes, or goes in before them
        texts = {case["text"], case["text"].removesuffix(case.get("closers", ""))}
        matches = [e for e in accepted if e["language"] == language and e["text"] in texts]
        assert matches, (
            f"{case['file']}: inserted {case['text']!r}, but no accepted {language} event has that "
            f"text; accepted: {[(e['language'], e['text']) for e in accepted]}"
        )
        assert matches[0]["source"] == "editor"


def run_driver(name: str, cmd: list[str], env: dict[str, str], work: Path) -> dict | list:
    returncode, output = run_node(name, cmd, env)
    if returncode != 0:
        dest = save_artifacts(name, work, output)
        pytest.fail(f"{name} failed (exit {returncode}); artifacts in {dest}\n{output[-4000:]}")
    return json.loads((work / "result.json").read_text())


# Ghost text at 12 of the 14 pauses, on the defaults: issue 43's target.
PAUSES_SHOWN = 12


def report_pauses(work: Path, editor: str) -> dict:
    """Copies a driver's pause table to the artifacts (out/editor-tests/<editor>/pauses.json: vscode,
    neovim-0.11.4, ...) and prints it, with the status's figure (VS Code's status bar, Neovim's statusline)."""
    pauses = json.loads((work / "pauses.json").read_text())
    dest = ARTIFACTS / editor
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / "pauses.json", dest / "pauses.json")
    latency = pauses["latency"]
    status = latency.get("statusBar", latency.get("statusLine"))
    p90 = f", p90 {latency['measuredP90Ms']} ms" if "measuredP90Ms" in latency else ""
    print(f"{editor}: ghost text at {pauses['shown']} of {pauses['of']} pauses\n{pauses['table']}")
    print(
        f"{editor}: status {status!r}: {latency['statusMs']} ms; keystroke to ghost text p50 "
        f"{latency['measuredP50Ms']} ms{p90}; ratio {latency['ratio']}"
    )
    return pauses


def check_pauses(pauses: dict | None) -> None:
    """What both editors' pause tables must show: the 14 pauses, ghost text at PAUSES_SHOWN of them or
    more, and the status's own latency figure (printed beside the measured p50 by report_pauses)."""
    assert pauses is not None
    records = pauses["pauses"]
    assert [r["language"] for r in records] == ["python"] * 7 + ["rust"] * 7
    assert {r["kind"] for r in records} == {"mid-line", "new-line", "bracket"}
    assert pauses["shown"] >= PAUSES_SHOWN, f"ghost text at {pauses['shown']} of {len(records)} pauses"
    # The status's latency beside the measured p50 (issue 43's target: within 20%) is printed, not
    # asserted: 0.82 to 0.95 of it in four VS Code runs on a loaded 2-core machine, too near the bound to hold.
    assert pauses["latency"]["statusMs"] is not None, pauses["latency"]


# (editors.env key, version, the `display` option, the display it must come to, how it starts, whether
# it times the pause table): every Neovim installed, each in the display it picks by itself, plus 0.7.2
# forced to ghost text (the overlay that 0.9, which cannot be installed here, draws: inline virtual text
# came in 0.10) and 0.11 forced to the popup menu. 0.12 starts the way its users may:
# vim.lsp.enable('specdec') alone, no setup(). The pauses (minutes) only where ghost text is the default
# display of a current Neovim: 0.11's extmark and 0.12's native.
NEOVIMS = [
    ("NVIM_07", "0.7.2", "auto", "popup", "setup", False),
    ("NVIM_07", "0.7.2", "extmark", "extmark", "setup", False),
    ("NVIM_010", "0.10", "auto", "extmark", "setup", False),
    ("NVIM_011", "0.11.4", "auto", "extmark", "setup", True),
    ("NVIM_011", "0.11.4", "popup", "popup", "setup", False),
    ("NVIM_012", "0.12", "auto", "native", "enable", True),
]


@pytest.mark.parametrize(
    ("key", "version", "display", "expect", "start", "pauses"),
    NEOVIMS,
    ids=[f"{n[1]}-{n[2]}-{n[4]}" for n in NEOVIMS],
)
def test_neovim_accepts_completion(editors, key, version, display, expect, start, pauses, tmp_path):
    nvim = editors[key]
    assert subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout.startswith(f"NVIM v{version}")
    cmd = [
        nvim,
        "--headless",
        "-u",
        "NONE" if start == "setup" else "NORC",  # NORC: no init.lua, but plugins (plugin/specdec.lua) load
        "-i",
        "NONE",
        "--cmd",
        "set rtp^=clients/neovim",
        "-c",
        "luafile clients/tests/neovim_test.lua",
    ]
    env = {
        "SPECDEC_TEST_DIR": str(tmp_path),
        "SPECDEC_TEST_CMD": json.dumps([str(SPECDEC), "serve"]),
        "SPECDEC_TEST_TIMEOUT_MS": str((TIMEOUT_S - 60) * 1000),
        "SPECDEC_TEST_DISPLAY": display,
        "SPECDEC_TEST_EXPECT": expect,
        "SPECDEC_TEST_START": start,
        "SPECDEC_TEST_PAUSES": "1" if pauses else "0",
    }
    try:
        results = run_driver(f"neovim-{version}-{display}", cmd, env, tmp_path)
    finally:
        timed = report_pauses(tmp_path, f"neovim-{version}") if pauses and (tmp_path / "pauses.json").exists() else None
    assert [r["file"] for r in results] == ["greet.py", "greet.lua"]
    for r in results:
        assert r["command"]["command"] == "specdec.accept"
        if expect != "popup":  # ghost text came by itself, with a completion plugin asking on every key
            assert r["inline_requests"] >= 1
            assert r["completions"] >= r["typed"], r
    # the accepted event holds the text of the item whose command ran: the rest, after a part accepted by word
    accepted = [{**r, "text": r.get("accepted", r["text"])} for r in results]
    check_accepted(tmp_path, accepted, ["python", "lua"])
    # neovim_test.lua's auto-pairs case (shout.py): accepted past the auto-closed ")"
    autopairs = json.loads((tmp_path / "autopairs.json").read_text())
    check_accepted(tmp_path, [autopairs], ["python"])
    if pauses:
        check_pauses(timed)


# (editors.env key, the `display` option): the ghost-text displays against fake_lsp.py, in seconds
NEOVIM_LOGIC = [
    ("NVIM_07", "extmark"),  # the overlay of 0.9
    ("NVIM_010", "auto"),
    ("NVIM_011", "auto"),
    ("NVIM_012", "auto"),  # native
    ("NVIM_012", "extmark"),
]


@pytest.mark.parametrize(("key", "display"), NEOVIM_LOGIC, ids=[f"{k}-{d}" for k, d in NEOVIM_LOGIC])
def test_neovim_ghost_text_logic(editors, key, display, tmp_path):
    cmd = [editors[key], "--headless", "-u", "NONE", "-i", "NONE", "--cmd", "set rtp^=clients/neovim"]
    cmd += ["-c", "luafile clients/tests/neovim_logic_test.lua"]
    env = {**os.environ, "SPECDEC_TEST_DIR": str(tmp_path), "SPECDEC_TEST_DISPLAY": display}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    print(output)
    if proc.returncode != 0:
        dest = save_artifacts(f"neovim-logic-{key}-{display}", tmp_path, output)
        pytest.fail(f"exit {proc.returncode}; artifacts in {dest}\n{output[-4000:]}")


def test_vscode_restart_logic(editors):
    """The extension's plain-Node parts (vscode_logic_test.mjs): the pause a restart onto an updated server
    waits for, and another window's lock. Node 24 runs the TypeScript sources as they are."""
    node = f"{editors['NODE24']}/bin/node"
    cmd = [node, "--disable-warning=MODULE_TYPELESS_PACKAGE_JSON", "clients/tests/vscode_logic_test.mjs"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    print(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vscode_accepts_ghost_text(editors, tmp_path):
    assert VSIX.exists(), f"{VSIX} is missing: run `npm run package` in clients/vscode"
    env = {
        "CODE_SERVER": editors["CODE_SERVER"],
        "VSIX": str(VSIX),
        "SPECDEC": str(SPECDEC),
        "WORK": str(tmp_path),
        "PATH": f"{editors['NODE24']}/bin:{os.environ['PATH']}",
        "TIMEOUT_MS": str((TIMEOUT_S - 120) * 1000),
    }
    for name in ("SCREENSHOT", "SCREENSHOT_DIR"):
        if os.environ.get(f"SPECDEC_{name}"):
            env[name] = os.environ[f"SPECDEC_{name}"]
    node = f"{editors['NODE24']}/bin/node"
    try:
        result = run_driver("vscode", [node, "clients/tests/vscode_test.mjs"], env, tmp_path)
    finally:
        pauses = report_pauses(tmp_path, "vscode") if (tmp_path / "pauses.json").exists() else None
    check_pauses(pauses)
    assert pauses is not None
    records = pauses["pauses"]
    # a bracket case's ghost text is drawn around the auto-closed bracket: the line holds it once
    brackets = [r for r in records if r["kind"] == "bracket" and r["shown"]]
    assert all(r["balanced"] for r in brackets), [(r["id"], r["line"]) for r in brackets if not r["balanced"]]
    # in each language it runs past the bracket (the item retyping it), and Tab took it: the saved line
    # is the line drawn, the bracket once (checked by the driver)
    cases = result["cases"]
    assert sorted(c["language"] for c in cases) == ["python", "rust"], [r["id"] for r in brackets if r["pastBracket"]]
    for c in cases:
        assert c["line"] == c["drawn"], c
    check_accepted(tmp_path, cases, [c["language"] for c in cases])
    # the line-end pauses (the next line offered below a finished line), reported apart from the 14
    line_end = pauses["lineEnd"]
    assert [r["kind"] for r in line_end["pauses"]] == ["line-end", "line-end"]
    print(f"line-end: ghost text at {line_end['shown']} of {line_end['of']}; accepted {line_end['accepted']}")
    # both showed in each of three runs (deterministic decoding, timing varies): at least one must, and Tab
    # on it inserted the server's text exactly (checked by the driver), its indentation once
    assert line_end["shown"] >= 1, line_end["pauses"]
    assert result["lineEndAccepted"]["text"].startswith("\n"), result["lineEndAccepted"]
    check_accepted(tmp_path, [result["lineEndAccepted"]], [result["lineEndAccepted"]["language"]])
    assert "specdec" in result["status"]
    # the ghost text came by itself, and Ctrl+Space's suggest widget asked the server too (the LSP trace's counts)
    assert result["requests"]["inline"] >= 1 and result["requests"]["completion"] >= 1, result["requests"]
    # nothing asked in markdown (off by default), in manual mode before Alt+\, or while snoozed
    assert [q["name"] for q in result["quiet"]] == ["markdown", "manual", "snooze"]
    assert result["manual"]["ghost"].strip() and result["manual"]["requests"] >= 1, result["manual"]
    assert "snoozed" in result["snoozed"]
    assert result["serverInfoLines"] > 0  # specdec.server.args ["-v"] reached the output channel
    assert result["found"] == "the workspace .venv"  # no specdec.server.command, no specdec on PATH
