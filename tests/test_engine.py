import itertools
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from core.decoding.engine import GenerationConfig, PromptError, generate, generate_all
from core.drafting.base import MAX_BLOCK_SIZE, Draft, NgramDrafter
from core.drafting.policy.config import PolicyConfig
from core.verification.sampling import SamplingConfig
from lab.testing import assert_sampled_distribution_exact, make_target, tiny_llama


class NoisyOracle:
    """Proposes the known greedy continuation with random corruptions: exercises every accept length."""

    name = "oracle"
    feature_layers = (1, 2)
    max_block_size = MAX_BLOCK_SIZE

    def __init__(self, reference: list[int], corrupt: float, vocab: int, seed: int = 0):
        self.reference, self.corrupt, self.vocab = reference, corrupt, vocab
        self.rng = np.random.default_rng(seed)
        self.committed: list[int] = []
        self.features_seen = 0

    def reset(self):
        self.committed, self.features_seen = [], 0

    def extend(self, token_ids, features):
        assert features is not None and features.shape == (len(token_ids), 64)  # two layers of D = 32
        self.committed += list(token_ids)
        self.features_seen += len(token_ids)

    def propose(self, anchor, block_size, sampling, generator):
        start = len(self.committed) - self.prompt_len + 1  # output index after the anchor
        block = list(self.reference[start : start + block_size])
        block += [0] * (block_size - len(block))
        for i in range(block_size):
            if self.rng.random() < self.corrupt:
                block[i] = int(self.rng.integers(self.vocab))
        return Draft(torch.tensor(block), None)


class SkewedSampler:
    """A deliberately bad stochastic drafter: samples every slot from a fixed skewed q."""

    name = "skewed"
    feature_layers = ()
    max_block_size = MAX_BLOCK_SIZE

    def __init__(self, q_row):
        self.q_row = torch.tensor(q_row)

    def reset(self):
        pass

    def extend(self, token_ids, features):
        pass

    def propose(self, anchor, block_size, sampling, generator):
        q_draft = self.q_row.expand(block_size, -1)  # (K, V)
        return Draft(torch.multinomial(q_draft, 1, generator=generator)[:, 0], q_draft)


def prompts(n, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab, size=int(rng.integers(1, 12))).tolist() for _ in range(n)]


def test_greedy_speculative_equals_plain_for_many_prompts_and_all_k(tiny_target):
    vocab = tiny_target.vocab_size
    accept_lengths = set()
    for i, prompt in enumerate(prompts(24, vocab)):
        plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40, block_size=1))
        for k in (1 + i % 16, 16 - i % 16):
            gen = GenerationConfig(max_new_tokens=40, block_size=k)
            oracle = NoisyOracle(plain, corrupt=0.15, vocab=vocab, seed=i)
            oracle.prompt_len = len(prompt)
            out, events = generate_all(tiny_target, prompt, gen, oracle)
            assert out == plain, (i, k)
            assert oracle.features_seen == len(prompt) + len(out) - 1  # every committed position but the anchor
            accept_lengths |= {ev.n_accepted for ev in events if ev.drafted}
            out_ngram, _ = generate_all(tiny_target, prompt, gen, NgramDrafter())
            assert out_ngram == plain, (i, k)
    assert set(range(12)) <= accept_lengths  # rejections happened at every early slot


def test_kv_cache_rolls_back_to_committed_length(tiny_target):
    """After each round the cache holds exactly the committed tokens minus the anchor."""
    seen = []
    original = tiny_target.model.forward

    def spy(*args, **kwargs):
        cache = kwargs["past_key_values"]
        seen.append((cache.get_seq_length(), kwargs["input_ids"].shape[1]))
        return original(*args, **kwargs)

    prompt = [5, 6, 7, 8]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=30))
    oracle = NoisyOracle(plain, corrupt=0.3, vocab=tiny_target.vocab_size)
    oracle.prompt_len = len(prompt)
    tiny_target.model.forward = spy
    try:
        out, events = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=30, block_size=6), oracle)
    finally:
        del tiny_target.model.forward
    assert out == plain
    committed = len(prompt)
    for (cache_len, fed), ev in zip(seen, events):
        assert cache_len == (0 if ev.kind == "prefill" else committed - 1)
        committed += 0 if ev.kind == "prefill" else ev.n_accepted + 1
        if ev.kind == "prefill":
            committed += 1


