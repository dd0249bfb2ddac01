"""The frozen drafting view: the same per-slot distributions as the network's own forward, from kept parts (its
products in fp32 here, so that the two agree to float rounding; tests/test_native_trunk.py checks the 8-bit ones)."""
import pytest
import torch

from core.verification.sampling import SamplingConfig
from drafter.runtime.drafters import FlowDrafter, build_net
from drafter.runtime.drafting import BlockSampler
from drafter.runtime.frozen import CachedContext, FrozenDraftNet
from tests.test_drafter import tiny_cfg


def random_net(kind: str, target, vocab_ids, seed: int = 0):
    torch.manual_seed(seed)
    net = build_net(tiny_cfg(kind, 16, target.model.config.hidden_size), target, vocab_ids)
    for p in net.parameters():  # leave adaLN-Zero and zero biases: every path and every bias matters here
        torch.nn.init.normal_(p, std=0.3)
    return net.eval()


def eager_context(drafter: FlowDrafter, feats: torch.Tensor, anchor: int):
    """The context the network reads from scratch: the last W positions through ctx_in, the anchor, positions."""
    net, window = drafter.net, drafter.net.cfg.context_window
    rows = net.ctx_in(feats[-window:])[None]  # (1, n, D)
    anchor_embed = drafter.input_embeddings[anchor].float()[None]  # (1, D_t)
    return net.context_projected(rows, torch.ones(rows.shape[:2], dtype=torch.bool), anchor_embed)


@pytest.mark.parametrize("kind, mode", [("flashmap", "flowmap"), ("dflash", "dflash")])
def test_frozen_view_drafts_what_the_network_drafts(kind, mode, tiny_target):
    vocab_ids = torch.arange(16)
    vocab_ids[0] = -1
    net = random_net(kind, tiny_target, vocab_ids)
    drafter = FlowDrafter(net, vocab_ids, tiny_target, mode, products="fp32")
    assert isinstance(drafter.frozen, FrozenDraftNet)
    feats = torch.randn(13, 2 * tiny_target.model.config.hidden_size)
    # the window (8) slides over rounds of different sizes; the maps must follow it
    for start, stop in [(0, 3), (3, 4), (4, 9), (9, 13)]:
        drafter.extend(list(range(start, stop)), feats[start:stop])
        cached, mask = drafter.context(5)
        assert isinstance(cached, CachedContext) and cached.shape == (1, min(stop, 8) + 1, net.cfg.d_model)
        with torch.no_grad():
            ctx, eager_mask = eager_context(drafter, feats[:stop], 5)
            noises = [(torch.zeros(1, 4, net.cfg.target_hidden),), (torch.randn(1, 4, net.cfg.target_hidden),)]
            for noise in (noises if mode == "flowmap" else [()]):
                want = BlockSampler(net, mode)._from_noise(ctx, eager_mask, 4, noise)  # (1, K, V)
                got = drafter.sampler._from_noise(cached, mask, 4, noise)
                assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_frozen_view_follows_weight_updates_and_batches_copies(tiny_target):
    vocab_ids = torch.arange(16)
    vocab_ids[0] = -1
    net = random_net("flashmap", tiny_target, vocab_ids)
    drafter = FlowDrafter(net, vocab_ids, tiny_target, "flowmap", products="fp32")
    feats = torch.randn(6, 2 * tiny_target.model.config.hidden_size)
    drafter.extend(list(range(6)), feats)
    drafter.propose(3, 4, SamplingConfig(), torch.Generator().manual_seed(0))  # builds the kept parts
    with torch.no_grad():  # a training step, as far as the kept parts know
        for block in net.blocks:
            block.ada.weight.add_(0.5)
            block.cross_attn.k.bias.add_(1.0)
            block.cross_attn.v.weight.mul_(0.5)
    drafter.reset()
    drafter.extend(list(range(6)), feats)
    cached, mask = drafter.context(3)
    ctx, eager_mask = eager_context(drafter, feats, 3)
    s, t = torch.zeros(1), torch.ones(1)
    x = net.noise_input(torch.zeros(1, 4, net.cfg.target_hidden), t)
    with torch.no_grad():
        assert torch.allclose(drafter.frozen.probs(x, s, t, cached, mask), net.probs(x, s, t, ctx, eager_mask),
                              atol=1e-5)
        copies = cached.repeat_interleave(3)  # best-of-M and trees draft M copies of one context in one pass
        assert copies.shape[0] == 3
        batched = drafter.frozen.probs(x.expand(3, -1, -1), s.expand(3), t.expand(3), copies, mask.expand(3, -1))
        assert torch.allclose(batched, net.probs(x, s, t, ctx, eager_mask).expand(3, -1, -1), atol=1e-5)


def test_an_unwatched_view_keeps_what_it_built(tiny_target):
    """watch_weights=False (a loaded checkpoint, whose weights never change) skips the per-call weight check: the
    view keeps drafting from the weights it was built from, even after they change."""
    vocab_ids = torch.arange(16)
    vocab_ids[0] = -1
    net = random_net("flashmap", tiny_target, vocab_ids)
    drafter = FlowDrafter(net, vocab_ids, tiny_target, "flowmap", products="fp32", watch_weights=False)
    feats = torch.randn(6, 2 * tiny_target.model.config.hidden_size)
    drafter.extend(list(range(6)), feats)
    before = drafter.propose(3, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)).q_draft
    with torch.no_grad():
        for block in net.blocks:
            block.cross_attn.v.weight.mul_(0.5)
    drafter.reset()
    drafter.extend(list(range(6)), feats)
    after = drafter.propose(3, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)).q_draft
    assert torch.equal(before, after)
    watched = FlowDrafter(net, vocab_ids, tiny_target, "flowmap", products="fp32")
    watched.extend(list(range(6)), feats)
    fresh = watched.propose(3, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)).q_draft
    assert not torch.allclose(fresh, before)
