"""Per-request decoding statistics: a plain record the telemetry layer can serialize as is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from speccomplete.metrics import acceptance_rate, mean_accepted_length


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    prompt_truncated_tokens: int = 0  # dropped from the left to fit the context window
    prompt_reused_tokens: int = 0  # already in the cache from the previous request: not prefilled again
    new_tokens: int = 0
    rounds: int = 0  # target forward passes after prefill
    drafted: int = 0
    accepted: int = 0
    rejected_rounds: int = 0  # rounds that ended in a rejected draft token
    accepted_histogram: list[int] = field(default_factory=list)  # [n] = rounds that accepted n drafts
    gammas: list[int] = field(default_factory=list)  # drafts proposed in each round
    lookup_drafted: int = 0  # of `drafted`, the tokens copied from the context (hybrid drafts)
    lookup_accepted: int = 0
    lookup_rejected_rounds: int = 0  # of `rejected_rounds`, those whose drafts were a copy
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    total_ms: float = 0.0
    ttft_ms: float = 0.0
    finish_reason: str = ""  # engine.FinishReason once decoded; the server also writes "reused" (no decoding)
    draft_counts: str = "rounds"  # rounds (all recorded), totals (drafted/accepted only) or unreported (none)
    threads: int = 0  # on the CPU, the fewest intra-op threads any step ran with (cpu_threads.IdleCores); 0 elsewhere

    def record_round(self, drafted: int, accepted: int, lookup: bool = False) -> None:
        self.rounds += 1
        if lookup:
            self.lookup_drafted += drafted
            self.lookup_accepted += accepted
        self.gammas.append(drafted)
        self.drafted += drafted
        self.accepted += accepted
        if accepted < drafted:
            self.rejected_rounds += 1
            self.lookup_rejected_rounds += lookup
        if drafted:
            while len(self.accepted_histogram) <= accepted:
                self.accepted_histogram.append(0)
            self.accepted_histogram[accepted] += 1

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance estimate α̂ (speccomplete.metrics.acceptance_rate)."""
        return acceptance_rate(self.accepted, self.rejected_rounds)

    @property
    def model_alpha(self) -> float | None:
        """α̂ at the positions a model drafted (not copied by a prompt lookup): the draft's own acceptance."""
        return acceptance_rate(self.accepted - self.lookup_accepted, self.rejected_rounds - self.lookup_rejected_rounds)

    @property
    def mean_accepted(self) -> float | None:
        """Mean accepted drafts per round that drafted anything, τ (speccomplete.metrics.mean_accepted_length)."""
        return mean_accepted_length(self.accepted, sum(self.accepted_histogram))

    @property
    def tokens_per_s(self) -> float:
        return 1000 * self.new_tokens / self.total_ms if self.total_ms else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {
            "alpha": self.alpha,
            "model_alpha": self.model_alpha,
            "mean_accepted": self.mean_accepted,
            "tokens_per_s": self.tokens_per_s,
        }