def test_sampled_output_distribution_equals_target():
    """Chi-square on the joint of output tokens 2-3 (drafted and verified) against exact target probs."""
    target = make_target(tiny_llama(vocab_size=5, layers=1, seed=3, scale=8.0))
    for drafter in (SkewedSampler([0.9, 0.025, 0.025, 0.025, 0.025]), NgramDrafter()):
        assert_sampled_distribution_exact(target, drafter)


def test_eos_stops_and_is_not_emitted(tiny_target):
    prompt = [9, 10, 11]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=20))
    eos_target = make_target(tiny_target.model, eos=(plain[5],))
    out, events = generate_all(eos_target, prompt, GenerationConfig(max_new_tokens=20), NgramDrafter())
    assert out == plain[: plain.index(plain[5])]
    assert events[-1].finish_reason == "eos"


def test_max_new_tokens_and_stop_strings(tiny_target):
    prompt = [12, 13]
    out, events = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=7, block_size=16), NgramDrafter())
    assert len(out) == 7 and events[-1].finish_reason == "length"
    full_text = tiny_target.decode(out)
    stop = tiny_target.decode(out[3:5])
    gen = GenerationConfig(max_new_tokens=7, stop_strings=(stop,))
    events = list(generate(tiny_target, prompt, gen))
    assert events[-1].finish_reason == "stop"
    assert events[-1].text == full_text[: full_text.find(stop)]


def test_cancel_is_checked_every_round(tiny_target):
    cancel = threading.Event()
    events = []
    for ev in generate(tiny_target, [5, 6], GenerationConfig(max_new_tokens=100), cancel=cancel):
        events.append(ev)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    assert len(events) == 4


def test_bad_prompts_and_settings(tiny_target):
    with pytest.raises(PromptError, match="empty"):
        list(generate(tiny_target, [], GenerationConfig()))
    with pytest.raises(PromptError, match="context"):
        list(generate(tiny_target, [5] * 500, GenerationConfig(max_new_tokens=64)))
    for k in (0, 17):
        with pytest.raises(ValueError, match="block size"):
            GenerationConfig(block_size=k)
    with pytest.raises(ValueError):
        GenerationConfig(max_new_tokens=0)


def test_ngram_drafter_copies_what_followed_the_latest_match():
    drafter = NgramDrafter(max_ngram=2)
    drafter.extend([1, 2, 3, 4, 1, 2, 5, 6, 7, 1], None)
    draft = drafter.propose(2, 3, SamplingConfig(), torch.Generator())
    assert draft.tokens.tolist() == [5, 6, 7] and draft.q_draft is None
    assert drafter.propose(99, 3, SamplingConfig(), torch.Generator()).tokens.numel() == 0


def test_ngram_index_finds_what_a_scan_of_the_conversation_finds():
    def scan(seq, block):  # the latest earlier occurrence of the longest suffix (3..1 tokens), by brute force
        for n in range(min(3, len(seq) - 1), 0, -1):
            starts = [s for s in range(len(seq) - n) if seq[s:s + n] == seq[-n:]]
            if starts:
                return seq[starts[-1] + n : starts[-1] + n + block], n
        return [], 0

    rng = np.random.default_rng(0)
    for trial in range(200):
        seq = rng.integers(0, 4 if trial % 2 else 12, size=int(rng.integers(1, 40))).tolist()
        drafter = NgramDrafter()
        cut = int(rng.integers(0, len(seq)))
        drafter.extend(seq[:cut], None)
        drafter.extend(seq[cut:-1], None)  # in two parts, as rounds commit them
        assert drafter.lookup(seq[-1], 5) == scan(seq, 5), seq


class Counting(NoisyOracle):
    """NoisyOracle that counts its calls and needs no features."""

    calls = 0

    def extend(self, token_ids, features):
        self.committed += list(token_ids)

    def propose(self, anchor, block_size, sampling, generator):
        self.calls += 1
        return super().propose(anchor, block_size, sampling, generator)


