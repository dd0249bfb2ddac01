"""FlashMap over a z-lab DFlash backbone (drafter/networks/zlab_flow.py): at initialisation its t = 0 pass is the
published drafter's, logit for logit; the teacher warm-starts from the published folder, trains, saves, resumes,
distils, and drafts in the engine with outputs identical to plain decoding."""
import json

import pytest
import torch
from safetensors.torch import load_file

import drafter.training.train as train_mod
from core.decoding.engine import GenerationConfig, generate_all
from drafter.data import write_shard
from drafter.registry import build_drafter
from drafter.runtime.drafters import load_net, zlab_warm_start
from drafter.spec import DrafterSpec
from tests.test_drafter import tiny_seqs
from tests.test_zlab_dflash import BLOCK, write_zlab, zlab_config, zlab_tensors


@pytest.fixture(scope="module")
def zlab_folder(tiny_qwen3_target, tmp_path_factory):
    cfg = zlab_config(tiny_qwen3_target)
    return write_zlab(tmp_path_factory.mktemp("zlab"), cfg, zlab_tensors(cfg))


def published_logits(folder, target, feats: torch.Tensor, anchor: int) -> torch.Tensor:
    """The published drafter's logits for the slots after the anchor, as ZLabDFlashDrafter computes them."""
    drafter = build_drafter(DrafterSpec("dflash", weights=str(folder)), target)
    drafter.extend(list(range(len(feats))), feats)
    ids = torch.tensor([anchor] + [drafter.c.mask_token_id] * (BLOCK - 1))  # (BLOCK,)
    with torch.no_grad():
        hidden = drafter.net(drafter.embed(ids), torch.arange(len(feats), len(feats) + BLOCK), drafter.ctx_kv)
        return drafter.head(hidden[1:])  # (K, V)


def flow_logits(net, target, feats: torch.Tensor, anchor: int, s: float, t: float, seed: int = 0) -> torch.Tensor:
    ctx, mask = net.context_projected(net.ctx_in(feats)[None], torch.ones(1, len(feats), dtype=torch.bool),
                                      target.model.get_input_embeddings().weight[anchor][None])
    x = torch.randn(1, net.cfg.block_size, net.cfg.draft_vocab, generator=torch.Generator().manual_seed(seed))
    times = torch.tensor([s]), torch.tensor([t])
    with torch.no_grad():
        return net(net.state_input(x, *times), *times, ctx, mask)[0]  # (K, V)


def features(target, n=6, seed=1) -> torch.Tensor:
    width = 2 * target.model.config.hidden_size  # two target layers in the tiny published config
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))  # (N, F)


def test_at_initialisation_the_t0_pass_is_the_published_drafter(zlab_folder, tiny_qwen3_target):
    net, vocab_ids = zlab_warm_start(zlab_folder, tiny_qwen3_target, context_window=16)
    assert torch.equal(vocab_ids, torch.arange(tiny_qwen3_target.vocab_size))
    assert net.cfg.block_size == BLOCK - 1 and net.cfg.feature_layers == (1, 3)
    feats = features(tiny_qwen3_target)
    want = published_logits(zlab_folder, tiny_qwen3_target, feats, anchor=9)
    for seed in (0, 1):  # whatever the noise: at t = 0 the state carries none of it
        assert torch.allclose(flow_logits(net, tiny_qwen3_target, feats, 9, 0.0, 0.0, seed), want, atol=1e-5)
    zeros = torch.zeros(1)
    ctx, mask = net.context_projected(net.ctx_in(feats)[None], torch.ones(1, 6, dtype=torch.bool),
                                      tiny_qwen3_target.model.get_input_embeddings().weight[9][None])
    with torch.no_grad():
        assert torch.allclose(net(net.masked_input(1), zeros, zeros, ctx, mask)[0], want, atol=1e-5)


