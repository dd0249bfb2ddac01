from dataclasses import replace

import pytest
import torch

from core.decoding.engine import GenerationConfig
from core.drafting.base import Copy, Draft
from core.drafting.policy.config import PolicyConfig
from core.drafting.policy.costs import CallCost, RoundCosts
from core.drafting.policy.cut import best_cut, best_draft_length, draft_pays, expected_tokens, within_loss
from core.drafting.policy.policy import DraftPolicy
from core.drafting.policy.waits import FeatureCapture, MeasuredPays, SkipEmpty
from core.verification.sampling import SamplingConfig


def test_best_draft_length_trades_expected_tokens_against_verify_cost():
    cpu_curve = (1.0, 1.53, 1.43, 1.5, 1.55, 1.6, 1.62, 1.64, 1.66, 1.7, 1.72, 1.75, 1.8, 1.82, 1.85, 1.87, 1.9)
    assert best_draft_length(torch.ones(16), cpu_curve) == 16  # sure drafts: verify them all
    assert best_draft_length(torch.zeros(16), cpu_curve) == 0  # hopeless drafts: a plain step is cheapest
    sure_then_lost = torch.tensor([0.95, 0.95, 0.95] + [0.05] * 13)
    assert best_draft_length(sure_then_lost, cpu_curve) == 3
    assert best_draft_length(torch.full((4,), 0.9), (1.0, 1.0, 1.0)) == 2  # never past the curve's end


def test_a_bounded_cut_gives_up_at_most_max_lost_expected_tokens_against_the_whole_draft():
    steep = (1.0, *(1.0 + 0.5 * n for n in range(1, 17)))  # each position costs half a plain step
    confidence = [0.6] * 16  # reach 0.6^k: expected tokens 1 + 0.6 + 0.36 + ...
    expected = expected_tokens(confidence, steep)
    assert best_draft_length(confidence, steep) == 1  # the cost alone keeps one slot
    for max_lost in (0.5, 0.1, 0.02, 0.001):
        n = best_draft_length(confidence, steep, max_lost)
        assert n == within_loss(confidence, steep, max_lost)
        assert expected[-1] - expected[n] <= max_lost < expected[-1] - expected[n - 1]  # the shortest such prefix
    assert within_loss(confidence, steep, 0.0) == 16 and best_draft_length(confidence, steep, 0.0) == 1  # 0: no bound
    cheap = (1.0,) * 17  # where the cost keeps more than the bound asks, the cost's cut stands
    assert best_draft_length([0.9] * 16, cheap, 0.5) == best_draft_length([0.9] * 16, cheap) == 16
    assert best_draft_length([0.0] * 16, steep, 0.02) == 0  # nothing to lose: a plain step
    short = (1.0, 1.5, 2.0)  # never past the curve's end
    assert best_draft_length(confidence, short, 0.001) == 2


def test_the_policy_cuts_a_network_draft_within_its_bound():
    curve = (1.0, *(1.0 + 0.5 * n for n in range(1, 17)))
    weak = FixedDrafter(Draft(torch.arange(16), None, torch.full((16,), 0.6)))
    greedy, generator = SamplingConfig(temperature=0.0), torch.Generator()
    for max_lost, want in ((0.0, 1), (0.02, within_loss([0.6] * 16, curve, 0.02))):
        gen = GenerationConfig(verify_cost=curve, policy=PolicyConfig(max_skip=0, max_lost=max_lost))
        assert len(DraftPolicy.for_run(gen).draft(weak, 1, 16, greedy, generator).tokens) == want
    assert want > 1
    with pytest.raises(ValueError, match="max_lost"):
        PolicyConfig(max_lost=-0.1)


def test_the_one_pass_cut_finds_the_best_expected_tokens_per_cost_of_every_prefix():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n_slots, n_costs = (int(x) for x in torch.randint(0, 18, (2,), generator=generator))
        confidence = (torch.rand(n_slots, generator=generator) * 1.4 - 0.2).tolist()  # outside [0, 1] as well
        curve = (1.0, *(1.0 + torch.rand(n_costs, generator=generator).cumsum(0) * 0.5).tolist())
        per_cost = [tokens / cost for tokens, cost in zip(expected_tokens(confidence, curve), curve)]
        n, value = best_cut(confidence, curve)
        assert n == per_cost.index(max(per_cost)) and value == pytest.approx(max(per_cost))
    assert best_cut([1.0, 1.0], (1.0, 2.0, 3.0)) == (0, 1.0)  # a tie with a plain step: the plain step


