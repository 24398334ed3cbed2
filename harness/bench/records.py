"""The bench's records: one method's run on one prompt (`Run`: its tokens, seconds and decoder stats, and
the prefill and decode times read from them) and every method's run on one case (`CaseRuns`, with the
product's follow-up request after them and the graphs recorded or compiled around them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from speccomplete.decoder.stats import GenerationStats

from ..lib.cases import Case


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: GenerationStats | None = None  # our decoders' and llama.cpp's runs (HF's keep none)
    text: str | None = None  # llama.cpp's runs: it streams text, not our token ids
    first_token_s: float | None = None  # HF's runs: the time to the first token it streamed

    @property
    def prefill_s(self) -> float | None:
        """The prompt's share of `seconds`: the decoder's own prefill time, or HF's time to its first token."""
        return self.stats.prefill_ms / 1000 if self.stats is not None else self.first_token_s

    @property
    def decode_s(self) -> float | None:
        prefill = self.prefill_s
        return None if prefill is None else self.seconds - prefill

    @property
    def first_token_ms(self) -> float | None:
        """Time to the first token: read back from the device, so on CUDA it bounds a prefill whose
        stamp (our stats' prefill_ms) may come before the device has finished it."""
        if self.stats is not None:
            return self.stats.ttft_ms or None
        return None if self.first_token_s is None else self.first_token_s * 1000

    @property
    def token_count(self) -> int:
        return self.stats.new_tokens if self.text is not None and self.stats else len(self.tokens)

    @property
    def our_stats(self) -> GenerationStats:
        """The stats of a run of one of our decoders or llama.cpp (HF's methods keep none)."""
        assert self.stats is not None, "an HF method's run has no decoder stats"
        return self.stats


@dataclass
class CaseRuns:
    """Every method's run on one case, and the product's follow-up request after it."""

    case: Case
    runs: dict[str, Run] = field(default_factory=dict)
    followup: dict[str, float] = field(default_factory=dict)  # warm / cold: ms to the first token, tokens prefilled
    recorded: dict[str, int] = field(default_factory=dict)  # graphs recorded or compiled during the case's runs
    recordings_after: dict[str, int | None] = field(default_factory=dict)  # Recordings.counts() after them
