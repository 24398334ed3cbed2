"""The settings tables in the docs, generated from the one place each setting is defined, so they cannot go
stale: the server's from server/options.py (`ServerOptions`: name, type, default; `HELP`: what it does), the
VS Code extension's from its package.json. Each table sits in its page between two markers:

    <!-- generated: server-settings (python -m tools.settings_doc) -->
    ...
    <!-- end generated: server-settings -->

    python -m tools.settings_doc           # rewrite the tables
    python -m tools.settings_doc --check   # exit 1 if a table is stale (tests/tools)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin

from speccomplete.server.options import HELP, Range, ServerOptions, field_types, snake_to_camel

REPO = Path(__file__).resolve().parents[1]
VSCODE_PACKAGE = REPO / "clients" / "vscode" / "package.json"
VSCODE_SETTINGS = REPO / "clients" / "vscode" / "src" / "settings.ts"
# which table goes into which page
PAGES = {"server-settings": REPO / "README.md", "vscode-settings": REPO / "clients" / "vscode" / "README.md"}


def _type_text(hint) -> str:
    if get_origin(hint) is Annotated:
        base, *extras = get_args(hint)
        bounds = [e.describe() for e in extras if isinstance(e, Range)]
        return _type_text(base) + (f" {bounds[0]}" if bounds else "")
    if get_origin(hint) is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(hint))
    if get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_type_text(a) for a in get_args(hint) if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in get_args(hint) else "")
    if get_origin(hint) is tuple:
        return f"list of {_type_text(get_args(hint)[0])}"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(hint, str(hint))


def _value_text(value) -> str:
    return "null" if value is None else f"`{json.dumps(value)}`"


def server_table() -> str:
    hints = field_types()
    rows = ["| setting | type | default | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(ServerOptions):
        rows.append(
            f"| `{snake_to_camel(f.name)}` | {_type_text(hints[f.name])} | {_value_text(f.default)} | {HELP[f.name]} |"
        )
    return "\n".join(rows)


def vscode_server_options(source: Path = VSCODE_SETTINGS) -> dict[str, str]:
    """The extension's setting -> server option map (SERVER_OPTIONS in clients/vscode/src/settings.ts)."""
    block = re.search(r"const SERVER_OPTIONS[^{]*\{(.*?)\n\};", source.read_text(), re.DOTALL)
    if block is None:
        raise ValueError(f"no SERVER_OPTIONS object in {source}")
    return {f"specdec.{k}": v for k, v in re.findall(r"^\s*'?([\w.]+)'?: '(\w+)',", block.group(1), re.MULTILINE)}


def vscode_table(package: Path = VSCODE_PACKAGE) -> str:
    """Every setting of package.json; one the extension passes on to the server shows the server's option
    and, unset, the server's default."""
    properties = json.loads(package.read_text())["contributes"]["configuration"]["properties"]
    passed_on = vscode_server_options()
    defaults = {snake_to_camel(f.name): f.default for f in dataclasses.fields(ServerOptions)}
    rows = ["| setting | server option | type | default | what it does |", "|---|---|---|---|---|"]
    for name, spec in properties.items():
        kind = " \\| ".join(f"`{v}`" if v else '`""`' for v in spec["enum"]) if "enum" in spec else spec.get("type", "")
        if isinstance(kind, list):
            kind = " or ".join(kind)
        text = spec.get("markdownDescription") or spec.get("description", "")
        text = re.sub(r"`#([\w.]+)#`", r"`\1`", text).replace("\n", " ").replace("|", "\\|")
        key = passed_on.get(name)
        default = _value_text(spec.get("default"))
        if key is not None and spec.get("default") in (None, ""):
            default = f"the server's: {_value_text(defaults[key])}"
        rows.append(f"| `{name}` | {f'`{key}`' if key else '–'} | {kind} | {default} | {text} |")
    return "\n".join(rows)


TABLES = {"server-settings": server_table, "vscode-settings": vscode_table}


def render(page: str, name: str, table: str) -> str:
    """`page` with the table between its markers replaced by `table`."""
    begin = re.compile(rf"<!-- generated: {name} [^\n]*-->\n")
    end = f"<!-- end generated: {name} -->"
    start = begin.search(page)
    if start is None or end not in page[start.end() :]:
        raise ValueError(f"no '<!-- generated: {name} ... -->' ... '{end}' markers")
    stop = page.index(end, start.end())
    return page[: start.end()] + table + "\n" + page[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, path in PAGES.items():
        page = path.read_text()
        fresh = render(page, name, TABLES[name]())
        if fresh != page:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(fresh)
    if stale:
        verb = "stale" if args.check else "rewritten"
        print(f"{verb}: " + ", ".join(map(str, stale)), file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
