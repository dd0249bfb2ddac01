import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.drafting.base import NgramDrafter
from core.runtime.fp8 import (
    FP8_MAX,
    Fp8Linear,
    decoder_linears,
    probe_product,
    quantize_decoder,
    quantize_rows,
    share_row_codes,
)
from core.runtime.graphs import GraphedSteps
from core.runtime.lean import LeanForward
from lab.testing import make_target, tiny_llama

pytestmark = pytest.mark.skipif(probe_product(torch.device("cpu")) is not None,
                                reason="this torch has no row-scaled FP8 product on the CPU")


def test_row_codes_are_within_e4m3_rounding_and_extreme_rows_stay_finite():
    torch.manual_seed(0)
    x = torch.randn(5, 64) * torch.tensor([1e-6, 1.0, 3e4, 1.0, 0.0])[:, None]  # tiny, plain, huge, plain, zero rows
    codes, scale = quantize_rows(x)  # (5, 64), (5, 1)
    back = codes.float() * scale
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    assert torch.isfinite(back).all() and (back[4] == 0).all()
    assert codes.float().abs().amax(dim=1)[:4].eq(FP8_MAX).all()  # each row's largest value takes the top code
    # e4m3 keeps 3 mantissa bits: rounding errs by at most 1/16 of a value (normal range) or half the subnormal step
    err = (back - x).abs()
    assert (err <= x.abs() / 16 + scale * 2.0 ** -10).all()


def test_an_fp8_linear_is_close_to_its_linear_and_each_row_ignores_the_others():
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 48, bias=True, dtype=torch.bfloat16)
    fp8 = Fp8Linear(linear)
    x = torch.randn(2, 17, 64, dtype=torch.bfloat16)  # (B, T, I)
    out = fp8(x)  # (B, T, O)
    want = linear(x)
    assert out.shape == (2, 17, 48) and out.dtype == torch.bfloat16
    assert (out - want).float().norm() / want.float().norm() < 0.08
    alone = torch.stack([fp8(x[0, t:t + 1]) for t in range(17)], dim=0).squeeze(1)  # (T, O), one row at a time
    assert torch.equal(alone, out[0])  # a row's scale is its own: the verify rows are the one-row steps' rows
    loud = x.clone()
    loud[0, 3] *= 1000  # one very large row changes no other row's codes
    assert torch.equal(fp8(loud)[0, 4:], out[0, 4:])


def test_quantize_decoder_replaces_the_layers_linears_only_and_frees_their_weights():
    model = tiny_llama(layers=2).to(torch.bfloat16)
    head = model.lm_head.weight
    before = decoder_linears(model)
    assert quantize_decoder(model, torch.device("cpu")) == len(before) == 14  # 7 per layer
    assert not decoder_linears(model) and all(linear.weight is None for _, _, linear in before)
    assert model.lm_head.weight is head and isinstance(model.model.layers[0].mlp.down_proj, Fp8Linear)
    assert model.model.layers[1].self_attn.q_proj.weight_codes.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("engine", ["transformers", "lean", "steps"])
def test_an_fp8_target_drafts_exactly_what_it_decodes(engine):
    model = tiny_llama(layers=2, scale=4.0).to(torch.bfloat16)
    quantize_decoder(model, torch.device("cpu"))
    target = make_target(model)
    if engine != "transformers":
        target.lean = LeanForward(model)  # its products are the Fp8Linear modules, called as they are
    if engine == "steps":  # the fixed-shape steps CUDA graphs replay, without capture; sdpa attention, as on a GPU
        target.lean = GraphedSteps(LeanForward(model, fixed_order=False), "sim")
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=24, block_size=1))
    drafted, events = generate_all(target, prompt, GenerationConfig(max_new_tokens=24, block_size=4), NgramDrafter())
    assert drafted == plain and len(plain) == 24 and sum(ev.n_accepted for ev in events) > 0


def test_a_layer_quantises_each_input_once_and_gives_the_unshared_outputs(monkeypatch):
    model = tiny_llama(layers=2, scale=4.0).to(torch.bfloat16)
    assert quantize_decoder(model, torch.device("cpu")) == 14
    made = []
    row_codes = Fp8Linear.row_codes
    monkeypatch.setattr(Fp8Linear, "row_codes", lambda self, x: made.append(self) or row_codes(self, x))
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    with torch.inference_mode():
        shared = model(ids).logits  # (1, T, V)
        assert len(made) == 2 * 4  # per layer: q/k/v once, o, gate/up once, down
        assert all(m.shared is None or m.shared.last is None for m in model.modules() if isinstance(m, Fp8Linear))
        assert share_row_codes(model, share=False) == 0
        made.clear()
        alone = model(ids).logits
    assert len(made) == 2 * 7 and torch.equal(shared, alone)  # the same codes: bit-identical logits


def test_shared_codes_follow_the_input_whatever_the_order_of_the_calls():
    model = tiny_llama(layers=1).to(torch.bfloat16)
    quantize_decoder(model, torch.device("cpu"))
    attn = model.model.layers[0].self_attn
    x, y = torch.randn(3, 32, dtype=torch.bfloat16), torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        attn.q_proj(x)  # x's codes kept for k and v
        assert torch.equal(attn.k_proj(y), unshared(attn.k_proj, y))  # another input: its own codes
        assert torch.equal(attn.v_proj(x), unshared(attn.v_proj, x))
    assert attn.v_proj.shared.last is None  # the group's last linear let the entry go


def unshared(linear: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    shared, linear.shared = linear.shared, None
    try:
        return linear(x)
    finally:
        linear.shared = shared
