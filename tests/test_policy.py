from dataclasses import replace

import pytest
import torch

from core.decoding.engine import GenerationConfig
from core.drafting.base import Copy, Draft
from core.drafting.policy.config import DEFAULTS, PolicyConfig
from core.drafting.policy.offers import EMPTY, best_copy, best_cut, best_draft_length, copy_offer, expected_tokens
from core.drafting.policy.policy import CUT_EMPTY, DraftPolicy, FeatureCapture
from core.drafting.policy.state import Acceptance, Costs, PolicyState, Verdict
from core.verification.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


class FixedDrafter:
    """Always proposes the same draft (a stand-in for the network), counting its calls."""

    name, feature_layers, max_block_size = "fixed", (), 16

    def __init__(self, draft: Draft, copies: tuple[Copy, ...] | None = None):
        self.draft, self.calls = draft, 0
        if copies is not None:
            self.propose_lookups = lambda anchor, k: copies

    def propose(self, anchor, k, sampling, generator) -> Draft:
        self.calls += 1
        return self.draft


# -- offers: the cut, and what a copy offers -----------------------------------------------------------------------

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
        assert expected[-1] - expected[n] <= max_lost < expected[-1] - expected[n - 1]  # the shortest such prefix
    assert best_draft_length(confidence, steep, 0.0) == 1  # 0: no bound
    cheap = (1.0,) * 17  # where the cost keeps more than the bound asks, the cost's cut stands
    assert best_draft_length([0.9] * 16, cheap, 0.5) == best_draft_length([0.9] * 16, cheap) == 16
    assert best_draft_length([0.0] * 16, steep, 0.02) == 0  # nothing to lose: a plain step
    assert best_draft_length(confidence, (1.0, 1.5, 2.0), 0.001) == 2  # never past the curve's end
    with pytest.raises(ValueError, match="max_lost"):
        PolicyConfig(max_lost=-0.1)


def test_the_cut_finds_the_best_expected_tokens_per_cost_of_every_prefix_with_or_without_a_call():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n_slots, n_costs = (int(x) for x in torch.randint(0, 18, (2,), generator=generator))
        confidence = (torch.rand(n_slots, generator=generator) * 1.4 - 0.2).tolist()  # outside [0, 1] as well
        curve = (1.0, *(1.0 + torch.rand(n_costs, generator=generator).cumsum(0) * 0.5).tolist())
        call = float(torch.rand(1, generator=generator)) * (n_slots % 2)
        costs = [curve[0], *(cost + call for cost in curve[1:])]
        per_cost = [tokens / cost for tokens, cost in zip(expected_tokens(confidence, curve), costs)]
        n, expected = best_cut(confidence, curve, call)
        assert n == per_cost.index(max(per_cost)) and expected == expected_tokens(confidence, curve)[n]
    assert best_cut([1.0, 1.0], (1.0, 2.0, 3.0)) == (0, 1.0)  # a tie with a plain step: the plain step
    half, flat = [0.5] * 4, (1.0, 1.1, 1.0, 1.0, 1.2)  # expected 1.5, 1.75, 1.875, 1.94
    assert best_cut(half, flat, 0.5)[0] == 3  # (1 + 0.875) / (1.0 + 0.5) = 1.25 > 1: a call that pays
    assert best_cut(half, flat, 1.0)[0] == 0  # 1.875 / 2.0: a plain step gives more per unit of cost


def test_copies_are_offered_cut_on_their_acceptance_measured_per_depth():
    """A copy whose first token is often rejected but whose later tokens are kept once the first is: its deeper slots
    read their own, higher rates, and its offer verifies more of it than one rate for every slot would."""
    acceptance = Acceptance()
    assert acceptance.rates("phrasebook", 4, 3) == pytest.approx([0.7] * 3)  # the prior, before anything was measured
    for _ in range(10):
        acceptance.record("phrasebook", 4, n_verified=6, n_accepted=0)
        acceptance.record("phrasebook", 4, n_verified=6, n_accepted=6)
    first, *deeper = acceptance.rates("phrasebook", 4, 8)
    assert first == pytest.approx((10 + 0.7 * 2) / (20 + 2)) and deeper[0] == pytest.approx((10 + first * 2) / 12)
    assert all(rate > 0.9 for rate in deeper[:5]) and deeper[6] == pytest.approx(deeper[4])  # never verified: as 6
    curve = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2)
    offer = copy_offer(Copy(list(range(6)), matched=4, source="phrasebook"), 6, acceptance, curve)
    assert len(offer.draft.tokens) == 6 and offer.cost == 2.2 and offer.value > 1.0
    assert best_draft_length(torch.full((6,), first), curve) == 2  # one rate for all slots: two of them
    acceptance.record("phrasebook", 4, n_verified=1, n_accepted=0)  # a read kept from before a record is dropped
    assert acceptance.rates("phrasebook", 4, 1)[0] == pytest.approx((10 + 0.7 * 2) / (21 + 2))
    assert acceptance.key("lookup", 7) == ("lookup", 3) and acceptance.key("phrasebook", 7) == ("phrasebook", 7)


