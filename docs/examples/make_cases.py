"""Build cases.jsonl from the example files in cases/: the cursor is where the file has a "‸".

Every example is written by the project team for these cases (no corpus text): in each of the
14 languages, one `-block` case (cursor on an empty line inside a block: a multi-line completion)
and one `-line` case (cursor mid-line: the rest of the line). Run from the repository root:

    python docs/examples/make_cases.py
"""

import json
from pathlib import Path

CURSOR = "\u2038"
HERE = Path(__file__).parent


def main() -> None:
    with open(HERE / "cases.jsonl", "w") as out:
        for source in sorted((HERE / "cases").iterdir()):
            text = source.read_text(encoding="utf-8")
            if text.count(CURSOR) != 1:
                raise SystemExit(f"{source}: needs exactly one {CURSOR} cursor mark")
            before = text[: text.index(CURSOR)]
            line = before.count("\n")
            column = before[before.rfind("\n") + 1:]
            character = len(column.encode("utf-16-le")) // 2
            case = {"id": source.stem, "path": str(source.relative_to(HERE.parent.parent)),
                    "text": text.replace(CURSOR, ""), "line": line, "character": character}
            out.write(json.dumps(case) + "\n")


if __name__ == "__main__":
    main()