def test_a_draft_pays_when_its_expected_tokens_cover_the_drafter_call_too():
    flat = (1.0, 1.1, 1.0, 1.0, 1.2)  # a oneDNN-like curve: 3 and 4 positions cost what one does
    half = torch.full((4,), 0.5)  # expected accepted 0.5, 0.75, 0.875, 0.94
    assert draft_pays(half, flat, 0.0) and best_draft_length(half, flat) == 3
    assert draft_pays(half, flat, 0.5)  # (1 + 0.875) / (1.0 + 0.5) = 1.25 > 1
    assert not draft_pays(half, flat, 1.0)  # 1.875 / 2.0: a plain step gives more per unit of cost
    weak = torch.tensor([0.15, 0.1, 0.1, 0.1])
    assert best_draft_length(weak, flat) == 3 and not draft_pays(weak, flat, 0.2)  # kept, yet not worth a call
    for conf in (torch.rand(6), torch.zeros(6), torch.ones(6)):  # no drafter cost: "the cut keeps something"
        assert draft_pays(conf, flat, 0.0) == (best_draft_length(conf, flat) > 0)
    assert not draft_pays(torch.ones(0), flat, 0.0) and not draft_pays(torch.ones(3), (1.0,), 0.0)
    with pytest.raises(ValueError, match="draft_cost"):
        GenerationConfig(draft_cost=-0.1)


def test_the_skips_charge_the_drafter_call_at_t0_only():
    """At T > 0 the confidence is no acceptance estimate (GenerationConfig.charges_draft_cost): the same draft
    counts toward the skips at T = 0 and not at T = 1."""
    draft = Draft(torch.tensor([5, 6]), None, torch.full((2,), 0.3))  # pays at cost 0, not with a 0.5 call
    for temperature, charged in ((0.0, True), (1.0, False)):
        gen = GenerationConfig(verify_cost=(1.0, 1.1, 1.2), draft_cost=0.5,
                               sampling=SamplingConfig(temperature=temperature))
        policy = DraftPolicy.for_run(gen)
        policy.cut(draft, 2)
        assert gen.charges_draft_cost() == charged and policy.skip.empty == int(charged)
    assert not GenerationConfig(draft_cost=0.5).charges_draft_cost()  # no cost curve: no cut, nothing charged


class FixedDrafter:
    """Always proposes the same draft (a stand-in for the network)."""

    def __init__(self, draft: Draft):
        self.draft = draft

    def propose(self, anchor, k, sampling, generator) -> Draft:
        return self.draft


def test_the_skips_charge_the_call_cost_measured_in_the_reply():
    """The start-up estimate charges until three calls and three plain rounds are measured; then the median call
    over the median plain round. A round that called the network counts as drafting even when its draft was cut to
    nothing (its time is the call's, not a plain step's)."""
    gen = GenerationConfig(verify_cost=(1.0, 1.1, 1.2), draft_cost=0.2,
                           policy=PolicyConfig(max_skip=0))  # no skips: a call each round
    policy = DraftPolicy.for_run(gen)
    greedy, generator = SamplingConfig(temperature=0.0), torch.Generator()
    assert policy.call_cost() == 0.2
    weak = FixedDrafter(Draft(torch.tensor([5, 6]), None, torch.full((2,), 0.05)))  # cut to nothing
    for _ in range(3):
        draft = policy.draft(weak, 1, 2, greedy, generator)
        assert len(draft.tokens) == 0 and policy.called
        policy.observe(draft, 0, 1, 0.016, draft_seconds=0.006)
    assert len(policy.state.drafter.drafted_rounds) == 3 and not policy.state.drafter.plain_rounds
    assert policy.call_cost() == 0.2  # no plain round measured yet
    for seconds in (0.009, 0.010, 0.030):  # plain rounds: the median is 10 ms
        policy.state.drafter.observe(False, 1, seconds)
    assert policy.call_cost() == pytest.approx(0.6)
    assert DraftPolicy.for_run(GenerationConfig(verify_cost=(1.0, 1.1), sampling=SamplingConfig(temperature=1.0),
                                                draft_cost=0.2), policy.state).call_cost() == 0.0  # T > 0: none
    cost = CallCost(window=2)
    for seconds in (1.0, 2.0, 3.0):
        cost.record(seconds)
    assert cost.calls == [2.0, 3.0]


def test_skip_empty_backs_off_after_empty_drafts_and_resets_on_a_kept_one():
    skip, pattern = SkipEmpty(max_skip=4), []
    for paid in (False, False, False, False, True, False):
        calls = 0
        while not skip.draft_now():  # rounds skipped before the next drafter call
            calls += 1
        pattern.append(calls)
        skip.drafted(paid)
    assert pattern == [0, 1, 2, 4, 4, 0]  # 1, 2, 4 then capped at 4; a draft that paid resets
    assert SkipEmpty(max_skip=0).draft_now() and GenerationConfig(policy=PolicyConfig(max_skip=0)).policy.max_skip == 0
    with pytest.raises(ValueError, match="max_skip"):
        GenerationConfig(policy=PolicyConfig(max_skip=-1))


