"""Draft trees: several candidate continuations verified in one target pass, and which of them the target takes.

A chain of drafts survives only as far as its first miss; at an acceptance near one half that is rarely past its
second token. A tree offers the target the draft's next-best tokens too, at each depth, in the same pass: a round
accepts the longest path the target agrees with (EAGLE-2, SpecInfer).

A verify feeds the root (the last committed token) and the nodes, in an order where a parent comes before its
children. Row 0 is the root; node i is row i + 1. Each row sits at the position its depth gives and attends to
the cache and to its own ancestors only (`TreeShape`, lean_forward.py), so a row's logits are those of the one
path leading to it. After the verify the cache keeps the accepted path's rows and drops the rest (`path_rows`,
kv_cache.keep_rows).

Acceptance with a tree's candidates decided ahead (a draft's top-k, a lookup's copies: never drawn at random):
- greedy: follow the child whose token is the target's argmax at each row, as long as there is one;
- sampled: at a row with target distribution p, try its children in order; a child c is taken with probability
  p(c) / (the mass of p not yet tried), and after every miss p loses c. Where all miss (or there are none), the
  token is drawn from what is left of p. Each token comes out with probability p(token), as without drafts: the
  multi-candidate rule of SpecInfer with candidates that are not random, so lossless for any tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class DraftTree:
    """Nodes of draft tokens below the last committed token. parents[i]: the node node i follows, -1 for the
    root; always an earlier node. Siblings hold different tokens."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        seen: set[tuple[int, int]] = set()
        for node, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if not -1 <= parent < node:
                raise ValueError(f"node {node}'s parent {parent} is not an earlier node or the root (-1)")
            if (parent, token) in seen:
                raise ValueError(f"node {node} repeats token {token} under parent {parent}")
            seen.add((parent, token))

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    @classmethod
    def of_paths(cls, paths: list[list[int]]) -> DraftTree:
        """The trie of `paths` (each a list of tokens after the root): shared starts become one branch. Nodes
        come in the order the paths first reach them, so the first path is nodes 0, 1, ..."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for path in paths:
            parent = -1
            for token in path:
                node = index.get((parent, token))
                if node is None:
                    node = index[(parent, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                parent = node
        return cls(tuple(tokens), tuple(parents))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Each row's depth: 0 for the root, 1 for its children, ... (a row's position is the root's plus it)."""
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent + 1] + 1)
        return depths

    def row_parents(self) -> list[int]:
        """Each row's parent row: -1 for the root, else its node's parent's row."""
        return [-1, *(parent + 1 for parent in self.parents)]

    def path_rows(self, row: int) -> list[int]:
        """The rows from the root down to `row`, both included."""
        return paths_of(self.row_parents())[row]

    def children(self) -> list[list[int]]:
        """For each row, its children's rows, in node order (the order sampled acceptance tries them)."""
        children: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for node, parent in enumerate(self.parents):
            children[parent + 1].append(node + 1)
        return children

    def shape(self, device: torch.device | str = "cpu") -> TreeShape:
        return TreeShape.of(self, device)


@dataclass(frozen=True)
class TreeShape:
    """What a forward pass needs of a tree, on the model's device: each row's depth [T] and parent row [T] (-1 for
    the root), and which rows each row attends to [T, T] (itself and its ancestors), which only a batched feed
    reads (a compiled step attends row by row, and passes None)."""

    depths: torch.Tensor
    parents: torch.Tensor
    ancestors: torch.Tensor | None

    @classmethod
    def of(cls, tree: DraftTree, device: torch.device | str = "cpu") -> TreeShape:
        row_parents = tree.row_parents()
        ancestors = torch.zeros(len(row_parents), len(row_parents), dtype=torch.bool)
        for row, path in enumerate(paths_of(row_parents)):
            ancestors[row, path] = True
        parents = torch.tensor(row_parents, device=device)
        return cls(torch.tensor(tree.depths(), device=device), parents, ancestors.to(device))

    @classmethod
    def chain(cls, rows: int, device: torch.device | str = "cpu") -> TreeShape:
        """A feed of `rows` tokens one after another, as a tree: what a compiled step takes for a chain."""
        depths = torch.arange(rows, device=device)
        return cls(depths, depths - 1, torch.ones(rows, rows, dtype=torch.bool, device=device).tril())


def paths_of(parents: list[int]) -> list[list[int]]:
    """For rows with these parent rows (-1: the root), each row's path: the rows from the root to it."""
    paths: list[list[int]] = []
    for row, parent in enumerate(parents):
        paths.append([*paths[parent], row] if parent >= 0 else [row])
    return paths


def accept_greedy(tree: DraftTree, choices: list[int]) -> tuple[list[int], int]:
    """choices: the target's argmax at each row. Returns the accepted nodes' rows, root excluded, and the token
    after them (the target's choice at the last accepted row)."""
    children = tree.children()
    rows: list[int] = []
    row = 0
    while True:
        token = choices[row]
        taken = next((child for child in children[row] if tree.tokens[child - 1] == token), None)
        if taken is None:
            return rows, token
        rows.append(taken)
        row = taken


def accept_sampled(tree: DraftTree, p: torch.Tensor, generator: torch.Generator | None) -> tuple[list[int], int]:
    """p: [rows, V] target probabilities at each row. Returns the accepted rows and the token after them,
    by the multi-candidate rule (module docstring): lossless for a tree decided ahead of the target."""
    children = tree.children()
    parent_rows = torch.tensor(tree.parents, device=p.device) + 1
    tokens = torch.tensor(tree.tokens, device=p.device)
    # every node's probability under its parent's row, and one uniform draw per node, in one transfer each
    p_node = p[parent_rows, tokens].tolist() if len(tree) else []
    draws = torch.rand(len(tree), generator=generator, device=p.device).tolist()
    rows: list[int] = []
    row = 0
    while True:
        left = 1.0  # the mass of p at this row not yet tried
        missed: list[int] = []
        taken = None
        for child in children[row]:
            chance = p_node[child - 1] / left if left > 0 else 0.0
            if draws[child - 1] < chance:
                taken = child
                break
            missed.append(tree.tokens[child - 1])
            left -= p_node[child - 1]
        if taken is None:
            rest = p[row]
            if missed:
                rest = rest.index_fill(0, torch.tensor(missed, device=p.device), 0.0)
                # only rounding leaves no mass: every token of p was a missed child
                rest = torch.where(rest.sum() > 0, rest, p[row])
            return rows, int(sample(rest, generator))
        rows.append(taken)
        row = taken
