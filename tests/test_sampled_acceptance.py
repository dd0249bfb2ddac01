import pytest
import torch

from core.verification.sampling import SamplingConfig, target_probs
from drafter.data import draft_vocabulary
from drafter.evaluation import sampled_acceptance
from drafter.runtime.drafters import FlowDrafter, build_net
from tests.test_drafter import tiny_cfg, tiny_seqs


@pytest.fixture(scope="module")
def drafter(tiny_target):
    vocab_ids = draft_vocabulary(tiny_seqs(), 64)  # every token the sequences hold: most of the target's
    net = build_net(tiny_cfg(vocab=64), tiny_target, vocab_ids)
    for p in net.parameters():  # leave adaLN-Zero: make the noise matter
        torch.nn.init.normal_(p, std=0.2)
    return FlowDrafter(net.eval(), vocab_ids, tiny_target, "flowmap")


def test_each_anchor_pairs_the_scales_on_one_context(tiny_target, drafter):
    ids, sampling = list(range(5, 17)), SamplingConfig(temperature=0.3)  # p sharp: min(p, q) reads q
    rows = sampled_acceptance.slot_one_acceptance(tiny_target, drafter, ids, 6, sampling, (0.0, 1.0, 1.0))
    assert len(rows) == 6 and all(0.0 <= v <= 1.0 + 1e-6 for row in rows for v in row)
    assert all(row[1] == row[2] for row in rows)  # one scale twice: the same noise at each anchor, the same q
    assert any(row[0] != row[1] for row in rows)  # x0 = 0 and x0 ~ noise draft differently
    # the first anchor by hand: the drafter fed the positions before it, sum_v min(p, q)
    p_target, q_draft = first_anchor_by_hand(tiny_target, drafter, ids, sampling)
    assert rows[0][0] == pytest.approx(float(torch.minimum(p_target, q_draft).sum()))


def first_anchor_by_hand(tiny_target, drafter, ids, sampling):
    """The target's distribution after ids[6] (V,) and the drafter's q there (V,) from x0 = 0, fed ids[:6]."""
    drafter.reset()
    with torch.inference_mode():
        logits, features = sampled_acceptance.target_forward(tiny_target, ids, tiny_target.new_cache(len(ids)),
                                                             drafter.feature_layers)
        drafter.extend(ids[:6], features[:6])
        drafter.sampler.noise_scale = 0.0
        q_draft = drafter.propose(ids[6], 1, sampling, torch.Generator().manual_seed(6)).q_draft[0]
    return target_probs(logits[6], sampling), q_draft


def test_paired_difference_and_its_standard_error():
    out = sampled_acceptance.paired([(0.5, 0.25), (0.75, 0.25), (0.25, 0.25)], (0.0, 1.0))
    assert out["positions"] == 3 and out["mean"] == {"0.0": 0.5, "1.0": 0.25}
    assert out["0.0 - 1.0"]["mean"] == pytest.approx(0.25)
    assert out["0.0 - 1.0"]["se"] == pytest.approx(0.25 / 3 ** 0.5)


def test_measure_runs_on_the_targets_sampled_replies(tiny_target, drafter):
    out = sampled_acceptance.measure(tiny_target, drafter, ["w10 w11", "w12 w13"], 1.0, 6, (0.0, 1.0))
    assert out["positions"] == 2 * 5  # each reply of 6 tokens: its first 5 are anchors
    assert set(out["mean"]) == {"0.0", "1.0"}


def test_argmax_adds_the_acceptance_of_qs_most_likely_token_proposed_deterministically(tiny_target, drafter):
    ids, sampling = list(range(5, 17)), SamplingConfig(temperature=1.0)
    rows = sampled_acceptance.slot_one_acceptance(tiny_target, drafter, ids, 6, sampling, (0.0,), argmax=True)
    p_target, q_draft = first_anchor_by_hand(tiny_target, drafter, ids, sampling)
    assert rows[0][1] == pytest.approx(float(p_target[q_draft.argmax()]))  # p of the deterministic token
    out = sampled_acceptance.paired(rows, (0.0, "argmax"))
    assert set(out["mean"]) == {"0.0", "argmax"} and "0.0 - argmax" in out