def test_the_flow_state_enters_away_from_t0_and_never_at_t0(zlab_folder, tiny_qwen3_target):
    net, _ = zlab_warm_start(zlab_folder, tiny_qwen3_target, context_window=16)
    torch.nn.init.normal_(net.state_in.weight, std=0.5)  # as after training: the state path is open
    feats = features(tiny_qwen3_target)
    want = published_logits(zlab_folder, tiny_qwen3_target, feats, anchor=9)
    assert torch.allclose(flow_logits(net, tiny_qwen3_target, feats, 9, 0.0, 0.0), want, atol=1e-5)
    later = flow_logits(net, tiny_qwen3_target, feats, 9, 0.5, 0.5)
    assert not torch.allclose(later, want, atol=1e-2)
    assert not torch.allclose(later, flow_logits(net, tiny_qwen3_target, feats, 9, 0.5, 0.5, seed=1), atol=1e-2)


def test_time_modulation_starts_as_the_identity_and_then_conditions(zlab_folder, tiny_qwen3_target):
    net, _ = zlab_warm_start(zlab_folder, tiny_qwen3_target, context_window=16)
    feats = features(tiny_qwen3_target)
    t0 = flow_logits(net, tiny_qwen3_target, feats, 9, 0.0, 0.0)
    assert torch.allclose(flow_logits(net, tiny_qwen3_target, feats, 9, 0.0, 1.0), t0, atol=1e-5)  # zero-initialised
    for ada in net.ada:
        torch.nn.init.normal_(ada.weight, std=0.5)
    assert not torch.allclose(flow_logits(net, tiny_qwen3_target, feats, 9, 0.0, 1.0), t0, atol=1e-3)


def test_padded_context_positions_are_ignored(zlab_folder, tiny_qwen3_target):
    """Training batches right-align windows with masked padding in front: the padding must change nothing."""
    net, _ = zlab_warm_start(zlab_folder, tiny_qwen3_target, context_window=16)
    feats = features(tiny_qwen3_target)
    anchor_embed = tiny_qwen3_target.model.get_input_embeddings().weight[9][None]
    padded = torch.cat([torch.randn(3, feats.shape[1]), feats])  # (3 + N, F)
    mask = torch.tensor([[False] * 3 + [True] * len(feats)])
    ctx, full_mask = net.context_projected(net.ctx_in(padded)[None], mask, anchor_embed)
    zeros = torch.zeros(1)
    with torch.no_grad():
        got = net(net.masked_input(1), zeros, zeros, ctx, full_mask)[0]
    assert torch.allclose(got, published_logits(zlab_folder, tiny_qwen3_target, feats, anchor=9), atol=1e-5)


def test_teacher_warm_started_from_a_published_folder_trains_distils_and_drafts_exactly(
        zlab_folder, tiny_qwen3_target, tmp_path, monkeypatch):
    seqs = tiny_seqs(n=8)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "shard-00000.safetensors", [s.tokens[:6] for s in seqs], [s.tokens[6:] for s in seqs])
    monkeypatch.setattr(train_mod, "load_target", lambda cfg: tiny_qwen3_target)

    def run(stage, out, steps, init, *extra):
        args = train_mod.parse_args(["--stage", stage, "--data", str(data), "--out", str(out), "--steps", str(steps),
                                     "--save-every", "2", "--batch-seqs", "2", "--anchors-per-seq", "4",
                                     "--context-window", "8", "--target", "tiny", "--init", str(init), *extra])
        return train_mod.train(train_mod.config_from_args(args), train_mod.shape_from_args(args),
                               train_mod.target_config_from_args(args))

    teacher = run("teacher", tmp_path / "teacher", 2, zlab_folder, "--t0-share", "0.3")
    meta = json.loads((teacher / "config.json").read_text())
    assert meta["drafter"]["backbone"] == "zlab" and meta["training"]["step"] == 2
    run("teacher", tmp_path / "teacher", 4, zlab_folder)  # resumes from its own save
    net, _vocab, meta = load_net(teacher, tiny_qwen3_target)
    assert meta["training"]["resumed_from"] == 2 and net.cfg.context_window == 8
    assert net.cfg.modulation == "scale-gate"  # a warm start exports back to the published format
    from drafter.formats.export import export_dflash

    exported = build_drafter(DrafterSpec("dflash", weights=str(export_dflash(teacher, tmp_path / "export"))),
                             tiny_qwen3_target)
    assert exported.max_block_size == BLOCK - 1
    student = run("distill", tmp_path / "flashmap", 2, teacher)
    with pytest.raises(ValueError, match="teacher only"):
        run("distill", tmp_path / "bad", 2, zlab_folder)
    frozen = run("teacher", tmp_path / "frozen", 2, zlab_folder, "--freeze-backbone")
    published = load_file(str(zlab_folder / "model.safetensors"))
    saved = load_file(str(frozen / "model.safetensors"))
    assert all(torch.equal(saved[f"backbone.{k}"], v) for k, v in published.items())  # bf16 both: bit-equal
    assert not torch.equal(saved["state_in.weight"], torch.zeros_like(saved["state_in.weight"]))  # trained
    gen = GenerationConfig(max_new_tokens=16)
    for spec in (DrafterSpec("flashmap", weights=str(student)), DrafterSpec("flashmap", weights=str(student), steps=2),
                 DrafterSpec("flashmap-teacher", weights=str(teacher), steps=4)):
        drafter = build_drafter(spec, tiny_qwen3_target)
        assert drafter.max_block_size == BLOCK - 1
        plain, _ = generate_all(tiny_qwen3_target, [5, 6, 7, 8], gen)
        out, events = generate_all(tiny_qwen3_target, [5, 6, 7, 8], gen, drafter)
        assert out == plain and any(ev.drafted for ev in events)