def test_measured_pays_backs_off_while_drafting_rounds_commit_fewer_tokens_a_second():
    policy = MeasuredPays(max_skip=8, window=4, min_rounds=2)
    kinds = []
    for _ in range(40):  # drafting rounds: 2 tokens in 3 s; plain rounds: 1 token in 1 s
        drafting = policy.draft_now()
        kinds.append(drafting)
        policy.observe(drafting, 2 if drafting else 1, 3.0 if drafting else 1.0)
    assert kinds[:4] == [True, False, True, False]  # both kinds measured first
    assert sum(kinds[-20:]) <= 2  # then waits of 1, 2, 4, 8, 8 ... plain rounds between single tries
    for _ in range(300):  # drafting turns profitable (5 tokens in 2 s): the next try pays and resets the wait
        drafting = policy.draft_now()
        policy.observe(drafting, 5 if drafting else 1, 2.0 if drafting else 1.0)
    assert policy.losses == 0 and all(policy.draft_now() for _ in range(3))
    never = MeasuredPays(max_skip=0)
    for _ in range(10):
        assert never.draft_now()
        never.observe(True, 1, 10.0)
        never.observe(False, 1, 1.0)


def test_the_copied_rounds_verdict_outlasts_a_short_slow_patch_that_the_network_s_backs_off_from():
    """PolicyState's copied rounds are judged over a longer window than the network's: 48 rounds that paid (2 tokens in
    1.5 s against plain steps' 1 in 1 s) then 16 that did not (1 token in 1.2 s) still pay over the last 64, where
    the last 16 alone read slower than plain steps."""
    from core.drafting.policy.state import PolicyState

    state = PolicyState()
    for measured in (state.lookup, state.drafter):
        measured.max_skip = 32  # as DraftPolicy.for_run sets it for the app's replies
        for tokens, seconds in [(2, 1.5)] * 48 + [(1, 1.2)] * 16:
            measured.observe(True, tokens, seconds)
            measured.observe(False, 1, 1.0)
    assert state.lookup.window > state.drafter.window
    assert state.lookup.losses == 0 and state.lookup.draft_now()
    assert state.drafter.losses > 0 and not state.drafter.draft_now()


def test_a_drafter_far_slower_than_plain_steps_is_retried_within_the_time_budget():
    def gaps_between_tries(policy, rounds=3000):
        kinds = []
        for _ in range(rounds):  # drafting rounds: 2 tokens in 5 s (0.4 of plain steps' rate); plain: 1 token in 1 s
            drafting = policy.draft_now()
            kinds.append(drafting)
            policy.observe(drafting, 2 if drafting else 1, 5.0 if drafting else 1.0)
        tries = [i for i, drafting in enumerate(kinds) if drafting]
        return [b - a for a, b in zip(tries[2:], tries[3:])]  # after the first measurements

    policy = MeasuredPays(max_skip=8, window=4, min_rounds=2)
    assert policy.budget_wait(0.4, tokens=2) == 600  # 2 tokens a round, (1 / 0.4 - 1) / 0.005 rounds each
    gaps = gaps_between_tries(policy)
    assert 3 <= len(gaps) and min(gaps) > 600  # far beyond the back-off's own 8: each try costs <= 0.5% of the time
    capped = gaps_between_tries(MeasuredPays(max_skip=8, window=4, min_rounds=2, longest_wait=50))
    assert max(capped) <= 51
    close = MeasuredPays(max_skip=8, window=4, min_rounds=2)
    assert close.budget_wait(0.95) == 11  # a close call is measured again soon


def test_sampled_drafts_are_cut_on_their_measured_acceptance_per_slot():
    """At T > 0 the cut reads the network's acceptance measured per slot in earlier rounds (SlotRates), not the
    draft's own confidence: a sure-looking draft is verified short until its slots are seen to be accepted."""
    from core.drafting.policy.rates import SlotRates
    from core.drafting.policy.state import PolicyState

    rates = SlotRates()
    assert torch.allclose(rates.rates(3), torch.full((3,), 0.5))  # the prior
    rates.record(n_verified=3, n_accepted=1)  # slot 0 kept, slot 1 rejected, slot 2 never reached
    assert rates.reached == [1, 1] + [0.0] and rates.accepted == [1, 0] + [0.0]
    assert torch.allclose(rates.rates(3), torch.tensor([2 / 3, 1 / 3, 0.5]))

    class Sure:  # confidence 1 everywhere, a q of its own: a sampled draft
        name, feature_layers, max_block_size = "sure", (), 4

        def propose(self, anchor, block_size, sampling, generator):
            q_draft = torch.full((4, 8), 1 / 8)  # (K, V)
            return Draft(torch.tensor([1, 2, 3, 4]), q_draft, torch.ones(4))

    curve = (1.0, 1.15, 1.35, 1.55, 1.8)
    gen = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(1.0), verify_cost=curve)
    state = PolicyState()
    policy = DraftPolicy.for_run(gen, state)
    draft = policy.draft(Sure(), 0, 4, gen.sampling, torch.Generator())
    assert len(draft.tokens) == 1 and draft.q_draft.shape == (1, 8)  # prior 0.5: one slot pays best
    for _ in range(20):
        state.sampled.record(4, 4)  # every slot kept, round after round
    assert len(policy.draft(Sure(), 0, 4, gen.sampling, torch.Generator()).tokens) == 4
    greedy = GenerationConfig(max_new_tokens=8, verify_cost=curve)
    assert len(DraftPolicy.for_run(greedy, PolicyState()).draft(Sure(), 0, 4, greedy.sampling,
                                                                  torch.Generator()).tokens) == 4  # T = 0: its own


