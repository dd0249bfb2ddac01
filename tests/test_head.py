"""The next-token head (drafter/head.py): it learns, calibrates, saves, loads, refuses what it cannot use."""
import json

import pytest
import torch

from drafter.head import (
    BUCKETS,
    FrozenHead,
    HeadConfig,
    HeadError,
    HeadTrainConfig,
    NextTokenHead,
    calibrate,
    fit,
    load_head,
    save_head,
    to_draft_ids,
)

V_T, D_T, LAYERS = 64, 32, (1, 2)  # the tiny target's vocabulary and width (conftest.tiny_target), two feature layers


def tiny_head(hidden: int = 64, draft_vocab: int = 48, seed: int = 0) -> tuple[NextTokenHead, torch.Tensor]:
    torch.manual_seed(seed)
    vocab_ids = torch.tensor([-1, *range(1, draft_vocab)])  # (V,) "other", then target ids 1..V-1
    embed, rows = torch.randn(V_T, D_T), torch.randn(draft_vocab, D_T)
    return NextTokenHead(HeadConfig(LAYERS, D_T, hidden, draft_vocab), embed, rows), vocab_ids


def toy_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features that say nothing, anchors 1..40 and a next token that is a function of the anchor: learnable."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, len(LAYERS) * D_T, generator=g)  # (N, F)
    anchors = torch.randint(1, 41, (n,), generator=g)  # (N,)
    return feats, anchors, (anchors * 7) % 40 + 1  # (N,) target ids inside the draft vocabulary


def test_the_head_learns_a_next_token_and_its_confidence_is_calibrated_by_fifths():
    head, vocab_ids = tiny_head()
    feats, anchors, nexts = toy_task(4096, seed=1)
    labels = to_draft_ids(nexts, vocab_ids, V_T)
    before = calibrate(head.eval(), feats, anchors, labels)
    cfg = HeadTrainConfig((), (), "", "", epochs=6, batch=128, lr=1e-2)
    losses = fit(head.train(), feats, anchors, labels, cfg, log=lambda _: None)
    assert losses[-1] < losses[0] / 4
    held = toy_task(1024, seed=2)
    after = calibrate(head.eval(), held[0], held[1], to_draft_ids(held[2], vocab_ids, V_T))
    assert before["accuracy"] < 0.1 and after["accuracy"] > 0.95
    assert sum(after["counts"]) <= after["positions"] and after["counts"][BUCKETS - 1] > 900
    assert after["rates"][BUCKETS - 1] > 0.95  # the top fifth: nearly always the token


def test_outside_the_draft_vocabulary_is_other():
    vocab_ids = torch.tensor([-1, 5, 9])
    assert to_draft_ids(torch.tensor([9, 5, 7, 0]), vocab_ids, V_T).tolist() == [2, 1, 0, 0]


def test_a_saved_head_loads_frozen_and_proposes_its_argmax(tiny_target, tmp_path):
    head, vocab_ids = tiny_head()
    save_head(tmp_path / "head", head, vocab_ids, tiny_target.identity, {"positions": 0},
              {"rates": [0.1, 0.3, 0.5, 0.7, 0.9]})
    frozen = load_head(tmp_path / "head", tiny_target)
    assert isinstance(frozen, FrozenHead) and frozen.calibration == (0.1, 0.3, 0.5, 0.7, 0.9)
    loaded = NextTokenHead(head.cfg, tiny_target.model.get_input_embeddings().weight.detach(),
                           tiny_target.model.get_output_embeddings().weight.detach()[vocab_ids.clamp_min(0)])
    state = {k: v.to(torch.bfloat16).float() for k, v in head.state_dict().items()}  # saved in bf16
    loaded.load_state_dict(state)
    feats = torch.randn(20, len(LAYERS) * D_T)
    anchors = torch.randint(0, V_T, (20,))
    with torch.no_grad():
        probs = torch.softmax(loaded(feats, anchors), -1)  # (20, V)
    for row, anchor, p in zip(feats, anchors.tolist(), probs):
        guess = frozen.propose(row, anchor)
        top, at = p.max(-1)
        if int(at) == 0:
            assert guess is None  # "other" is never proposed
        else:
            assert guess[0] == int(vocab_ids[at]) and guess[1] == pytest.approx(float(top), rel=0.05)
    assert [frozen.bucket(c) for c in (0.0, 0.19, 0.2, 0.99, 1.0)] == [1, 1, 2, 5, 5]
    assert frozen.prior(2) == (0.3,)


def test_a_head_that_cannot_be_used_is_refused_with_the_reason(tiny_target, tmp_path):
    with pytest.raises(HeadError, match="no head"):
        load_head(tmp_path / "missing", tiny_target)
    head, vocab_ids = tiny_head()
    folder = tmp_path / "head"
    save_head(folder, head, vocab_ids, {**tiny_target.identity, "name": "other-model"}, {}, {})
    with pytest.raises(HeadError, match="trained for"):
        load_head(folder, tiny_target)
    save_head(folder, head, vocab_ids, tiny_target.identity, {}, {})
    assert load_head(folder, tiny_target).calibration == ()  # no calibration: no prior, the policy measures it
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(HeadError, match="corrupt"):
        load_head(folder, tiny_target)
    meta = json.loads((folder / "config.json").read_text())
    meta["head"]["hidden"] = 7
    save_head(folder, head, vocab_ids, tiny_target.identity, {}, {})
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(HeadError, match="do not match"):
        load_head(folder, tiny_target)
    meta["format"] = "something-else/1"
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(HeadError, match="unknown format"):
        load_head(folder, tiny_target)


def test_training_refuses_check_sets(tiny_target, tmp_path):
    from drafter.head import train

    held = tmp_path / "check"
    held.mkdir()
    (held / "meta.json").write_text(json.dumps({"held_apart": True}))
    cfg = HeadTrainConfig((str(held),), (str(held),), str(tmp_path / "out"), "unused")
    with pytest.raises(HeadError, match="check sets"):
        train(cfg, tiny_target)
