import json

import pytest
import torch

import drafter.training.train as train_mod
from drafter.data import write_shard
from tests.test_drafter import tiny_seqs


@pytest.fixture
def tiny_run(tiny_target, tmp_path, monkeypatch):
    seqs = tiny_seqs(n=8)
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "shard-00000.safetensors", [s.tokens[:6] for s in seqs], [s.tokens[6:] for s in seqs])
    monkeypatch.setattr(train_mod, "load_target", lambda cfg: tiny_target)

    def run(stage, out, steps, init=None):
        argv = ["--stage", stage, "--data", str(data), "--out", str(out), "--steps", str(steps), "--save-every", "2",
                "--batch-seqs", "2", "--anchors-per-seq", "4", "--block-size", "4", "--d-model", "32",
                "--n-layers", "1", "--n-heads", "2", "--n-feature-layers", "2", "--draft-vocab", "16",
                "--context-window", "8", "--target", "tiny"]
        if init:
            argv += ["--init", str(init)]
        args = train_mod.parse_args(argv)
        return train_mod.train(train_mod.config_from_args(args), train_mod.shape_from_args(args),
                               train_mod.target_config_from_args(args))

    return run, tmp_path


def test_train_checkpoints_resume_and_distill(tiny_run, tiny_target):
    run, tmp = tiny_run
    teacher = run("teacher", tmp / "teacher", 2)
    meta = json.loads((teacher / "config.json").read_text())
    assert meta["training"]["step"] == 2 and meta["target"] == tiny_target.identity
    assert (teacher / "train_state.safetensors").exists()
    before = (teacher / "model.safetensors").read_bytes()
    run("teacher", tmp / "teacher", 4)  # the same command with more steps resumes at step 2
    meta = json.loads((teacher / "config.json").read_text())
    assert meta["training"]["step"] == 4 and meta["training"]["resumed_from"] == 2
    assert (teacher / "model.safetensors").read_bytes() != before
    (teacher / "train_state.safetensors").unlink()  # as after a fresh clone: moments are not committed
    run("teacher", tmp / "teacher", 6)
    record = json.loads((teacher / "config.json").read_text())["training"]
    assert (record["step"], record["resumed_from"]) == (6, 4)
    assert [r["step"] for r in record["earlier_runs"]] == [2, 4]  # each phase's record survives the next
    student = run("distill", tmp / "flashmap", 2, init=teacher)
    assert json.loads((student / "config.json").read_text())["drafter"]["kind"] == "flashmap"
    dflash = run("dflash", tmp / "dflash", 2)
    assert json.loads((dflash / "config.json").read_text())["drafter"]["kind"] == "dflash"


def test_schedules_warm_up_then_decay():
    cosine = train_mod.TrainConfig("teacher", "d", "o", steps=100)
    wsd = train_mod.TrainConfig("distill", "d", "o", init="t", steps=100)
    assert train_mod.lr_factor(0, cosine) < train_mod.lr_factor(3, cosine) == 1.0
    assert train_mod.lr_factor(50, cosine) < 1.0 and train_mod.lr_factor(99, cosine) < 0.01
    assert train_mod.lr_factor(70, wsd) == 1.0 and 0 < train_mod.lr_factor(90, wsd) < 1.0
    with pytest.raises(ValueError, match="--init"):
        train_mod.TrainConfig("distill", "d", "o")


def blocks_for(target, seqs, net, vocab_ids):
    from drafter.data import blocks_from_sequences, target_to_draft_map
    to_draft = target_to_draft_map(vocab_ids, target.vocab_size)
    return blocks_from_sequences(target, seqs, 4, net.cfg.block_size, net.cfg.context_window, net.cfg.feature_layers,
                                 to_draft, torch.Generator().manual_seed(0))


def test_teacher_warm_starts_from_a_dflash_style_net(tiny_run, tiny_target):
    from safetensors.torch import load_file

    run, tmp = tiny_run
    dflash = run("dflash", tmp / "dflash", 2)
    args = train_mod.parse_args(["--stage", "teacher", "--data", "x", "--out", str(tmp / "t"), "--init", str(dflash),
                                 "--t0-share", "0.3"])
    cfg = train_mod.config_from_args(args)
    assert cfg.t0_share == 0.3 and cfg.init == str(dflash)
    net, teacher, _vocab = train_mod.build_student(cfg, None, tiny_target, [])
    assert net.cfg.kind == "flashmap" and teacher is None
    start = load_file(str(dflash / "model.safetensors"))
    assert all(torch.equal(start[k].float(), v.to(torch.bfloat16).float()) for k, v in net.state_dict().items()
               if k in start and k != "slot_in.bias")
    # its t = 0 pass, from any noise, is the DFlash-style net's one pass (start_from_mask)
    from drafter.runtime.drafters import load_net
    from tests.test_drafter import tiny_seqs
    source, vocab_ids, _ = load_net(dflash, tiny_target)
    batch = blocks_for(tiny_target, tiny_seqs(), source, vocab_ids)
    zeros = torch.zeros(batch.tokens.shape[0])
    noise = torch.randn(*batch.tokens.shape, len(vocab_ids))  # (B, K, V)
    with torch.no_grad():
        want = source(source.masked_input(len(zeros)), zeros, zeros, *batch.context(source))
        got = net(net.state_input(noise, zeros, zeros), zeros, zeros, *batch.context(net))
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(want, torch.zeros_like(want))
    with pytest.raises(ValueError, match="t0-share"):
        train_mod.TrainConfig("teacher", "d", "o", t0_share=1.5)


