"""Training drafts: building a corpus (corpus.py, distill.py), fine-tuning a draft toward its target
(draft.py, train.py) and measuring how well it fits (fitness.py). `specdec corpus` and `specdec
finetune` (speccomplete/harness/drafting.py) run it; nothing the server runs imports it."""