def test_prompt_lookup_offers_its_copy_alone_and_joins_the_drafter_as_a_branch():
    from core.drafting.base import LookupHybrid

    main = Counting([7, 8, 9, 10, 11], corrupt=0.0, vocab=64)
    main.prompt_len, main.feature_layers = 2, ()
    hybrid = LookupHybrid(main, branch=4)
    hybrid.extend([1, 2], None)
    greedy = SamplingConfig(temperature=0.0)
    assert hybrid.propose_lookup(99, 4) is None  # nothing to copy
    draft = hybrid.propose(99, 4, greedy, torch.Generator())  # the drafter's block as it is
    assert draft.alternatives == () and len(draft.tokens) == 4 and main.calls == 1
    hybrid.reset()
    hybrid.extend([5, 6, 3, 4, 40, 41, 42, 43, 44, 7, 3], None)
    lookup = hybrid.propose_lookup(4, 6)  # "3 4" matched: what followed it, with the match's length
    assert lookup.tokens == [40, 41, 42, 43, 44, 7] and lookup.matched == 2 and main.calls == 1
    draft = hybrid.propose(4, 4, greedy, torch.Generator())  # beside the network: one more branch of the trie
    assert draft.alternatives == ((40, 41, 42, 43),) and main.calls == 2 and draft.lookup_match == 0
    sampled = hybrid.propose(4, 4, SamplingConfig(temperature=1.0), torch.Generator())
    assert sampled.alternatives == () and main.calls == 3  # no trie at T > 0: the drafter's block alone


def test_copies_without_a_network_equal_plain_decoding_and_credit_the_copy_the_target_followed(tiny_target):
    """The app's Copies choice (LookupHybrid(NoNetwork)): at T = 0 the empty network draft carries the copy as an
    alternative; the kept tokens count to that copy's source, never to a plain step."""
    from core.decoding.stats import AcceptanceStats
    from core.drafting.base import LookupHybrid, NoNetwork

    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40))
    out, events = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40, block_size=6),
                               LookupHybrid(NoNetwork()))
    stats = AcceptanceStats().add_all(events)
    assert out == plain and "plain" not in stats.tokens and stats.tokens.get("lookup", 0) > 0
    assert sum(stats.tokens.values()) == sum(len(ev.committed) for ev in events)
    assert all(ev.kept_from in ("", "lookup", "phrasebook") for ev in events)
    assert all(ev.source != "plain" for ev in events if ev.n_accepted)  # a round that kept a copy was no plain step


def test_drafting_with_prompt_lookup_equals_plain_decoding(tiny_target):
    from core.drafting.base import LookupHybrid

    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # repeats, so lookup has something to copy
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40))
    settings = (GenerationConfig(max_new_tokens=40, block_size=6),  # no cost curve: strong lookups whole
                # the app's: cut by measured acceptance, measured rounds
                GenerationConfig(max_new_tokens=40, block_size=6, verify_cost=(1.0, 1.1, 1.2, 1.5, 1.8, 2.0, 2.2),
                                 policy=PolicyConfig(plain_probe_every=16)))
    sources, branches = set(), 0
    for gen in settings:
        for corrupt in (0.0, 0.5):
            oracle = NoisyOracle(plain, corrupt=corrupt, vocab=64, seed=1)
            oracle.prompt_len = len(prompt)
            out, events = generate_all(tiny_target, prompt, gen, LookupHybrid(oracle, branch=3))
            assert out == plain
            sources |= {ev.source for ev in events[1:]}
            branches += sum(ev.branches > 1 for ev in events)
    assert sources == {"plain", "lookup", "drafter"} and branches  # lookup alone, and as a branch of the trie


