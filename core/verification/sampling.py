"""Verification math for speculative decoding, as pure functions.

Shape letters: K = drafted block length, V = vocabulary size.

The rule is Leviathan et al. (2023), paper §2: accept draft token y_k with probability
min(1, p_target(y_k) / q_draft(y_k)); at the first rejection resample from the normalised
residual max(0, p_target - q_draft); if every draft token is accepted, sample a bonus token from
the target's next distribution. At T=0 this reduces to the longest prefix matching the argmax.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.runtime import native

# argmax, softmax and CDF inversion over a row of CPU logits (core/runtime/csrc/sampling.cpp), built by
# core.runtime.native
kernels = native.sampling_kernels


def _kernels_for(x: torch.Tensor, dtypes=(torch.bfloat16, torch.float32)):
    """The kernels where they serve this tensor (a CPU tensor of one of `dtypes`), else None."""
    return kernels() if x.device.type == "cpu" and x.dtype in dtypes else None


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from the target's logits; identical for plain and speculative runs."""

    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k

    def __post_init__(self):
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Turn target logits (..., V) into the distribution we sample from: temperature, top-k, top-p.

    Greedy decoding returns the one-hot of the argmax, so the same verification code serves T=0.
    """
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.float().argmax(-1), logits.shape[-1]).float()  # (..., V)
    module = _kernels_for(logits)
    if module is not None and not (sampling.top_k and sampling.top_k < logits.shape[-1]):
        rows = logits.reshape(-1, logits.shape[-1]).contiguous()  # (R, V)
        probs = module.softmax_rows(rows, 1.0 / sampling.temperature).reshape(logits.shape)  # (..., V)
        return nucleus(probs, sampling.top_p) if sampling.top_p < 1.0 else probs
    logits = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    return nucleus(probs, sampling.top_p) if sampling.top_p < 1.0 else probs


NUCLEUS_FIRST = 64  # most likely tokens looked at first for the top-p set; 4x more each time they hold too little mass


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p: each row's tokens whose mass strictly above them (the sum of the larger probabilities) is below top_p,
    renormalised; tokens of equal probability are kept or dropped together, so the set does not depend on how a sort
    orders ties (bf16 logits tie often), nor on the other rows. probs (..., V) -> (..., V).
    Sorting all 49,152 probabilities costs most of a decode step on a CPU (docs/journal/engine.md); the set lies among
    the top few dozen tokens as a rule, so only the top k are sorted (k = 64, then 4x more while some row's k-th
    probability has less than top_p above it, which is what bounds the set)."""
    rows = probs.reshape(-1, probs.shape[-1])  # (R, V)
    k = min(NUCLEUS_FIRST, rows.shape[-1])
    while True:
        top, order = torch.topk(rows, k, dim=-1)  # (R, k) each, most likely first
        above = mass_above(top)  # (R, k)
        if k == rows.shape[-1] or bool((above[:, -1] >= top_p).all()):
            break
        k = min(4 * k, rows.shape[-1])
    kept = torch.zeros_like(rows).scatter(-1, order, top.masked_fill(above >= top_p, 0.0))  # (R, V)
    return (kept / kept.sum(-1, keepdim=True)).reshape(probs.shape)


def mass_above(top: torch.Tensor) -> torch.Tensor:
    """For probabilities sorted in descending order (R, k): the sum of those strictly larger than each (R, k), the
    running sum before its group of equal values, so equal values read the same whatever order they came in."""
    before = top.cumsum(-1) - top  # (R, k) the sum before each position
    columns = torch.arange(top.shape[-1], device=top.device).expand_as(top)  # (R, k)
    starts = torch.ones_like(top, dtype=torch.bool)
    starts[:, 1:] = top[:, 1:] != top[:, :-1]  # (R, k) where a group of equal values begins
    first = torch.where(starts, columns, 0).cummax(-1).values  # (R, k) its group's first position
    return before.gather(-1, first)