def test_a_published_folder_for_another_target_or_with_missing_tensors_is_refused(zlab_folder, tiny_target,
                                                                                   tiny_qwen3_target, tmp_path):
    from drafter.formats.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="made for a target"):
        zlab_warm_start(zlab_folder, tiny_target, context_window=8)
    cfg = zlab_config(tiny_qwen3_target)
    tensors = {k: v for k, v in zlab_tensors(cfg).items() if k != "norm.weight"}
    with pytest.raises(CheckpointError, match="missing"):
        zlab_warm_start(write_zlab(tmp_path / "partial", cfg, tensors), tiny_qwen3_target, context_window=8)


def test_a_new_published_layout_drafter_trains_from_scratch_warm_starts_a_flow_and_exports(
        tiny_target, tmp_path, monkeypatch):
    """--backbone zlab on a Llama target: DFlash-style from scratch, the FlashMap teacher warm-started from it
    (its t = 0 pass starts as DFlash-style's), both exported and drafting exactly."""
    from drafter.formats.export import export_dflash

    seqs = tiny_seqs(n=8)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "shard-00000.safetensors", [s.tokens[:6] for s in seqs], [s.tokens[6:] for s in seqs])
    monkeypatch.setattr(train_mod, "load_target", lambda cfg: tiny_target)

    def run(stage, out, *extra):
        args = train_mod.parse_args(["--stage", stage, "--data", str(data), "--out", str(out), "--steps", "2",
                                     "--save-every", "2", "--batch-seqs", "2", "--anchors-per-seq", "4",
                                     "--context-window", "8", "--block-size", "3", "--target", "tiny", *extra])
        return train_mod.train(train_mod.config_from_args(args), train_mod.shape_from_args(args),
                               train_mod.target_config_from_args(args))

    dflash = run("dflash", tmp_path / "dflash", "--backbone", "zlab", "--n-layers", "1", "--mask-token-id", "4")
    meta = json.loads((dflash / "config.json").read_text())["drafter"]
    assert meta["backbone"] == "zlab" and meta["modulation"] == "scale-gate" and meta["kind"] == "dflash"
    assert meta["zlab"]["block_size"] == 4 and meta["zlab"]["dflash_config"]["mask_token_id"] == 4
    teacher = run("teacher", tmp_path / "teacher", "--init", str(dflash), "--t0-share", "0.3")
    net, _vocab, _meta = load_net(teacher, tiny_target)
    assert net.cfg.kind == "flashmap" and net.cfg.modulation == "scale-gate"
    gen = GenerationConfig(max_new_tokens=12)
    plain, _ = generate_all(tiny_target, [5, 6, 7, 8], gen)
    for ckpt in (dflash, teacher):
        folder = export_dflash(ckpt, tmp_path / f"export-{ckpt.name}", dtype="float32")
        out, events = generate_all(tiny_target, [5, 6, 7, 8], gen,
                                   build_drafter(DrafterSpec("dflash", weights=str(folder)), tiny_target))
        assert out == plain and any(ev.drafted for ev in events)
    with pytest.raises(SystemExit):
        run("dflash", tmp_path / "bad", "--backbone", "other")