def test_lookup_drafts_are_cut_by_their_measured_acceptance_and_stay_exact_at_t1():
    from core.drafting.base import Copy, LookupHybrid
    from core.drafting.policy.offers import copy_offer
    from core.drafting.policy.state import Acceptance

    acceptance = Acceptance()
    assert acceptance.rates("lookup", 2, 1) == pytest.approx([0.7])  # the prior, before anything was measured
    for _ in range(20):
        acceptance.record("lookup", 1, n_verified=3, n_accepted=0)  # one-token matches: always rejected at once
        acceptance.record("lookup", 5, n_verified=4, n_accepted=4)  # long matches (counted with 3): always kept
    assert acceptance.rates("lookup", 1, 1)[0] < 0.1 and acceptance.rates("lookup", 3, 1)[0] > 0.95
    assert acceptance.rates("lookup", 4, 4) == acceptance.rates("lookup", 3, 4)
    curve = (1.0, 1.1, 1.2, 1.5, 1.8)
    copy = [9, 9, 9, 9]
    assert copy_offer(Copy(copy, matched=1), 4, acceptance, curve) is None  # not worth verifying
    assert len(copy_offer(Copy(copy, matched=3), 4, acceptance, curve).draft.tokens) == 4
    assert copy_offer(Copy(copy, matched=3), 2, acceptance, curve).draft.lookup_match == 3  # a cut lookup stays one
    target = make_target(tiny_llama(vocab_size=5, layers=1, seed=3, scale=8.0))
    assert_sampled_distribution_exact(target, LookupHybrid(SkewedSampler([0.9, 0.025, 0.025, 0.025, 0.025])),
                                      prompt=(4, 3, 2, 4, 3), verify_cost=curve)


class RandomQDrafter(SkewedSampler):
    """Each round picks one of two q rows at random (a confident one and a flat one), so the adaptive cut
    varies from round to round. confidence: "max" (the largest probability of each slot's q, as the shipped
    drafters report) or "sampled" (the probability of the sampled token: a cut that looks at the sample,
    which biases T > 0)."""

    ROWS = torch.tensor([[0.7, 0.05, 0.05, 0.1, 0.1], [0.25, 0.25, 0.2, 0.15, 0.15]])

    def __init__(self, confidence: str):
        self.mode = confidence
        self.name = f"random-q-{confidence}"

    def propose(self, anchor, block_size, sampling, generator):
        row = int(torch.randint(2, (1,), generator=generator))
        q_draft = self.ROWS[row].expand(block_size, -1)  # (K, V)
        tokens = torch.multinomial(q_draft, 1, generator=generator)[:, 0]
        picked = q_draft[torch.arange(block_size), tokens] if self.mode == "sampled" else q_draft.max(-1).values
        return Draft(tokens, q_draft, picked)


def test_adaptive_cut_at_t1_never_reads_a_drafts_own_confidence():
    """Chi-square on the first drafted token's marginal (V=5), 3,000 seeds per mode. A drafter whose confidence
    depends on the tokens it sampled ("sampled") would bias the output if the cut read it (before the policy cut
    sampled drafts on measured per-slot acceptance, core.drafting.policy.state.Acceptance, this mode failed the check at
    p < 1e-3)."""
    from scipy.stats import chisquare

    from lab.testing import exact_joint_23

    target = make_target(tiny_llama(vocab_size=5, layers=2, seed=3, scale=8.0))
    exact = exact_joint_23(target, [4, 3]).numpy().reshape(5, 5).sum(1)  # (V,) marginal of output token 2
    curve = (1.0, 1.3, 2.2)  # a one-slot draft pays only when its confidence is above 0.3

    def pvalue(mode: str) -> float:
        counts = np.zeros(5)
        for seed in range(3000):
            gen = GenerationConfig(max_new_tokens=3, block_size=2, sampling=SamplingConfig(1.0), seed=seed,
                                   verify_cost=curve)
            out, _ = generate_all(target, [4, 3], gen, RandomQDrafter(mode))
            counts[out[1]] += 1
        return chisquare(counts, exact / exact.sum() * counts.sum()).pvalue

    assert pvalue("max") > 1e-3
    assert pvalue("sampled") > 1e-3