def test_a_copy_with_a_calibrated_prior_is_offered_on_it_until_the_conversation_measures_its_own():
    acceptance = Acceptance()
    assert acceptance.rates("phrasebook", 50, 3, prior=(0.1, 0.5)) == pytest.approx([0.1, 0.5, 0.5])  # last carried
    for _ in range(4):
        acceptance.record("phrasebook", 51, n_verified=2, n_accepted=2)
    first, second = acceptance.rates("phrasebook", 51, 2, prior=(0.1, 0.5))
    assert first == pytest.approx((4 + 0.1 * 2) / (4 + 2)) and second == pytest.approx((4 + 0.5 * 2) / (4 + 2))
    curve, fresh = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2), Acceptance()
    rare = Copy(list(range(6)), matched=2, source="phrasebook", prior=(0.05,) * 6, grade=40)
    sure = Copy(list(range(6)), matched=2, source="phrasebook", prior=(0.95,) * 6, grade=41)
    unknown = Copy(list(range(6)), matched=2, source="phrasebook", grade=42)
    assert copy_offer(rare, 6, fresh, curve) is None
    sure_offer, unknown_offer = copy_offer(sure, 6, fresh, curve), copy_offer(unknown, 6, fresh, curve)
    assert len(sure_offer.draft.tokens) == 6 > len(unknown_offer.draft.tokens)
    assert copy_offer(sure, 6, fresh, curve).draft.lookup_match == 41  # measured by its grade
    assert copy_offer(sure, 6, fresh, ()) is None  # no cost curve: only a strong match, whole
    strong = copy_offer(replace(sure, matched=3), 6, fresh, ())
    assert len(strong.draft.tokens) == 6 and strong.cost == 1.0
    assert best_copy((rare, unknown, sure), 6, fresh, curve).draft.lookup_match == 41  # the most per unit of cost
    assert best_copy((rare,), 6, fresh, curve) is None


# -- state: verdicts, acceptance, costs ------------------------------------------------------------------------------

def test_a_verdict_backs_off_after_rounds_that_did_not_pay_and_ends_the_wait_on_one_that_did():
    verdict, pattern = Verdict(max_wait=4), []
    for paid in (False, False, False, False, True, False):
        skipped = 0
        while verdict.hold():  # rounds held back before the next draft
            skipped += 1
        pattern.append(skipped)
        verdict.observe(True, 1, 1.0, paid=paid)
    assert pattern == [0, 1, 2, 4, 4, 0]  # 1, 2, 4 then capped at 4; a round that paid ends the back-off
    never = Verdict(max_wait=0)
    never.observe(True, 1, 1.0, paid=False)
    assert not never.hold()
    with pytest.raises(ValueError, match="max_skip"):
        PolicyConfig(max_skip=-1)


def test_a_verdict_backs_off_while_its_rounds_commit_fewer_tokens_a_second_than_plain_steps():
    verdict, kinds = Verdict(replace(DEFAULTS, min_rounds=2), 4, max_wait=8, measures=True), []
    for _ in range(40):  # drafting rounds: 2 tokens in 3 s; plain rounds: 1 token in 1 s
        drafting = not verdict.hold()
        kinds.append(drafting)
        verdict.observe(drafting, 2 if drafting else 1, 3.0 if drafting else 1.0)
    assert kinds[:4] == [True, False, True, False]  # both kinds measured first
    assert verdict.ratio() == pytest.approx(2 / 3) and sum(kinds[-20:]) <= 1  # the budget's wait
    for _ in range(300):  # drafting turns profitable (5 tokens in 2 s): the next try pays and ends the wait
        drafting = not verdict.hold()
        verdict.observe(drafting, 5 if drafting else 1, 2.0 if drafting else 1.0)
    assert verdict.losses == 0 and all(not verdict.hold() for _ in range(3))
    assert Verdict(measures=False, drafted_rounds=[(1, 1.0)] * 5, plain_rounds=[(1, 1.0)] * 5).ratio() is None


