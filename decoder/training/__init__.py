"""Training drafts: building a corpus (corpus.py, distill.py; packed.py: a corpus that travelled as packed source
text, tokenized on the machine that trains), the one training loop (trainer.py) and the kinds of draft it trains,
each supplying its loss and dev fitness (derived.py: the target's own layers; eagle3.py: EAGLE-3, online on a GPU),
and how well a draft fits (fitness.py). `specdec corpus`, `specdec finetune` and `specdec train-eagle3` (harness/)
run it; nothing the server runs imports it."""