def test_drafts_that_do_not_pay_for_the_drafter_are_skipped_and_the_output_stays_exact(tiny_target):
    class Unsure:  # always drafts the same two tokens with confidence 0.3: kept by the cut, not worth a call
        name, feature_layers, max_block_size = "unsure", (), 2
        calls = 0

        def reset(self):
            pass

        def extend(self, token_ids, features):
            pass

        def propose(self, anchor, block_size, sampling, generator):
            Unsure.calls += 1
            return Draft(torch.tensor([5, 6])[:block_size], None, torch.full((min(2, block_size),), 0.3))

    curve = (1.0, 1.1, 1.2)
    plain, _ = generate_all(tiny_target, [5, 6, 7], GenerationConfig(max_new_tokens=24))
    for draft_cost, few in ((0.0, False), (0.5, True)):
        Unsure.calls = 0
        gen = GenerationConfig(max_new_tokens=24, verify_cost=curve, draft_cost=draft_cost,
                               policy=PolicyConfig(max_skip=8))
        # a clock that ticks once a reading: drafting and verifying take a tick each, so a call measures half a
        # plain round (core.drafting.policy.state.Costs), as the start-up estimate of 0.5 says
        events = list(generate(tiny_target, [5, 6, 7], gen, Unsure(), clock=itertools.count().__next__))
        out = [tok for ev in events for tok in ev.committed]
        assert out == plain
        rounds = len(events) - 1
        assert (Unsure.calls < rounds / 2) == few  # with the call's cost counted, most rounds skip the drafter


def test_plain_probes_keep_a_reply_measurable_and_exact(tiny_target):
    """With plain_probe_every = N no N rounds in a row all draft: the reply carries plain steps for its speed
    ratio, and the output is unchanged."""
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=60))
    for every in (0, 4):
        gen = GenerationConfig(max_new_tokens=60, block_size=4,
                               policy=PolicyConfig(plain_probe_every=every, max_skip=0))
        out, events = generate_all(tiny_target, prompt, gen, AlwaysDrafts())
        assert out == plain
        drafted = [bool(ev.drafted) for ev in events if ev.kind == "round"]
        longest = max(len(run) for run in "".join("d" if d else "." for d in drafted).split("."))
        assert longest == every if every else longest >= len(drafted) - 1  # the last round has no room to draft


class AlwaysDrafts:
    """Proposes a token that is rarely right, every round."""

    name = "always"
    feature_layers = ()
    max_block_size = MAX_BLOCK_SIZE

    def reset(self):
        pass

    def extend(self, token_ids, features):
        pass

    def propose(self, anchor, block_size, sampling, generator):
        return Draft(torch.tensor([3] * block_size), None)


def test_verify_cost_curves_are_made_sane():
    from core.runtime.verify_cost import sane_curve

    assert sane_curve([1.2, 2.5, 2.91, 0.8]) == (1.0, 2.0, 2.91, 1.0)  # within [1, n], otherwise as measured


class SlowDrafter(AlwaysDrafts):
    """Drafts that are never accepted and cost the clock 5 units a call."""

    def __init__(self, clock):
        self.clock, self.calls = clock, 0

    def propose(self, anchor, block_size, sampling, generator):
        self.calls += 1
        self.clock.now += 5.0
        return super().propose(anchor, block_size, sampling, generator)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.5
        return self.now


def slow_reply(target, drafter: SlowDrafter, prompt: list[int], temperature: float, max_new_tokens: int) -> list:
    """A reply with a slow drafter (its clock) and plain probes, checked against plain decoding at T = 0 -> events."""
    gen = GenerationConfig(max_new_tokens=max_new_tokens, block_size=4, sampling=SamplingConfig(temperature), seed=3,
                           policy=PolicyConfig(plain_probe_every=16))
    plain, _ = generate_all(target, prompt, replace(gen, policy=replace(gen.policy, plain_probe_every=0)))
    events = list(generate(target, prompt, gen, drafter, clock=drafter.clock))
    if temperature == 0:  # at T > 0 exactness is the distribution's (test_sampled_output_distribution_...)
        assert [t for ev in events for t in ev.committed] == plain
    return events


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_drafter_that_costs_more_than_it_brings_is_mostly_skipped_and_the_output_stays_exact(tiny_target,
                                                                                                temperature):
    drafter = SlowDrafter(Clock())
    events = slow_reply(tiny_target, drafter, [5, 6, 7], temperature, 60)
    assert drafter.calls <= 12 and len(events) > 40  # of ~60 rounds