def test_the_copied_rounds_verdict_outlasts_a_short_slow_patch_that_the_network_s_backs_off_from():
    """48 rounds that paid (2 tokens in 1.5 s against plain steps' 1 in 1 s) then 16 that did not (1 token in 1.2 s)
    still pay over the copies' last 64, where the network's last 16 alone read slower than plain steps."""
    state = PolicyState()
    for verdict in (state.copies, state.network):
        verdict.measures = True
        for tokens, seconds in [(2, 1.5)] * 48 + [(1, 1.2)] * 16:
            verdict.observe(True, tokens, seconds)
            verdict.observe(False, 1, 1.0)
    assert state.copies.window > state.network.window
    assert state.copies.losses == 0 and not state.copies.hold()
    assert state.network.losses > 0 and state.network.hold()


def test_a_source_far_slower_than_plain_steps_is_retried_within_the_time_budget():
    def gaps_between_tries(verdict, rounds=3000):
        tries = []
        for i in range(rounds):  # drafting rounds: 2 tokens in 5 s (0.4 of plain steps' rate); plain: 1 token in 1 s
            drafting = not verdict.hold()
            tries += [i] if drafting else []
            verdict.observe(drafting, 2 if drafting else 1, 5.0 if drafting else 1.0)
        return [b - a for a, b in zip(tries[2:], tries[3:])]  # after the first measurements

    verdict = Verdict(replace(DEFAULTS, min_rounds=2), 4, max_wait=8, measures=True)
    assert verdict.budget_wait(0.4, tokens=2) == 600  # 2 tokens a round, (1 / 0.4 - 1) / 0.005 rounds each
    gaps = gaps_between_tries(verdict)
    assert 3 <= len(gaps) and min(gaps) > 600  # far beyond the back-off's own 8: each try costs <= 0.5% of the time
    capped = Verdict(replace(DEFAULTS, min_rounds=2, longest_wait=50), 4, max_wait=8, measures=True)
    assert max(gaps_between_tries(capped)) <= 51
    assert verdict.budget_wait(0.95) == 11  # a close call is measured again soon


def test_a_stall_counts_as_a_few_plain_rounds_and_a_first_verdict_waits_long_only_once_patience_is_spent():
    """One drafting round of 0.55 s among three (plain rounds 5 ms) counts as 8 plain rounds: the verdict waits 294
    rounds, where the stall taken whole had set the longest wait. Three copied rounds at 2/3 of plain steps' rate wait
    100 rounds; with 16 rounds of patience they back off one round, and the long wait comes at the 16th."""
    waits = {}
    for stall in (8.0, float("inf")):
        verdict = Verdict(replace(DEFAULTS, stall=stall), 64, max_wait=32, measures=True)
        for _ in range(3):
            verdict.observe(False, 1, 0.005)
        for seconds in (0.006, 0.006, 0.55):
            verdict.observe(True, 2, seconds)
        waits[stall] = verdict.wait
    assert waits[8.0] == 294 and waits[float("inf")] == DEFAULTS.longest_wait

    def first_wait(verdict):
        for _ in range(3):
            verdict.observe(False, 1, 1.0)
            verdict.observe(True, 1, 1.5)
        return verdict.wait

    assert first_wait(Verdict(window=64, max_wait=32, measures=True)) == 100
    patient = Verdict(window=64, max_wait=32, measures=True, patience=16)
    assert first_wait(patient) == 1  # the first verdict: one loss, one round's back-off
    for _ in range(13):
        patient.observe(True, 1, 1.5)
    assert len(patient.drafted_rounds) == 16 and patient.wait == 100
    for temperature, patience in ((0.0, 16), (1.0, 0)):  # the app's replies: patient at T = 0 only
        state = PolicyState()
        DraftPolicy.for_run(GenerationConfig(sampling=SamplingConfig(temperature)), state)
        assert state.copies.patience == patience and state.network.patience == 0