def test_a_deadline_saves_and_stops_short_of_the_planned_steps(tiny_run, tiny_target, monkeypatch):
    """The first GPU run planned far too many steps and was killed with no checkpoint: a deadline must save."""
    run, tmp = tiny_run
    args = train_mod.parse_args(["--stage", "dflash", "--data", str(tmp / "data"), "--out", str(tmp / "d"),
                                 "--steps", "1000", "--save-every", "1000", "--batch-seqs", "2",
                                 "--anchors-per-seq", "2", "--block-size", "4", "--d-model", "32", "--n-layers", "1",
                                 "--n-heads", "2", "--n-feature-layers", "2", "--draft-vocab", "16",
                                 "--context-window", "8"])
    cfg = train_mod.config_from_args(args)
    saves, steps = [], []
    seqs = lambda layers: train_mod.training_sequences(cfg.data, layers)  # noqa: E731
    net_cfg = train_mod.network_config(cfg, train_mod.shape_from_args(args), tiny_target)
    train_mod.train_on(cfg, tiny_target, seqs, net_cfg, saves.append,
                       stop_at=0.0, on_step=steps.append)
    record = json.loads((tmp / "d/config.json").read_text())["training"]
    assert steps == [0] and record["step"] == 1 and saves == [tmp / "d"]


def test_distillation_can_start_from_an_earlier_flow_map(tiny_run, tiny_target):
    from safetensors.torch import load_file

    run, tmp = tiny_run
    teacher = run("teacher", tmp / "teacher", 2)
    earlier = run("distill", tmp / "earlier", 2, init=teacher)
    args = train_mod.parse_args(["--stage", "distill", "--data", "x", "--out", str(tmp / "s"), "--init", str(teacher),
                                 "--student-init", str(earlier)])
    net, frozen, _vocab = train_mod.build_student(train_mod.config_from_args(args), None, tiny_target, [])
    start = load_file(str(earlier / "model.safetensors"))
    assert frozen is not None and all(torch.equal(start[k].float(), v.to(torch.bfloat16).float())
                                      for k, v in net.state_dict().items() if k in start)
    with pytest.raises(ValueError, match="distill only"):
        train_mod.TrainConfig("teacher", "d", "o", student_init=str(earlier))


def test_noise_path_blocks_are_a_distillation_option_with_an_even_teacher_path():
    train_mod.TrainConfig("distill", "d", "o", init="t", noise_path_blocks=4)
    with pytest.raises(ValueError, match="noise-path"):
        train_mod.TrainConfig("teacher", "d", "o", noise_path_blocks=4)
    with pytest.raises(ValueError, match="noise-path"):
        train_mod.TrainConfig("distill", "d", "o", init="t", noise_path_blocks=4, zero_noise_steps=3)


def test_precision_auto_picks_bf16_only_where_the_hardware_has_it():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    avx2 = frozenset({"avx", "avx2", "fma"})
    assert train_mod.resolve_precision("auto", cpu, avx2) == "fp32"  # emulated bf16: ~25x slower (measured)
    assert train_mod.resolve_precision("auto", cpu, avx2 | {"avx512_bf16"}) == "fp32"  # no AMX: fp32 faster (measured)
    assert train_mod.resolve_precision("auto", cpu, avx2 | {"amx_bf16"}) == "bf16"
    assert train_mod.resolve_precision("auto", cpu, frozenset()) == "fp32"  # no /proc/cpuinfo: the safe answer
    assert train_mod.resolve_precision("auto", gpu, frozenset()) == "bf16"
    assert train_mod.resolve_precision("bf16", cpu, avx2) == "bf16"  # an explicit choice stands
    assert train_mod.resolve_precision("fp32", gpu, frozenset()) == "fp32"
    # a full-vocabulary head (the z-lab backbone) is one large product: AVX512-BF16 pays there (measured)
    assert train_mod.resolve_precision("auto", cpu, avx2 | {"avx512_bf16"}, full_vocab_head=True) == "bf16"
    assert train_mod.resolve_precision("auto", cpu, avx2, full_vocab_head=True) == "fp32"
    args = train_mod.parse_args(["--stage", "dflash", "--data", "d", "--out", "o", "--device", "cpu"])
    assert train_mod.config_from_args(args).precision in ("bf16", "fp32")  # resolved before the config is saved


def test_a_check_set_is_never_trained_on(tmp_path):
    seqs = tiny_seqs(n=2)
    for name, meta in (("train", {}), ("check", {"held_apart": True})):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "shard-00000.safetensors", [s.tokens[:6] for s in seqs],
                    [s.tokens[6:] for s in seqs])
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    assert len(train_mod.training_sequences((str(tmp_path / "train"),))) == 2
    with pytest.raises(SystemExit, match="check set"):
        train_mod.training_sequences((str(tmp_path / "train"), str(tmp_path / "check")))
