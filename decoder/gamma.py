"""How many tokens to draft next round.

γ may fall to 0, which is plain autoregressive decoding, so a draft that keeps missing costs
almost nothing. At 0 the policy probes γ=1 now and then, backing off exponentially while the
probes keep failing, so a draft that starts agreeing again is noticed.
"""

from __future__ import annotations


class FixedGamma:
    clocked = False  # γ as given, whether or not drafting pays (DraftPayoff, which the engine consults)

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

    clocked = True  # its γ runs where drafting pays on this machine (DraftPayoff)

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

    clocked = True  # its γ runs where drafting pays on this machine (DraftPayoff)

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


class DraftPayoff:
    """Whether the model draft pays on this machine, by the clock: the time per committed token of rounds it
    drafts against that of plain rounds (one target step), each a decayed average over recent rounds. The engine
    asks the same of draft trees against chains (`choose`: a tree's rows cost more than a chain's; where a
    language's second choices are seldom the target's, they buy nothing).

    The γ policies judge a draft by how far it matches; what that is worth differs from machine to machine. A
    self draft runs most of a target step per draft and saves the head's read, and its verify runs the head over
    a round's rows: nearly free where int8 products are bound by the reads (VNNI), dear where they are bound by
    the multiplies (AVX2 alone), so the same α̂ pays on one CPU and not on another (docs/speculative-decoding.md,
    "Does the draft pay here"). While either side has fewer than `min_rounds` measurements the side with fewer
    runs; then the faster one does, and now and then the other, so a change (a compiled step put in use, a busier
    machine, a language whose drafts start to match) is noticed: after `recheck` rounds, and after twice as many
    each time a recheck leaves the answer as it was, up to `most_between` (a flip starts again at `recheck`).
    Rounds that copy from the context are neither side: the lookup runs whatever this says.
    """

    def __init__(self, decay: float = 0.9, min_rounds: int = 4, recheck: int = 16, most_between: int = 256):
        self.decay, self.min_rounds, self.recheck, self.most_between = decay, min_rounds, recheck, most_between
        self.ms = {True: 0.0, False: 0.0}  # decayed sums by side: True, rounds the model drafted
        self.tokens = {True: 0.0, False: 0.0}
        self.weights = {True: 0.0, False: 0.0}  # decayed counts of rounds by side
        self.rounds = {True: 0, False: 0}
        self.since_recheck = 0
        self.between = recheck  # rounds from one recheck to the next
        self.checking: bool | None = None  # the answer a recheck running now was run against

    def pays(self) -> bool | None:
        """Whether drafting commits tokens faster than plain steps; None until both sides are measured."""
        if min(self.rounds.values()) < self.min_rounds:
            return None
        return self.tokens[True] * self.ms[False] >= self.tokens[False] * self.ms[True]

    def gate(self, gamma: int) -> int:
        """The γ to run this round: the policy's `gamma`, or 0 (a plain round) where drafting does not pay or a
        plain round is due."""
        if gamma == 0:
            self.checking = None
            return 0
        return gamma if self.choose() else 0

    def choose(self) -> bool:
        """Whether this round takes the measured side (True) or the other: the faster, or the one a measurement
        or a recheck is due on."""
        self.checking = None  # a recheck whose round was not timed (it copied, or drafted nothing) says nothing
        pays = self.pays()
        if pays is None:
            return self.rounds[True] <= self.rounds[False]
        self.since_recheck += 1
        if self.since_recheck >= self.between:
            self.since_recheck, self.checking = 0, pays
            pays = not pays
        return pays

    def record(self, drafted: bool, ms: float, tokens: int) -> None:
        """A round of the policy's γ > 0 that copied nothing: `drafted` whether the gate let the model draft."""
        self.ms[drafted] = self.decay * self.ms[drafted] + ms
        self.tokens[drafted] = self.decay * self.tokens[drafted] + tokens
        self.weights[drafted] = self.decay * self.weights[drafted] + 1
        self.rounds[drafted] += 1
        if self.checking is not None and drafted != self.checking:  # the recheck's round
            held = self.pays() == self.checking
            self.between = min(2 * self.between, self.most_between) if held else self.recheck
            self.checking = None

    def carried(self) -> DraftPayoff:
        """A start for another language on this machine: these rates, each side weighed as one round, so that the
        language's own first round of a side counts as much (its drafts may match further or less far), counted
        as just enough rounds to answer, and its rechecks from the first interval."""
        other = DraftPayoff(self.decay, self.min_rounds, self.recheck, self.most_between)
        for side in (True, False):
            if self.weights[side]:
                other.ms[side] = self.ms[side] / self.weights[side]
                other.tokens[side] = self.tokens[side] / self.weights[side]
                other.weights[side] = 1.0
            other.rounds[side] = min(self.rounds[side], self.min_rounds)
        return other

    def __repr__(self) -> str:
        rates = {side: self.tokens[side] / self.ms[side] * 1000 if self.ms[side] else 0.0 for side in (True, False)}
        return f"payoff(drafted {rates[True]:.0f} tok/s, plain {rates[False]:.0f} tok/s, pays={self.pays()})"


