import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.decoding.engine import GenerationConfig, generate_all
from core.drafting.base import NgramDrafter
from core.runtime import cpu_linear
from core.runtime import target as target_mod
from core.runtime.cpu_linear import PackedLinear, pack_linears
from core.runtime.target import TargetConfig, load_target
from core.runtime.threads import cpu_flags
from lab.testing import QWEN3_TEMPLATE, load_or_refused, make_target, tiny_llama, tiny_qwen3, tiny_tokenizer

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_f_linear_for_any_rows_and_falls_back_outside_inference(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    packed = PackedLinear(linear)
    assert packed.weight is linear.weight and packed.bias is linear.bias
    for shape in [(1, 48), (17, 48), (1, 5, 48), (2, 3, 48)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            out = packed(x)
        assert out.shape == (*shape[:-1], 80)
        torch.testing.assert_close(out, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    x = torch.randn(4, 48, requires_grad=True)
    with torch.enable_grad():  # training: the original weight, with gradients
        packed(x).sum().backward()
    assert linear.weight.grad is not None and x.grad is not None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert packed(x).dtype == torch.bfloat16  # autocast: F.linear, so autocast still applies


def test_rows_come_out_the_same_alone_or_in_a_verify_block():
    """Why oneDNN: a position's output does not depend on how many positions share the forward (at this shape;
    MKL's differ), which keeps a verify forward over K + 1 positions in step with fewer positions."""
    torch.manual_seed(0)
    packed = PackedLinear(torch.nn.Linear(576, 1536, bias=False))
    x = torch.randn(17, 576)  # (T, I)
    with torch.inference_mode():
        block = packed(x)  # (T, O)
        assert all(torch.equal(packed(x[:n]), block[:n]) for n in (2, 5, 16))


def test_pack_linears_keeps_ties_state_and_outputs():
    model = tiny_llama(vocab_size=64)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    reference = copy.deepcopy(model)
    keys = set(model.state_dict())
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert pack_linears(model) == n_linear > 0
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    assert model.lm_head.weight is model.model.embed_tokens.weight and set(model.state_dict()) == keys
    ids = torch.tensor([[5, 9, 11, 3, 40, 7]])  # (B, T)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    assert pack_linears(model.to(torch.bfloat16)) == 0  # every linear already packed: nothing left to pack


def test_bf16_weights_are_packed_only_where_onednn_can_reorder_them():
    avx2 = frozenset({"avx", "avx2", "fma", "f16c"})
    assert cpu_linear.packed_dtypes(avx2) == (torch.float32,)  # oneDNN raises reordering bf16 there
    assert torch.bfloat16 in cpu_linear.packed_dtypes(avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
    assert torch.bfloat16 in cpu_linear.packed_dtypes(avx2 | {"avx_ne_convert"})
    assert cpu_linear.packed_dtypes(frozenset()) == (torch.float32,)  # no /proc/cpuinfo: the safe answer


def test_greedy_drafting_with_a_packed_target_equals_plain_decoding():
    packed, plain = make_target(tiny_llama(vocab_size=64)), make_target(tiny_llama(vocab_size=64))
    pack_linears(packed.model)
    rng = np.random.default_rng(0)
    for _ in range(6):
        prompt = rng.integers(4, 64, size=int(rng.integers(2, 10))).tolist()
        reference, _ = generate_all(plain, prompt, GenerationConfig(max_new_tokens=30))
        alone, _ = generate_all(packed, prompt, GenerationConfig(max_new_tokens=30))
        drafted, events = generate_all(packed, prompt, GenerationConfig(max_new_tokens=30, block_size=8),
                                       NgramDrafter())
        assert alone == reference and drafted == reference
        assert any(ev.drafted for ev in events)  # verify forwards over several positions happened


def test_load_target_packs_on_the_cpu_unless_asked_not_to_or_short_of_memory(tmp_path, monkeypatch):
    tiny_qwen3().save_pretrained(tmp_path)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(tmp_path)
    assert load_target(TargetConfig(str(tmp_path), device="cpu", dtype="fp32")).extra["packed_linears"] > 0
    bf16 = load_or_refused(TargetConfig(str(tmp_path), device="cpu", dtype="bf16"))  # None: refused with AMX
    if bf16 is not None:
        bf16_packed = bf16.extra.get("packed_linears", 0)
        assert (bf16_packed > 0) == (torch.bfloat16 in cpu_linear.packed_dtypes(cpu_flags()))
    unpacked = load_target(TargetConfig(str(tmp_path), device="cpu", cpu_linear="torch"))
    assert "packed_linears" not in unpacked.extra
    monkeypatch.setattr(target_mod, "free_memory_bytes", lambda device: 2 * 10**4)  # room for no second copy
    assert target_mod.pack_if_room(unpacked) == 0
    monkeypatch.setattr(target_mod, "free_memory_bytes", lambda device: 10**12)
    assert target_mod.pack_if_room(unpacked) > 0
    with pytest.raises(ValueError, match="--cpu-linear"):
        TargetConfig(cpu_linear="mkl")


def test_a_cached_verify_cost_curve_is_kept_apart_per_kernel(tmp_path):
    from dataclasses import replace

    from core.runtime.verify_cost import CostCurves, cache_file, load_cached, save_cached

    plain = make_target(tiny_llama(vocab_size=64))
    packed = replace(plain, extra={"packed_linears": 14})
    steep = CostCurves((256,), ((1.0, 1.9, 1.9),))  # torch's steep curve must not steer a packed target's cut
    save_cached(tmp_path, plain, steep)
    assert cache_file(tmp_path, plain) != cache_file(tmp_path, packed) and load_cached(tmp_path, packed) is None


@pytest.mark.parametrize("out_features, in_features, bias", [(16, 32, False), (48, 96, True), (960, 576, False)])
def test_the_native_q4_product_is_the_codes_weight_for_any_rows_and_each_row_alone(out_features, in_features, bias):
    """core.runtime.cpu_linear.Int4Linear through the native step's q4_mm: its blocks stand for quantize_q4's weight
    exactly (unpack_q4_blocks), its product is that weight's to bf16 rounding, and a row's output is bit for bit the
    same alone or among 17 (every row count from 1 to 17 goes through a different mix of tiles)."""
    from core.runtime import native
    from core.runtime.cpu_linear import Int4Linear, as_multiplied, quantize_q4, unpack_q4_blocks

    module, why = native.load()
    if module is None:
        pytest.skip(why)
    torch.manual_seed(out_features)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    q4 = Int4Linear(linear, native=module)
    codes, scale, minimum = quantize_q4(linear.weight)
    steps = (codes.float().reshape(out_features, -1, 32) * scale.half().float()[..., None])  # (O, I/32, 32)
    floors = minimum.half().float()[..., None].expand_as(steps)  # (O, I/32, 32)
    want_weight = (steps + floors).reshape(out_features, in_features)
    assert torch.equal(unpack_q4_blocks(q4.blocks, module.LAYOUT), want_weight)
    x = torch.randn(17, in_features).bfloat16()
    with torch.no_grad():
        full = q4(x)  # (17, O)
        # codes and minimums alike multiply the rows as the product sees them (8-bit codes or bf16)
        want = torch.nn.functional.linear(as_multiplied(x, module.ACTIVATIONS), want_weight,
                                          None if linear.bias is None else linear.bias.detach().bfloat16().float())
        assert torch.allclose(full.float(), want, atol=0.05 * want.abs().max().item() / 8, rtol=0.02)
        for rows in range(1, 17):
            assert torch.equal(q4(x[:rows]), full[:rows])
        assert all(torch.equal(q4(x[t : t + 1]), full[t : t + 1]) for t in range(17))


def test_the_products_prefetch_distance_changes_no_value_and_is_checked():
    """lean_step.cpp's products may ask for the weight's cache lines some blocks ahead (by default 2, or none with the
    VNNI products): a hint only, so the q4 and q8 products are bit for bit the same at every distance, 0 (none) and past
    the last block included."""
    from core.runtime import native
    from core.runtime.cpu_linear import Int4Linear, Int8Linear

    module, why = native.load()
    if module is None:
        pytest.skip(why)
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 48)
    products = (Int4Linear(linear, native=module), Int8Linear(torch.nn.Linear(96, 48, bias=False), module))
    x = torch.randn(5, 96).bfloat16()
    default = module.prefetch_blocks()
    assert default == (0 if module.ACTIVATIONS == "8-bit" and module.LAYOUT == "quads" else 2)
    try:
        with torch.no_grad():
            module.set_prefetch_blocks(0)
            want = [product(x) for product in products]
            for blocks in (1, 3, 64):
                module.set_prefetch_blocks(blocks)
                assert all(torch.equal(product(x), out) for product, out in zip(products, want))
        for wrong in (-1, 65):
            with pytest.raises(RuntimeError, match="prefetch distance"):
                module.set_prefetch_blocks(wrong)
    finally:
        module.set_prefetch_blocks(default)


@pytest.mark.parametrize("layout", ["pairs", "bytes", "quads"])
def test_every_q4_layout_holds_the_same_codes_scales_and_minimums(layout):
    """pack_q4_blocks' three arrangements (bf16 pairs, AVX2's bytes, VNNI's quads) each unpack to the weight its codes
    stand for; only the native build of each CPU reads its own, so this checks the ones this CPU does not."""
    from core.runtime.cpu_linear import pack_q4_blocks, quantize_q4, unpack_q4_blocks

    torch.manual_seed(3)
    codes, scale, minimum = quantize_q4(torch.randn(48, 96))  # 3 tiles x 3 blocks
    want = (codes.float().reshape(48, 3, 32) * scale.half().float()[..., None] + minimum.half().float()[..., None])
    blocks = pack_q4_blocks(codes, scale, minimum, layout)  # (3, 3, 80)
    assert blocks.shape == (3, 3, 80)
    assert torch.equal(unpack_q4_blocks(blocks, layout), want.reshape(48, 96))
    if layout == "quads":  # byte 64j + 4l + i: output l's input 8j + i (low bits) and 8j + 4 + i (high bits)
        first = blocks[0, 0, :64].contiguous().view(torch.uint8)  # (256,) the first block's code bytes
        out, j, i = 5, 2, 3
        assert first[64 * j + 4 * out + i] == codes[out, 8 * j + i] | (codes[out, 8 * j + 4 + i] << 4)


@pytest.mark.parametrize("out_features, in_features", [(16, 32), (48, 96), (4096, 576)])
def test_the_native_q8_product_is_the_codes_weight_for_any_rows_and_each_row_alone(out_features, in_features):
    """core.runtime.cpu_linear.Int8Linear (GGUF's Q8_0 scheme, the LM head in q4): its blocks stand for quantize_q8's
    weight exactly, the codes are within about half a step of the weight, its product is that weight's to bf16 rounding,
    and a row's output is bit for bit the same alone or among 17."""
    from core.runtime import native
    from core.runtime.cpu_linear import Int8Linear, as_multiplied, quantize_q8, unpack_q8_blocks

    module, why = native.load()
    if module is None:
        pytest.skip(why)
    torch.manual_seed(in_features)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    q8 = Int8Linear(linear, module)
    codes, scale = quantize_q8(linear.weight)
    want_weight = (codes.float().reshape(out_features, -1, 32) * scale.half().float()[..., None]).reshape(
        out_features, in_features)
    assert torch.equal(unpack_q8_blocks(q8.blocks, module.Q8_LAYOUT), want_weight)
    step = scale.repeat_interleave(32, dim=1)  # (O, I)
    # within half a step, plus the fp16-rounded scale's error over up to 127 steps
    assert ((want_weight - linear.weight.detach()).abs() <= 0.5 * step + 127 * (scale.half().float() - scale).abs()
            .repeat_interleave(32, dim=1) + 1e-7).all()
    x = torch.randn(17, in_features).bfloat16()
    with torch.no_grad():
        full = q8(x)  # (17, O)
        want = torch.nn.functional.linear(as_multiplied(x, module.ACTIVATIONS), want_weight)
        assert torch.allclose(full.float(), want, atol=0.01 * want.abs().max().item(), rtol=0.01)
        for rows in range(1, 17):
            assert torch.equal(q8(x[:rows]), full[:rows])
        assert all(torch.equal(q8(x[t : t + 1]), full[t : t + 1]) for t in range(17))


def test_onednn_is_kept_off_amx_unless_the_environment_chose_otherwise(monkeypatch):
    """AMX's bf16 products are not batch-invariant: core caps oneDNN below them (core/__init__.py), and a test or the
    app may excuse a bf16 refusal only where the cap lets AMX through on a CPU that has it."""
    import os

    assert os.environ.get("ONEDNN_MAX_CPU_ISA")
    amx, avx512 = frozenset({"amx_bf16", "avx512_bf16"}), frozenset({"avx512_bf16"})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not cpu_linear.amx_products(amx)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert cpu_linear.amx_products(amx) and not cpu_linear.amx_products(avx512)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu_linear.amx_products(amx)
