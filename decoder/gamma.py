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


class CostModelGamma:
    """γ* from a cost model (Leviathan et al.; docs/speculative-decoding.md, "Tokens per round, and the speed-up"),
    fed by live acceptance.

    A round of γ drafts yields E(γ) = (1 - α^(γ+1)) / (1 - α) tokens and costs γ·c draft steps
    plus a verify of γ+1 tokens, 1 + v·γ target steps. γ* maximizes E(γ) / cost(γ); when no
    γ > 0 beats plain decoding (E/cost ≤ 1) it is 0, with probes as in HeuristicGamma so a
    rising α is noticed. α̂ = accepted / (accepted + rejections), over recent rounds (decayed).
    """

    def __init__(
        self,
        draft_cost: float = 0.2,
        verify_cost: float = 0.03,
        max_gamma: int = 8,
        prior_alpha: float = 0.5,
        decay: float = 0.95,
        probe_after: int = 8,
    ):
        self.c, self.v, self.max_gamma = draft_cost, verify_cost, max_gamma
        self.accepted, self.rejections = 2 * prior_alpha, 2 * (1 - prior_alpha)  # worth two rounds of evidence
        self.decay = decay
        self.probe_after = probe_after
        self.rounds_at_zero = 0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    def best_gamma(self) -> int:
        a = min(self.alpha, 0.999)
        gain = {g: (1 - a ** (g + 1)) / (1 - a) / (1 + g * (self.c + self.v)) for g in range(self.max_gamma + 1)}
        return max(gain, key=gain.__getitem__)

    def next_gamma(self) -> int:
        gamma = self.best_gamma()
        if gamma == 0 and self.rounds_at_zero >= self.probe_after:
            return 1
        return gamma

    def update(self, requested: int, drafted: int, accepted: int) -> None:
        if requested == 0:
            self.rounds_at_zero += 1
            return
        if drafted == 0:
            return
        self.rounds_at_zero = 0
        self.accepted = self.decay * self.accepted + accepted
        self.rejections = self.decay * self.rejections + (accepted < drafted)

    def __repr__(self) -> str:
        return f"cost(α̂={self.alpha:.2f}, c={self.c}, v={self.v}, γ*={self.best_gamma()})"


def parse_gamma_policy(spec: str | int):
    """'4' -> fixed γ=4; 'heuristic' or 'heuristic:START:MAX' -> adaptive; 'cost' or 'cost:C:V' -> cost model
    with draft step cost C and extra verify cost per token V, both in target steps."""
    name, *numbers = str(spec).split(":")
    if name == "heuristic" and len(numbers) in (0, 2) and all(x.isdigit() for x in numbers):
        return HeuristicGamma(*map(int, numbers))
    if name == "cost" and len(numbers) in (0, 2) and all(x.replace(".", "", 1).isdigit() for x in numbers):
        if not numbers:
            return CostModelGamma()
        draft_cost, verify_cost = map(float, numbers)
        return CostModelGamma(draft_cost, verify_cost)
    if not numbers and name.lstrip("-").isdigit():
        return FixedGamma(int(name))
    raise ValueError(f"gamma must be an integer >= 0, 'heuristic[:START:MAX]' or 'cost[:C:V]', got {spec!r}")
