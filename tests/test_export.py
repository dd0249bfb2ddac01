"""drafter/formats/export.py: a drafter on the z-lab backbone written as a published DFlash folder. The fold is exact:
the
folder, read back by the project's own z-lab loader, drafts the blocks the unexported drafter drafts (fp32, every
slot), on tiny random Llama and Qwen3 targets and on the embedded default."""
import json
import os
from pathlib import Path

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from drafter.formats.checkpoint import CheckpointError, save_checkpoint
from drafter.formats.dflash import is_zlab_folder, read_zlab
from drafter.formats.export import export_dflash, main
from drafter.registry import build_drafter
from drafter.runtime.drafters import build_net
from drafter.spec import DrafterSpec
from drafter.training.train import NetShape, TrainConfig, network_config


def random_zlab_drafter(target, folder, kind="flashmap", modulation="scale-gate", layers=2, block=4, seed=0):
    """A checkpoint of a new z-lab-backbone drafter for `target` with every weight random, the time modulation and
    the state path included (zero-initialised ones would make the fold trivial)."""
    stage = "dflash" if kind == "dflash" else "teacher"
    shape = NetShape(backbone="zlab", modulation=modulation, n_layers=layers, block_size=block, n_feature_layers=2,
                     context_window=64)
    cfg = network_config(TrainConfig(stage=stage, data=(), out=str(folder)), shape, target)
    vocab_ids = torch.arange(target.vocab_size)
    net = build_net(cfg, target, vocab_ids)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    save_checkpoint(folder, net, vocab_ids, target.identity, {"step": 0})
    return folder


def proposed_blocks(target, spec: DrafterSpec, prompt: list[int], tokens: int = 24) -> tuple[list, list]:
    out, events = generate_all(target, prompt, GenerationConfig(max_new_tokens=tokens), build_drafter(spec, target))
    return out, [ev.drafted for ev in events if ev.kind == "round"]


@pytest.mark.parametrize("which", ["tiny_target", "tiny_qwen3_target"])
@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_the_exported_folder_drafts_the_same_blocks(which, kind, request, tmp_path):
    target = request.getfixturevalue(which)
    ckpt = random_zlab_drafter(target, tmp_path / "ckpt", kind=kind)
    out = export_dflash(ckpt, tmp_path / "export", dtype="float32")
    assert is_zlab_folder(out)
    cfg, tensors = read_zlab(out)
    assert all(v.dtype == torch.float32 for v in tensors.values()) and cfg.block_size == 5
    assert not any(name.startswith(("ada", "time_mlp", "state")) for name in tensors)  # the published names only
    unexported = DrafterSpec("flashmap" if kind == "flashmap" else "dflash", weights=str(ckpt),
                             noise_scale=0.0 if kind == "flashmap" else 1.0)
    exported = DrafterSpec("dflash", weights=str(out))
    prompt = [5, 6, 7, 8, 9]
    plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=24))
    got_out, got = proposed_blocks(target, exported, prompt)
    want_out, want = proposed_blocks(target, unexported, prompt)
    assert got == want and len(got) > 1 and len(got[0]) == 4  # every slot of every round (the last ones clipped)
    assert got_out == want_out == plain


def test_logits_of_the_export_equal_the_flow_maps_to_fp32_rounding(tiny_qwen3_target, tmp_path):
    target = tiny_qwen3_target
    ckpt = random_zlab_drafter(target, tmp_path / "ckpt", seed=3)
    exported = build_drafter(DrafterSpec("dflash", weights=str(export_dflash(ckpt, tmp_path / "x", dtype="float32"))),
                             target)
    flow = build_drafter(DrafterSpec("flashmap", weights=str(ckpt), noise_scale=0.0), target)
    feats = torch.randn(7, exported.net.fc.in_features, generator=torch.Generator().manual_seed(1))  # (N, F)
    for drafter in (exported, flow):
        drafter.extend(list(range(7)), feats)
    ids = torch.tensor([9] + [exported.c.mask_token_id] * 4)  # (5,) anchor + masked slots
    with torch.no_grad():
        want = exported.head(exported.net(exported.embed(ids), torch.arange(7, 12), exported.ctx_kv)[1:])  # (4, V)
        flow.project_pending()
        ctx, mask = flow.context(9)
        net = flow.net
        zeros, ones = torch.zeros(1), torch.ones(1)
        got = net(net.noise_input(torch.zeros(1, 4, net.cfg.target_hidden), ones), zeros, ones, ctx, mask)[0]
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_what_cannot_be_folded_is_refused_with_the_reason(tiny_qwen3_target, tmp_path):
    ckpt = random_zlab_drafter(tiny_qwen3_target, tmp_path / "shifted", modulation="shift-scale-gate")
    with pytest.raises(CheckpointError, match="shifts"):
        export_dflash(ckpt, tmp_path / "x")
    with pytest.raises(CheckpointError, match="no drafter checkpoint"):
        export_dflash(tmp_path / "missing", tmp_path / "y")
    dit = tmp_path / "dit"
    net_cfg = network_config(TrainConfig(stage="teacher", data=(), out=str(dit)), NetShape(
        d_model=16, n_layers=1, n_heads=2, draft_vocab=32, block_size=4, n_feature_layers=2), tiny_qwen3_target)
    vocab = torch.arange(32)
    save_checkpoint(dit, build_net(net_cfg, tiny_qwen3_target, vocab), vocab, tiny_qwen3_target.identity, {})
    with pytest.raises(SystemExit, match="z-lab DFlash backbone"):
        main(["--format", "dflash", str(dit), str(tmp_path / "z")])


