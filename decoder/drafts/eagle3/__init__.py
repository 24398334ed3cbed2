"""The EAGLE-3 draft: one decoder layer that drafts from the target's own hidden states.

- model.py: the draft model (`Eagle3`, `Eagle3Shape`, `init_from_target`), its draft cache (`KVCache`) and its
  file format, the `speculators` package's (`save_eagle3`, `load_eagle3`, `read_config`).
- drafter.py: `Eagle3Drafter`, the draft at decode time, fed the states the verify pass keeps.
- chain.py: `GreedyChains`, the drafter's greedy chain as one captured graph (CUDA).
- compiled.py: `CompiledDraftStep`, the draft's layer step compiled once per machine and kept on disk (the CPU).

Training it is decoder/training/eagle3.py; exporting it to llama.cpp's GGUF is `specdec eagle3-gguf`
(harness/eagle3_gguf.py). The drafts package exports `Eagle3Drafter`; import the rest from its module.
"""