def test_at_t_above_0_the_network_is_not_called_where_its_measured_slots_cut_any_draft_to_nothing():
    """The cut of a sampled draft reads only the measured per-slot acceptance, known before the call: where it keeps
    nothing, the call is skipped (the skips back off as after an empty draft); before any measurement, and at T = 0,
    the network is called."""
    from core.drafting.policy.state import PolicyState

    calls = []

    class Counted:
        name, feature_layers, max_block_size = "counted", (), 4

        def propose(self, anchor, block_size, sampling, generator):
            calls.append(anchor)
            return Draft(torch.tensor([1, 2, 3, 4]), torch.full((4, 8), 1 / 8), torch.ones(4))

    curve = (1.0, 1.15, 1.35, 1.55, 1.8)
    gen = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(1.0), verify_cost=curve)
    state = PolicyState()
    policy = DraftPolicy.for_run(gen, state)
    assert len(policy.draft(Counted(), 0, 4, gen.sampling, torch.Generator()).tokens) == 1 and calls == [0]
    for _ in range(20):
        state.sampled.record(1, 0)  # slot 1 rejected, round after round
    assert policy.sampled_cut_is_empty(4)
    draft = policy.draft(Counted(), 1, 4, gen.sampling, torch.Generator())
    assert len(draft.tokens) == 0 and calls == [0] and not policy.called  # no call for a draft cut to nothing
    assert policy.skip.empty == 1  # backed off as after an empty draft
    greedy = GenerationConfig(max_new_tokens=8, verify_cost=curve)
    DraftPolicy.for_run(greedy, state).draft(Counted(), 2, 4, greedy.sampling, torch.Generator())
    assert calls == [0, 2]  # T = 0 reads the draft's own confidence: the network is called


def test_copied_drafts_are_cut_on_their_acceptance_measured_per_depth():
    """A copy whose first token is often rejected but whose later tokens are kept once the first is (a phrase the
    target either starts or not): its deeper slots read their own, higher rates, and the cut verifies more of it than
    one rate for every slot would."""
    from core.drafting.policy.rates import LookupRates
    from core.drafting.policy.state import PolicyState

    rates = LookupRates()
    assert rates.rates(4, "phrasebook", 3) == pytest.approx([0.7] * 3)  # the prior, before anything was measured
    for _ in range(10):
        rates.record(4, n_verified=6, n_accepted=0, source="phrasebook")
        rates.record(4, n_verified=6, n_accepted=6, source="phrasebook")
    first, *deeper = rates.rates(4, "phrasebook", 8)
    assert first == pytest.approx((10 + 0.7 * 2) / (20 + 2)) and deeper[0] == pytest.approx((10 + first * 2) / 12)
    assert all(rate > 0.9 for rate in deeper[:5])
    assert deeper[6] == pytest.approx(deeper[5]) == pytest.approx(deeper[4])  # slots 7, 8 never verified: as 6
    assert rates.rate(4, "phrasebook") == first and rates.rates(3, "phrasebook", 2) == pytest.approx([0.7] * 2)
    curve = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2)
    policy = DraftPolicy.for_run(GenerationConfig(verify_cost=curve), PolicyState(rates=rates))
    copy = Copy(list(range(6)), matched=4, source="phrasebook")
    assert len(policy.cut_lookup(copy, 6).tokens) == 6
    assert best_draft_length(torch.full((6,), first), curve) == 2  # one rate for all slots: two of them
    rates.record(4, n_verified=1, n_accepted=0, source="phrasebook")  # a read kept from before a record is dropped
    assert rates.rate(4, "phrasebook") == pytest.approx((10 + 0.7 * 2) / (21 + 2))
    assert rates.rates(4, "phrasebook", 8)[1:] != deeper
    assert rates.rates(3, "phrasebook", 9) == pytest.approx([0.7] * 9)  # a longer read than the kept one: computed


