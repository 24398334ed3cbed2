"""Sequence-level self-distillation data: the target continues corpus prompts, the draft learns them.

Following the multilingual-drafter recipe, each prompt is continued at several temperatures
({0, 0.3, 0.7, 1.0}), so the draft sees the target's own greedy and sampled behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .corpus import Document


@torch.inference_mode()
def self_distilled(
    model,
    tokenizer,
    documents: Iterable[Document],
    temperatures: list[float],
    prompts: int,
    new_tokens: int,
    prompt_tokens: int = 256,
    seed: int = 0,
) -> Iterator[Document]:
    """Yield prompt + target continuation documents: `prompts` documents x each temperature."""
    generator_seed = seed
    for n, doc in enumerate(documents):
        if n >= prompts:
            return
        ids = tokenizer(doc.text, add_special_tokens=True, return_tensors="pt")["input_ids"][:, :prompt_tokens]
        ids = ids.to(model.device)
        for temperature in temperatures:
            torch.manual_seed(generator_seed)
            generator_seed += 1
            out = model.generate(
                ids,
                max_new_tokens=new_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=None,
                top_k=None,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
            text = tokenizer.decode(out[0], skip_special_tokens=True)
            yield Document(doc.language, text, f"self-distill:T={temperature}:{doc.source}")
