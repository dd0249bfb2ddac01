"""core.runtime.w8: int8 row-scaled weights multiplied by unquantised activations. The codes and scales, the torch
product the CPU runs, a decoder whose linears are replaced; and the Triton kernel itself through Triton's interpreter
on the CPU (where Triton is installed: .ci/run installs it), against the torch product."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.runtime import w8
from lab.testing import make_target, tiny_llama

ROOT = Path(__file__).resolve().parent.parent


def test_codes_rebuild_each_row_within_half_its_step_and_a_zero_row_stays_zero():
    weight = torch.randn(48, 100, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 48)[:, None]
    weight[5] = 0.0
    codes, scale = w8.quantize(weight)
    assert codes.dtype == torch.int8 and codes.abs().max() <= w8.CODE_MAX and scale.shape == (48,)
    assert ((codes.float() * scale[:, None] - weight).abs() <= scale[:, None] / 2 + 1e-7).all()
    assert (codes[5] == 0).all() and scale[5] == 1.0
    assert (codes.abs().amax(dim=1)[torch.arange(48) != 5] == w8.CODE_MAX).all()  # each row uses its whole range


def test_a_decoder_of_w8_linears_generates_and_reads_one_byte_a_weight():
    model = tiny_llama(vocab_size=64, layers=2, seed=3)
    target = make_target(model)
    linears = sum(1 for m in model.modules() if type(m) is torch.nn.Linear) - 1  # the LM head stays
    assert w8.quantize_decoder(model) == linears
    layers = [m for m in model.modules() if isinstance(m, w8.W8Linear)]
    assert len(layers) == linears and all(m.weight_codes.dtype == torch.int8 for m in layers)
    x = torch.randn(2, 3, layers[0].in_features)
    assert torch.allclose(layers[0](x), w8.reference(x.reshape(6, -1), layers[0].weight_codes, layers[0].weight_scale,
                                                     layers[0].bias).reshape(2, 3, -1))
    out, _ = generate_all(target, [5, 6, 7], GenerationConfig(max_new_tokens=8))
    assert len(out) == 8


KERNEL_CHECK = """
import json, torch
from core.runtime import w8
gen = torch.Generator().manual_seed(1)
rows = {}
for ins, outs, bias in ((300, 70, True), (256, 32, False), (64, 100, True)):
    weight = torch.randn(outs, ins, generator=gen)
    codes, scale = w8.quantize(weight)
    b = torch.randn(outs, generator=gen) if bias else None
    x = torch.randn(20, ins, generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        got = {r: w8.product(xs[:r], codes, scale, b) for r in (1, 3, 17, 20)}
        want = w8.reference(xs, codes, scale, b).float()
        rows[f"{ins}x{outs} {dtype}"] = {
            "err": max((got[r].float() - want[:r]).abs().max().item() for r in got),
            "scale": want.abs().max().item(),
            "rows_alike": all(torch.equal(got[r], got[20][:r]) for r in got),
            "dtype_kept": all(g.dtype == dtype for g in got.values())}
print(json.dumps(rows))
"""


def test_the_triton_kernel_under_the_interpreter_gives_the_torch_product_for_any_row_count():
    pytest.importorskip("triton", reason="Triton is not installed here (.ci/run installs it)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for name, row in rows.items():
        # fp32 tiles: the torch product's own rounding; bf16 outputs: within one bf16 step of it (the interpreter
        # truncates where the GPU rounds)
        tolerance = 1e-5 if "float32" in name else 2 ** -7
        assert row["err"] <= tolerance * max(1.0, row["scale"]), (name, row)
        assert row["rows_alike"] and row["dtype_kept"], (name, row)