def draw_device(generator: torch.Generator | None, near: torch.device | str = "cpu") -> torch.device:
    """Where a random draw from `generator` runs: on the generator's own device (a CUDA generator cannot draw on the
    host, nor a host one on the card); without a generator, `near`. Every draw in the engine and the drafters names
    its device so (tests/test_sampling.py checks each one)."""
    return generator.device if generator is not None else torch.device(near)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, excluded: int | None = None) -> int:
    """Draw one token id from a distribution (V,), the `excluded` token's mass counted as 0: sample_rows' one-row
    case."""
    return int(sample_rows(probs[None], generator, None if excluded is None else [excluded])[0])


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None = None,
                excluded: list[int] | None = None, u: torch.Tensor | None = None) -> torch.Tensor:
    """One token id from each row of probs (K, V) (unnormalised rows are fine) -> (K,) long, by inverting each row's
    CDF with one uniform draw: exact, and a token of probability 0 is never drawn (its CDF step is empty). `excluded`
    (K ids, or None): a token per row whose mass counts as 0 (the residual max(0, p - q) of a deterministic draft's
    one-hot q: p without the rejected token). Sums run in float64, so 49k partial sums keep their small steps; far
    faster than torch.multinomial (docs/journal/engine.md). The native kernel (core/runtime/csrc/sampling.cpp) sums
    blocks of 64 first, then steps within one. u: the uniforms (K,) float64 already drawn (None: drawn here)."""
    if u is None:
        u = torch.rand(probs.shape[0], generator=generator, device=draw_device(generator, probs.device),
                       dtype=torch.float64).to(probs.device)  # (K,)
    module = _kernels_for(probs, (torch.float32,))
    if module is not None:
        return module.sample_rows(probs.contiguous(), u, excluded or [])
    if excluded is not None:
        probs = probs.clone()
        probs[torch.arange(probs.shape[0], device=probs.device), torch.tensor(excluded, device=probs.device)] = 0.0
    cdf = probs.double().cumsum(-1)  # (K, V)
    goal = u * cdf[:, -1]  # (K,)
    return torch.searchsorted(cdf, goal[:, None], right=True)[:, 0].clamp_max(probs.shape[-1] - 1)  # (K,)