def test_the_cli_writes_a_bf16_folder_by_default(tiny_target, tmp_path, capsys):
    ckpt = random_zlab_drafter(tiny_target, tmp_path / "ckpt")
    main(["--format", "dflash", str(ckpt), str(tmp_path / "out")])
    assert "wrote" in capsys.readouterr().out
    meta = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["dtype"] == "bfloat16" and meta["flashmap_export"]["t"] == 1.0
    saved = json.loads((ckpt / "config.json").read_text())["drafter"]["zlab"]["dflash_config"]["target_layer_ids"]
    assert meta["dflash_config"]["target_layer_ids"] == saved == [0]  # hidden_states[1]: z-lab counts layers from 0
    _cfg, tensors = read_zlab(tmp_path / "out")
    assert all(v.dtype == torch.bfloat16 for v in tensors.values())
    drafter = build_drafter(DrafterSpec("dflash", weights=str(tmp_path / "out")), tiny_target)
    assert drafter.max_block_size == 4


@pytest.mark.slow
def test_the_fold_is_exact_on_the_embedded_default(embedded_target, tmp_path):
    ckpt = random_zlab_drafter(embedded_target, tmp_path / "ckpt", layers=1, block=8)
    out = export_dflash(ckpt, tmp_path / "export", dtype="float32")
    prompt = embedded_target.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
    got_out, got = proposed_blocks(embedded_target, DrafterSpec("dflash", weights=str(out)), prompt, tokens=12)
    want_out, want = proposed_blocks(embedded_target, DrafterSpec("flashmap", weights=str(ckpt), noise_scale=0.0),
                                     prompt, tokens=12)
    # the fold is exact algebra but not the same float operations: a random drafter's near-tied top two tokens (over
    # the embedded target's 49,152) may swap in a rare slot, so the drafts agree slot by slot nearly everywhere
    assert got_out == want_out and len(got) == len(want) > 1
    slots = [(a, b) for g, w in zip(got, want) for a, b in zip(g, w)]
    assert len(slots) > 8 and sum(a == b for a, b in slots) >= 0.9 * len(slots)


@pytest.mark.slow
@pytest.mark.skipif(not (Path(__file__).parent.parent / ".venv-vllm" / ".installed").exists(),
                    reason="the converter runs in the vLLM environment (bash scripts/install_vllm.sh)")
def test_llama_cpps_own_converter_reads_the_export(embedded_target, tmp_path):
    """llama.cpp's convert_hf_to_gguf.py (the source llama-cpp-python 0.3.36 vendors) turns an exported folder into
    a DFlash GGUF with the block, mask token and target layers it carries (scripts/llamacpp_dflash.sh)."""
    import subprocess

    from gguf import GGUFReader

    root = Path(__file__).parent.parent
    ckpt = random_zlab_drafter(embedded_target, tmp_path / "ckpt", layers=1, block=15)
    export = export_dflash(ckpt, tmp_path / "export")
    subprocess.run(["bash", "scripts/llamacpp_dflash.sh", str(export)], cwd=root, check=True,
                   env={**os.environ, "CONVERT_ONLY": "1"}, capture_output=True)
    fields = GGUFReader(root / "runs" / "llama.cpp-dflash" / "drafter.gguf").fields

    def value(name):
        return fields[name].contents()

    config = json.loads((export / "config.json").read_text())
    assert value("general.architecture") == "dflash" and value("dflash.block_size") == 16
    assert value("tokenizer.ggml.mask_token_id") == config["dflash_config"]["mask_token_id"]
    assert value("dflash.target_layers") == [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
