import pytest
import torch

from drafter.networks.rotary import rotary, rotate_halves, rotate_pairs


def test_the_two_layouts_are_one_rotation_of_channels_ordered_differently():
    """Interleaved pairs (x[2i], x[2i + 1]) rotated as "pairs" equal the same channels laid out as halves
    (x[i], x[i + Hd/2]) rotated as "halves": one rotary, two layouts."""
    torch.manual_seed(0)
    positions, head_dim = torch.arange(7) * 13, 8
    x = torch.randn(7, 3, head_dim)  # (N, H, Hd)
    halves_order = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    by_pairs = rotate_pairs(x, *rotary(positions, head_dim, 1e4, "pairs"))
    cos, sin = rotary(positions, head_dim, 1e4, "halves")  # (N, Hd)
    by_halves = rotate_halves(x[..., halves_order].transpose(0, 1), cos, sin).transpose(0, 1)  # (H, N, Hd) rotated
    assert torch.allclose(by_pairs[..., halves_order], by_halves, atol=1e-6)
    assert torch.allclose(by_pairs.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps lengths
    assert torch.equal(rotate_pairs(x, *rotary(torch.zeros(7), head_dim, 1e4, "pairs")), x)  # position 0 turns nothing


def test_each_layout_keeps_its_checkpoints_arithmetic_and_an_unknown_one_is_refused():
    x = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    cos, sin = rotary(torch.arange(5), 8, 1e6, "pairs")
    assert cos.dtype == torch.float32 and cos.shape == (5, 1, 4)
    assert rotate_pairs(x, cos, sin).dtype == torch.bfloat16  # computed in fp32, rounded once
    cos, sin = rotary(torch.arange(5), 8, 1e6, "halves")
    assert cos.shape == (5, 8) and rotate_halves(x.transpose(0, 1), cos, sin).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="layout"):
        rotary(torch.arange(5), 8, 1e6, "interleaved")
