"""Count a draft's vocabulary in a corpus: writes `vocab_counts` beside `vocab_ids` in the draft's
vocab_ids.safetensors, so that the self draft can cut its head to the most frequent of them
(drafts/trained.py, `draft_vocabulary`). `specdec finetune` writes the counts of the drafts it trains;
this gives them to a draft trained before it did, from a sample drawn as its vocabulary was:

    specdec corpus --splits SPLITS --split train --budget 400k --nl-roots ROOTS.txt --out data/train
    python -m tools.vocab_counts --data data/train --draft decoder/weights/gemma3-270m-code
"""

from __future__ import annotations

import argparse
from pathlib import Path

from safetensors.torch import load_file

from speccomplete.decoder.drafts.trained import VOCABULARY, write_vocabulary
from speccomplete.decoder.training.corpus import Shards
from speccomplete.decoder.training.draft import token_counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a corpus folder written by `specdec corpus`")
    parser.add_argument("--draft", required=True, help="a trained draft's folder, holding vocab_ids.safetensors")
    args = parser.parse_args(argv)
    path = Path(args.draft) / VOCABULARY
    if not path.is_file():
        parser.error(f"{path} does not exist: --draft names a trained draft's folder with a cut head")
    ids = load_file(str(path))["vocab_ids"]
    tokens = Shards.load(args.data).tokens
    counts = token_counts(tokens, ids)
    write_vocabulary(args.draft, ids, counts)
    share = counts.sort(descending=True).values.cumsum(0) / tokens.numel()
    print(f"{path}: {len(ids)} ids counted over the corpus's {tokens.numel():,} tokens")
    for rows in sorted({4096, 8192, 16384, len(ids)}):
        if rows <= len(ids):
            print(f"  the {rows} most frequent cover {share[rows - 1]:.4f} of them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
