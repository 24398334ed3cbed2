"""What one reliability check reports: its measurements and its targets, met or not."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Target:
    name: str  # e.g. "unanswered requests"
    value: float | int | str  # what was measured
    goal: str  # e.g. "== 0", "<= 400 ms"
    met: bool


@dataclass
class CheckResult:
    check: str  # "fuzz", "tcp", "storm", "kill", "configs"
    seed: int
    full: bool  # the full version (else the short one CI runs)
    metrics: dict = field(default_factory=dict)  # plain JSON values
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what went wrong, one line each (the first few)

    @property
    def passed(self) -> bool:
        return all(t.met for t in self.targets)

    def target(self, name: str, value, goal: str, met: bool) -> None:
        self.targets.append(Target(name, value, goal, bool(met)))