class WindowedSlowDrafter(SlowDrafter):
    """A slow network that reads the features of the last `context_window` positions: every call must find them."""

    feature_layers, context_window = (1, 2), 4

    def reset(self):
        self.positions = self.featured = self.skipped = 0  # positions told of; of the last ones, those with features

    def extend(self, token_ids, features):
        self.positions += len(token_ids)
        if features is None or len(features) < len(token_ids):  # a gap: the context starts again after it
            self.featured, self.skipped = 0, self.skipped + (features is None)
        self.featured += 0 if features is None else len(features)

    def propose(self, anchor, block_size, sampling, generator):
        assert self.featured >= min(self.context_window, self.positions)
        return super().propose(anchor, block_size, sampling, generator)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_features_are_captured_only_where_the_network_may_read_them_and_the_output_stays_exact(tiny_target,
                                                                                               temperature):
    drafter = WindowedSlowDrafter(Clock())
    events = slow_reply(tiny_target, drafter, [5, 6, 7, 8, 9, 10], temperature, 80)
    assert drafter.calls >= 2 and drafter.skipped > len(events) / 2  # measured slow: most rounds capture nothing


def test_features_are_captured_after_a_round_that_wanted_the_network_while_its_waits_allow_a_call():
    from core.decoding.engine import captures
    from core.drafting.policy.policy import DraftPolicy

    gen = GenerationConfig(max_new_tokens=8, verify_cost=(1.0, 1.1), policy=PolicyConfig(plain_probe_every=16))
    assert captures(DraftPolicy.for_run(gen), (1, 2)) == (1, 2)  # no context_window: every forward captures
    policy = DraftPolicy.for_run(gen, window=WindowedSlowDrafter.context_window)
    assert captures(policy, (1, 2), prefill=True) == (1, 2)  # the prompt's
    assert captures(policy, (1, 2)) == ()  # no round has wanted the network yet
    policy.capture.since_wanted = 0  # a round wanted the network
    assert captures(policy, (1, 2)) == (1, 2)
    policy.state.network.wait = 100  # measured slow: it cannot be called while these positions are in its window
    assert captures(policy, (1, 2)) == ()
    assert captures(policy, ()) == ()


def test_cached_positions_keep_the_features_of_their_last_run_without_a_gap():
    from core.decoding.engine import Cached

    cached = Cached([1], [torch.zeros(1, 2)])
    cached.add([2, 3], torch.ones(2, 2))
    assert cached.all_features().shape == (3, 2)
    cached.add([4], None)  # a forward that captured nothing
    assert cached.all_features() is None
    cached.add([5, 6], torch.full((2, 2), 2.0))
    assert cached.ids == [1, 2, 3, 4, 5, 6] and cached.all_features().tolist() == [[2.0, 2.0]] * 2


def test_what_drafting_measured_carries_over_to_the_next_reply(tiny_target):
    from core.drafting.policy.state import PolicyState

    gen = GenerationConfig(max_new_tokens=40, block_size=4, policy=PolicyConfig(plain_probe_every=16))
    fresh_clock, carried_clock = Clock(), Clock()
    fresh, carried = SlowDrafter(fresh_clock), SlowDrafter(carried_clock)
    measured = PolicyState()
    list(generate(tiny_target, [5, 6, 7], gen, carried, clock=carried_clock, measured=measured))  # a first reply
    carried.calls = 0
    second = list(generate(tiny_target, [9, 8, 7], gen, carried, clock=carried_clock, measured=measured))
    alone = list(generate(tiny_target, [9, 8, 7], gen, fresh, clock=fresh_clock))
    assert [ev.committed for ev in second] == [ev.committed for ev in alone]  # exact either way
    assert carried.calls < fresh.calls and carried.calls <= 2  # it starts where the last reply left off