def test_round_costs_replace_the_lengths_they_measured_within_physical_bounds_and_price_the_call():
    costs, start = Costs(replace(DEFAULTS, cost_window=4, cost_min_rounds=2, curve_weight=0.0)), (1.0, 1.1, 1.3, 1.5)
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
    costs.cfg = replace(costs.cfg, curve_weight=4.0)  # the start-up curve weighs as 4 rounds against the window's 4
    assert costs.curve(start)[1] == pytest.approx((1.2 + 1.1) / 2)
    assert costs.curve(start)[3] == pytest.approx((2 * 4.0 + 4 * 1.5) / 6)  # two rounds of 4 positions, four of start
    for seconds in (0.01, 0.012, 0.05, 0.011, 0.013):  # network calls, n = 0
        costs.record(0, seconds)
    assert costs.ratios[0] == pytest.approx([0.6, 2.5, 0.55, 0.65]) and costs.medians[0] == pytest.approx(0.65)


def test_a_verdict_s_running_sums_give_the_rate_of_the_rounds_in_its_window():
    verdict, generator = Verdict(window=5, measures=True, max_wait=0), torch.Generator().manual_seed(1)
    for step in range(60):
        verdict.observe(bool(step % 3), int(torch.randint(1, 4, (1,), generator=generator)),
                        float(torch.rand(1, generator=generator)) * 0.01 + 1e-4)
        for kind, rounds in ((True, verdict.drafted_rounds), (False, verdict.plain_rounds)):
            assert len(rounds) <= 5 and verdict.totals[kind] == pytest.approx([sum(c for c, _ in rounds),
                                                                               sum(s for _, s in rounds)])


def test_renewing_the_length_a_round_measured_equals_computing_the_curve_whole():
    gen = GenerationConfig(verify_cost=(1.0, 1.15, 1.3, 1.6, 2.0))
    policy, generator = DraftPolicy.for_run(gen, PolicyState(costs=Costs(replace(DEFAULTS, cost_min_rounds=2)))), \
        torch.Generator().manual_seed(2)
    for _ in range(80):
        fed = int(torch.randint(1, 7, (1,), generator=generator))  # 6: past the curve's end
        draft = Copy(list(range(fed - 1)), matched=3).draft(fed - 1) if fed > 1 else EMPTY
        policy.observe(draft, 0, 1, 0.01 * (1 + 0.3 * (fed - 1)) * float(1 + torch.rand(1, generator=generator)))
        assert policy.verify_cost == pytest.approx(policy.state.costs.curve(gen.verify_cost))
    assert policy.verify_cost != gen.verify_cost


def test_the_policy_state_is_built_from_its_config():
    assert PolicyState() == PolicyState.of(DEFAULTS)
    cfg = replace(DEFAULTS, network_window=5, copied_window=7, min_rounds=2, copy_prior=0.4, sampled_prior=0.3,
                  cost_window=11, cost_min_rounds=3, curve_weight=3.0, lookup_strong=2, stall=4.0)
    state = PolicyState.of(cfg)
    assert (state.network.window, state.copies.window) == (5, 7)
    assert state.network.cfg is state.copies.cfg is state.acceptance.cfg is state.costs.cfg is cfg
    assert state.acceptance.rates("lookup", 9, 2) == pytest.approx([0.4, 0.4])
    assert state.acceptance.key("lookup", 9) == ("lookup", 2) and state.acceptance.rates("drafter", 0, 1) == [0.3]
    policy = DraftPolicy.for_run(GenerationConfig(verify_cost=(1.0, 1.1), policy=cfg), window=64)
    assert policy.capture.cfg is cfg and policy.cfg is cfg
    for bad in ({"max_skip": -1}, {"network_window": 0}, {"try_budget": 0.0}, {"stall": 0.5}):
        with pytest.raises(ValueError):
            PolicyConfig(**bad)


# -- the policy: one rule over the offers ----------------------------------------------------------------------------

