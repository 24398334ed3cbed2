"""A first run converts the packaged GGUF (decoder/models.py, convert_gguf) and says how far it got: the
editor's progress bar (server/loading.py) draws what these reports say."""

from __future__ import annotations

from speccomplete.decoder import models
from speccomplete.decoder.models import convert_gguf, load_model
from speccomplete.harness.tiny_gguf import write_tiny_gguf


def test_conversion_reports_each_phase_in_order_and_ends_at_one(tmp_path):
    reports: list[tuple[float, str]] = []
    out = convert_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "converted", lambda *r: reports.append(r))

    fractions = [fraction for fraction, _ in reports]
    assert fractions == sorted(fractions), "the bar never moves back"
    assert 0.0 <= fractions[0] and fractions[-1] == 1.0
    assert reports[-1][1] == "converted tiny.gguf"
    phases = [message.rsplit(": ", 1)[1] for _, message in reports[:-1]]
    assert list(dict.fromkeys(phases)) == list(models.CONVERT_SECONDS)
    # each phase starts where the expected times before it put it
    total = sum(models.CONVERT_SECONDS.values())
    firsts = {message.rsplit(": ", 1)[1]: fraction for fraction, message in reversed(reports[:-1])}
    assert abs(firsts["tokenizer"] - models.CONVERT_SECONDS["weights"] / total) < 0.01
    model, _ = load_model(str(out))  # what it wrote loads
    assert model.config.num_hidden_layers > 0


def test_a_slow_phase_moves_the_bar_but_never_past_its_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(models.time, "monotonic", lambda: clock[0])
    reports: list[float] = []
    phases = models._ConversionProgress(lambda fraction, message: reports.append(fraction), "m.gguf")
    phases.begin("weights")
    clock[0] += models.CONVERT_SECONDS["weights"] / 2
    phases.report()
    clock[0] += 10 * models.CONVERT_SECONDS["weights"]  # far slower than expected
    phases.report()
    weights_end = models.CONVERT_SECONDS["weights"] / sum(models.CONVERT_SECONDS.values())
    assert reports[0] == 0.0
    assert abs(reports[1] - weights_end / 2) < 1e-9
    assert reports[1] < reports[2] < weights_end
