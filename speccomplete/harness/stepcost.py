"""`specdec stepcost`: what one target forward costs, by dtype and by tokens per pass.

The speculative speedup depends on c = draft step / target step and on how much more a verify
of γ+1 tokens costs than a single-token step, so this is the measurement behind the default
dtype and behind any γ choice. Same prompt, same cache state, median of repeats.
"""

from __future__ import annotations

import statistics
import time

import torch

from speccomplete.decoder.drafts import derive_draft
from speccomplete.decoder.kv_cache import forward_logits, new_cache


def _prefilled(model, prompt: list[int], cache_factory=new_cache):
    cache = cache_factory()
    forward_logits(model, cache, prompt, keep=1)
    return cache


def _median_ms(model, cache, feed: list[int], repeats: int) -> float:
    """Median time to feed `feed` after the cached prompt; each pass is cropped off again."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward_logits(model, cache, feed, keep=len(feed))
        times.append((time.perf_counter() - start) * 1000)
        cache.crop(-len(feed))
    return statistics.median(times)


@torch.inference_mode()
def step_costs(model, prompt: list[int], widths=(1, 2, 3, 5, 9), draft_layers=(0, 1), repeats: int = 7,
               cache_factory=new_cache) -> dict:
    """Median ms per forward of each width, with the decoder's cache unless `cache_factory` says otherwise."""
    cache = _prefilled(model, prompt, cache_factory)
    row = {f"target_{w}_ms": _median_ms(model, cache, prompt[-w:], repeats) for w in widths}
    draft = derive_draft(model, list(draft_layers))
    row["draft_1_ms"] = _median_ms(draft, _prefilled(draft, prompt, cache_factory), prompt[-1:], repeats)
    one = row["target_1_ms"]
    row.update({f"verify_{w}_ratio": row[f"target_{w}_ms"] / one for w in widths if w > 1})
    row["c"] = row["draft_1_ms"] / one
    return row
