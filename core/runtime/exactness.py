"""Is a loaded target's forward batch-invariant? Each position's logits must come out bit for bit the same whether
the position is fed alone (plain decoding), among K + 1 chain positions (a verify round) or in a tree (several
drafts merged, App. D). Only then does speculative decoding give exactly plain decoding's tokens in that precision,
whatever the near-ties: a precision that fails here is not offered as exact (core.runtime.target).

Shape letters: T = positions fed in one forward, V = vocabulary.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from core.runtime import native
from core.runtime.forward import keep_positions, target_forward
from core.runtime.threads import cpu_flags
from core.runtime.trie import build_trie

CHAIN_SIZES = (17, 5)  # K + 1 at K = 16, and a short block
PROBE_STEPS = 48


@dataclass(frozen=True)
class InvarianceReport:
    dtype: str
    positions: int  # positions compared in each way of feeding them
    chain_identical: int  # of positions * len(CHAIN_SIZES) rows
    tree_identical: int  # of positions
    max_abs_diff: float  # largest logit difference seen

    @property
    def exact(self) -> bool:
        return self.chain_identical == self.positions * len(CHAIN_SIZES) and self.tree_identical == self.positions

    def describe(self) -> str:
        if self.exact:
            return (f"{self.dtype}: batch-invariant ({self.positions} positions alone = in chains = in trees, "
                    "bit for bit)")
        return (f"{self.dtype}: not batch-invariant on this machine ({self.chain_identical}/"
                f"{self.positions * len(CHAIN_SIZES)} chain rows, {self.tree_identical}/{self.positions} tree rows "
                f"identical; largest logit difference {self.max_abs_diff:.2g})")


def _greedy_alone(target, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Plain greedy decoding one position at a time: the tokens fed (anchor first) and each one's logits (V,)."""
    cache = target.new_cache(len(prompt) + steps + 2 * max(CHAIN_SIZES))
    logits, _ = _forward(target, prompt, cache, keep=1)
    fed, rows = [int(logits[-1].argmax())], []
    for _ in range(steps):
        logits, _ = _forward(target, fed[-1:], cache)
        rows.append(logits[0].clone())
        fed.append(int(logits[0].argmax()))
    return fed[:steps], rows


def _forward(target, ids, cache, keep: int = 0, trie=None):
    return target_forward(target, ids, cache, (), keep=keep, trie=trie)  # what decoding itself calls


def _chain_rows(target, prompt: list[int], fed: list[int], size: int) -> list[torch.Tensor]:
    cache = target.new_cache(len(prompt) + len(fed) + 2 * size)
    _forward(target, prompt, cache, keep=1)
    rows = []
    for start in range(0, len(fed), size):
        logits, _ = _forward(target, fed[start:start + size], cache)  # (T, V)
        rows.extend(logits)
    return rows


def _tree_rows(target, prompt: list[int], fed: list[int], vocab: int) -> list[torch.Tensor]:
    """Each block of the true continuation verified as a trie beside a decoy branch that forks after its first node;
    the cache keeps the true path (gathered into place), as a tree round does."""
    cache = target.new_cache(len(prompt) + 2 * len(fed) + 32)
    _forward(target, prompt, cache, keep=1)
    rows: list = []
    size = 6
    for start in range(0, len(fed), size):
        block = fed[start:start + size]  # anchor, then the nodes of the true branch
        decoy = block[1:2] + [(tok + 1) % vocab for tok in block[2:4]] if len(block) > 2 else [(block[0] + 1) % vocab]
        trie = build_trie([decoy, block[1:]], 2 * size)
        ids = [block[0], *trie.tokens]
        logits, _ = _forward(target, ids, cache, trie=trie)  # (1 + nodes, V)
        path = [0]
        for tok in block[1:]:  # follow the true branch through the trie
            path.append(1 + next(i for i, (t, parent) in enumerate(zip(trie.tokens, trie.parents))
                                 if t == tok and parent == path[-1] - 1))
        rows.extend(logits[i] for i in path)
        keep_positions(cache, len(ids), path)
    return rows


def check_invariance(target, prompt: list[int], steps: int = PROBE_STEPS) -> InvarianceReport:
    """Compare each position's logits fed alone with the same position's row in chains of CHAIN_SIZES and trees."""
    with torch.inference_mode():
        fed, alone = _greedy_alone(target, prompt, steps)
        chains = [_chain_rows(target, prompt, fed, size) for size in CHAIN_SIZES]
        tree = _tree_rows(target, prompt, fed, target.vocab_size)
    same = lambda rows: sum(torch.equal(a, b) for a, b in zip(alone, rows))  # noqa: E731
    diff = max(float((a.float() - b.float()).abs().max()) for rows in (*chains, tree) for a, b in zip(alone, rows))
    return InvarianceReport(str(target.model.dtype).removeprefix("torch."), len(alone),
                            sum(same(rows) for rows in chains), same(tree), diff)


def probe_prompt(vocab: int, length: int = 24) -> list[int]:
    """A fixed prompt of any model's vocabulary (no tokenizer needed)."""
    return [(37 * i + 11) % vocab for i in range(length)]


def probe_key(target) -> str:
    """What batch invariance depends on: the CPU (its kernels, and the ISA oneDNN is capped at: core/__init__.py),
    torch's build, the threads, the model and dtype."""
    flags = " ".join(sorted(cpu_flags()))
    return "|".join([platform.machine(), platform.processor(), hashlib.sha1(flags.encode()).hexdigest()[:12],
                     os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
                     torch.__version__, str(torch.get_num_threads()), target.identity["name"],
                     str(target.model.dtype), str(target.device),
                     f"lean={target.lean.weights if target.lean else None}",
                     f"native={native.forward_build(target)}"])


def cached_check(target, prompt: list[int], root: Path | None) -> InvarianceReport:
    """check_invariance, read from / written to a small JSON file under root keyed by probe_key (None: no cache)."""
    key = probe_key(target)
    path = None if root is None else Path(root) / f"invariance-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"
    if path is not None and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.pop("key") == key:
                return InvarianceReport(**data)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: check again
    print(f"Checking that the {target.model.dtype} forward is batch-invariant on this machine (once; cached)…",
          flush=True)
    report = check_invariance(target, prompt)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, **asdict(report)}))
    return report
