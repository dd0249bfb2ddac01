"""Tree verification of several drafts at once (paper App. D), as pure functions.

Shape letters: M = drafts (branches), K = slots per draft, N = trie nodes, T = N + 1 positions fed to
the target (the anchor, then the nodes), P = positions already in the KV cache, V = vocabulary.

A flow drafter drafts M blocks from independent noise draws in one batched pass. Their common
prefixes are merged into a trie and the trie is verified in one target forward: every node sees the
cache, the anchor and its own ancestors only (a tree attention mask), at position P + depth. At T=0
the target's greedy path walks down the trie as far as some child holds the target's argmax, so the
output is the plain greedy output token for token; at T > 0 it follows the target's own draws (walk), which
samples the target exactly. Node order is breadth-first, so a parent always precedes its children and a node
budget keeps the shallow nodes, where acceptance happens.
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
    cost a dispatch a node, ~50 us each after a forward."""
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


def greedy_path(trie: Trie, target_argmax: list[int]) -> tuple[list[int], int]:
    """Walk the trie along the target's argmax (T=0). target_argmax (T,) per position.
    Returns the accepted node indices, root first, and the target's token after the last of them."""
    return walk(trie, target_argmax.__getitem__)


def walk(trie: Trie, token_at) -> tuple[list[int], int]:
    """Walk the trie from the anchor along the target's own tokens: token_at(position) is the target's token after
    fed position `position` (0 = the anchor, n + 1 = node n), asked for only along the walk; the walk goes on while
    some child holds it. -> (the accepted node indices, root first; the target's token after the last of them).
    With the argmax it is T = 0's greedy path; with a draw from each position's distribution it samples the target
    itself, so the output is exact at any temperature whatever the trie holds: a drafted token is kept exactly when
    the target drew it (for one chain of deterministic drafts this is the rejection rule's own acceptance, p(token);
    for several children of one node, the sum of their p)."""
    path, position = [], 0  # position 0 = the anchor
    children = [trie.children(-1)] + [trie.children(n) for n in range(len(trie))]  # per position
    token = token_at(position)
    while token in children[position]:
        node = children[position][token]
        path.append(node)
        position = node + 1
        token = token_at(position)
    return path, token


def is_chain(trie: Trie) -> bool:
    """One branch: node n's parent is n - 1, so the ordinary causal forward verifies it."""
    return trie.parents == tuple(range(-1, len(trie) - 1))


def depth_in(trie: Trie, branch: list[int]) -> int:
    """How many leading tokens of `branch` are a path of the trie from the anchor."""
    node, depth = -1, 0
    for token in branch:
        child = trie.children(node).get(token)
        if child is None:
            break
        node, depth = child, depth + 1
    return depth


def followed_branch(trie: Trie, branches: list[list[int]], accepted: list[int]) -> list[int]:
    """The branch to show for a round: the first that holds the accepted tokens, as far as it made it
    into the trie (so slot colouring and per-slot statistics read a tree round as a chain)."""
    branch = next((b for b in branches if b[: len(accepted)] == accepted), accepted)
    return branch[: depth_in(trie, branch)]
