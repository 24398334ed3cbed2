"""How many tokens to draft next round.

γ may fall to 0, which is plain autoregressive decoding, so a draft that keeps missing costs
almost nothing. At 0 the policy probes γ=1 now and then, backing off exponentially while the
probes keep failing, so a draft that starts agreeing again is noticed.
"""

from __future__ import annotations


class FixedGamma:
    def __init__(self, gamma: int):
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = self.max_gamma = gamma

    def next_gamma(self) -> int:
        return self.gamma

    def update(self, requested: int, drafted: int, accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"fixed({self.gamma})"


class HeuristicGamma:
    """HF's "heuristic" schedule (+2 after a fully accepted round, -1 otherwise), allowed to reach 0."""

    def __init__(self, start: int = 4, max_gamma: int = 16, first_probe_after: int = 8, max_probe_after: int = 128):
        if not 0 <= start <= max_gamma:
            raise ValueError(f"need 0 <= start <= max_gamma, got start={start}, max_gamma={max_gamma}")
        self.gamma = start
        self.max_gamma = max_gamma
        self.first_probe_after = first_probe_after
        self.max_probe_after = max_probe_after
        self.probe_after = first_probe_after
        self.rounds_at_zero = 0

    def next_gamma(self) -> int:
        if self.gamma == 0 and self.rounds_at_zero >= self.probe_after:
            return 1
        return self.gamma

    def update(self, requested: int, drafted: int, accepted: int) -> None:
        if requested == 0:
            self.rounds_at_zero += 1
            return
        if drafted == 0:
            # Nothing was verified (no n-gram match, or an unsure draft): no evidence either way.
            # A probe that drafted nothing is retried after the same wait.
            if self.gamma == 0:
                self.rounds_at_zero = 0
            return
        full = accepted == drafted
        if self.gamma == 0:  # this was a probe
            self.rounds_at_zero = 0
            if full:
                self.gamma, self.probe_after = 1, self.first_probe_after
            else:
                self.probe_after = min(2 * self.probe_after, self.max_probe_after)
            return
        self.gamma = min(self.gamma + 2, self.max_gamma) if full else self.gamma - 1

    def __repr__(self) -> str:
        return f"heuristic(γ={self.gamma}, max={self.max_gamma})"


def parse_gamma_policy(spec: str | int):
    """'4' -> fixed γ=4; 'heuristic' or 'heuristic:START:MAX' -> adaptive."""
    name, *numbers = str(spec).split(":")
    if name == "heuristic" and len(numbers) in (0, 2) and all(x.isdigit() for x in numbers):
        return HeuristicGamma(*map(int, numbers))
    if not numbers and name.lstrip("-").isdigit():
        return FixedGamma(int(name))
    raise ValueError(f"gamma must be an integer >= 0 or 'heuristic[:START:MAX]', got {spec!r}")
