"""core/runtime/csrc/sampling.cpp: the native kernels compute what torch's ops do (core.verification.sampling runs every
test of tests/test_sampling.py through both)."""
import pytest
import torch

from core.verification import sampling
from core.verification.sampling import greedy_tokens

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
def test_a_plain_step_at_t_above_0_draws_what_target_probs_then_sample_draw(module, dtype):
    """verify_logits with no draft (a plain step, one native call) draws the token that the distribution and
    the draw made apart do, from the same generator state, at every temperature; with top-p or top-k too."""
    gen = torch.Generator().manual_seed(6)
    logits = (torch.randn(1, 49152, generator=gen) * 3).to(dtype)  # (1, V)
    for config in (sampling.SamplingConfig(0.3), sampling.SamplingConfig(1.0), sampling.SamplingConfig(1.5),
                   sampling.SamplingConfig(0.7, top_p=0.9), sampling.SamplingConfig(0.7, top_k=5)):
        fused, apart = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        draws = [sampling.verify_logits([], logits, None, config, fused) for _ in range(200)]
        assert all(verdict.n_accepted == 0 for verdict in draws)
        expected = [sampling.sample(sampling.target_probs(logits[0], config), apart) for _ in range(200)]
        assert [verdict.next_token for verdict in draws] == expected and len(set(expected)) > 1


def reference_verify_copy(module, logits, drafted, temperature, u):
    """The rejection sampling verify_copy does, in torch from the kernels' softmax, with the same uniforms (2K + 1,)."""
    for slot, token in enumerate(drafted):
        p_slot = module.softmax_rows(logits[slot : slot + 1], 1 / temperature)[0]  # (V,)
        if u[2 * slot] < p_slot[token]:
            continue
        redraw = p_slot.clone()
        redraw[token] = 0.0
        cdf = redraw.double().cumsum(-1)  # (V,)
        return slot, int(torch.searchsorted(cdf, u[2 * slot + 1] * cdf[-1:], right=True)[0])
    cdf = module.softmax_rows(logits[-1:], 1 / temperature)[0].double().cumsum(-1)  # (V,)
    return len(drafted), int(torch.searchsorted(cdf, u[-1] * cdf[-1:], right=True)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_verify_copy_keeps_and_redraws_what_rejection_sampling_does_from_the_same_uniforms(module, dtype):
    """A copied draft's native rejection sampling: slot k kept while u[2k] < p_k(token), the first rejected one
    redrawn from p_k without it with u[2k + 1], the bonus token from p_K with u[2K]; drafts of likely and unlikely
    tokens, so every slot and the bonus are reached."""
    gen = torch.Generator().manual_seed(8)
    logits = (torch.randn(4, 300, generator=gen) * 2).to(dtype)  # (K + 1, V), K = 3
    logits[0, 5] = logits[1, 6] = logits[2, 7] = 6.0  # a likely draft 5, 6, 7
    outcomes = set()
    for drafted in ([5, 6, 7], [5, 9, 7], [11, 6, 7]):
        for temperature in (0.5, 1.0):
            for _ in range(300):
                u = torch.rand(7, generator=gen, dtype=torch.float64)
                ours = module.verify_copy(logits, drafted, 1 / temperature, u)
                assert tuple(ours) == reference_verify_copy(module, logits, drafted, temperature, u)
                outcomes.add(ours[0])
    assert outcomes == {0, 1, 2, 3}
