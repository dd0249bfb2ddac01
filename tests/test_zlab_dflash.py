"""Published DFlash drafters (z-lab format): a tiny random checkpoint written with the published
tensor names and config fields, loaded natively and run through the engine."""
import json

import pytest
import torch
from safetensors.torch import save_file

from core.decoding.engine import GenerationConfig, generate_all
from drafter.networks.rotary import rotary
from drafter.registry import DrafterUnavailable, build_drafter
from drafter.runtime.dflash import ZLabDFlashDrafter
from drafter.spec import DrafterSpec
from lab.testing import QWEN3_TEMPLATE, assert_sampled_distribution_exact, make_target, tiny_qwen3

BLOCK = 4


def zlab_config(target, layers=2) -> dict:
    """The published config.json fields (z-lab/Qwen3-8B-DFlash-b16 layout), at tiny sizes."""
    c = target.model.config
    return {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0, "block_size": BLOCK,
        "dflash_config": {"mask_token_id": 7, "target_layer_ids": [0, 2]}, "dtype": "bfloat16",
        "head_dim": 8, "hidden_act": "silu", "hidden_size": c.hidden_size, "intermediate_size": 48,
        "layer_types": ["full_attention"] * layers, "max_position_embeddings": 512, "num_attention_heads": 4,
        "num_hidden_layers": layers, "num_key_value_heads": 2, "num_target_layers": c.num_hidden_layers,
        "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": target.vocab_size,
    }


def zlab_tensors(cfg: dict, seed=0) -> dict[str, torch.Tensor]:
    """Random weights under the published tensor names."""
    gen = torch.Generator().manual_seed(seed)
    d, hd, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"fc.weight": (d, len(cfg["dflash_config"]["target_layer_ids"]) * d), "hidden_norm.weight": (d,),
              "norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
                       p + "mlp.down_proj.weight": (d, inter), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    return {name: (1 + 0.1 * torch.randn(shape, generator=gen)) if len(shape) == 1
            else 0.3 * torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write_zlab(folder, cfg, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def zlab_folder(tiny_qwen3_target, tmp_path_factory):
    cfg = zlab_config(tiny_qwen3_target)
    return write_zlab(tmp_path_factory.mktemp("zlab"), cfg, zlab_tensors(cfg))


def test_round_trip_loads_natively_and_is_lossless(zlab_folder, tiny_qwen3_target):
    drafter = build_drafter(DrafterSpec("dflash", weights=str(zlab_folder)), tiny_qwen3_target)
    assert isinstance(drafter, ZLabDFlashDrafter) and drafter.feature_layers == (1, 3)  # hidden_states offset 1
    assert drafter.net.layers[1].self_attn.k_norm.weight.dtype == torch.float32  # the target's dtype
    gen = GenerationConfig(max_new_tokens=24, block_size=8)  # asks for more than the block's 3 slots
    for prompt in ([5, 6, 7, 8], [9, 10, 11, 12, 13, 14]):
        plain, _ = generate_all(tiny_qwen3_target, prompt, gen)
        out, events = generate_all(tiny_qwen3_target, prompt, gen, drafter)
        assert out == plain
        assert all(len(ev.drafted) <= BLOCK - 1 for ev in events)


def test_sampled_output_keeps_the_target_distribution(tmp_path):
    target = make_target(tiny_qwen3(vocab_size=5, seed=3), template=QWEN3_TEMPLATE)  # V=5: exact joint is cheap
    cfg = dict(zlab_config(target), dflash_config={"mask_token_id": 4, "target_layer_ids": [0, 2]})
    folder = write_zlab(tmp_path / "v5", cfg, zlab_tensors(cfg))
    drafter = build_drafter(DrafterSpec("dflash", weights=str(folder)), target)
    assert_sampled_distribution_exact(target, drafter, n=1200)


def test_context_kv_cache_equals_one_pass(zlab_folder, tiny_qwen3_target):
    """Keys/values extended position by position equal those of the whole context at once."""
    drafter = build_drafter(DrafterSpec("dflash", weights=str(zlab_folder)), tiny_qwen3_target)
    feats = torch.randn(7, 64)  # (N, F)
    drafter.reset()
    for start, stop in ((0, 3), (3, 4), (4, 7)):
        drafter.extend(list(range(start, stop)), feats[start:stop])
    whole = drafter.net.context_kv(feats, torch.arange(7))
    for (k, v), (wk, wv) in zip(drafter.ctx_kv, whole):
        assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)


def test_positions_without_features_restart_the_context_at_their_own_positions(zlab_folder, tiny_qwen3_target):
    """It reads every position, so the engine captures them all (no context_window); a reused prefix may still
    lack the first ones: the context then starts after them, each key at its own position."""
    drafter = build_drafter(DrafterSpec("dflash", weights=str(zlab_folder)), tiny_qwen3_target)
    assert getattr(drafter, "context_window", None) is None
    feats = torch.randn(7, 64)  # (N, F)
    drafter.reset()
    drafter.extend(list(range(3)), feats[:3])
    drafter.extend(list(range(3, 5)), None)
    drafter.extend(list(range(5, 7)), feats[5:7])
    whole = drafter.net.context_kv(feats[5:7], torch.arange(5, 7))
    assert drafter.n_ctx == 7
    for (k, v), (wk, wv) in zip(drafter.ctx_kv, whole):
        assert torch.allclose(k, wk, atol=1e-5) and torch.allclose(v, wv, atol=1e-5)


def test_rope_matches_transformers_qwen3(tiny_qwen3_target):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = tiny_qwen3_target.model.config
    positions = torch.tensor([0, 1, 5, 300])
    cos, sin = Qwen3RotaryEmbedding(cfg)(torch.zeros(1, 4, cfg.hidden_size), positions[None])
    ours = rotary(positions, cfg.head_dim, cfg.rope_parameters["rope_theta"], "halves")
    assert torch.allclose(ours[0], cos[0], atol=1e-5) and torch.allclose(ours[1], sin[0], atol=1e-5)


def test_refuses_other_targets_and_broken_folders(zlab_folder, tiny_target, tiny_qwen3_target, tmp_path):
    with pytest.raises(DrafterUnavailable, match="made for a target"):
        build_drafter(DrafterSpec("dflash", weights=str(zlab_folder)), tiny_target)  # 2 target layers, not 4
    cfg = zlab_config(tiny_qwen3_target)
    tensors = zlab_tensors(cfg)
    del tensors["layers.1.mlp.up_proj.weight"]
    with pytest.raises(DrafterUnavailable, match="missing"):
        folder = write_zlab(tmp_path / "missing", cfg, tensors)
        build_drafter(DrafterSpec("dflash", weights=str(folder)), tiny_qwen3_target)
    broken = write_zlab(tmp_path / "corrupt", cfg, zlab_tensors(cfg))
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DrafterUnavailable, match="cannot read"):
        build_drafter(DrafterSpec("dflash", weights=str(broken)), tiny_qwen3_target)
    scaled = write_zlab(tmp_path / "yarn", dict(cfg, rope_scaling={"type": "yarn", "factor": 4}), zlab_tensors(cfg))
    with pytest.raises(DrafterUnavailable, match="rope_scaling"):
        build_drafter(DrafterSpec("dflash", weights=str(scaled)), tiny_qwen3_target)
    with pytest.raises(DrafterUnavailable, match="not in the local cache"):
        build_drafter(DrafterSpec("dflash", weights="z-lab/no-such-drafter-for-tests"), tiny_qwen3_target)