def test_the_phrasebook_offers_its_copy_beside_prompt_lookup_and_the_policy_takes_the_one_that_pays():
    from core.drafting import phrasebook
    from core.drafting.base import LookupHybrid
    from core.drafting.policy.offers import best_copy
    from core.drafting.policy.state import Acceptance

    book = phrasebook.build([[3, 4, 50, 51, 52]] * 2, phrasebook.PhrasebookConfig(min_ngram=2, max_ngram=3))
    main = Counting([7, 8, 9, 10, 11], corrupt=0.0, vocab=64)
    main.prompt_len, main.feature_layers = 2, ()
    hybrid = LookupHybrid(main, branch=4, phrasebook=book)
    hybrid.extend([5, 6, 3, 4, 40, 41, 42, 43, 3], None)
    conversation, phrase = hybrid.propose_lookups(4, 6)
    assert conversation.tokens == [40, 41, 42, 43, 3, 4] and conversation.source == "lookup"
    graded = phrasebook.grade(2, phrasebook.agreement_class(1.0, 2))  # "3 4": both occurrences went on with 50
    assert phrase.tokens == [50, 51, 52] and (phrase.matched, phrase.key) == (2, graded)
    assert phrase.source == "phrasebook"
    curve = (1.0, 1.1, 1.2, 1.5, 1.8, 2.0, 2.2)
    acceptance = Acceptance()
    for _ in range(20):  # in this conversation the phrasebook's copies were kept, prompt lookup's two-token ones not
        acceptance.record("phrasebook", graded, 3, 3)
        acceptance.record("lookup", 2, 3, 0)
    chosen = best_copy((conversation, phrase), 6, acceptance, curve).draft
    assert chosen.ids == [50, 51, 52] and chosen.lookup_match == graded and chosen.source == "phrasebook"
    acceptance = Acceptance()
    for _ in range(20):  # the other way round
        acceptance.record("phrasebook", graded, 3, 0)
        acceptance.record("lookup", 2, 3, 3)
    assert best_copy((conversation, phrase), 6, acceptance, curve).draft.lookup_source == "lookup"
    assert hybrid.propose(4, 4, SamplingConfig(temperature=0.0), torch.Generator()).alternatives == ((40, 41, 42, 43),)
    hybrid.reset()
    hybrid.extend([5, 6, 3], None)  # no earlier "3 4": the phrasebook's copy is the trie's branch
    assert hybrid.propose(4, 4, SamplingConfig(temperature=0.0), torch.Generator()).alternatives == ((50, 51, 52),)


def test_drafting_with_the_phrasebook_equals_plain_decoding_and_keeps_the_t1_distribution(tiny_target):
    from core.drafting import phrasebook
    from core.drafting.base import LookupHybrid

    prompt = [5, 6, 7, 8, 9, 10]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40))
    config = phrasebook.PhrasebookConfig(min_ngram=2, max_ngram=3, length=6)
    right = phrasebook.build([plain] * 2, config)  # the target's own reply: its copies are kept
    wrong = phrasebook.build([[(t * 7 + 1) % 64 for t in plain]] * 2 + [plain[:12]] * 2, config)  # mostly rejected
    curve = (1.0, 1.1, 1.2, 1.5, 1.8, 2.0, 2.2)
    sources = set()
    for book in (right, wrong):
        gen = GenerationConfig(max_new_tokens=40, block_size=6, verify_cost=curve,
                               policy=PolicyConfig(plain_probe_every=16))
        oracle = NoisyOracle(plain, corrupt=0.5, vocab=64, seed=1)
        oracle.prompt_len = len(prompt)
        out, events = generate_all(tiny_target, prompt, gen, LookupHybrid(oracle, branch=3, phrasebook=book))
        assert out == plain
        sources |= {ev.source for ev in events[1:]}
    assert "phrasebook" in sources
    target = make_target(tiny_llama(vocab_size=5, layers=1, seed=3, scale=8.0))
    book = phrasebook.build([[4, 3, 2, 4, 3, 2, 4, 3]] * 2, config)
    assert_sampled_distribution_exact(target, LookupHybrid(SkewedSampler([0.9, 0.025, 0.025, 0.025, 0.025]),
                                                           phrasebook=book),
                                      prompt=(4, 3, 2, 4, 3), verify_cost=curve)


