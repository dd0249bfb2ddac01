"""The one generate loop: draft -> verify -> accept -> roll back the KV cache -> emit an event.

Shape letters: T = positions fed to the target in one forward, K = drafted block length,
V = vocabulary, F = drafter feature width.

Cache invariant: the KV cache holds every committed token except the anchor (the last committed
token). A round feeds [anchor, draft_1..draft_K] (T = K+1), which gives the target's distribution
after the anchor and after each draft token; after verification the cache is cropped to the
anchor plus the accepted drafts, and the target's own token becomes the next anchor.
Plain decoding is this loop with no drafter (K = 0), so baseline and speculative runs share
every line but the draft. A draft with alternatives (several noise draws, paper App. D) is merged
into a trie of at most K nodes and verified as a tree in the same one forward (at T > 0 by the target's own draws
along the trie, core.verification.tree.walk); the cache then keeps the anchor and the accepted path (`keep_positions`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from transformers import DynamicCache

from core.decoding.detokenize import IncrementalText
from core.decoding.prefix import PrefixCache, reuses_prefixes
from core.drafting.base import MAX_BLOCK_SIZE, Draft, Drafter
from core.drafting.policy.config import PolicyConfig
from core.drafting.policy.policy import Decision, DraftPolicy
from core.drafting.policy.state import PolicyState
from core.runtime.forward import keep_positions, target_forward
from core.runtime.lean import StaticCache
from core.runtime.target import Target
from core.runtime.threads import resumed
from core.runtime.trie import Trie, build_trie
from core.verification.sampling import (
    SamplingConfig,
    Verdict,
    draw_token,
    greedy_tokens,
    verify_greedy,
    verify_logits,
)
from core.verification.tree import followed_branch, greedy_path, walk


class PromptError(ValueError):
    """The prompt cannot be generated from (empty, or too long for the model's context)."""


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    block_size: int | None = None  # K, tokens drafted per round; None: the drafter's own (its max_block_size)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    # relative cost of one target forward over 1, 2, ... positions (core.runtime.verify_cost); when given, a draft
    # with confidences is cut to the length with the most expected tokens per unit of cost
    verify_cost: tuple[float, ...] = ()
    # one drafter call relative to a one-position target forward (core.drafting.call_cost.draft_cost): where it is
    # charged (charges_draft_cost), a draft whose best expected tokens per unit of cost, this included, do not beat a
    # plain step counts as empty for the policy's skips
    draft_cost: float = 0.0
    # when to draft and how much to verify: every constant of the drafting policy (core.drafting.policy.config)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self):
        if self.block_size is not None and not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size K must be in 1..{MAX_BLOCK_SIZE}, got {self.block_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.draft_cost >= 0:
            raise ValueError(f"draft_cost must be >= 0, got {self.draft_cost}")

    def charges_draft_cost(self) -> bool:
        """Whether the skips charge each draft for the drafter's call: with a cost curve, at T = 0 only. At T > 0 a
        draft's confidence (its largest probability) does not estimate its acceptance (sum_v min(p, q)) and no
        calibration maps it (drafter/runtime/calibration.py fits T = 0); charging on it skipped drafts that paid
        (docs/journal/engine.md)."""
        return bool(self.verify_cost) and self.sampling.greedy


@dataclass(frozen=True, kw_only=True)
class RoundEvent:
    """One target forward: what was drafted, how much survived, what the target added (built by keyword)."""

    kind: str  # "prefill" | "round"
    drafted: tuple[int, ...]  # the drafter's block (empty for plain decoding and prefill)
    n_accepted: int  # drafted tokens kept (a prefix)
    target_token: int  # the target's resampled / bonus token
    committed: tuple[int, ...]  # tokens appended to the output (after EOS/stop/length truncation)
    text: str  # the whole reply so far
    draft_s: float
    verify_s: float
    finish_reason: str | None = None  # None while running; eos | stop | length | cancelled
    branches: int = 1  # drafts merged into the verified trie (App. D); `drafted` is the one followed furthest
    source: str = "plain"  # what the round verified: "plain" (nothing), "drafter" (the network) or a copy's source
    # where its kept draft tokens came from (kept_source): `source`, or the alternative the target followed (a copy
    # beside the network's draft); "" where it kept none, and for events made elsewhere (then: `source`)
    kept_from: str = ""
    # why the round verified what it did (core.drafting.policy.policy.Decision); None for prefill, plain decoding and
    # events made elsewhere
    decision: Decision | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Never:
    """A cancel flag that is never set (threading.Event has the same is_set method)."""

    def is_set(self) -> bool:
        return False


@dataclass
class _State:
    """Bookkeeping of one generation, kept apart from the algorithm."""

    prompt_len: int
    detokenizer: IncrementalText  # the reply's tokens and its text as they arrive
    text: str = ""

    @property
    def output(self) -> list[int]:
        return self.detokenizer.ids


def block_size_for(gen: GenerationConfig, drafter: Drafter | None) -> int:
    """K for this run: the requested block size capped by the largest block the drafter can propose (a
    checkpoint trained for K = 8 asked for 16 drafts 8), the drafter's own when none is requested; 0 for plain."""
    if drafter is None:
        return 0
    return min(gen.block_size or drafter.max_block_size, drafter.max_block_size)


def check_prompt(target: Target, prompt_ids: list[int], gen: GenerationConfig, block_size: int) -> None:
    if not prompt_ids:
        raise PromptError("The prompt is empty.")
    limit = target.max_positions
    if len(prompt_ids) + gen.max_new_tokens + block_size + 1 > limit:
        raise PromptError(
            f"The prompt is {len(prompt_ids)} tokens; with max_new_tokens={gen.max_new_tokens} it exceeds the "
            f"context of {limit} tokens. Shorten the conversation or lower max new tokens (or start the app with a "
            "larger --context, where the model and memory allow)."
        )


def _verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator) -> Verdict:
    """The round's verdict from the target's logits (K+1, V): greedy at T = 0; at T > 0 rejection sampling, in one
    native call for a deterministic draft (copied tokens, or none: a plain step)."""
    if sampling.greedy:
        return verify_greedy(draft.ids, logits)
    return verify_logits(draft.ids, logits, draft.q_draft, sampling, generator)


def branches_of(draft: Draft) -> list[list[int]]:
    return [list(draft.ids), *(list(alt) for alt in draft.alternatives)]


def round_trie(draft: Draft, k: int) -> Trie:
    """The nodes one round verifies: the draft's tokens, merged with its alternatives (App. D) into a
    trie of at most k nodes. A draft without alternatives is a chain of its own tokens."""
    return build_trie(branches_of(draft), k)


def verify_round(draft: Draft, trie: Trie, logits: torch.Tensor, sampling: SamplingConfig, generator):
    """-> (indices of the kept positions, 0 = the anchor, then the accepted nodes; the target's token)."""
    if not draft.alternatives:  # one draft: greedy or rejection-sampling verification of a chain
        verdict = _verify(draft, logits, sampling, generator)
        return list(range(1 + verdict.n_accepted)), verdict.next_token
    if sampling.greedy:
        path, next_token = greedy_path(trie, greedy_tokens(logits))
    else:  # the target's own draw at each position of the walk: a sample of the target whatever the trie holds
        path, next_token = walk(trie, lambda at: draw_token(logits[at : at + 1], sampling, generator))
    return [0, *(node + 1 for node in path)], next_token


def kept_rows(features: torch.Tensor, kept_at: list[int]) -> torch.Tensor:
    """The kept positions' features (N, F) of a round's (T, F): a view where they are its first N rows (a chain's
    accepted prefix, every plain step), so most rounds copy nothing."""
    n = len(kept_at)
    if n == features.shape[0]:  # every position fed was kept (every plain step): the tensor itself, no op
        return features
    return features[:n] if kept_at[-1] == n - 1 else features[kept_at]


def captures(policy: DraftPolicy, layers: tuple[int, ...], prefill: bool = False) -> tuple[int, ...]:
    """The feature layers this forward (the prompt's prefill, or a round's) captures: the drafter's, where the policy
    wants them (DraftPolicy.captures: for a network that reads a window of them, the prompt and the rounds around
    those that could call it), else none. A policy choice only: the logits are the same either way, and a drafter
    told of positions without features starts its context after them."""
    if not layers or policy.captures(prefill):
        return layers
    return ()


def _commit(state: _State, target: Target, tokens: list[int], gen: GenerationConfig) -> tuple[list[int], str | None]:
    """Append tokens to the output, cutting at EOS, the length budget or a stop string."""
    kept = target.until_eos(tokens)
    tokens, reason = kept, ("eos" if len(kept) < len(tokens) else None)
    room = gen.max_new_tokens - len(state.output)
    if len(tokens) >= room:
        tokens, reason = tokens[:room], reason or "length"
    state.text = state.detokenizer.extend(tokens)
    for stop in gen.stop_strings:
        cut = state.text.find(stop)
        if stop and cut >= 0:
            state.text, reason = state.text[:cut], "stop"
    return tokens, reason


def generate(
    target: Target,
    prompt_ids: list[int],
    gen: GenerationConfig,
    drafter: Drafter | None = None,
    cancel=None,
    clock: Callable[[], float] = time.perf_counter,
    measured: PolicyState | None = None,
    prefix: PrefixCache | None = None,
) -> Iterator[RoundEvent]:
    """One RoundEvent per target forward until EOS, a stop string, the budget or cancel. `measured` carries
    what drafting measured in earlier replies of a conversation (core.drafting.policy.state.PolicyState; updated in
    place), so a reply starts from it instead of measuring again; None: this reply measures on its own. `prefix` holds
    what the previous generation left in its cache (core.decoding.prefix.PrefixCache; updated in place): the prompt's
    prefill starts after the tokens it shares with it; None: the whole prompt is prefilled.
    Every step runs in inference mode, entered in whichever thread resumes the reply (core.runtime.threads.resumed):
    the mode is thread-local, and one entered inside the reply would be off in the next server thread, where the
    fixed-shape steps' in-place writes into tensors made in inference mode raise and an eager forward records autograd
    graphs."""
    return resumed(_reply(target, prompt_ids, gen, drafter, cancel, clock, measured, prefix), torch.inference_mode)


def _reply(target: Target, prompt_ids: list[int], gen: GenerationConfig, drafter: Drafter | None, cancel,
           clock: Callable[[], float], measured: PolicyState | None,
           prefix: PrefixCache | None) -> Iterator[RoundEvent]:
    """generate's reply: the cache (a reused prefix in it), the policy and the generators, then the loop."""
    block_size = block_size_for(gen, drafter)
    check_prompt(target, prompt_ids, gen, block_size)
    cancel = cancel or Never()
    layers = drafter.feature_layers if drafter is not None else ()
    capacity = len(prompt_ids) + gen.max_new_tokens + block_size + 1
    cache, reused, reused_features = (prefix or PrefixCache()).take(target, prompt_ids, layers, capacity)
    policy = DraftPolicy.for_run(gen, measured, getattr(drafter, "context_window", None))
    run = _Run(cache, policy, layers, block_size,
               draft_gen=torch.Generator(device="cpu").manual_seed(gen.seed + 1),  # drafter noise, apart from target's
               verify_gen=torch.Generator(device=target.device).manual_seed(gen.seed))
    kept = prefix is not None and reuses_prefixes(target)  # what this cache holds is handed on only where reusable
    cached = Cached(list(prompt_ids[:reused]), [] if reused_features is None else [reused_features],
                    keep_features=kept)
    try:
        yield from _generate(target, prompt_ids, reused, gen, drafter, cancel, clock, run, cached)
    finally:
        if kept and prefix is not None:
            prefix.keep(cached.ids, cache, cached.all_features(), layers)


@dataclass(frozen=True)
class _Run:
    """The fixed parts of one generation: its cache, policy, the drafter's feature layers, K and the generators."""

    cache: StaticCache | DynamicCache
    policy: DraftPolicy
    layers: tuple[int, ...]
    block_size: int
    draft_gen: torch.Generator
    verify_gen: torch.Generator


@dataclass
class Cached:
    """The positions a generation's cache holds (everything committed but the anchor) and the drafter features of the
    last of them, for core.decoding.prefix.PrefixCache."""

    ids: list[int]
    features: list[torch.Tensor]  # (N_i, F) each, in order: the features of the last sum(N_i) positions
    keep_features: bool = True  # False: ids only (no prefix cache will take them; a long reply's features add up)

    def add(self, ids: list[int], features: torch.Tensor | None) -> None:
        """Positions (N,) and their features (N, F), or None where none were captured (core.decoding.engine.captures),
        which
        leaves only the positions after them with features."""
        self.ids += ids
        if features is None:
            self.features = []
        if features is not None and self.keep_features:
            self.features.append(features)

    def all_features(self) -> torch.Tensor | None:
        return torch.cat(self.features) if self.features else None  # (M, F): the last M positions'


def _generate(target: Target, prompt_ids: list[int], reused: int, gen: GenerationConfig, drafter: Drafter | None,
              cancel, clock, run: _Run, cached: Cached) -> Iterator[RoundEvent]:
    """generate's loop, after `reused` prompt positions came from the previous generation's cache (their features
    already in `cached`)."""
    state = _State(len(prompt_ids), IncrementalText(target.decode))
    policy, cache, layers = run.policy, run.cache, run.layers
    t0 = clock()
    logits, features = target_forward(target, prompt_ids[reused:], cache, captures(policy, layers, True), keep=1)
    reused_features = cached.all_features()  # (R, F): the last R reused positions', or None
    cached.add(prompt_ids[reused:], features)
    if reused_features is not None and features is not None:
        features = torch.cat([reused_features, features])  # (R + N, F): the reused positions', then the new ones
    no_draft = Draft(torch.empty(0, dtype=torch.long), None)
    anchor = _verify(no_draft, logits[-1:], gen.sampling, run.verify_gen).next_token
    verify_s = clock() - t0
    if drafter is not None:
        drafter.reset()
        drafter.extend(prompt_ids, features)
    committed, reason = _commit(state, target, [anchor], gen)
    yield RoundEvent(kind="prefill", drafted=(), n_accepted=0, target_token=anchor, committed=tuple(committed),
                     text=state.text, draft_s=0.0, verify_s=verify_s, finish_reason=reason)
    while reason is None:
        if cancel.is_set():
            yield RoundEvent(kind="round", drafted=(), n_accepted=0, target_token=anchor, committed=(),
                             text=state.text, draft_s=0.0, verify_s=0.0, finish_reason="cancelled")
            return
        t0 = clock()
        room = gen.max_new_tokens - len(state.output)
        k = min(run.block_size, room - 1)
        draft = no_draft
        if drafter is not None and k > 0:
            draft = policy.draft(drafter, anchor, k, gen.sampling, run.draft_gen)
        drafting = draft is not no_draft
        trie = round_trie(draft, k)
        t1 = clock()
        block = [anchor, *trie.tokens]  # (T,) = (K+1,) for a full chain
        logits, features = target_forward(target, block, cache, captures(policy, layers), trie=trie)
        kept_at, anchor = verify_round(draft, trie, logits, gen.sampling, run.verify_gen)
        keep_positions(cache, len(block), kept_at)
        kept = [block[i] for i in kept_at]  # anchor + accepted drafts now have hidden states
        kept_features = None if features is None else kept_rows(features, kept_at)  # (N, F)
        cached.add(kept, kept_features)
        if drafter is not None:
            drafter.extend(kept, kept_features)
        t2 = clock()
        committed, reason = _commit(state, target, kept[1:] + [anchor], gen)
        followed = followed_branch(trie, branches_of(draft), kept[1:])
        event = RoundEvent(
            kind="round", drafted=tuple(followed), n_accepted=len(kept) - 1, target_token=anchor,
            committed=tuple(committed), text=state.text, draft_s=t1 - t0, verify_s=t2 - t1, finish_reason=reason,
            branches=1 + len(draft.alternatives), source=draft.shown_source,
            kept_from=kept_source(draft, followed) if len(kept) > 1 else "",
            decision=policy.decision if drafting else None,
        )
        policy.observe(draft, event.n_accepted, len(event.committed), event.draft_s + event.verify_s, event.draft_s)
        yield event


def kept_source(draft: Draft, followed: list[int]) -> str:
    """Where a round's kept draft tokens came from, `followed` being the branch the target followed: the draft's own
    source, or where that is one of its alternatives, the alternative's (a copy beside the network's draft, or another
    of the network's drafts: a tree)."""
    if not draft.alternatives or not followed or draft.ids[: len(followed)] == list(followed):
        return draft.source
    return draft.branch_source or "drafter"


def generate_all(target: Target, prompt_ids: list[int], gen: GenerationConfig, drafter: Drafter | None = None):
    """Run to completion; return (output token ids, list of events)."""
    events = list(generate(target, prompt_ids, gen, drafter))
    return [tok for ev in events for tok in ev.committed], events
