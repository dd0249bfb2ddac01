"""The paper's Figure 1(b) as a program: a factorised one-pass drafter cannot keep two modes apart,
a flow (and the flow map distilled from it) can.

Synthetic target: given a context, the 2-slot continuation is one of two word pairs with equal
probability ("new york" / "san diego" for context 0, "los angeles" / "las vegas" for context 1).
We train the DFlash-style factorised drafter, the flow teacher, and the distilled flow map with the
project's own network, losses and drafting code, then sample blocks at temperature 1 (fresh noise
per block for the flow models) and report the fraction of blocks that are one of the two modes.

python -m drafter.training.toy_modes --json
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from drafter.blocks import Blocks
from drafter.config import DrafterConfig
from drafter.networks.dit import DraftNet
from drafter.runtime import drafting
from drafter.training.losses import dflash_loss, distill_loss, teacher_loss

WORDS = ["<other>", "new", "york", "san", "diego", "los", "angeles", "las", "vegas"]
MODES = {0: [(1, 2), (3, 4)], 1: [(5, 6), (7, 8)]}


def toy_config(kind: str) -> DrafterConfig:
    return DrafterConfig(kind=kind, block_size=2, d_model=64, n_layers=2, n_heads=4, mlp_ratio=2,
                         feature_layers=(0,), target_hidden=16, draft_vocab=len(WORDS), context_window=1)


def make_net(kind: str, seed: int) -> DraftNet:
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(len(WORDS), 16, generator=gen)  # a toy target's E, shared by E and LM head
    return DraftNet(toy_config(kind), embed, embed.clone())


def context_features(ctx_ids: torch.Tensor) -> torch.Tensor:
    """A fixed feature vector per context id. (B,) -> (B, 1, 16)."""
    table = torch.randn(2, 16, generator=torch.Generator().manual_seed(123))
    return table[ctx_ids][:, None]


def batch(size: int, gen: torch.Generator) -> tuple[Blocks, torch.Tensor]:
    ctx_ids = torch.randint(0, 2, (size,), generator=gen)  # (B,)
    which = torch.randint(0, 2, (size,), generator=gen)  # (B,) mode index
    tokens = torch.tensor([MODES[int(c)][int(w)] for c, w in zip(ctx_ids, which)])  # (B, 2)
    blocks = Blocks.from_windows(context_features(ctx_ids), torch.ones(size, 1, dtype=torch.bool), ctx_ids,
                                 torch.zeros(size, 16), tokens, torch.ones_like(tokens, dtype=torch.bool))
    return blocks, ctx_ids


def train(net: DraftNet, loss_fn, steps: int, lr: float, seed: int) -> DraftNet:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95), foreach=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    for _ in range(steps):
        blocks, _ = batch(128, gen)
        loss = loss_fn(net, blocks, gen)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
    return net.eval()


def mode_fraction(net: DraftNet, draft_fn, n: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        blocks, ctx_ids = batch(n, gen)
        probs = draft_fn(net, *blocks.context(net), gen)  # (B, 2, V)
        tokens = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=gen).view(n, 2)  # T = 1
    hits = [tuple(tok.tolist()) in MODES[int(c)] for tok, c in zip(tokens, ctx_ids)]
    return sum(hits) / n


def run(steps: int = 600, samples: int = 2000, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    factorized = train(make_net("dflash", seed), lambda net, b, g: dflash_loss(net, b), steps, 3e-3, seed)
    teacher = train(make_net("flashmap", seed), teacher_loss, 2 * steps, 3e-3, seed)
    frozen = copy.deepcopy(teacher).requires_grad_(False)
    distill = lambda net, b, g: distill_loss(net, frozen, b, g)  # noqa: E731
    student = train(copy.deepcopy(teacher), distill, 2 * steps, 1e-3, seed + 1)
    factor = drafting.noise_embedding_factor(student)
    return {
        "factorized": mode_fraction(factorized, lambda n, c, m, g: drafting.masked(n, c, m, 2), samples, seed),
        "teacher_16step": mode_fraction(teacher, lambda n, c, m, g: drafting.jumps(n, c, m, 2, 16, g, True),
                                        samples, seed),
        "flowmap_1step": mode_fraction(student, lambda n, c, m, g: drafting.one_jump(n, c, m, 2, g, factor),
                                       samples, seed),
        "flowmap_2step": mode_fraction(student, lambda n, c, m, g: drafting.jumps(n, c, m, 2, 2, g), samples, seed),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--steps", type=int, default=600, help="training steps of the DFlash-style net")
    parser.add_argument("--seed", type=int, default=0, help="data, weights and noise seed")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = run(args.steps, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value:.3f} of blocks are one of the two modes")
        print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
