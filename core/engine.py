"""The one generate loop: draft -> verify -> accept -> roll back the KV cache -> emit an event.

Shape letters: T = positions fed to the target in one forward, K = drafted block length,
V = vocabulary, F = drafter feature width.

Cache invariant: the KV cache holds every committed token except the anchor (the last committed
token). A round feeds [anchor, draft_1..draft_K] (T = K+1), which gives the target's distribution
after the anchor and after each draft token; after verification the cache is cropped to the
anchor plus the accepted drafts, and the target's own token becomes the next anchor.
Plain decoding is this loop with no drafter (K = 0), so baseline and speculative runs share
every line but the draft. A draft with alternatives (several noise draws, paper App. D) is merged
into a trie of at most K nodes and verified as a tree in the same one forward (T=0 only); the
cache then keeps the anchor and the accepted path (`keep_positions`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from core.drafting import MAX_BLOCK_SIZE, Draft, Drafter
from core.forward import keep_positions, target_forward
from core.sampling import SamplingConfig, target_probs, verify_greedy, verify_sampled
from core.target import Target
from core.tree import Trie, build_trie, followed_branch, greedy_path

PLAIN_PROBE_EVERY = 16  # the app's drafting replies: a plain step at least every 16 rounds (< 3% of their speed)


class PromptError(ValueError):
    """The prompt cannot be generated from (empty, or too long for the model's context)."""


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    block_size: int | None = None  # K, tokens drafted per round; None: the drafter's own (its max_block_size)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    # relative cost of one target forward over 1, 2, ... positions (core.verify_cost); when given, a draft
    # with confidences is cut to the length with the most expected tokens per unit of cost
    verify_cost: tuple[float, ...] = ()
    # one drafter call relative to a one-position target forward (core.verify_cost.draft_cost): where it is charged
    # (charges_draft_cost), a draft whose best expected tokens per unit of cost, this included, do not beat a plain
    # step counts as empty for the skips below
    draft_cost: float = 0.0
    # with a cost curve: after drafts that did not pay (draft_pays), skip the drafter's call for 1, 2, 4, ... rounds,
    # at most this many (0: never skip); a FlashMap jump costs ~0.24 of a target step on this CPU, two jumps ~0.58
    max_skip: int = 8
    # with a drafter: if no round of the last N was a plain step (an empty draft), make the next one plain, so a
    # reply always carries plain-step timings measured under its own load (the app's honest speed ratio); 0: never
    plain_probe_every: int = 0
    # with plain probes: while drafting rounds measure fewer tokens a second than plain steps in this reply, skip the
    # drafter for 1, 2, 4, ... rounds, at most this many (MeasuredPays; 0: never)
    max_measured_wait: int = 32

    def __post_init__(self):
        if self.block_size is not None and not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size K must be in 1..{MAX_BLOCK_SIZE}, got {self.block_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_skip < 0:
            raise ValueError(f"max_skip must be >= 0, got {self.max_skip}")
        if not self.draft_cost >= 0:
            raise ValueError(f"draft_cost must be >= 0, got {self.draft_cost}")
        if self.plain_probe_every < 0:
            raise ValueError(f"plain_probe_every must be >= 0, got {self.plain_probe_every}")
        if self.max_measured_wait < 0:
            raise ValueError(f"max_measured_wait must be >= 0, got {self.max_measured_wait}")

    def charges_draft_cost(self) -> bool:
        """Whether the skips charge each draft for the drafter's call: with a cost curve, at T = 0 only. At T > 0 a
        draft's confidence (its largest probability) does not estimate its acceptance (sum_v min(p, q)) and no
        calibration maps it (drafter/calibration.py fits T = 0); charging on it skipped drafts that paid: the app's
        T = 1 default 0.98x -> 0.96x of plain decoding (docs/results/policy-ab-t1-2026-11-30.json)."""
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
    output: list[int] = field(default_factory=list)
    text: str = ""


@dataclass
class SkipEmpty:
    """When to call the drafter: after `empty` drafts in a row that did not pay for themselves (draft_pays), skip
    the next min(2^(empty-1), max_skip) rounds, which are then plain steps; a draft that paid resets it.
    A policy only: a skipped round verifies an empty draft, so the output stays exact."""

    max_skip: int
    empty: int = 0
    wait: int = 0

    def draft_now(self) -> bool:
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def drafted(self, paid: bool) -> None:
        self.empty = 0 if paid else self.empty + 1
        self.wait = min(2 ** (self.empty - 1), self.max_skip) if self.empty else 0


@dataclass
class PlainProbe:
    """When to make a round a plain step without calling the drafter: after `every` rounds in a row that all
    drafted something (0: never). A policy only: a plain round verifies an empty draft, so the output stays exact;
    it costs at most one round's drafting in `every`."""

    every: int
    since_plain: int = 0

    def due(self) -> bool:
        return self.every > 0 and self.since_plain >= self.every

    def record(self, plain: bool) -> None:
        self.since_plain = 0 if plain else self.since_plain + 1


@dataclass
class MeasuredPays(SkipEmpty):
    """Whether drafting pays in wall time, as measured in this reply: tokens committed per second by the rounds that
    drafted against the rounds that did not (plain steps, which the plain probes guarantee), over the last `window`
    rounds of each kind. While drafting rounds commit fewer tokens a second than plain steps, skip the drafter for
    1, 2, 4, ... up to `max_skip` rounds (SkipEmpty's back-off, with a measured verdict instead of the drafter's
    confidence), then draft once more to measure again; a drafting round that pays resets the wait. It sees
    everything a draft costs (the drafter's call, the longer verify, the cut). A policy only: it decides from past
    rounds' timings and committed tokens, never from the round being verified, so the output stays exact at every
    temperature. 0 max_skip: never skips."""

    max_skip: int = 32
    window: int = 16
    min_rounds: int = 3  # rounds of each kind measured before the first verdict
    # a drafter measured far slower than plain steps is re-measured rarely enough that its tries cost at most this
    # share of the time (budget_wait), up to 8 max_skip rounds, beyond the back-off's own limit
    budget: float = 0.01
    drafted_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent drafting rounds
    plain_rounds: list = field(default_factory=list)  # (tokens committed, seconds) of recent plain rounds

    @property
    def losses(self) -> int:
        """Drafting rounds in a row measured slower than plain steps."""
        return self.empty

    def draft_now(self) -> bool:
        if not super().draft_now():
            return False
        # the first rounds alternate until both kinds are measured, so a verdict comes within a few rounds
        plain, drafted = len(self.plain_rounds), len(self.drafted_rounds)
        return not (self.max_skip and plain < self.min_rounds and drafted > plain)

    def observe(self, drafted: bool, committed: int, seconds: float) -> None:
        rounds = self.drafted_rounds if drafted else self.plain_rounds
        rounds.append((committed, seconds))
        del rounds[: -self.window]
        if drafted and self.max_skip and self._measured():
            ratio = self.rate(self.drafted_rounds) / self.rate(self.plain_rounds)
            self.drafted(paid=ratio >= 1)
            if ratio < 1:
                tokens = sum(c for c, _ in self.drafted_rounds) / len(self.drafted_rounds)
                self.wait = max(self.wait, min(self.budget_wait(ratio, tokens), 8 * self.max_skip))

    def budget_wait(self, ratio: float, tokens: float = 1.0) -> int:
        """Plain rounds to wait after drafting rounds measured at `ratio` of plain steps' tokens a second, `tokens`
        committed a round: such a round takes tokens * (1 / ratio - 1) plain rounds longer than plain steps would
        for its tokens, which must stay within `budget` of the rounds."""
        return math.ceil(tokens * (1 / max(ratio, 1e-3) - 1) / self.budget)

    def _measured(self) -> bool:
        return len(self.drafted_rounds) >= self.min_rounds and len(self.plain_rounds) >= self.min_rounds

    @staticmethod
    def rate(rounds: list) -> float:
        seconds = sum(s for _, s in rounds)
        return sum(c for c, _ in rounds) / seconds if seconds > 0 else float("inf")


@dataclass
class DraftPolicy:
    """When to call the drafter and how much of a draft to verify: the adaptive cut under the verify cost
    (clip_draft), the skips after drafts that did not pay for the drafter's call (SkipEmpty, draft_pays), the
    skips while drafting measures slower than plain steps in this reply (MeasuredPays) and the plain probes
    (PlainProbe). A policy only: whatever it decides, verification keeps the output exact."""

    gen: GenerationConfig
    skip: SkipEmpty
    probe: PlainProbe
    measured: MeasuredPays

    @classmethod
    def for_run(cls, gen: GenerationConfig, measured: MeasuredPays | None = None) -> "DraftPolicy":
        if measured is None:
            measured = MeasuredPays()
        measured.max_skip = gen.max_measured_wait if gen.plain_probe_every else 0
        return cls(gen, SkipEmpty(gen.max_skip if gen.verify_cost else 0), PlainProbe(gen.plain_probe_every), measured)

    def draft_now(self) -> bool:
        # each policy's wait runs down only while it is asked, so ask the measured one first
        return self.measured.draft_now() and self.skip.draft_now() and not self.probe.due()

    def observe(self, event: "RoundEvent") -> None:
        """A round's outcome: what it committed and what it cost, for the measured policy."""
        self.measured.observe(bool(event.drafted), len(event.committed), event.draft_s + event.verify_s)

    def cut(self, proposal: Draft | None, k: int) -> Draft:
        """The part of the proposal to verify (an empty draft for none)."""
        draft = clip_draft(proposal, k, self.gen.verify_cost)
        if proposal is not None and proposal.confidence is not None and self.gen.verify_cost:  # a draft it can cut
            charged = self.gen.draft_cost if self.gen.charges_draft_cost() else 0.0
            self.skip.drafted(draft_pays(proposal.confidence[:k], self.gen.verify_cost, charged))
        self.probe.record(plain=len(draft.tokens) == 0)
        return draft


def best_draft_length(confidence: torch.Tensor, verify_cost: tuple[float, ...]) -> int:
    """The prefix length n maximising expected committed tokens per unit of verify cost,
    (1 + sum_{k<=n} prod_{j<=k} c_j) / cost(n + 1 positions), with the drafter's per-slot confidence c
    as its acceptance estimate. A policy only: whatever length it picks, verification keeps the output exact."""
    n_max = min(len(confidence), len(verify_cost) - 1)
    reach = torch.cumprod(confidence[:n_max].double().clamp(0, 1), 0)  # (n_max,) P(slots 1..k all accepted)
    expected = torch.cat([torch.ones(1, dtype=torch.float64), 1 + reach.cumsum(0)])  # (n_max+1,) n = 0..n_max
    cost = torch.tensor(verify_cost[: n_max + 1], dtype=torch.float64)
    return int((expected / cost).argmax())


def draft_pays(confidence: torch.Tensor, verify_cost: tuple[float, ...], draft_cost: float) -> bool:
    """Whether drafting beats a plain step in expected tokens per unit of cost when the drafter's own call is paid
    too: max over n >= 1 of (1 + sum_{k<=n} prod_{j<=k} c_j) / (cost(n + 1) + draft_cost) > 1 / cost(1) = 1.
    With draft_cost = 0 this is "the cut keeps something" (best_draft_length > 0). The draft in hand is sunk, so
    its cut ignores draft_cost; this only tells the skip policy whether the next call is likely worth making."""
    n_max = min(len(confidence), len(verify_cost) - 1)
    if n_max < 1:
        return False
    reach = torch.cumprod(confidence[:n_max].double().clamp(0, 1), 0)  # (n_max,) P(slots 1..n all accepted)
    expected = 1 + reach.cumsum(0)  # (n_max,) n = 1..n_max
    cost = torch.tensor(verify_cost[1 : n_max + 1], dtype=torch.float64) + draft_cost  # (n_max,)
    return bool((expected / cost).max() > 1.0)


def clip_draft(draft: Draft | None, k: int, verify_cost: tuple[float, ...] = ()) -> Draft:
    """No draft -> an empty one; a drafter that overshoots the room left is cut to k slots; with a cost
    curve, a draft with confidences is cut to its best expected length. (Alternatives are cut by the
    trie's node budget, round_trie.)"""
    if draft is None:
        return Draft(torch.empty(0, dtype=torch.long), None)
    if verify_cost and draft.confidence is not None:
        k = min(k, best_draft_length(draft.confidence, verify_cost))
    if len(draft.tokens) <= k:
        return draft
    cut = lambda x: None if x is None else x[:k]  # noqa: E731
    return Draft(draft.tokens[:k], cut(draft.q_draft), cut(draft.confidence), draft.alternatives)


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
            f"model's context of {limit} tokens. Shorten the conversation or lower max new tokens."
        )


def _verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, generator):
    if sampling.greedy:
        return verify_greedy(draft.tokens.to(logits.device), logits)
    p_target = target_probs(logits, sampling)  # (K+1, V)
    q_draft = None if draft.q_draft is None else draft.q_draft.to(p_target)
    return verify_sampled(draft.tokens.to(logits.device), p_target, q_draft, generator)


