"""The one training loop (decoder/training/trainer.py) with a stand-in objective: what the loop itself owns."""

from __future__ import annotations

import json

import pytest
import torch

from speccomplete.decoder.training.trainer import LoopConfig, Phase, train


class Sequences:
    """Ten sequences of eight tokens in two languages: the Dataset interface the sampler reads."""

    languages = ["python", "rust"]

    def __init__(self):
        self.tokens = torch.arange(80).view(10, 8)
        self.language = torch.tensor([0, 1] * 5)

    def indices_of(self, language: str) -> torch.Tensor:
        return (self.language == self.languages.index(language)).nonzero().flatten()


class Regression:
    """Fits one weight to the tokens' mean; runs out of memory on batches larger than `fits` rows."""

    top1_key = "top1"

    def __init__(self, fits: int = 100):
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.fits = fits
        self.batches: list[int] = []

    def parameters(self):
        return {"weight": self.weight}

    def loss(self, data, indices):
        if len(indices) > self.fits:
            raise torch.OutOfMemoryError("stand-in: batch too large")
        self.batches.append(len(indices))
        error = (self.weight - data.tokens[indices].float().mean() / 80) ** 2
        return error, {"error": error.detach()}

    def evaluate(self):
        fit = float(1 - (self.weight.detach() - 0.5).abs())
        return {"python": {"expected_acceptance": fit, "top1": fit}, "all": {"expected_acceptance": fit, "top1": fit}}

    def train_mode(self, on: bool) -> None:
        pass


def test_a_batch_that_does_not_fit_is_split_and_the_step_retried(tmp_path):
    objective = Regression(fits=2)
    cfg = LoopConfig(out=str(tmp_path), batch_size=8, lr=0.1, warmup_tokens=1)
    state = train(objective, [Phase(Sequences(), 4 * 64)], cfg)
    # 8 rows failed, then 4, then 2 fit: 4 accumulated batches of 2 make each step's 64 tokens
    assert objective.batches == [2] * 16 and state["step"] == 4 and state["tokens"] == 4 * 64


def test_losses_come_back_once_per_log_interval_and_at_the_end(tmp_path):
    records = []
    cfg = LoopConfig(out=str(tmp_path), batch_size=2, lr=0.05, warmup_tokens=1, log_every=3)
    state = train(Regression(), [Phase(Sequences(), 7 * 16)], cfg, progress=records.append)
    assert [r["step"] for r in records] == [3, 6, 7] and state["complete"]
    assert set(records[0]) >= {"loss", "error", "tokens_per_s", "lr", "tokens", "phase"}
    logged = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [3, 6, 7]
    # evaluated before the first step and after the last
    assert [r["step"] for r in logged if "dev" in r] == [0, 7] == [e["step"] for e in state["evals"]]


def test_a_loop_without_budget_is_refused(tmp_path):
    with pytest.raises(ValueError, match="positive token budget"):
        train(Regression(), [Phase(Sequences(), 0)], LoopConfig(out=str(tmp_path)))


def test_the_schedule_follows_the_clock_when_the_time_limit_ends_the_run_first(tmp_path):
    from speccomplete.decoder.training.trainer import learning_rate

    cfg = LoopConfig(out=str(tmp_path), lr=1.0, warmup_tokens=10)
    assert learning_rate(cfg, 0, 1000) == pytest.approx(0.1)  # warmup
    assert learning_rate(cfg, 10, 1000) == pytest.approx(1.0)
    # a tenth of the tokens but half the time: the cosine is halfway, whichever is further along
    assert learning_rate(cfg, 109, 1000, time_spent=0.5) == pytest.approx(0.55)
    assert learning_rate(cfg, 109, 1000, time_spent=0.5) < learning_rate(cfg, 109, 1000)
    assert learning_rate(cfg, 20, 1000, time_spent=1.0) == pytest.approx(0.1)