def test_a_copy_with_a_calibrated_prior_is_cut_on_it_until_the_conversation_measures_its_own():
    """A phrasebook copy carries its grade's calibrated acceptance: each slot starts from it (not from 0.7, nor from the
    slot before), so a grade that was rarely kept is not verified and one nearly always kept is verified long; rounds
    of this conversation then move each slot towards what they measured."""
    from core.drafting.policy.rates import LookupRates
    from core.drafting.policy.state import PolicyState

    rates = LookupRates()
    assert rates.rates(50, "phrasebook", 3, prior=(0.1, 0.5)) == pytest.approx([0.1, 0.5, 0.5])  # the last carried
    assert rates.rates(50, "phrasebook", 2, beside=True, prior=(0.9, 0.9)) == pytest.approx([0.15, 0.15])  # not beside
    for _ in range(4):
        rates.record(50, n_verified=2, n_accepted=2, source="phrasebook")
    first, second = rates.rates(50, "phrasebook", 2, prior=(0.1, 0.5))
    assert first == pytest.approx((4 + 0.1 * 2) / (4 + 2)) and second == pytest.approx((4 + 0.5 * 2) / (4 + 2))
    curve = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2)
    policy = DraftPolicy.for_run(GenerationConfig(verify_cost=curve), PolicyState())
    rare = Copy(list(range(6)), matched=2, source="phrasebook", prior=(0.05,) * 6, grade=40)
    sure = Copy(list(range(6)), matched=2, source="phrasebook", prior=(0.95,) * 6, grade=41)
    unknown = Copy(list(range(6)), matched=2, source="phrasebook", grade=42)
    assert len(policy.cut_lookup(rare, 6).tokens) == 0
    assert len(policy.cut_lookup(sure, 6).tokens) == 6 > len(policy.cut_lookup(unknown, 6).tokens)
    assert policy.cut_lookup(sure, 6).lookup_match == 41  # measured by its grade
    policy = DraftPolicy.for_run(GenerationConfig(), PolicyState())  # no cost curve: the match length decides
    assert len(policy.cut_lookup(sure, 6).tokens) == 0
    assert len(policy.cut_lookup(replace(sure, matched=3), 6).tokens) == 6


def test_round_costs_replace_the_lengths_they_measured_within_physical_bounds():
    from core.drafting.policy.costs import RoundCosts

    costs, start = RoundCosts(window=4, min_rounds=2, prior_weight=0.0), (1.0, 1.1, 1.3, 1.5)
    assert costs.curve(start) == start and costs.curve(()) == ()  # nothing measured; no curve, no cut
    assert costs.record(2, 0.02) is False and not costs.ratios  # no plain round measured yet to relate it to
    for _ in range(2):
        costs.record(1, 0.01)
    assert costs.record(2, 0.02) is False and costs.record(2, 0.02) is True
    assert costs.curve(start) == pytest.approx((1.0, 2.0, 1.3, 1.5))
    for fed, seconds in ((3, 0.001), (3, 0.001), (4, 1.0), (4, 1.0)):  # under a plain round, then over n of them
        costs.record(fed, seconds)
    assert costs.curve(start) == pytest.approx((1.0, 2.0, 1.0, 4.0))
    for _ in range(4):  # the machine runs at half speed: each round is set against the plain rounds of its time
        costs.record(1, 0.02)
    for _ in range(4):
        costs.record(2, 0.024)
    assert costs.curve(start)[1] == pytest.approx(1.2)
    costs.prior_weight = 4.0  # the start-up curve weighs as 4 rounds against the window's 4
    assert costs.curve(start)[1] == pytest.approx((1.2 + 1.1) / 2)
    assert costs.curve(start)[3] == pytest.approx((2 * 4.0 + 4 * 1.5) / 6)  # two rounds of 4 positions, four of start


