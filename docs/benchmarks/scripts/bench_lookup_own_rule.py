"""`specdec bench` with the prompt lookup on its own span rule, the clock's spans off (decoder/gamma.py's
LookupSpan answers None, as before any round is timed): the other side of docs/speculative-decoding.md's "How far
a copy goes". From the repository root, in its .venv, with the bench's own arguments:

    python docs/benchmarks/scripts/bench_lookup_own_rule.py bench --cases docs/examples/cases.jsonl --no-hf \
        --prompt-lookup 0 --steps compiled --llamacpp none --compare-drafts ngram --json PATH
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # the bench's llama.cpp rows start processes that import this file again
    from speccomplete.cli import main
    from speccomplete.decoder.gamma import LookupSpan

    LookupSpan.span = lambda self, depth, room: None  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