class RowCosts:
    """What a target pass costs on this machine by the rows it feeds, by the clock: a decayed average of the
    milliseconds of each row count the rounds verified. A row count not measured within the last `forget`
    rounds is read off those that were: between two, on the line through them; past the widest, on the line
    through the widest two, or as dear as the one where only one was measured (a guess on the cheap side, so a
    wider verify is tried once and then known); below the narrowest, as dear as it. Where a pass is bound by
    reading the weights (a GPU, VNNI) a few more rows cost little; where by the multiplies (AVX2 alone), each
    costs a third of a step.
    """

    def __init__(self, decay: float = 0.9, forget: int = 256):
        self.decay, self.forget = decay, forget
        self.sums: dict[int, float] = {}  # decayed milliseconds by rows
        self.weights: dict[int, float] = {}  # decayed counts by rows
        self.last: dict[int, int] = {}  # the round each row count was last measured in
        self.rounds = 0

    def record(self, rows: int, ms: float) -> None:
        self.rounds += 1
        self.sums[rows] = self.decay * self.sums.get(rows, 0.0) + ms
        self.weights[rows] = self.decay * self.weights.get(rows, 0.0) + 1
        self.last[rows] = self.rounds

    def table(self, most: int) -> list[float] | None:
        """The milliseconds of 1..`most` rows (index 0: one row), or None before any round was measured."""
        recent = [r for r in sorted(self.last) if self.rounds - self.last[r] < self.forget]
        known = {r: self.sums[r] / self.weights[r] for r in recent}
        if not known:
            return None
        rows = list(known)
        costs = []
        for r in range(1, most + 1):
            below, above = [k for k in rows if k <= r], [k for k in rows if k >= r]
            if below and above:
                low, high = below[-1], above[0]
                share = 0.0 if high == low else (r - low) / (high - low)
                costs.append(known[low] + share * (known[high] - known[low]))
            elif above:
                costs.append(known[above[0]])
            elif len(rows) == 1:
                costs.append(known[rows[0]])
            else:
                a, b = rows[-2], rows[-1]
                costs.append(known[b] + max(0.0, (known[b] - known[a]) / (b - a)) * (r - b))
        return costs

    def __repr__(self) -> str:
        return "rows(" + ", ".join(f"{r}: {self.sums[r] / self.weights[r]:.1f} ms" for r in sorted(self.last)) + ")"


class LookupSpan:
    """How many tokens a prompt lookup copies, by the clock: the span whose round is expected to commit the most
    tokens a millisecond, from how far copies have matched (per language, like the γ policies' statistics) and
    what a verify of its rows costs here (RowCosts).

    A copy that has matched for a few tokens tends to go on matching (on the benchmark cases a fresh copy's first
    token matched half the time and its fourth 87% of the times the third had), so the estimate is of each depth
    into a run of copies: the tokens of the current run already accepted, the last depths pooled. The expected
    tokens of a span s from depth d are 1 + the sum over i ≤ s of the chance the first i match. A copy is at least
    one token: its second row costs next to nothing, so every depth keeps being measured.
    """

    DEPTHS = 8

    def __init__(self, costs: RowCosts, decay: float = 0.97, prior: float = 0.5):
        self.costs, self.decay = costs, decay
        self.matched = [prior] * self.DEPTHS  # decayed counts by depth: copied tokens that matched
        self.tried = [1.0] * self.DEPTHS  # and copied tokens the target checked

    def span(self, depth: int, room: int) -> int | None:
        """The span for a copy at `depth` into a run, at most `room`; None before any round was timed."""
        if room < 1:
            return room
        costs = self.costs.table(room + 1)
        if costs is None:
            return None
        best, best_rate, expected, chance = 1, 0.0, 1.0, 1.0
        for span in range(1, room + 1):
            d = min(depth + span - 1, self.DEPTHS - 1)
            chance *= self.matched[d] / self.tried[d]
            expected += chance
            rate = expected / costs[span]  # span copies: span + 1 rows
            if rate > best_rate:
                best, best_rate = span, rate
        return best

    def record(self, depth: int, copied: int, accepted: int) -> None:
        """A copy of `copied` tokens at `depth` into a run, of which the first `accepted` matched."""
        for i in range(min(copied, accepted + 1)):
            d = min(depth + i, self.DEPTHS - 1)
            self.tried[d] = self.decay * self.tried[d] + 1
            self.matched[d] = self.decay * self.matched[d] + (i < accepted)

    def __repr__(self) -> str:
        return "span(" + " ".join(f"{m / t:.2f}" for m, t in zip(self.matched, self.tried)) + f", {self.costs})"


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