class ConfidentOracle(NoisyOracle):
    """NoisyOracle whose drafts carry a per-slot confidence, so the policy cuts them short of the block."""

    def propose(self, anchor, block_size, sampling, generator):
        draft = super().propose(anchor, block_size, sampling, generator)
        return Draft(draft.tokens, None, torch.full((len(draft.tokens),), 0.6))


class ConfidentSampler(SkewedSampler):
    """SkewedSampler with a per-slot confidence (its q's largest probability), so sampled drafts are cut too."""

    def propose(self, anchor, block_size, sampling, generator):
        draft = super().propose(anchor, block_size, sampling, generator)
        return Draft(draft.tokens, draft.q_draft, draft.q_draft.max(-1).values)


def test_the_block_tail_follows_the_committed_tokens():
    from core.drafting.base import BlockTail, Copy

    tail = BlockTail()
    assert tail.copy(4, 16) is None  # nothing drafted yet
    tail.drafted(4, [5, 6, 7, 8], [0.9, 0.8, 0.3, 0.1])
    tail.extend([4, 5])  # the round kept the block's first slot; the target's own next token is still to come
    assert tail.copy(9, 16) is None  # the target went elsewhere: the block did not foresee it
    assert tail.copy(6, 16) == Copy([7, 8], 2, "tail")  # it did: the rest, keyed by slot 3's confidence (0.3 -> 2)
    assert tail.copy(6, 1) == Copy([7], 2, "tail")
    tail.extend([6])  # a plain round: the anchor alone was kept
    assert tail.copy(7, 16) == Copy([8], 1, "tail")
    tail.extend([7, 8])  # the block is used up
    assert tail.ahead == [] and tail.copy(8, 16) is None
    tail.drafted(4, [5, 6], [0.9, 0.9])
    tail.extend([4, 9])  # the round kept a token the block did not draft (another branch of the trie)
    assert tail.ahead == [] and tail.copy(5, 16) is None


def test_the_tail_of_a_cut_block_is_verified_free_and_the_output_stays_exact(tiny_target, monkeypatch):
    from core.drafting.base import Copy, LookupHybrid

    prompt = [5, 6, 7, 8, 9, 10]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=40))
    curve = (1.0, 1.1, 1.6, 2.4, 3.0, 3.6, 4.2)  # steep: the 0.6-confident blocks are cut to a slot or two
    sources = {}
    for use_tail in (True, False):
        oracle = ConfidentOracle(plain, corrupt=0.1, vocab=64, seed=1)
        oracle.prompt_len = len(prompt)
        hybrid = LookupHybrid(oracle, branch=0)
        hybrid.use_tail = use_tail
        gen = GenerationConfig(max_new_tokens=40, block_size=8, verify_cost=curve, policy=PolicyConfig(max_skip=0))
        out, events = generate_all(tiny_target, prompt, gen, hybrid)
        assert out == plain
        sources[use_tail] = [ev.source for ev in events[1:]]
    assert "tail" in sources[True] and "tail" not in sources[False]
    assert sources[True].count("drafter") < sources[False].count("drafter")  # each tail round saved a network call
    verified = []  # the tail copies the policy took as a round's draft
    draft = Copy.draft

    def counted(self, n):
        verified.append(self.source == "tail")
        return draft(self, n)

    monkeypatch.setattr(Copy, "draft", counted)
    target = make_target(tiny_llama(vocab_size=5, layers=1, seed=3, scale=8.0))
    hybrid = LookupHybrid(ConfidentSampler([0.1, 0.15, 0.3, 0.15, 0.3]), branch=0)  # q near the target's p here
    # a second slot costs more than it brings at the prior's acceptance: blocks are cut to one slot, the rest is tail
    assert_sampled_distribution_exact(target, hybrid, prompt=(4, 3, 2, 4, 3), verify_cost=(1.0, 1.05, 1.6, 2.4, 3.0),
                                      tokens=6, block_size=4, n=1200)
    assert sum(verified) > 20  # tail rounds at T = 1 among the runs the test counted
