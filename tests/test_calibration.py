import json
import logging

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.verification.sampling import SamplingConfig
from drafter.data import draft_vocabulary
from drafter.evaluation.calibrate import report_rows, two_fold
from drafter.formats.checkpoint import save_checkpoint
from drafter.runtime import calibration as calib
from drafter.runtime.drafters import build_net, calibration_for, load_engine_drafter
from drafter.spec import DrafterSpec, RunSpec, SpecError
from tests.test_drafter import tiny_cfg, tiny_seqs


def synthetic_rounds(n: int, k: int, slope: float, bias: float, seed: int = 0):
    """Rounds whose slot k is accepted, once reached, with probability sigmoid(slope logit(c_k) + bias)."""
    gen = torch.Generator().manual_seed(seed)
    confidence = torch.rand(n, k, generator=gen) * 0.98 + 0.01  # (R, K)
    p_accept = torch.sigmoid(slope * torch.logit(confidence) + bias)  # (R, K)
    hit = torch.rand(n, k, generator=gen) < p_accept  # (R, K)
    n_accepted = hit.long().cumprod(-1).sum(-1)  # (R,) the first miss ends the round
    return confidence, n_accepted, torch.full((n,), k)


def test_reached_slots_are_those_after_an_accepted_prefix_within_the_draft():
    reached, accepted = calib.reached_outcomes(torch.tensor([0, 2, 4]), torch.tensor([4, 4, 3]), 4)
    assert reached.tolist() == [[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert accepted.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]


def test_fit_recovers_the_acceptance_law_per_slot():
    confidence, n_accepted, draft_len = synthetic_rounds(20000, 3, slope=0.5, bias=1.0)
    fitted = calib.fit(confidence, n_accepted, draft_len)
    assert fitted.slope[0] == pytest.approx(0.5, abs=0.06) and fitted.bias[0] == pytest.approx(1.0, abs=0.08)
    assert fitted.slope[1] == pytest.approx(0.5, abs=0.1)
    predicted = calib.expected_vs_accepted(fitted(confidence), n_accepted)
    assert predicted["expected_accepted"] == pytest.approx(predicted["accepted"], rel=0.05)


def test_a_sure_but_wrong_drafter_is_brought_down_without_diverging():
    """Confidence ~0.999 everywhere, half of it accepted: where the identity map starts, the curvature vanishes."""
    gen = torch.Generator().manual_seed(0)
    confidence = 0.999 - 0.0005 * torch.rand(4000, 2, generator=gen)  # (R, K)
    n_accepted = (torch.rand(4000, generator=gen) < 0.5).long()  # slot 1 accepted half the time, slot 2 never
    fitted = calib.fit(confidence, n_accepted, torch.full((4000,), 2))
    first = fitted(confidence)[:, 0]
    assert all(abs(x) < 50 for x in fitted.slope + fitted.bias)
    assert first.mean().item() == pytest.approx(0.5, abs=0.03)
    assert calib.expected_vs_accepted(confidence, n_accepted)["expected_accepted"] > 1.9  # raw: ~2 expected


def test_thin_slots_borrow_the_slot_before_and_too_little_data_is_refused():
    confidence, n_accepted, draft_len = synthetic_rounds(300, 4, slope=1.0, bias=-2.0)
    fitted = calib.fit(confidence, n_accepted, draft_len)
    assert fitted.slope[3] == fitted.slope[2] or fitted.slope[3] == fitted.slope[1]  # slot 4 is rarely reached
    assert fitted(torch.full((2, 6), 0.5)).shape == (2, 6)  # slots past the fit use the last map
    with pytest.raises(calib.CalibrationError, match="too few rounds"):
        calib.fit(confidence[:10], n_accepted[:10], draft_len[:10])


def test_two_fold_report_is_held_out_and_per_domain():
    confidence, n_accepted, draft_len = synthetic_rounds(4000, 3, slope=0.5, bias=-1.0, seed=1)
    raw_conf = confidence  # the drafter's own, too sure: its law is sigmoid(0.5 logit c - 1)
    fold = torch.arange(4000) % 2 == 0
    calibrated = two_fold(raw_conf, n_accepted, draft_len, fold)
    rows = report_rows(raw_conf, calibrated, n_accepted, ["math", "chat"] * 2000)
    assert set(rows) == {"all", "math", "chat"} and rows["all"]["rounds"] == 4000 and rows["chat"]["rounds"] == 2000
    assert rows["all"]["expected_raw"] > 1.3 * rows["all"]["accepted"]
    assert rows["all"]["expected_calibrated"] == pytest.approx(rows["all"]["accepted"], rel=0.08)


@pytest.fixture()
def checkpoint(tiny_target, tmp_path):
    vocab_ids = draft_vocabulary(tiny_seqs(), 16)
    torch.manual_seed(0)
    net = build_net(tiny_cfg("flashmap", 16, tiny_target.model.config.hidden_size), tiny_target, vocab_ids)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    torch.nn.init.zeros_(net.other_head)
    save_checkpoint(tmp_path, net, vocab_ids, tiny_target.identity, {})
    return tmp_path


def test_a_calibration_belongs_to_its_weights_and_way_of_drafting(checkpoint, caplog):
    spec = DrafterSpec("flashmap", noise_scale=0.0, weights=str(checkpoint))
    assert calibration_for(spec, checkpoint) is None  # none fitted: raw confidence, no warning
    fitted = calib.SlotCalibration((0.5, 0.4), (-1.0, -0.5))
    calib.save(checkpoint, spec.sampler_key(), fitted, {"rounds": 1})
    assert calibration_for(spec, checkpoint) == fitted
    assert calibration_for(DrafterSpec("flashmap", noise_scale=0.0, block_size=2, weights=str(checkpoint)),
                           checkpoint) == fitted  # K is the cut's business
    assert calibration_for(DrafterSpec("flashmap", weights=str(checkpoint)), checkpoint) is None  # other sampler
    assert calibration_for(DrafterSpec("flashmap", noise_scale=0.0, calibrated=False), checkpoint) is None
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")  # other weights: refused, with the reason
    with caplog.at_level(logging.WARNING):
        assert calibration_for(spec, checkpoint) is None
    assert "other weights" in caplog.text
    (checkpoint / calib.FILE).write_text("{not json")
    with pytest.raises(calib.CalibrationError, match="unreadable"):
        calib.load(checkpoint, spec.sampler_key())


def test_saving_another_sampler_keeps_the_first_and_new_weights_drop_both(checkpoint):
    one, two = calib.SlotCalibration((1.0,), (0.0,)), calib.SlotCalibration((0.5,), (-1.0,))
    calib.save(checkpoint, "flashmap,scale=0.0", one, {})
    calib.save(checkpoint, "dflash", two, {})
    record = json.loads((checkpoint / calib.FILE).read_text())
    assert set(record["samplers"]) == {"flashmap,scale=0.0", "dflash"}
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")
    calib.save(checkpoint, "dflash", two, {})
    assert set(json.loads((checkpoint / calib.FILE).read_text())["samplers"]) == {"dflash"}


def test_the_engine_drafter_cuts_on_calibrated_confidence_at_t0_only_and_stays_exact(checkpoint, tiny_target):
    spec = DrafterSpec("flashmap", noise_scale=0.0, weights=str(checkpoint))
    low = calib.SlotCalibration((1.0,), (-30.0,))  # "nothing will be accepted": every draft cut to nothing
    calib.save(checkpoint, spec.sampler_key(), low, {})
    drafter = load_engine_drafter(spec, tiny_target)
    raw = load_engine_drafter(DrafterSpec("flashmap", noise_scale=0.0, calibrated=False, weights=str(checkpoint)),
                              tiny_target)
    greedy, gen = SamplingConfig(temperature=0.0), torch.Generator().manual_seed(0)
    for d in (drafter, raw):
        d.reset()
        d.extend([5, 6, 7], torch.randn(3, len(d.feature_layers) * tiny_target.model.config.hidden_size))
    calibrated_draft, raw_draft = drafter.propose(8, 4, greedy, gen), raw.propose(8, 4, greedy, gen)
    assert torch.equal(calibrated_draft.tokens, raw_draft.tokens)  # the same block, believed differently
    assert calibrated_draft.confidence.max() < 1e-9 < raw_draft.confidence.min()
    hot = drafter.propose(8, 4, SamplingConfig(temperature=1.0), gen)
    assert hot.confidence.min() > 1e-9  # fitted at T = 0: raw confidence at T > 0
    cost = GenerationConfig(max_new_tokens=12, verify_cost=(1.0, 1.1, 1.2, 1.3, 1.4))
    plain, _ = generate_all(tiny_target, [5, 6, 7, 8], cost)
    out, events = generate_all(tiny_target, [5, 6, 7, 8], cost, drafter)
    assert out == plain and all(not ev.drafted for ev in events)  # cut to nothing, skipped, still exact


def test_spec_calibrated_option_round_trips_and_suits_network_drafters_only():
    run = RunSpec.parse("flashmap,scale=0,adaptive=1,calibrated=0,k=8")
    spec = run.drafter
    assert not spec.calibrated and run.text() == "flashmap,scale=0.0,k=8,adaptive=1,calibrated=0"
    assert spec.text() == "flashmap,scale=0.0,k=8,calibrated=0" and run.adaptive
    assert spec.sampler_key() == "flashmap,scale=0.0" and "raw confidence" in run.describe()
    with pytest.raises(SpecError, match="what the engine does with the drafts"):
        DrafterSpec.parse("flashmap,adaptive=1")
    assert DrafterSpec.parse("dflash").calibrated
    with pytest.raises(SpecError, match="network drafters"):
        DrafterSpec.parse("ngram,calibrated=0")
