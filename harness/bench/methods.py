"""How each row is asked one prompt and timed into a `Run`, one kind of call per engine: ours from a cold
cache, llama.cpp's over the pipe to its own process, HF's generate and assisted generation with a streamer
that notes their first token; `build_methods` binds them, one callable per row."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from speccomplete.decoder.drafts.references import References
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder

from .contenders import Contenders
from .records import Run


class FirstToken:
    """An HF streamer that notes when the first generated token reaches the host: the prefill, as HF's
    generate reports no times (for assisted generation, the first round's drafts and verify with it)."""

    def __init__(self):
        self.puts = 0
        self.at: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.at is None:  # the first put is the prompt
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate(model, ids: list[int], max_new_tokens: int, streamer=None, **kwargs) -> list[int]:
    input_ids = torch.tensor([ids], device=model.device)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=model.generation_config.eos_token_id,
        streamer=streamer,
        **kwargs,
    )
    tokens = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    return [t for t in tokens if t not in eos]  # ours never returns the EOS token either


def assisted(target, draft, ids, max_new_tokens, gamma: int | None, streamer=None) -> list[int]:
    """HF assisted generation; gamma None is HF's default schedule (20 tokens, confidence threshold 0.4)."""
    config = draft.generation_config
    config.num_assistant_tokens = 20 if gamma is None else gamma
    config.num_assistant_tokens_schedule = "constant" if gamma is not None else "heuristic"
    config.assistant_confidence_threshold = 0.0 if gamma is not None else 0.4
    return hf_generate(target, ids, max_new_tokens, streamer, assistant_model=draft)


# (prompt ids, gamma group, the case's workspace for the rows that copy from it) -> the run
Method = Callable[[list[int], str, References | None], Run]


def build_methods(
    contenders: Contenders, max_new_tokens: int, hf_gammas: list[int], prompt_lookup: int | None
) -> dict[str, Method]:
    target, draft = contenders.hf_target, contenders.hf_draft

    # one closure per decoder and per γ: each binds its own
    def ours(decoder: SpeculativeDecoder, refers: bool) -> Method:
        def run(ids, group, references):
            references = references if refers else None
            options = DecodeOptions(max_new_tokens=max_new_tokens, gamma_group=group, references=references)
            return _ours(decoder, ids, options)

        return run

    def assisted_const(g: int) -> Method:
        return lambda ids, group, _: _timed(assisted, target, draft, ids, max_new_tokens, g)

    def llama(decoder) -> Method:
        return lambda ids, group, _: _llamacpp(decoder, ids, DecodeOptions(max_new_tokens=max_new_tokens))

    methods: dict[str, Method] = {
        name: ours(decoder, name in contenders.referring) for name, decoder in contenders.ours.items()
    }
    methods |= {name: llama(decoder) for name, decoder in contenders.llamacpp.items()}
    if target is not None and draft is not None:
        methods["hf_assisted_default"] = lambda ids, group, _: _timed(
            assisted, target, draft, ids, max_new_tokens, None
        )
        for g in hf_gammas:
            methods[f"hf_assisted_const{g}"] = assisted_const(g)
    if target is not None:
        methods["hf_greedy"] = lambda ids, group, _: _timed(hf_generate, target, ids, max_new_tokens)
        if prompt_lookup:  # HF's assisted generation with its prompt-lookup candidate generator
            methods["hf_assisted_lookup"] = lambda ids, group, _: _timed(
                hf_generate, target, ids, max_new_tokens, prompt_lookup_num_tokens=prompt_lookup
            )
    return methods


def _ours(decoder: SpeculativeDecoder, ids, options) -> Run:
    decoder.steps.truncate(0)  # every run starts cold: our decoders on one target share its cache
    if decoder.idle_cores is not None:  # a llama.cpp row's process ran just before: its load is gone
        decoder.idle_cores.assume_idle()
    start = time.perf_counter()
    generation = decoder.generate(ids, options)
    return Run(generation.token_ids, time.perf_counter() - start, generation.stats)


def _llamacpp(decoder, ids, options) -> Run:
    start = time.perf_counter()  # its decoders never reuse a prompt (cache_prompt=False): every run is cold
    generation = decoder.generate(ids, options)
    return Run([], time.perf_counter() - start, generation.stats, text=generation.text)


def _timed(fn, *args, **kwargs) -> Run:
    """An HF method's run, its time to the first token from a streamer."""
    first = FirstToken()
    start = time.perf_counter()
    tokens = fn(*args, streamer=first, **kwargs)
    seconds = time.perf_counter() - start
    return Run(tokens, seconds, first_token_s=None if first.at is None else first.at - start)
