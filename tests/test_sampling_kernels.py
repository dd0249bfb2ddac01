"""core/csrc/sampling.cpp: the native kernels compute what torch's ops do (core.sampling runs every test of
tests/test_sampling.py through both)."""
import pytest
import torch

from core import sampling
from core.sampling import greedy_tokens

INF = float("inf")


@pytest.fixture(scope="module")
def module():
    kernels = sampling.kernels()
    if kernels is None:
        pytest.skip("the native sampling kernels cannot be built here")
    return kernels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_argmax_and_softmax_agree_with_torch(module, dtype):
    """The kernels compute what torch's ops do: the first maximum (ties, -inf, a row's tail past whole vectors), and
    softmax(x / T) to float rounding, with exact zeros where torch's are (masked logits) and where torch's are below
    exp(-87) (simd.h's exp stops there)."""
    gen = torch.Generator().manual_seed(4)
    for width in (1, 16, 37, 1000, 49152):
        logits = (torch.randn(3, width, generator=gen) * 4).to(dtype)  # (3, width)
        logits[1, width // 2] = logits[1, -1] = 50.0  # a tie: the first wins
        logits[2, : width // 2] = -INF
        assert module.argmax_rows(logits) == logits.float().argmax(-1).tolist() == greedy_tokens(logits)
        for temperature in (0.05, 0.7, 1.0):
            ours = module.softmax_rows(logits, 1 / temperature)  # (3, width) fp32
            theirs = torch.softmax(logits.float() / temperature, -1)
            assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-30)
            assert bool((ours[theirs == 0] == 0).all()) and bool((theirs[ours == 0] < 2e-38).all())
            assert bool((ours[2, : width // 2] == 0).all())


def test_native_sampling_draws_what_the_cumulative_sum_does_from_the_same_uniforms(module):
    """CDF inversion by blocks (the native kernel) picks the token torch.searchsorted picks on float64 cumulative
    sums for the same uniform, across a vocabulary as wide as the embedded default's, with a token excluded too."""
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(4, 49152, generator=gen) * 3, -1)  # (4, V)
    probs[3, 100:] = 0.0  # mass in the first block-and-a-half only
    for excluded in ([], [7, 0, 49151, 50]):
        masked = probs.clone()
        for row, token in enumerate(excluded):
            masked[row, token] = 0.0
        cdf = masked.double().cumsum(-1)  # (4, V)
        for _ in range(500):
            u = torch.rand(4, generator=gen, dtype=torch.float64)  # (4,)
            expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
            assert torch.equal(module.sample_rows(probs, u, excluded), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sample_logits_draws_what_target_probs_then_sample_draw(module, dtype):
    """A plain step's one native call (core.sampling.sample_logits) draws the token that the distribution and the draw
    made apart do, from the same generator state, at every temperature; with top-p or top-k it takes that path."""
    gen = torch.Generator().manual_seed(6)
    logits = (torch.randn(1, 49152, generator=gen) * 3).to(dtype)  # (1, V)
    for config in (sampling.SamplingConfig(0.3), sampling.SamplingConfig(1.0), sampling.SamplingConfig(1.5),
                   sampling.SamplingConfig(0.7, top_p=0.9), sampling.SamplingConfig(0.7, top_k=5)):
        fused, apart = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        draws = [sampling.sample_logits(logits, config, fused) for _ in range(200)]
        assert draws == [sampling.sample(sampling.target_probs(logits[0], config), apart) for _ in range(200)]
        assert len(set(draws)) > 1
