"""Leave the trained drafts' weights out of a built speccomplete wheel: the one the VS Code extension carries.

    python -m tools.lean_wheel dist/server/speccomplete-0.1.0-py3-none-any.whl

The weights (decoder/weights/*/model.safetensors) are nearly all of the wheel, and the default draft, `ngram+self`,
reads only the shipped draft's vocabulary (vocab_ids.safetensors), which stays. A draft that needs weights (`auto`'s
trained draft, `eagle3`) then says that this install has none (drafts/trained.py, LEAN_INSTALL), and `auto` drafts
with the target's first layers. The wheel is rewritten in place, its RECORD without the files left out, so pip
installs it as any wheel. `npm run server-wheel` (clients/vscode) runs it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile
from pathlib import Path

LEFT_OUT = re.compile(r"speccomplete/decoder/weights/[^/]+/model\.safetensors")


def lean(wheel: Path) -> list[str]:
    """Rewrite `wheel` without the files LEFT_OUT matches; returns their names."""
    side = wheel.with_name(wheel.name + ".lean")
    left_out: list[str] = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(side, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if LEFT_OUT.fullmatch(item.filename):
                left_out.append(item.filename)
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not LEFT_OUT.fullmatch(line.split(",", 1)[0])).encode()
            target.writestr(item, data)
    os.replace(side, wheel)
    return left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for wheel in args.wheels:
        before = wheel.stat().st_size
        left_out = lean(wheel)
        after = wheel.stat().st_size
        print(f"{wheel.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB, left out {len(left_out)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
