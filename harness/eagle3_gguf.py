"""`specdec eagle3-gguf`: an EAGLE-3 draft folder as the GGUF llama.cpp drafts with
(decoder/drafts/eagle3_gguf.py; docs/eagle3.md, "Running the draft in llama.cpp")."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    from speccomplete.decoder.drafts.eagle3_gguf import OUTTYPES
    from speccomplete.decoder.drafts.trained import SHIPPED_DRAFTS

    p = subparsers.add_parser("eagle3-gguf")
    p.add_argument(
        "--draft",
        default=str(SHIPPED_DRAFTS / "gemma3-270m-eagle3"),
        help="the draft folder (default: the shipped one)",
    )
    p.add_argument(
        "--target", default="gemma3-270m", help="the target's GGUF file or packaged alias (default: %(default)s)"
    )
    p.add_argument("--out", required=True, help="the GGUF file to write")
    p.add_argument("--outtype", default="f16", choices=OUTTYPES, help="the matrices' type; norms stay f32")
    return p


def run(args: argparse.Namespace) -> int:
    from speccomplete.decoder.drafts.eagle3_gguf import write_eagle3_gguf

    out = write_eagle3_gguf(args.draft, args.target, args.out, args.outtype)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0