def test_the_round_takes_the_offer_with_the_most_tokens_per_unit_of_cost():
    """A copy that pays is taken over a network not yet measured (offered at a plain step's worth); a network whose
    rounds measured more tokens per unit of cost than the copy offers outbids it; a network measured losing waits,
    and a copy that does not pay leaves a plain step."""
    curve = (1.0, 1.1, 1.2, 1.3)
    copy = Copy([7, 8, 9], matched=3)  # at the prior 0.7: (1 + 0.7 + 0.49 + 0.34) / 1.3 = 1.95 tokens a cost unit
    network = FixedDrafter(Draft(torch.tensor([4, 5, 6]), None, torch.full((3,), 0.99)), copies=(copy,))
    gen = GenerationConfig(verify_cost=curve, policy=PolicyConfig(plain_probe_every=16))
    policy = DraftPolicy.for_run(gen)
    draft = policy.draft(network, 1, 3, GREEDY, None)
    assert draft.ids == [7, 8, 9] and network.calls == 0
    assert policy.decision.why() == "copies 3 tokens verified; network not asked: a copy is worth more"
    for drafted, tokens, seconds in [(False, 1, 1.0)] * 3 + [(True, 4, 1.5)] * 3:  # 4 tokens for 1.5 plain rounds:
        policy.state.network.observe(drafted, tokens, seconds)  # 2.67 a cost unit > 1.95
    draft = policy.draft(network, 1, 3, GREEDY, None)
    assert draft.ids == [4, 5, 6] and network.calls == 1 and policy.called
    assert policy.decision.why() == ("copies not taken: the network's measured rounds are worth more; "
                                      "network called: 3 drafted, 3 verified")
    policy.state.network.wait = 5  # measured losing: it waits
    assert policy.draft(network, 1, 3, GREEDY, None).ids == [7, 8, 9] and network.calls == 1
    assert policy.decision.network == "waiting: its last rounds did not pay"
    for _ in range(20):
        policy.state.acceptance.record("lookup", 3, 3, 0)  # the copies are rejected
    assert len(policy.draft(network, 1, 3, GREEDY, None).tokens) == 0
    assert policy.decision.why() == "copies none pays under the cut; network waiting: its last rounds did not pay"


def test_the_policy_cuts_a_network_draft_within_its_bound_and_probes_plain_steps():
    curve = (1.0, *(1.0 + 0.5 * n for n in range(1, 17)))
    weak = FixedDrafter(Draft(torch.arange(16), None, torch.full((16,), 0.6)))
    for max_lost, want in ((0.0, 1), (0.02, best_draft_length([0.6] * 16, curve, 0.02))):
        gen = GenerationConfig(verify_cost=curve, policy=PolicyConfig(max_skip=0, max_lost=max_lost))
        assert len(DraftPolicy.for_run(gen).draft(weak, 1, 16, GREEDY, None).tokens) == want
    assert want > 1
    policy = DraftPolicy.for_run(GenerationConfig(verify_cost=curve, policy=PolicyConfig(max_skip=0,
                                                                                         plain_probe_every=3)))
    drafted = [len(policy.draft(weak, 1, 16, GREEDY, None).tokens) > 0 for _ in range(8)]
    assert drafted == [True, True, True, False, True, True, True, False]
    assert policy.decision.copies == policy.decision.network == "not asked: a plain step is due (plain probe)"


def test_a_network_draft_pays_for_its_call_at_t0_only_and_the_call_is_priced_as_the_reply_measured_it():
    """At T > 0 the confidence is no acceptance estimate (GenerationConfig.charges_draft_cost): the same draft backs the
    network off at T = 0 and not at T = 1. The start-up estimate is charged until calls and plain rounds are measured;
    a round that called the network counts as its round even when its draft was cut to nothing."""
    draft = Draft(torch.tensor([5, 6]), None, torch.full((2,), 0.3))  # pays at cost 0, not with a 0.5 call
    for temperature, charged in ((0.0, True), (1.0, False)):
        gen = GenerationConfig(verify_cost=(1.0, 1.1, 1.2), draft_cost=0.5,
                               sampling=SamplingConfig(temperature=temperature))
        policy = DraftPolicy.for_run(gen)
        cut = policy.draft(FixedDrafter(draft), 1, 2, gen.sampling, None)
        policy.observe(cut, 1, 2, 0.02, 0.01)
        assert gen.charges_draft_cost() == charged and policy.state.network.losses == int(charged)
    assert not GenerationConfig(draft_cost=0.5).charges_draft_cost()  # no cost curve: no cut, nothing charged
    gen = GenerationConfig(verify_cost=(1.0, 1.1, 1.2), draft_cost=0.2, policy=PolicyConfig(max_skip=0))
    policy = DraftPolicy.for_run(gen)
    weak = FixedDrafter(Draft(torch.tensor([5, 6]), None, torch.full((2,), 0.05)))  # cut to nothing
    for _ in range(8):
        cut = policy.draft(weak, 1, 2, GREEDY, None)
        assert len(cut.tokens) == 0 and policy.called and policy.decision.network == CUT_EMPTY
        assert policy.call_cost() == 0.2  # the estimate: calls count once plain rounds were measured
        policy.observe(cut, 0, 1, 0.016, draft_seconds=0.006)
    assert len(policy.state.network.drafted_rounds) == 8 and not policy.state.network.plain_rounds
    assert policy.call_cost() == pytest.approx(0.6)  # 6 ms calls over the 10 ms the rounds verified
    t1 = replace(gen, sampling=SamplingConfig(temperature=1.0))
    assert DraftPolicy.for_run(t1, policy.state).call_cost() == 0.0  # T > 0: none charged