def test_a_copy_the_start_up_curve_verifies_is_cut_once_rounds_of_its_length_measure_dear():
    """The cut weighs the lengths this reply measured: a one-token copy kept a quarter of the time pays where the
    start-up curve prices two positions at 1.05 plain rounds, not where its rounds measured 3 (the curve weighing as one
    round of them). A network round counts without its call's own seconds, a tree not at all, and what was measured
    carries to the conversation's next reply."""
    from core.drafting.policy.costs import RoundCosts
    from core.drafting.policy.state import PolicyState

    state = PolicyState(costs=RoundCosts(prior_weight=1.0))
    gen = GenerationConfig(verify_cost=(1.0, 1.05, 1.1, 1.15, 1.2))
    policy = DraftPolicy.for_run(gen, state)
    copy = Copy([5, 6, 7], matched=3)
    assert policy.cut_copy(copy, 1)[0] == 1
    for _ in range(4):
        policy.observe(Draft(torch.empty(0, dtype=torch.long), None), 0, 1, 0.010)
    for _ in range(4):
        policy.observe(copy.draft(1), 0, 1, 0.030)  # rejected: its rate falls to (0 + 0.7 * 2) / (4 + 2)
    assert policy.state.rates.rate(3) == pytest.approx(1.4 / 6) and policy.verify_cost[1] == pytest.approx(1.81)
    assert policy.cut_copy(copy, 1)[0] == 0 and best_draft_length([1.4 / 6], gen.verify_cost) == 1
    policy.called = True  # network rounds of two slots: 0.012 s verified after a 0.040 s call
    for _ in range(4):
        policy.observe(Draft(torch.tensor([5, 6]), None, torch.tensor([0.9, 0.9])), 2, 3, 0.052, 0.040)
    policy.called = False
    tree = Draft(torch.tensor([5]), None, alternatives=((6, 7, 8),))
    for _ in range(4):
        policy.observe(tree, 0, 1, 1.0)
    assert policy.verify_cost[2] == pytest.approx((4 * 1.2 + 1.1) / 5) and len(state.costs.ratios[2]) == 4  # copies'
    assert DraftPolicy.for_run(gen, state).verify_cost == policy.verify_cost


def test_the_running_sums_give_the_measured_rate_of_the_rounds_in_the_window():
    measured = MeasuredPays(window=5, max_skip=0)
    generator = torch.Generator().manual_seed(1)
    for step in range(60):
        drafted = bool(step % 3)
        measured.observe(drafted, int(torch.randint(1, 4, (1,), generator=generator)),
                         float(torch.rand(1, generator=generator)) * 0.01 + 1e-4)
        for kind, rounds in ((True, measured.drafted_rounds), (False, measured.plain_rounds)):
            fresh = sum(c for c, _ in rounds) / sum(s for _, s in rounds) if rounds else float("inf")  # summed anew
            assert len(rounds) <= 5 and measured.summed_rate(kind) == pytest.approx(fresh)


def test_renewing_one_length_of_the_cost_curve_equals_computing_it_whole():
    start = (1.0, 1.15, 1.3, 1.6, 2.0)
    costs, curve = RoundCosts(min_rounds=2, prior_weight=4.0), start
    generator = torch.Generator().manual_seed(2)
    for step in range(80):
        fed = int(torch.randint(1, 7, (1,), generator=generator))  # 6: past the curve's end
        if costs.record(fed, 0.01 * (1 + 0.3 * (fed - 1)) * float(1 + torch.rand(1, generator=generator))):
            curve = costs.renewed(curve, start, fed)
        assert curve == pytest.approx(costs.curve(start))
    assert curve != start and RoundCosts().renewed((), (), 2) == ()


def test_two_copies_that_differ_at_their_first_token_are_verified_together_where_the_pair_pays():
    """Alone, a copy kept a fifth of the time does not pay for two positions at 1.3 plain rounds; beside a second copy
    measured at a quarter, the pair's 1.45 expected tokens for three positions at 1.4 does (best_try). Each branch's
    acceptance is then recorded apart by what the round kept, without tries=1 (copy_tries) none is verified, and tries
    measured dear (apart from chains) are no longer made."""
    from core.drafting.policy.state import PolicyState

    gen = GenerationConfig(verify_cost=(1.0, 1.3, 1.4), policy=PolicyConfig(copy_tries=True))
    state = PolicyState()
    state.rates.prior_rate, state.rates.beside_prior = 0.2, 0.25
    lookup, phrase = Copy([5, 6], matched=3), Copy([7, 8], matched=2, source="phrasebook")
    policy = DraftPolicy.for_run(gen, state)
    assert policy.cut_copy(lookup, 3)[0] == 0 and policy.cut_copy(phrase, 3)[0] == 0
    draft = policy.best_lookup((lookup, phrase), 3)
    assert draft.ids == [5] and draft.alternatives == ((7,),) and draft.beside == ("phrasebook", 2)
    assert draft.lookup_source == "lookup" and draft.lookup_match == 3
    assert len(policy.best_lookup((lookup, Copy([5, 9], matched=2, source="phrasebook")), 3).ids) == 0  # same first
    policy.observe(draft, 1, 2, 0.01, accepted=[7])  # the round followed the phrasebook's branch
    assert state.rates.reached[("lookup", 3)] == [1] and state.rates.accepted[("lookup", 3)] == [0]
    assert state.rates.reached[("phrasebook", 2, "beside")] == [1]
    assert state.rates.accepted[("phrasebook", 2, "beside")] == [1]
    off = DraftPolicy.for_run(replace(gen, policy=replace(gen.policy, copy_tries=False)), PolicyState())
    off.state.rates.prior_rate = 0.2
    assert len(off.best_lookup((lookup, phrase), 3).ids) == 0
    empty = Draft(torch.empty(0, dtype=torch.long), None)
    for _ in range(4):  # plain rounds of 10 ms, then tries of three positions at 30 ms: measured as dear as 3 rounds
        policy.observe(empty, 0, 1, 0.010)
    for _ in range(4):
        policy.observe(draft, 0, 1, 0.030, accepted=[])
    assert policy.try_cost[2] == pytest.approx((4 * 3.0 + 4.0 * 1.4) / 8) and policy.verify_cost == gen.verify_cost
    assert policy.best_try((lookup, phrase), [0, 0], 3)[1] < 1.0  # no longer worth a plain step