def residual(p_target: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """Normalised max(0, p - q) over (V,). Falls back to p when p == q exactly (rejection impossible). Chosen where
    the tensors lie: nothing is read back."""
    diff = (p_target - q_draft).clamp_min(0.0)  # (V,)
    total = diff.sum()
    return torch.where(total > 0, diff / total, p_target)


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one block: how many drafts survive and the token the target adds."""

    n_accepted: int
    next_token: int


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, (T, V) -> T ids, found in fp32: bf16 values widen exactly and the first maximum wins
    either way, while torch's bf16 argmax is several times slower than its fp32 one (docs/journal/engine.md); the native
    kernel finds the same first maximum in one pass over the bf16 row."""
    module = _kernels_for(logits)
    if module is not None:
        return module.argmax_rows(logits if logits.dim() == 2 else logits.reshape(-1, logits.shape[-1]))
    return logits.float().argmax(-1).tolist()


def top_probs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax and its probability under softmax(row), (R, V) -> ids (R,) int64, probabilities (R,) fp32:
    a greedy draft's tokens and confidence. The native kernel takes two passes over a row where torch's max and
    logsumexp take several (measured in docs/journal/engine.md, "Against the FlashMap authors' reference loop")."""
    module = _kernels_for(logits)
    if module is not None:
        ids, probs = module.top_probs(logits)
        return torch.tensor(ids, dtype=torch.long), probs
    top, ids = logits.float().max(dim=-1)
    return ids, torch.exp(top - logits.float().logsumexp(dim=-1))


def as_ids(tokens: torch.Tensor | list[int]) -> list[int]:
    """Token ids (K,) as Python ints, from a tensor or a list."""
    return tokens if isinstance(tokens, list) else tokens.tolist()


def verify_greedy(draft_tokens: torch.Tensor | list[int], target_logits: torch.Tensor) -> Verdict:
    """T=0: keep the longest prefix equal to the target's argmax. draft (K,), logits (K+1, V)."""
    best = greedy_tokens(target_logits)  # (K+1,)
    drafted = as_ids(draft_tokens)  # (K,)
    n_accepted = 0
    while n_accepted < len(drafted) and drafted[n_accepted] == best[n_accepted]:
        n_accepted += 1
    return Verdict(n_accepted, best[n_accepted])


def verify_sampled(
    draft_tokens: torch.Tensor,
    p_target: torch.Tensor,
    q_draft: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """T>0 rejection sampling. draft (K,), p_target (K+1, V), q_draft (K, V) or None.

    None means a deterministic drafter: q is the one-hot of the drafted token, so acceptance
    probability is p_target(y_k) and the residual is p_target with y_k removed.
    """
    return verify_sampled_rows(draft_tokens, p_target.__getitem__, q_draft, generator)


def verify_logits(draft_tokens: list[int], logits: torch.Tensor, q_draft: torch.Tensor | None,
                  sampling: SamplingConfig, generator: torch.Generator | None = None) -> Verdict:
    """T > 0 rejection sampling against the target's logits (K+1, V): verify_sampled_rows with p from target_probs, each
    row's only once the sampling reaches its slot. A deterministic draft (q_draft None: a copied draft, or none for a
    plain step) goes in one native call where only the temperature shapes p (core/runtime/csrc/sampling.cpp's
    verify_copy): after a forward each torch op costs about ten times its warm cost (its code and data come back from
    memory; docs/journal/engine.md), and the op-by-op path makes ~9 a slot. Its 2K + 1 uniforms are drawn at once (slot
    k's test, slot k's redraw, the bonus token's), so a plain step (K = 0) draws the one uniform sample() draws."""
    if logits.device.type in BATCHED_ON:
        return verify_batched(draft_tokens, logits, q_draft, sampling, generator)
    module = _kernels_for(logits)
    if (q_draft is not None or module is None or sampling.top_p < 1.0
            or (sampling.top_k and sampling.top_k < logits.shape[-1])):
        return verify_sampled_rows(draft_tokens, lambda slot: target_probs(logits[slot], sampling), q_draft, generator)
    u = torch.rand(2 * len(draft_tokens) + 1, generator=generator, device=draw_device(generator, logits.device),
                   dtype=torch.float64).to(logits.device)
    return Verdict(*module.verify_copy(logits, draft_tokens, 1.0 / sampling.temperature, u))


# devices whose logits are verified in one batch (verify_batched): an accelerator, where reading a value back costs a
# synchronisation; on the CPU each reached slot's distribution is computed only when the walk reaches it instead
BATCHED_ON = ("cuda",)


def verify_batched(draft_tokens: list[int], logits: torch.Tensor, q_draft: torch.Tensor | None,
                   sampling: SamplingConfig, generator: torch.Generator | None = None) -> Verdict:
    """verify_sampled_rows' rule with every slot's test made at once where the logits lie: the target's distribution
    of all K + 1 rows, each slot's p and q at its drafted token, K uniforms for the tests and one for the token the
    target adds, then two values read back (the accepted count, the added token) whatever K is.
    logits (K+1, V), q_draft (K, V) or None (a deterministic draft: q is the drafted token's one-hot)."""
    k = len(draft_tokens)
    p_target = target_probs(logits, sampling)  # (K+1, V)
    u = torch.rand(k + 1, generator=generator, device=draw_device(generator, logits.device),
                   dtype=torch.float64).to(logits.device)  # (K+1,): K tests, then the added token's draw
    if k:
        tokens = torch.tensor(draft_tokens, device=logits.device)[:, None]  # (K, 1)
        p_tok = p_target[:k].gather(1, tokens)[:, 0].double()  # (K,)
        q_tok = torch.ones_like(p_tok) if q_draft is None else q_draft.to(p_target).gather(1, tokens)[:, 0].double()
        accepted = (q_tok > 0) & (u[:k] * q_tok < p_tok)  # (K,)
        n_accepted = int(accepted.logical_not().cumsum(0).eq(0).sum())  # the first read back
    else:
        n_accepted = 0
    row, excluded = p_target[n_accepted], None  # (V,)
    if n_accepted < k and q_draft is not None:  # the residual max(0, p - q) at the first rejected slot
        row = residual(row, q_draft[n_accepted].to(row))
    elif n_accepted < k:  # max(0, p - one-hot(token)): p without the rejected token
        excluded = [draft_tokens[n_accepted]]
    token = sample_rows(row[None], excluded=excluded, u=u[k:])  # (1,) the added token, from the last uniform
    return Verdict(n_accepted, int(token[0]))  # the second read back


def draw_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None = None) -> int:
    """The target's token drawn from one row of logits (1, V) at T > 0, as a plain step draws it (verify_logits with
    nothing drafted): a tree's walk at T > 0 draws each position of its path so (core.verification.tree.walk)."""
    return verify_logits([], logits, None, sampling, generator).next_token


def verify_sampled_rows(
    draft_tokens: torch.Tensor | list[int],
    p_row: Callable[[int], torch.Tensor],
    q_draft: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """verify_sampled with the target's distribution after slot k given as p_row(k) -> (V,), asked for only up to
    the first rejection: at T > 0 most drafts are rejected at their first slot, and a row's distribution costs a pass
    over the vocabulary (the engine computes it from that row's logits on demand)."""
    drafted = as_ids(draft_tokens)  # (K,)
    for slot, token in enumerate(drafted):
        p_slot = p_row(slot)  # (V,)
        p_tok = float(p_slot[token])
        q_tok = 1.0 if q_draft is None else float(q_draft[slot, token])
        u = float(torch.rand((), generator=generator, device=draw_device(generator, p_slot.device)))
        # accept with probability min(1, p/q); q_tok > 0 because the token was drawn from q
        if q_tok > 0 and u * q_tok < p_tok:
            continue
        if q_draft is None:  # max(0, p - one-hot(token)): p without the token (rejection implies p_tok < 1)
            return Verdict(slot, sample(p_slot, generator, excluded=token))
        return Verdict(slot, sample(residual(p_slot, q_draft[slot].to(p_slot)), generator))
    return Verdict(len(drafted), sample(p_row(len(drafted)), generator))