def test_sampled_drafts_are_cut_on_their_measured_acceptance_and_not_drafted_where_it_cuts_them_to_nothing():
    """At T > 0 the cut reads the network's acceptance measured per slot in earlier rounds, not the draft's own
    confidence: a sure-looking draft is verified short until its slots are seen kept; where the measured slots cut any
    draft to nothing the network is not called (and backs off); at T = 0 the draft's own confidence is read."""
    sure = FixedDrafter(Draft(torch.tensor([1, 2, 3, 4]), torch.full((4, 8), 1 / 8), torch.ones(4)))
    curve = (1.0, 1.15, 1.35, 1.55, 1.8)
    gen = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(1.0), verify_cost=curve)
    state = PolicyState()
    policy = DraftPolicy.for_run(gen, state)
    draft = policy.draft(sure, 0, 4, gen.sampling, None)
    assert len(draft.tokens) == 1 and draft.q_draft.shape == (1, 8)  # prior 0.5: one slot pays best
    policy.observe(draft, 1, 2, 0.01)
    assert state.acceptance.counts[("drafter", 0)] == [[1.0, 1.0]]
    assert state.acceptance.rates("drafter", 0, 2) == pytest.approx([2 / 3, 0.5])
    for _ in range(20):
        state.acceptance.record("drafter", 0, 4, 4)  # every slot kept, round after round
    assert len(policy.draft(sure, 0, 4, gen.sampling, None).tokens) == 4
    state = PolicyState()
    policy = DraftPolicy.for_run(gen, state)
    for _ in range(20):
        state.acceptance.record("drafter", 0, 1, 0)  # slot 1 rejected, round after round
    calls = sure.calls
    assert len(policy.draft(sure, 1, 4, gen.sampling, None).tokens) == 0 and sure.calls == calls
    assert policy.decision.network == "not called: its measured acceptance cuts any draft to nothing"
    assert state.network.losses == 1 and not policy.called
    greedy, state.network.wait = replace(gen, sampling=GREEDY), 0  # the back-off over
    assert len(DraftPolicy.for_run(greedy, state).draft(sure, 2, 4, GREEDY, None).tokens) == 4  # T = 0: its own


def test_a_copy_is_cut_once_rounds_of_its_length_measure_dear_and_the_store_carries_to_the_next_reply():
    """A one-token copy kept a quarter of the time pays where the start-up curve prices two positions at 1.05 plain
    rounds, not where its rounds measured 3 (the curve weighing as one round). A network round counts without its
    call's own seconds, a tree not at all."""
    state = PolicyState(costs=Costs(replace(DEFAULTS, curve_weight=1.0)))
    gen = GenerationConfig(verify_cost=(1.0, 1.05, 1.1, 1.15, 1.2))
    policy = DraftPolicy.for_run(gen, state)
    copy = Copy([5, 6, 7], matched=3)
    assert copy_offer(copy, 1, state.acceptance, policy.verify_cost) is not None
    for _ in range(4):
        policy.observe(EMPTY, 0, 1, 0.010)
    for _ in range(4):
        policy.observe(copy.draft(1), 0, 1, 0.030)  # rejected: its rate falls to (0 + 0.7 * 2) / (4 + 2)
    assert state.acceptance.rates("lookup", 3, 1)[0] == pytest.approx(1.4 / 6)
    assert policy.verify_cost[1] == pytest.approx(1.81)
    assert copy_offer(copy, 1, state.acceptance, policy.verify_cost) is None
    assert best_draft_length([1.4 / 6], gen.verify_cost) == 1
    policy.called = True  # network rounds of two slots: 0.012 s verified after a 0.040 s call
    for _ in range(4):
        policy.observe(Draft(torch.tensor([5, 6]), None, torch.tensor([0.9, 0.9])), 2, 3, 0.052, 0.040)
    policy.called = False
    tree = Draft(torch.tensor([5]), None, alternatives=((6, 7, 8),))
    for _ in range(4):
        policy.observe(tree, 0, 1, 1.0)
    assert policy.verify_cost[2] == pytest.approx((4 * 1.2 + 1.1) / 5) and len(state.costs.ratios[2]) == 4
    assert DraftPolicy.for_run(gen, state).verify_cost == policy.verify_cost


