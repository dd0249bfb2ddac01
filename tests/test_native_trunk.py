"""drafter.runtime.native_trunk: the DiT trunk as one native call computes what DraftNet.trunk computes (up to float
rounding; where the build multiplies 8-bit codes, what it computes with its weights and each product's inputs so
rounded), for any width, head count, block and context size; where it cannot be built the frozen view keeps the
Python trunk."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

from core.runtime import cpu_linear, native
from drafter.config import DrafterConfig
from drafter.networks.dit import DraftNet
from drafter.runtime import frozen as frozen_module
from drafter.runtime import native_trunk
from drafter.runtime.frozen import CachedContext, FrozenDraftNet
from tests.test_native import LANE_BUILDS, lane_build_flags


@pytest.fixture(scope="module")
def module():
    built, why = native_trunk.load()
    if built is None:
        pytest.skip(why)
    return built


def random_net(d_model=32, heads=2, layers=2, block=4, hidden=24, vocab=40, window=8, seed=0) -> DraftNet:
    torch.manual_seed(seed)
    cfg = DrafterConfig(kind="flashmap", block_size=block, d_model=d_model, n_layers=layers, n_heads=heads,
                        mlp_ratio=2, feature_layers=(1, 2), target_hidden=hidden, draft_vocab=vocab,
                        context_window=window)
    net = DraftNet(cfg, torch.randn(vocab, hidden), torch.randn(vocab, hidden))
    for p in net.parameters():  # past adaLN-Zero's zeros: every path and every bias matters here
        torch.nn.init.normal_(p, std=0.3)
    return net.eval()


def as_multiplied(module, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (R, I), weight (N, I)) as the module's products multiply them: fp32 as they are; 8-bit (module.PRODUCTS):
    the weight's Q8_0 codes times their scales and each row's inputs rounded per block of 32, zero-padded to whole
    blocks -> (R, I'), (N, I')."""
    if module.PRODUCTS != "8-bit":
        return x, weight
    rows = cpu_linear.as_multiplied(F.pad(x, (0, -x.shape[-1] % cpu_linear.Q4_GROUP)), "8-bit")  # (R, I')
    return rows, cpu_linear.unpack_q8_blocks(native_trunk.pack(module, weight), "bytes")[: weight.shape[0]]


@pytest.mark.parametrize("rows, inner, outer", [(1, 5, 3), (16, 256, 256), (19, 24, 40), (8, 576, 100), (3, 17, 33)])
def test_the_product_is_torchs_linear_for_any_shape(module, rows, inner, outer):
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(outer, inner), torch.randn(outer), torch.randn(rows, inner)
    got = module.linear(x, native_trunk.pack(module, weight), bias)
    assert got.shape == (rows, outer)
    assert torch.allclose(got, F.linear(*as_multiplied(module, x, weight), bias), atol=1e-4, rtol=1e-4)
    if module.PRODUCTS == "8-bit":  # the rounding moves each output by about a percent of its inputs' scale
        assert torch.allclose(got, F.linear(x, weight, bias), atol=0.05 * inner**0.5, rtol=0.05)


def as_the_module_multiplies(net: DraftNet, module) -> DraftNet:
    """A copy of net whose trunk's linear layers (those NativeTrunk packs; the time conditioning stays torch's) compute
    what the module's products compute (as_multiplied)."""
    net = copy.deepcopy(net)
    per_block = lambda b: (b.self_attn.q, b.self_attn.k, b.self_attn.v, b.self_attn.o,  # noqa: E731
                           b.cross_attn.q, b.cross_attn.o, b.mlp[0], b.mlp[2])
    trunk_layers = [net.slot_in, net.out, *(layer for b in net.blocks for layer in per_block(b))]
    for layer in trunk_layers:
        layer.forward = lambda x, layer=layer: F.linear(  # noqa: E731
            *as_multiplied(module, x.reshape(-1, x.shape[-1]), layer.weight), layer.bias).view(*x.shape[:-1], -1)
    return net


def kv_layers(net: DraftNet) -> list:
    return [layer for b in net.blocks for layer in (b.cross_attn.k, b.cross_attn.v)]


