import pytest

from core.runtime.plan import GIB, facts_config, kv_cache_bytes, plan_memory

QWEN3_8B = facts_config("Qwen/Qwen3-8B")


def test_kv_cache_for_qwen3_8b():
    # 2 (K and V) x 36 layers x 8 kv heads x 128 dims x 2 bytes = 144 KiB per token
    assert kv_cache_bytes(QWEN3_8B, 1) == 147456
    assert kv_cache_bytes(QWEN3_8B, 8192) == pytest.approx(1.125 * GIB)


@pytest.mark.parametrize("gib, capability, context, expected", [
    (8, (8, 9), 8192, None),  # nothing fits: even FP8 weights are ~9 GB
    (16, (8, 9), 8192, "fp8"),  # a 16 GB Ada card: FP8
    (16, (8, 6), 8192, "8bit"),  # Ampere has no FP8: LLM.int8
    (24, (8, 9), 8192, "none"),  # RTX 4090, 8k context: bf16 (15.3 GiB + 1.1 cache + drafter + buffers) fits
    (24, (8, 9), 32768, "fp8"),  # RTX 4090, 32k context: the 4.5 GiB cache pushes bf16 out, FP8 fits
    (32, (12, 0), 32768, "none"),  # RTX 5090: bf16 fits even at 32k
])
def test_plan_picks_the_fastest_option_that_fits(gib, capability, context, expected):
    free = int(gib * GIB * 0.95)  # the driver and display keep some memory
    plan = plan_memory(QWEN3_8B, free, capability, context=context)  # with the released FlashMap drafter
    assert plan.quant == expected, plan.describe()
    assert ("nothing fits" in plan.describe()) == (expected is None)


def test_auto_quant_follows_the_plan_on_a_gpu_and_is_none_on_the_cpu(monkeypatch, capsys):
    import torch

    from core.runtime import target as target_mod
    from core.runtime.target import TargetConfig, TargetLoadError, resolve_quant

    cfg = TargetConfig("Qwen/Qwen3-8B")
    assert resolve_quant(cfg, QWEN3_8B, torch.device("cpu")) == "none"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(target_mod, "free_memory_bytes", lambda device: 15 * GIB)
    assert resolve_quant(cfg, QWEN3_8B, torch.device("cuda")) == "fp8"
    assert "-> --quant fp8" in capsys.readouterr().out  # the plan and its reasons are printed
    assert resolve_quant(TargetConfig("x", quant="8bit"), QWEN3_8B, torch.device("cuda")) == "8bit"  # override
    monkeypatch.setattr(target_mod, "free_memory_bytes", lambda device: 6 * GIB)
    with pytest.raises(TargetLoadError, match="nothing fits"):
        resolve_quant(cfg, QWEN3_8B, torch.device("cuda"))


def test_the_released_flashmap_drafter_is_counted_as_the_release_builds_it():
    """Its parameters as the authors' package builds them (a small DiT here), and the released drafters' stated
    sizes: 500M for Qwen3-8B, 475M for Qwen3-4B; the plan reserves them with their context by default."""
    from flashmap import FlashMapConfig, FlashMapDraftModel

    from core.runtime.plan import flashmap_drafter_bytes

    dit = dict(layers=2, width=64, heads=4, mlp=96, cond=16, time=8, feature_layers=3)
    model = FlashMapDraftModel(FlashMapConfig(target_hidden_size=48, vocab_size=10, target_layer_ids=[0, 1, 2],
                                              hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=96, cond_dim=16, time_embed_dim=8))
    assert flashmap_drafter_bytes(48, 0, dit, 1) == sum(p.numel() for p in model.parameters())
    assert flashmap_drafter_bytes(4096, 0, bytes_per_value=1) == pytest.approx(500e6, rel=1e-3)
    assert flashmap_drafter_bytes(2560, 0, bytes_per_value=1) == pytest.approx(475e6, rel=1e-3)
    with_drafter = plan_memory(QWEN3_8B, 24 * GIB, (8, 9), context=8192)
    without = plan_memory(QWEN3_8B, 24 * GIB, (8, 9), context=8192, drafter_bytes=0)
    extra = with_drafter.options[0].total - without.options[0].total
    assert extra == flashmap_drafter_bytes(4096, 8192) and 1.2 * GIB < extra < 1.4 * GIB  # 1.0 GB + its context
