"""A lent GPU's logistics, in one place (docs/gpu.md, the runbook): everything that gets the work onto the machine
and its results back, and nothing a user runs.

pack         `python -m tools.gpu.pack`: the carry, cut into loads of one device call each (here, before the calls)
packed_text  the training corpus as packed source text, written for the carry (read there by
             decoder/training/packed.py, `specdec corpus --packed`)
unpack       the Python of gpu/unpack.sh on the machine (run by its path: standard library at its top)
returns      the draft's weights cut into parts the device tool returns, and joined again here (gpu/step.sh splits
             by its path on the machine; tools/ratchet.py joins)

The shell that runs on the machine stays in gpu/ (unpack.sh, step.sh, aside.sh).
"""