def test_a_stall_counts_as_a_few_plain_rounds_not_as_a_verdict_for_a_thousand():
    """One drafting round of 0.55 s among three (plain rounds 5 ms) is counted as 8 plain rounds: the verdict then
    waits 294 rounds, where the stall taken whole had set the longest wait."""
    waits = {}
    for stall in (8.0, float("inf")):
        measured = MeasuredPays(window=64, max_skip=32, stall=stall)
        for _ in range(3):
            measured.observe(False, 1, 0.005)
        for seconds in (0.006, 0.006, 0.55):
            measured.observe(True, 2, seconds)
        waits[stall] = measured.wait
    assert waits[8.0] == 294 and waits[float("inf")] == MeasuredPays.longest_wait


def test_a_verdict_from_the_first_few_rounds_backs_off_without_the_budget_s_long_wait():
    """Three copied rounds at 2/3 of plain steps' rate: as in 0.40.0, that first verdict waits 100 rounds (the
    budget's wait); with confident_rounds it backs off one round and measures on, and the long wait comes once 16
    copied rounds say the same."""
    def first_wait(measured):
        for _ in range(3):
            measured.observe(False, 1, 1.0)
            measured.observe(True, 1, 1.5)
        return measured.wait

    assert first_wait(MeasuredPays(window=64, max_skip=32)) == 100
    patient = MeasuredPays(window=64, max_skip=32, confident_rounds=16)
    assert first_wait(patient) == 1
    for _ in range(13):
        patient.observe(True, 1, 1.5)
    assert len(patient.drafted_rounds) == 16 and patient.wait == 100
    from core.drafting.policy.state import PolicyState

    for temperature, patience in ((0.0, 16), (1.0, 0)):  # the app's replies: patient at T = 0 only
        state = PolicyState()
        DraftPolicy.for_run(GenerationConfig(sampling=SamplingConfig(temperature)), state)
        assert state.lookup.confident_rounds == patience and state.drafter.confident_rounds == 0


def test_the_network_may_be_called_once_its_verdict_s_wait_and_then_the_skips_have_run_down():
    """may_call_within(n) answers whether draft could call the network in one of the next n rounds: the measured
    verdict's wait runs down first, then the skips' (draft asks them in that order)."""
    for wait, skip in ((0, 0), (3, 0), (0, 2), (3, 2)):
        policy = DraftPolicy.for_run(GenerationConfig(max_new_tokens=8, verify_cost=(1.0, 1.1),
                                                      policy=PolicyConfig(plain_probe_every=16)))
        policy.state.drafter.wait, policy.skip.wait = wait, skip
        policy.state.drafter.plain_rounds = [(1, 1.0)] * 3  # measured: no alternation before the first verdict
        answers = [policy.may_call_within(n) for n in range(1, 8)]
        first = next(r for r in range(1, 9) if policy.state.drafter.draft_now() and policy.skip.draft_now())
        assert answers == [first <= n for n in range(1, 8)]
    policy.called = True  # a round that called it: its verdict may reset the waits
    assert policy.may_call_within(1)


def test_features_are_captured_for_a_while_after_a_round_that_wanted_the_network_which_waits_for_them():
    capture = FeatureCapture(window=4, armed=3, ready=2)
    assert capture.captures(may_call=True, prefill=True) and capture.is_ready()  # the prompt: its context at once
    assert not capture.captures(may_call=True) and not capture.is_ready()  # nothing wanted the network: a gap
    capture.wanted()
    assert [capture.captures(may_call=True) for _ in range(4)] == [True, True, True, False]
    capture.wanted()
    capture.captures(may_call=True)
    assert not capture.is_ready()  # one forward's features: not yet its context
    capture.captures(may_call=True)
    assert capture.is_ready()
    assert not capture.captures(may_call=False) and not capture.is_ready()  # its waits outlast the window: a gap