def python_trunk(net: DraftNet, slot_input, s, t, maps: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        context = CachedContext(maps, tuple(kv_layers(net)), batch=slot_input.shape[0])
        return net.trunk(slot_input, net.conditioning(s, t), context, None)


@pytest.mark.parametrize("d_model, heads, block, batch, context",
                         [(32, 2, 4, 1, 9), (48, 3, 5, 2, 1), (64, 1, 16, 3, 20), (256, 4, 16, 1, 129)])
def test_the_native_trunk_computes_the_python_trunk(module, d_model, heads, block, batch, context):
    net = random_net(d_model=d_model, heads=heads, block=block, window=max(context, 8))
    layers = kv_layers(net)
    maps = torch.randn(context, len(layers) * d_model)  # (C, 2L*D)
    slot_input = torch.randn(batch, block, net.cfg.target_hidden)  # (B, K, D_t)
    s, t = torch.full((batch,), 0.25), torch.full((batch,), 0.75)
    trunk = native_trunk.NativeTrunk(net, module)
    with torch.no_grad():
        got = trunk(slot_input, trunk.modulations(net.conditioning(s, t)), maps)
    want = python_trunk(as_the_module_multiplies(net, module), slot_input, s, t, maps)
    assert got.shape == want.shape
    assert_computes(module, got, want)


def assert_computes(module, got: torch.Tensor, want: torch.Tensor) -> None:
    """got equals want up to float rounding; with 8-bit products, up to an input code that a rounding difference
    moved by one step somewhere upstream (a percent of the outputs' scale at most, where a wrong product is off by
    their whole scale)."""
    if module.PRODUCTS != "8-bit":
        assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()
    else:
        assert (got - want).abs().max() <= 1e-2 * want.abs().max(), (got - want).abs().max()


def test_the_frozen_view_falls_back_to_the_python_trunk_with_one_line(monkeypatch, caplog):
    net = random_net()
    monkeypatch.setattr(native_trunk, "load", lambda: (None, "no compiler here"))
    monkeypatch.setattr(frozen_module, "_told", set())
    view = FrozenDraftNet(net)
    with caplog.at_level("WARNING"):
        view._refresh()
        FrozenDraftNet(net)._refresh()
    assert view.native is None
    assert sum("no compiler here" in r.message for r in caplog.records) == 1
    layers = tuple(view.kv_layers)
    maps = torch.randn(5, len(layers) * net.cfg.d_model)
    x, s, t = torch.randn(1, 4, net.cfg.target_hidden), torch.zeros(1), torch.ones(1)
    with torch.no_grad():
        want = python_trunk(net, x, s, t, maps) @ net.head_matrix().T
    got = view(x, s, t, CachedContext(maps, layers), None)
    assert torch.allclose(got, want, atol=1e-5)


def test_blocks_at_different_times_take_the_python_trunk(module):
    """The native trunk reads one time pair's modulations; a batch mixing time pairs is drafted op by op."""
    net = random_net()
    view = FrozenDraftNet(net)
    view._refresh()
    assert view.native is not None
    layers = tuple(view.kv_layers)
    maps = torch.randn(6, len(layers) * net.cfg.d_model)
    x, s, t = torch.randn(2, 4, net.cfg.target_hidden), torch.zeros(2), torch.tensor([0.5, 1.0])
    got = view(x, s, t, CachedContext(maps, layers, batch=2), None)
    with torch.no_grad():
        hidden = python_trunk(net, x, s, t, maps).flatten(0, 1)  # (B*K, D_t)
        want = F.linear(*as_multiplied(module, hidden, net.head_matrix())).view(got.shape)  # the head's product
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("lanes", sorted(LANE_BUILDS))
def test_the_builds_of_other_cpus_compute_it_too(lanes, monkeypatch):
    """The trunk as another CPU builds it (LANE_BUILDS)."""
    monkeypatch.setattr(native, "CFLAGS", (*native.CFLAGS, *lane_build_flags(lanes)))
    portable, why = native_trunk.load()
    assert portable is not None, why
    net = random_net(d_model=48, heads=3, block=5)
    layers = kv_layers(net)
    maps, x = torch.randn(7, len(layers) * 48), torch.randn(2, 5, net.cfg.target_hidden)
    s, t = torch.zeros(2), torch.ones(2)
    trunk = native_trunk.NativeTrunk(net, portable)
    with torch.no_grad():
        got = trunk(x, trunk.modulations(net.conditioning(s, t)), maps)
    assert_computes(portable, got, python_trunk(as_the_module_multiplies(net, portable), x, s, t, maps))