def branches_of(draft: Draft) -> list[list[int]]:
    return [draft.tokens.tolist(), *(list(alt) for alt in draft.alternatives)]


def round_trie(draft: Draft, k: int) -> Trie:
    """The nodes one round verifies: the draft's tokens, merged with its alternatives (App. D) into a
    trie of at most k nodes. A draft without alternatives is a chain of its own tokens."""
    return build_trie(branches_of(draft), k)


def verify_round(draft: Draft, trie: Trie, logits: torch.Tensor, sampling: SamplingConfig, generator):
    """-> (indices of the kept positions, 0 = the anchor, then the accepted nodes; the target's token)."""
    if not draft.alternatives:  # one draft: greedy or rejection-sampling verification of a chain
        verdict = _verify(draft, logits, sampling, generator)
        return list(range(1 + verdict.n_accepted)), verdict.next_token
    if not sampling.greedy:
        raise ValueError("tree verification of several drafts is exact at temperature 0 only")
    path, next_token = greedy_path(trie, logits.argmax(-1).tolist())
    return [0, *(node + 1 for node in path)], next_token


def _commit(state: _State, target: Target, tokens: list[int], gen: GenerationConfig) -> tuple[list[int], str | None]:
    """Append tokens to the output, cutting at EOS, the length budget or a stop string."""
    kept = target.until_eos(tokens)
    tokens, reason = kept, ("eos" if len(kept) < len(tokens) else None)
    room = gen.max_new_tokens - len(state.output)
    if len(tokens) >= room:
        tokens, reason = tokens[:room], reason or "length"
    state.output.extend(tokens)
    state.text = target.decode(state.output)
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
    measured: "MeasuredPays | None" = None,
) -> Iterator[RoundEvent]:
    """Yield one RoundEvent per target forward until EOS, a stop string, the budget or cancel. `measured` carries
    what drafting measured in earlier replies of a conversation (MeasuredPays; updated in place), so a reply starts
    from it instead of measuring again; None: this reply measures on its own."""
    block_size = block_size_for(gen, drafter)
    check_prompt(target, prompt_ids, gen, block_size)
    cancel = cancel or Never()
    layers = drafter.feature_layers if drafter is not None else ()
    draft_gen = torch.Generator(device="cpu").manual_seed(gen.seed + 1)  # drafter noise, independent of target
    verify_gen = torch.Generator(device=target.device).manual_seed(gen.seed)
    state = _State(len(prompt_ids))
    policy = DraftPolicy.for_run(gen, measured)
    cache = target.new_cache(len(prompt_ids) + gen.max_new_tokens + block_size + 1)
    with torch.inference_mode():
        t0 = clock()
        logits, features = target_forward(target, prompt_ids, cache, layers, keep=1)
        no_draft = Draft(torch.empty(0, dtype=torch.long), None)
        anchor = _verify(no_draft, logits[-1:], gen.sampling, verify_gen).next_token
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
            k = min(block_size, room - 1)
            asked = drafter is not None and k > 0 and policy.draft_now()
            draft = policy.cut(drafter.propose(anchor, k, gen.sampling, draft_gen) if asked else None, k)
            trie = round_trie(draft, k)
            t1 = clock()
            block = [anchor, *trie.tokens]  # (T,) = (K+1,) for a full chain
            logits, features = target_forward(target, block, cache, layers, trie=trie)
            kept_at, anchor = verify_round(draft, trie, logits, gen.sampling, verify_gen)
            keep_positions(cache, len(block), kept_at)
            kept = [block[i] for i in kept_at]  # anchor + accepted drafts now have hidden states
            if drafter is not None:
                drafter.extend(kept, None if features is None else features[kept_at])
            t2 = clock()
            committed, reason = _commit(state, target, kept[1:] + [anchor], gen)
            event = RoundEvent(
                kind="round", drafted=tuple(followed_branch(trie, branches_of(draft), kept[1:])),
                n_accepted=len(kept) - 1, target_token=anchor, committed=tuple(committed), text=state.text,
                draft_s=t1 - t0, verify_s=t2 - t1, finish_reason=reason, branches=1 + len(draft.alternatives),
            )
            policy.observe(event)
            yield event


def generate_all(target: Target, prompt_ids: list[int], gen: GenerationConfig, drafter: Drafter | None = None):
    """Run to completion; return (output token ids, list of events)."""
    events = list(generate(target, prompt_ids, gen, drafter))
    return [tok for ev in events for tok in ev.committed], events