def test_a_round_without_a_copy_that_pays_calls_the_network_only_once_it_has_its_features():
    class Network:
        calls, context_window = 0, 4

        def propose(self, anchor, k, sampling, generator):
            Network.calls += 1
            return Draft([5, 6], None, torch.tensor([0.9, 0.9]))

    network, greedy = Network(), SamplingConfig(0.0)
    policy = DraftPolicy.for_run(GenerationConfig(max_new_tokens=8, verify_cost=(1.0, 1.1, 1.2)),
                                 window=network.context_window)
    policy.captures(prefill=True)
    policy.captures()  # a round whose copy paid: no features, so a gap in the network's context
    for forward in range(FeatureCapture.ready + 1):
        draft = policy.draft(network, 3, 2, greedy, None)
        assert (Network.calls, len(draft.tokens) > 0) == ((1, True) if forward == FeatureCapture.ready else (0, False))
        assert policy.captures()  # each round wanted it: every forward captures


def test_every_drafting_round_says_why_it_verified_what_it_did(tiny_target):
    """Each round's event carries the policy's decision: its source as the event says it, and for the copies and the
    network what they came to or why they were not asked; plain steps name their reasons, which the stats count."""
    from core.decoding.engine import generate_all
    from core.decoding.stats import AcceptanceStats
    from core.drafting.base import LookupHybrid
    from core.drafting.policy import sources
    from tests.test_engine import NoisyOracle

    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=60))
    gen = GenerationConfig(max_new_tokens=60, block_size=6, verify_cost=(1.0, 1.1, 1.2, 1.5, 1.8, 2.0, 2.2),
                           policy=PolicyConfig(plain_probe_every=4))
    oracle = NoisyOracle(plain, corrupt=0.5, vocab=64, seed=1)
    oracle.prompt_len = len(prompt)
    out, events = generate_all(tiny_target, prompt, gen, LookupHybrid(oracle, branch=3))
    rounds = [ev for ev in events if ev.kind == "round"][:-1]  # the last one has room for the target's token only
    assert out == plain and rounds and all(ev.decision is not None for ev in rounds)
    assert all(ev.decision.source == ev.source for ev in rounds)
    known = {sources.PROBE, sources.NONE_FOUND, sources.NONE_PAYS, sources.SLOWER, sources.MEASURING,
             sources.DID_NOT_PAY, sources.COPY_TAKEN, sources.NO_FEATURES, sources.SAMPLED_EMPTY, sources.CUT_EMPTY}
    for ev in rounds:
        if ev.source == "plain":
            assert ev.decision.network in known and ev.decision.copies in known
        elif ev.source == "drafter":
            assert ev.decision.network.startswith("called: ")
        else:
            assert ev.decision.network == sources.COPY_TAKEN and ev.decision.copies.endswith("tokens verified")
    assert any(ev.decision.copies == sources.PROBE for ev in rounds)  # a probe every 4 drafting rounds
    stats = AcceptanceStats().add_all(events)
    assert sum(stats.plain_reasons.values()) == sum(ev.source == "plain" for ev in rounds) > 0
    assert generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=8))[1][1].decision is None  # no drafter


def test_the_policy_state_is_built_from_its_config():
    """PolicyState() is the defaults' PolicyState.of; another config reaches every measured part; a config out of
    range is refused."""
    from core.drafting.policy.config import DEFAULTS
    from core.drafting.policy.state import PolicyState

    assert PolicyState() == PolicyState.of(DEFAULTS)
    cfg = replace(DEFAULTS, network_window=5, copied_window=7, min_rounds=2, copy_prior=0.4, beside_prior=0.1,
                  sampled_prior=0.3, call_window=9, cost_window=11, curve_weight=3.0, try_curve_weight=1.0,
                  copied_patience=2, lookup_strong=2)
    state = PolicyState.of(cfg)
    assert (state.drafter.window, state.lookup.window, state.lookup.min_rounds) == (5, 7, 2)
    assert (state.rates.prior_rate, state.rates.beside_prior, state.rates.strong, state.sampled.prior_rate) == \
        (0.4, 0.1, 2, 0.3)
    assert (state.call_cost.window, state.costs.window, state.costs.prior_weight, state.tries.prior_weight) == \
        (9, 11, 3.0, 1.0)
    assert state.copied_patience == 2 and state.rates.key(3) == ("lookup", 2)
    policy = DraftPolicy.for_run(GenerationConfig(verify_cost=(1.0, 1.1), policy=cfg), window=64)
    assert (policy.capture.armed, policy.capture.ready) == (cfg.capture_armed, cfg.capture_ready)
    for bad in ({"max_skip": -1}, {"network_window": 0}, {"try_budget": 0.0}, {"stall": 0.5}):
        with pytest.raises(ValueError):
            PolicyConfig(**bad)


def test_the_policy_package_reads_in_one_sitting():
    """No module of the drafting policy is longer than 250 lines."""
    from pathlib import Path

    import core.drafting.policy as package

    lengths = {path.name: len(path.read_text().splitlines()) for path in Path(package.__file__).parent.glob("*.py")}
    assert max(lengths.values()) < 250, lengths
