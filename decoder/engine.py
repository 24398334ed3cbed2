"""The speculative decoding loop. Plain autoregressive decoding is the same loop with γ = 0.

Invariant: the target's KV cache holds every committed token but the last. Each round feeds the
last committed token plus the drafts in one forward pass, accepts a prefix of the drafts, appends
one more token from the target (the correction, or a bonus when all were accepted) and cuts the
cache back to the new invariant. Rolling back moves the cache's end; nothing is recomputed. The
one exception is the first round: prefill feeds the prompt (in chunks), and its last logits stand in
for that feed, so plain AR costs exactly one forward pass per token, as in HF generate. A draft
that is the target itself (drafts/self_draft.py) has fed its drafts already, one at a time, so its
verify is only the target's head over their hidden states.

Between requests the caches are kept: the next prompt is compared with the tokens the caches
hold, and only what differs is prefilled. Editors ask again and again about the same file, so
most of a prompt is usually already there.

With DecodeOptions.heal the prompt's last token is taken back, and the first round's first row of
target logits is masked to the tokens that continue its text (healing.py). Drafts are judged against
that masked row, so greedy and sampled speculation are still the target's own decoding, under the mask.

A request is cancelled (DecodeOptions.cancel) between rounds and between the prefill's chunks of
PREFILL_CHUNK tokens, so a cancelled long prompt stops within one chunk. A prefill cancelled midway
leaves the target's cache as the last request left it (cut to the tokens reused), as the drafters'
caches are: the next request picks up from there.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from . import greedy_rows
from .cpu_threads import IdleCores
from .drafts.base import Drafter, Proposal
from .drafts.references import References
from .gamma import DraftPayoff, FixedGamma, HeuristicGamma, LookupSpan, RowCosts
from .healing import allowed_first, heal
from .kv_cache import head_logits
from .sampling import (
    SamplingParams,
    accept_greedy,
    accept_sampled,
    greedy_verdict_on_host,
    probabilities,
    verdict,
)
from .stats import GenerationStats
from .target_steps import EagerTarget, Steps, context_window
from .text import TextStream
from .tree import DraftTree
from .tree import accept_greedy as tree_accept_greedy
from .tree import accept_sampled as tree_accept_sampled

log = logging.getLogger(__name__)

# Prompt tokens fed per forward pass of a prefill; a cancel is checked before each. The smallest chunk
# that costs a prefill next to nothing, so a cancelled prefill stops soon (docs/cpu.md, "Prefill").
PREFILL_CHUNK = 128


class Cancelled(Protocol):
    def is_set(self) -> bool: ...


@dataclass
class DecodeOptions:
    max_new_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    # tokens that end the generation as EOS does, not part of the text (a FIM model's end of the middle)
    stop_tokens: frozenset[int] = frozenset()
    stop_when: Callable[[str], bool] | None = None  # e.g. "the syntax node has closed"
    cancel: Cancelled | None = None  # checked between rounds and between the prefill's chunks
    on_text: Callable[[str], None] | None = None  # receives settled text as it grows
    seed: int | None = None
    max_prompt_tokens: int | None = None  # left-truncate longer prompts (the context window always applies)
    gamma_group: str = ""  # requests of one group (e.g. a language) share an adaptive γ policy's statistics
    # take the prompt's last token back and write it again (healing.py; text prompts only): that token counts
    # in max_new_tokens, so the text may be one token shorter
    heal: bool = False
    # other documents' tokens a prompt lookup may copy from where the prompt has no match (drafts/references.py)
    references: References | None = None


# Why a generation ended: an EOS token, max_new_tokens, a stop string, DecodeOptions.stop_when,
# or DecodeOptions.cancel.
FinishReason = Literal["eos", "length", "stop", "predicate", "cancelled"]


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    stats: GenerationStats
    # the target's log-probability of each token in token_ids (under its raw logits, before temperature):
    # the completion's own evidence of how sure the model was (server/gate.py)
    logprobs: list[float] = field(default_factory=list)
    # the end of the prompt that the first token wrote again (token healing, healing.py): the first tokens
    # cover it and then `text`, which does not repeat it
    healed: str = ""


def round_rows(gamma, drafter: Drafter | None) -> int:
    """The most tokens one round feeds the target: the last committed token and every draft."""
    if drafter is None:
        return 1
    return max(gamma.max_gamma, drafter.lookup_tokens) + 1


def eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


class SpeculativeDecoder:
    """Target + optional drafter + γ policy. `generate` is batch-1 and not thread-safe.

    steps: how the target runs (target_steps.py); EagerTarget when None. Decoders that take turns
    may share one, so a baseline runs on the same cache and compiled graphs as the product.
    """

    def __init__(
        self,
        target,
        tokenizer,
        drafter: Drafter | None = None,
        gamma=None,
        draft_confidence: float = 0.0,
        steps: Steps | None = None,
        tree_nodes: int = 0,
    ):
        """tree_nodes: the most drafts a round's draft tree holds (decoder/tree.py), where the drafter proposes
        trees and the steps verify them; 0: chains only."""
        if tree_nodes < 0:
            raise ValueError(f"tree_nodes must be >= 0, got {tree_nodes}")
        self.target = target
        self.tree_nodes = tree_nodes
        self.tokenizer = tokenizer
        self.drafter = drafter
        if gamma is None:
            gamma = HeuristicGamma() if drafter is not None else FixedGamma(0)
        self.gamma = gamma  # kept across requests, like HF's heuristic schedule
        self.group_gammas: dict[str, object] = {}  # a copy of it for each named gamma_group
        self.payoffs: dict[str, DraftPayoff] = {}  # whether the model draft pays here, by gamma_group (_payoff)
        self.tree_payoffs: dict[str, DraftPayoff] = {}  # whether a draft tree pays over a chain, by gamma_group
        self.row_costs = RowCosts()  # what a verify of so many rows costs here, timed from the rounds
        self.spans: dict[str, LookupSpan] = {}  # how long a lookup's copies run, by gamma_group (_lookup_span)
        self.draft_confidence = draft_confidence
        self.eos = eos_ids(target, tokenizer)
        self.steps = steps if steps is not None else EagerTarget(target, drafter.target_taps if drafter else ())
        if drafter is not None:
            drafter.attach(self.steps)  # a draft that runs on the target itself drafts on these (SelfDrafter)
            if self.steps.records_graphs:  # recorded steps: drafting's graphs are recorded now too
                drafter.warm_up(self.gamma.max_gamma)
        limits = [w for w in (context_window(target.config), self.steps.capacity) if w]
        self.window = min(limits) if limits else None
        self.idle_cores = IdleCores() if target.device.type == "cpu" else None
        # per tuple of stop strings: whether a token's own text holds one (_through_stop)
        self._stops_in: dict[tuple[str, ...], dict[int, bool]] = {}

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    @torch.inference_mode()
    def generate(self, prompt: str | list[int], options: DecodeOptions | None = None) -> Generation:
        opts = options or DecodeOptions()
        if opts.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {opts.max_new_tokens}")
        start = time.perf_counter()
        stats = GenerationStats()
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        healed = ""
        if opts.heal and isinstance(prompt, str):
            ids, healed = heal(self.tokenizer, ids)
        ids, stats.prompt_truncated_tokens = self.fit_prompt(ids, opts.max_new_tokens, opts.max_prompt_tokens)
        stats.prompt_tokens = len(ids)
        generator = torch.Generator(self.target.device).manual_seed(opts.seed) if opts.seed is not None else None
        stream = TextStream(self.tokenizer, ids, opts.stop_strings, healed)

        self._take_idle_cores(stats)
        reused = self._reuse_prefix(ids)
        stats.prompt_reused_tokens = reused
        prefill_logits = self._prefill(ids, reused, opts.cancel)
        if prefill_logits is None:
            stats.prefill_ms = stats.total_ms = _ms(start)
            stats.finish_reason = "cancelled"
            return Generation("", [], "cancelled", stats, [], healed)
        if self.drafter is not None:
            self.drafter.refer(opts.references)
            # an adaptive policy's lookup copies as far as pays on this machine, by the clock; a fixed γ's, by its rule
            clocked = getattr(self._policy(opts.gamma_group), "clocked", False)
            self.drafter.clock_lookup(self._lookup_span(opts.gamma_group) if clocked else None)
            self.drafter.reset(ids, reused)
        if prefill_logits.device.type == "cuda":  # the prefill's time, not its launch's (the first round waits anyway)
            torch.cuda.synchronize(prefill_logits.device)
        stats.prefill_ms = _ms(start)

        committed = list(ids)
        generated: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason | None = None
        while finish is None:
            if opts.cancel is not None and opts.cancel.is_set():
                finish = "cancelled"
                break
            self._take_idle_cores(stats)
            new_tokens, new_logprobs = self._round(
                committed,
                prefill_logits,
                opts,
                generator,
                stats,
                wanted=opts.max_new_tokens - len(generated),
                healed=healed if not generated else "",
            )
            prefill_logits = None
            for token, logprob in zip(new_tokens, new_logprobs):
                if token in self.eos or token in opts.stop_tokens:
                    finish = "eos"
                    break
                generated.append(token)
                logprobs.append(logprob)
                if len(generated) >= opts.max_new_tokens:
                    finish = "length"
                    break
            committed = ids + generated
            if generated and not stats.ttft_ms:
                stats.ttft_ms = _ms(start)
            settled = stream.update(generated)
            if stream.stopped:
                finish = "stop"
            elif finish is None and opts.stop_when is not None and opts.stop_when(stream.text):
                finish = "predicate"
            if settled and opts.on_text:
                opts.on_text(settled)
        rest = stream.finish()
        if rest and opts.on_text:
            opts.on_text(rest)
        stats.new_tokens = len(generated)
        stats.finish_reason = finish
        stats.total_ms = _ms(start)
        return Generation(stream.text, generated, finish, stats, logprobs, healed)

    @torch.inference_mode()
    def warm(self, prompt: str, options: DecodeOptions) -> int:
        """Prefill `prompt` but its last token, and decode nothing, so that `generate(prompt, options)`, or a
        request for a prompt that shares its start, finds the cache warm. Stops at a chunk boundary once
        `options.cancel` is set and keeps the chunks done. Returns the tokens the cache now holds of it."""
        ids = self.encode(prompt)
        if options.heal:
            ids, _ = heal(self.tokenizer, ids)
        ids, _ = self.fit_prompt(ids, options.max_new_tokens, options.max_prompt_tokens)
        self._take_idle_cores(GenerationStats())
        shared = self._reuse_prefix(ids)
        if self.drafter is not None:
            # the drafter holds at most what the target held before: no more than `shared` of it is this prompt's
            self.drafter.reset(ids[: shared + 1], shared)
        for begin in range(shared, len(ids) - 1, PREFILL_CHUNK):
            if options.cancel is not None and options.cancel.is_set():
                break
            self.steps.feed(ids[begin : min(begin + PREFILL_CHUNK, len(ids) - 1)])
        return len(self.steps.tokens)

    def _take_idle_cores(self, stats: GenerationStats) -> None:
        if self.idle_cores is not None:
            threads = self.idle_cores.adjust()
            stats.threads = min(stats.threads, threads) if stats.threads else threads

    def _policy(self, group: str):
        if not group:
            return self.gamma
        if group not in self.group_gammas:
            self.group_gammas[group] = copy.deepcopy(self.gamma)
        return self.group_gammas[group]

    def _payoff(self, group: str, payoffs: dict[str, DraftPayoff] | None = None) -> DraftPayoff:
        """The group's DraftPayoff among `payoffs` (by default the model draft's; the engine's tree_payoffs too)."""
        payoffs = self.payoffs if payoffs is None else payoffs
        if group not in payoffs:
            # What a round costs is the machine's: a new language starts from the answer of the one measured most,
            # and its own rounds and rechecks take over (docs/speculative-decoding.md, "Does the draft pay here").
            measured = [payoff for payoff in payoffs.values() if payoff.pays() is not None]
            most = max(measured, key=lambda payoff: sum(payoff.rounds.values()), default=None)
            payoffs[group] = most.carried() if most is not None else DraftPayoff()
        return payoffs[group]

    def _lookup_span(self, group: str) -> LookupSpan:
        if group not in self.spans:
            self.spans[group] = LookupSpan(self.row_costs)
        return self.spans[group]

    def _reuse_prefix(self, ids: list[int]) -> int:
        """Cut the target's cache to the longest prefix it shares with `ids`; returns its length.

        At least the last prompt token is always fed again: its logits start the decode.
        """
        held = self.steps.tokens
        shared = 0
        limit = min(len(held), len(ids) - 1)
        while shared < limit and held[shared] == ids[shared]:
            shared += 1
        self.steps.truncate(shared)
        return len(self.steps.tokens)  # fewer where the steps cannot cut back that far (graph_target.py)

    def _prefill(self, ids: list[int], reused: int, cancel: Cancelled | None) -> torch.Tensor | None:
        """Feed the prompt past its first `reused` tokens, PREFILL_CHUNK at a time; returns the logits
        of its last token, or None when `cancel` was set before a chunk."""
        logits = None
        for begin in range(reused, len(ids), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                # As the last request left it: a drafter's reset takes the reused tokens to be those it holds.
                self.steps.truncate(reused)
                return None
            end = begin + PREFILL_CHUNK
            if end < len(ids):
                self.steps.feed(ids[begin:end])  # no head: over a large vocabulary it costs a few tokens' layers
            else:
                logits = self.steps.forward(ids[begin:], keep=1)
        return logits

    def _round(
        self, committed, prefill_logits, opts, generator, stats, wanted: int, healed: str = ""
    ) -> tuple[list[int], list[float]]:
        """One draft-then-verify round. Returns the tokens to commit (accepted drafts plus one from the
        target) and the target's log-probability of each.

        wanted: the tokens still to generate; a round drafts at most one fewer (the target adds one).
        healed: the text the round's first token must start with (the first round of a healed prompt).
        """
        params = opts.sampling
        policy = self._policy(opts.gamma_group)
        asked = min(policy.next_gamma(), wanted - 1) if self.drafter is not None else 0
        # an adaptive policy's γ runs where drafting pays on this machine, by the clock; a fixed one's always
        payoff = self._payoff(opts.gamma_group) if asked > 0 and getattr(policy, "clocked", False) else None
        gamma = payoff.gate(asked) if payoff is not None else asked
        # timed: a round that runs a target step (the first after a prefill takes the prefill's logits)
        clock = payoff if prefill_logits is None and not healed else None
        t0 = time.perf_counter()
        proposal = None
        tree_steps = self._tree_steps() if prefill_logits is None and not healed else None
        # an adaptive policy's rounds draft trees where they pay over chains here, for this language, by the clock
        tree_clock = (
            self._payoff(opts.gamma_group, self.tree_payoffs)
            if self.drafter is not None and tree_steps is not None and getattr(policy, "clocked", False)
            else None
        )
        # the side is chosen before the draft, so that rounds with no tree to offer fall on both sides alike
        trees = tree_clock.choose() if tree_clock is not None else True
        tree_choice = (tree_clock, trees) if tree_clock is not None else None
        if self.drafter is not None and tree_steps is not None and trees:
            # within the rows the steps are sized for: past them a feed runs on other code (eager, not compiled)
            nodes = min(self.tree_nodes, round_rows(self.gamma, self.drafter) - 1, tree_steps.tree_rows() - 1)
            proposal = self.drafter.propose_tree(committed, gamma, nodes, params, generator)
        if proposal is None:
            proposal = (
                self.drafter.propose(committed, gamma, params, generator, self.draft_confidence)
                if self.drafter is not None
                else Proposal([], None)
            )
        offered = len(proposal.tokens)
        proposal = self._through_stop(proposal, opts.stop_strings)
        if self.drafter is not None and len(proposal.tokens) < offered:
            self.drafter.shortened(len(proposal.tokens))
        t1 = time.perf_counter()
        k = len(proposal.tokens)
        # Verify: the last committed token plus k drafts, one forward pass, k+1 rows of logits.
        if proposal.tree is not None and tree_steps is not None:
            tree = proposal.tree
            accepted, after, path_logprobs = self._verify_tree(tree_steps, committed, tree, params, generator)
            tree_steps.keep_path(len(committed) - 1, [0, *accepted])
            deepest = max(tree.depths())
            self._after_round(
                committed, len(accepted), proposal, policy, (asked, gamma), deepest, stats, t0, t1, clock, tree_choice
            )
            return [tree.tokens[row - 1] for row in accepted] + [after], path_logprobs
        if params.greedy and proposal.hidden is None and prefill_logits is None and not healed:
            # the product's usual round: the steps decide it too (on CUDA inside the step's graph)
            outcome = self.steps.verify_greedy([committed[-1]] + proposal.tokens)
        else:
            outcome = self._verify(committed, proposal, prefill_logits, params, generator, healed)
        n, token, *row_logprobs = outcome
        n, token = int(n), int(token)
        if proposal.hidden is None and prefill_logits is None:  # a pass of the target over the round's rows
            self.row_costs.record(k + 1, _ms(t1))
        # Roll back: keep the accepted drafts in both caches; the new token is fed next round.
        self.steps.truncate(len(committed) + n)
        self._after_round(committed, n, proposal, policy, (asked, gamma), k, stats, t0, t1, clock, tree_choice)
        return proposal.tokens[:n] + [token], row_logprobs[: n + 1]

    def _after_round(
        self,
        committed,
        n: int,
        proposal: Proposal,
        policy,
        gammas,
        deepest: int,
        stats,
        t0,
        t1,
        clock=None,
        tree_choice: tuple[DraftPayoff, bool] | None = None,
    ):
        """The drafter rolled back to the `n` drafts accepted, the γ policy told how far the draft matched
        (`deepest`: the most drafts one path offered), the clocks how long the round took, the round counted.
        gammas: (the γ the policy asked for, the γ that ran: 0 where the payoff's gate made it a plain round).
        clock: the payoff that times this round, if any; tree_choice: the trees' payoff and the side this round took."""
        asked, gamma = gammas
        if self.drafter is not None:
            self.drafter.rollback(len(committed) + n)
            if proposal.lookup:  # a copy from the context says nothing of how far the model draft would match
                policy.update(asked, 0, 0)
            elif gamma == asked:  # (a plain round the gate ran says nothing of it either)
                policy.update(gamma, deepest, n)
            # A draft that proposed nothing is on neither side: it may not have run (after a prefill), or it
            # ran and stopped unsure, a cost left uncounted.
            if clock is not None and not proposal.lookup and (gamma == 0 or proposal.tokens):
                clock.record(gamma > 0, _ms(t0), n + 1)
        stats.draft_ms += (t1 - t0) * 1000
        stats.verify_ms += _ms(t1)
        if tree_choice is not None:
            tree_payoff, trees = tree_choice
            tree_payoff.record(trees, _ms(t0), n + 1)
        stats.record_round(len(proposal.tokens), n, proposal.lookup)

    def _tree_steps(self) -> EagerTarget | None:
        """The steps, where rounds draft trees (a tree budget, and steps that verify them)."""
        steps = self.steps
        return steps if self.tree_nodes and isinstance(steps, EagerTarget) and steps.runs_trees else None

    def _verify_tree(
        self, steps: EagerTarget, committed, tree: DraftTree, params, generator
    ) -> tuple[list[int], int, list[float]]:
        """A draft tree's verify (decoder/tree.py): the last committed token and every node in one pass. Returns
        the accepted nodes' rows, the token after them and the target's log-probability of each token committed."""
        logits = steps.forward_tree(tree, committed[-1])
        kernel = params.greedy and greedy_rows.usable(logits)  # the CPU's decision, as a chain's (greedy_rows.py)
        if kernel:
            choices, maxima = greedy_rows.first_maxima(logits)
            accepted, token = tree_accept_greedy(tree, choices)
        elif params.greedy:
            accepted, token = tree_accept_greedy(tree, logits.argmax(-1).tolist())
        else:
            accepted, token = tree_accept_sampled(tree, probabilities(logits, params), generator)
        path = logits[[0, *accepted]]
        taken = [*(tree.tokens[row - 1] for row in accepted), token]
        if kernel:
            return accepted, token, greedy_rows.log_probabilities(path, taken, maxima[[0, *accepted]])
        chosen = path.gather(-1, torch.tensor(taken, device=logits.device).view(-1, 1)).squeeze(-1).float()
        return accepted, token, (chosen - torch.logsumexp(path.float(), -1)).tolist()

    def _verify(self, committed, proposal, prefill_logits, params, generator, healed) -> list[float]:
        """Any round's verify and acceptance from the target's logits: sampled, a healed first token, the
        first round (the prefill's logits stand in for the last committed token's) or a self draft's
        (only the head is left over its hidden states). Returns sampling.verdict's values."""
        k = len(proposal.tokens)
        if proposal.hidden is not None:  # the draft ran the target's own layers: only its head is left
            logits = head_logits(self.target, self.target.get_output_embeddings(), proposal.hidden)
        elif prefill_logits is None:
            logits = self.steps.forward([committed[-1]] + proposal.tokens, keep=k + 1)
        elif k:
            logits = torch.cat([prefill_logits, self.steps.forward(proposal.tokens, keep=k)])
        else:
            logits = prefill_logits
        if healed:  # the first token: the target's distribution over the tokens that continue `healed`
            allowed = allowed_first(self.tokenizer, healed, logits.shape[-1], logits.device)
            logits = torch.cat([logits[:1].masked_fill(~allowed, float("-inf")), logits[1:]])
        drafts = torch.tensor(proposal.tokens, dtype=torch.long, device=logits.device)
        if params.greedy and logits.device.type == "cpu":
            return greedy_verdict_on_host(logits, drafts)
        if params.greedy:
            decided = accept_greedy(logits, drafts)
        else:
            q = proposal.q
            if q is not None and q.shape[-1] < logits.shape[-1]:  # a draft head narrower than the target's
                q = torch.nn.functional.pad(q, (0, logits.shape[-1] - q.shape[-1]))
            decided = accept_sampled(probabilities(logits, params), q, drafts, generator)
        return verdict(logits, drafts, decided).tolist()

    def _through_stop(self, proposal: Proposal, stop_strings: tuple[str, ...]) -> Proposal:
        """The proposal up to its first draft whose own text holds a stop string: the generation ends
        there if it is accepted, so later drafts would be verify rows for nothing (a lookup's copy
        runs past a single-line completion's line end). A shorter proposal is still lossless."""
        if not stop_strings or len(proposal.tokens) < 2 or proposal.tree is not None:  # a tree's paths stay whole
            return proposal
        holds = self._stops_in.setdefault(stop_strings, {})
        for index, token in enumerate(proposal.tokens[:-1]):
            if token not in holds:
                text = self.tokenizer.decode([token])
                holds[token] = any(stop in text for stop in stop_strings if stop)
            if holds[token]:
                kept = index + 1
                return Proposal(
                    proposal.tokens[:kept],
                    None if proposal.q is None else proposal.q[:kept],
                    proposal.lookup,
                    None if proposal.hidden is None else proposal.hidden[: kept + 1],
                )
        return proposal

    def fit_prompt(
        self, ids: list[int], max_new_tokens: int, max_prompt_tokens: int | None = None
    ) -> tuple[list[int], int]:
        """Left-truncate prompt ids to fit the limit and the context window; returns (ids, tokens dropped)."""
        if not ids:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise ValueError("empty prompt, and the tokenizer has no BOS token to start from")
            ids = [bos]
        limits = [max_prompt_tokens] if max_prompt_tokens else []
        if self.window:
            # room for the answer and for one round of drafts beyond it
            limits.append(self.window - max_new_tokens - round_rows(self.gamma, self.drafter))
        budget = min(limits) if limits else None
        if budget is not None and budget < 1:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt in a {self.window}-token context"
            )
        if budget is None or len(ids) <= budget:
            return ids, 0
        log.warning("prompt of %d tokens truncated from the left to %d to fit the context", len(ids), budget)
        # keep a leading BOS: models trained with one degrade badly without it
        head = ids[:1] if ids[0] == self.tokenizer.bos_token_id else []
        return head + ids[len(ids) - budget + len(head) :], len(ids) - budget


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