def test_features_are_captured_around_rounds_that_want_the_network_which_waits_for_them():
    capture = FeatureCapture(4, replace(DEFAULTS, capture_armed=3, capture_ready=2))
    assert capture.captures(may_call=True, prefill=True) and capture.run == 2  # the prompt: its context at once
    assert not capture.captures(may_call=True) and capture.run == 0  # nothing wanted the network: a gap
    capture.since_wanted = 0
    assert [capture.captures(may_call=True) for _ in range(4)] == [True, True, True, False]
    assert not capture.captures(may_call=False)  # its waits outlast the window: a gap

    class Network(FixedDrafter):
        context_window = 4

    network = Network(Draft([5, 6], None, torch.tensor([0.9, 0.9])))
    policy = DraftPolicy.for_run(GenerationConfig(max_new_tokens=8, verify_cost=(1.0, 1.1, 1.2)),
                                 window=network.context_window)
    policy.captures(prefill=True)
    policy.captures()  # a round whose copy paid: no features, so a gap in the network's context
    for forward in range(DEFAULTS.capture_ready + 1):
        draft = policy.draft(network, 3, 2, GREEDY, None)
        ready = forward == DEFAULTS.capture_ready
        assert (network.calls, len(draft.tokens) > 0) == ((1, True) if ready else (0, False))
        assert policy.captures()  # each round wanted it: every forward captures
    for wait, captures in ((3, True), (4, False)):  # the window is 4: a wait of 4 outlasts these positions
        policy.called, policy.state.network.wait, policy.capture.since_wanted = False, wait, 0
        assert policy.captures() == captures
    policy.called = True  # a round that called it: its verdict may end the wait
    assert policy.captures()


def test_every_drafting_round_says_why_it_verified_what_it_did(tiny_target):
    """Each round's event carries the policy's decision: its source as the event says it, and for the copies and the
    network what they came to or why they were not asked; plain steps name their reasons, which the stats count."""
    from core.decoding.engine import generate_all
    from core.decoding.stats import AcceptanceStats
    from core.drafting.base import LookupHybrid
    from core.drafting.policy import policy as rule
    from core.drafting.policy import state
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
    known = {rule.PROBE, rule.NONE_FOUND, rule.NONE_PAYS, state.WAITING, state.MEASURING, rule.COPY_TAKEN,
             rule.NO_FEATURES, rule.SAMPLED_EMPTY, rule.CUT_EMPTY}
    for ev in rounds:
        if ev.source == "plain":
            assert ev.decision.network in known and ev.decision.copies in known
        elif ev.source == "drafter":
            assert ev.decision.network.startswith("called: ")
        else:
            assert ev.decision.network in (rule.COPY_TAKEN, state.WAITING, state.MEASURING)
            assert ev.decision.copies.endswith("tokens verified")
    assert any(ev.decision.copies == rule.PROBE for ev in rounds)  # a probe every 4 drafting rounds
    stats = AcceptanceStats().add_all(events)
    assert sum(stats.plain_reasons.values()) == sum(ev.source == "plain" for ev in rounds) > 0
    assert generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=8))[1][1].decision is None  # no drafter


def test_the_policy_package_is_at_most_half_the_lines_it_was_in_modules_read_in_one_sitting():
    """944 lines in ten modules before the one rule (0.52.0); at most half of that now, no module over 250 lines."""
    from pathlib import Path

    import core.drafting.policy as package

    lengths = {path.name: len(path.read_text().splitlines()) for path in Path(package.__file__).parent.glob("*.py")}
    assert max(lengths.values()) < 250 and sum(lengths.values()) <= 944 // 2, lengths
