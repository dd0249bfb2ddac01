"""Tree verification of several drafts at once (paper App. D), as pure functions over the round's trie
(core.runtime.trie: how its drafts merge and how a forward feeds it).

At T = 0 the target's greedy path walks down the trie as far as some child holds the target's argmax, so the output is
the plain greedy output token for token; at T > 0 it follows the target's own draws (walk), which samples the target
exactly.
"""
from __future__ import annotations

from collections.abc import Sequence

from core.runtime.trie import Trie


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


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
