"""The shape of a round's verified positions: a trie of drafted tokens (paper App. D) and how a forward feeds it.

Shape letters: N = trie nodes, T = N + 1 positions fed to the target (the anchor, then the nodes), P = positions
already in the KV cache.

Several drafts of one round are merged into a trie, breadth-first (a parent always precedes its children, and a node
budget keeps the shallow nodes, where acceptance happens), and the trie is fed in one target forward: every node sees
the cache, the anchor and its own ancestors only (a tree attention mask), at position P + depth. How the target's
tokens walk down it is verification's business (core.verification.tree).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Trie:
    tokens: tuple[int, ...]  # (N,) token of each node, breadth-first
    parents: tuple[int, ...]  # (N,) parent node index, -1 for a child of the anchor
    depths: tuple[int, ...]  # (N,) 1 for children of the anchor

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> dict[int, int]:
        """token -> node index of the children of `node` (-1: the anchor)."""
        return {tok: i for i, (tok, parent) in enumerate(zip(self.tokens, self.parents)) if parent == node}


def build_trie(branches: list[list[int]], budget: int) -> Trie:
    """Merge drafts into a trie of at most `budget` nodes, breadth-first: every depth-d node of any
    branch comes before any depth-(d+1) node, and a branch stops growing once its node is cut."""
    if len(branches) == 1:  # one draft (most rounds): its chain, made directly
        chain = tuple(branches[0][:budget])
        return Trie(chain, tuple(range(-1, len(chain) - 1)), tuple(range(1, len(chain) + 1)))
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    index: dict[tuple[int, ...], int] = {}  # prefix -> node
    alive = list(range(len(branches)))
    for depth in range(1, max((len(b) for b in branches), default=0) + 1):
        still = []
        for m in alive:
            if len(branches[m]) < depth:
                continue
            prefix = tuple(branches[m][:depth])
            if prefix not in index:
                if len(tokens) == budget:
                    continue  # this branch is cut here, and so are its deeper nodes
                index[prefix] = len(tokens)
                tokens.append(prefix[-1])
                parents.append(index[prefix[:-1]] if depth > 1 else -1)
                depths.append(depth)
            still.append(m)
        alive = still
    return Trie(tuple(tokens), tuple(parents), tuple(depths))


def ancestor_mask(trie: Trie) -> torch.Tensor:
    """(T, T) bool: row i may attend to column j. Position 0 is the anchor; node n is position n + 1
    and sees the anchor, its ancestors and itself. Built as lists and made a tensor once: row by row in torch it
    cost a dispatch a node, each dear after a forward (docs/journal/engine.md)."""
    size = len(trie) + 1
    rows = [[True] + [False] * (size - 1)]  # the anchor sees itself
    for node, parent in enumerate(trie.parents):  # parents come first, so their rows are complete
        row = list(rows[parent + 1])  # the parent's ancestors (the anchor's row for a child of the anchor)
        row[node + 1] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


def tree_positions(trie: Trie, past: int, device) -> torch.Tensor:
    """Position ids (T,) of [anchor, *nodes] fed after `past` cached positions: each node at its depth."""
    return torch.tensor(position_list(trie, past), device=device)


def position_list(trie: Trie, past: int) -> list[int]:
    """tree_positions as Python ints (T,), for the lean forward's one-call step."""
    return [past, *(past + d for d in trie.depths)]


def tree_inputs(trie: Trie, past: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4D attention mask (1, 1, T, P + T), True = attend, and position ids (1, T) of a trie fed
    after `past` cached positions."""
    tree = ancestor_mask(trie)  # (T, T)
    seen = torch.ones(tree.shape[0], past, dtype=torch.bool)  # (T, P): everything cached is visible
    mask = torch.cat([seen, tree], dim=1)[None, None].to(device)  # (1, 1, T, P+T)
    return mask, tree_positions(trie, past, device)[None]  # (1, T)


def is_chain(trie: Trie) -> bool:
    """One branch: node n's parent is n - 1, so the ordinary causal forward verifies it."""
    return trie.parents == tuple(range(-1, len(trie) - 1))
