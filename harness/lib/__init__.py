"""What several subcommands share; no subcommand lives here, and nothing here imports one.

cases        the case file: `Case`, reading, writing, sampling (`specdec cases` is ../cases.py)
model_args   the model and backend arguments, and loading the decoder they describe
session      one LSP session over a `specdec serve` process (eval, stress)
pipeline     requests to the server's pipeline in-process, and the warm-up before measuring (replay, quality)
grid         the decoder over a grid of fixed γ and temperatures, as events (sweep, study)
training     the training-loop arguments, settings and the run's summary (finetune, train-eagle3)
roofline     memory bandwidth and the weight bytes one decode step reads (bench, stepcost)
output       files written whole or not at all, and numbers in tables
facts        the machine's facts, in every summary and benchmark JSON (eval, training, bench, stepcost, study)
"""
