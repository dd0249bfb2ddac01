import pytest
import torch

from core.verification import sampling
from core.verification.sampling import (
    SamplingConfig,
    residual,
    sample,
    sample_rows,
    target_probs,
    verify_greedy,
    verify_sampled,
)

INF = float("inf")


@pytest.fixture(params=["native", "torch"], autouse=True)
def kernels_or_torch(request, monkeypatch):
    """Every test here runs through the native kernels (core/runtime/csrc/sampling.cpp) and through torch's ops."""
    if request.param == "torch":
        monkeypatch.setattr(sampling, "kernels", lambda: None)
    elif sampling.kernels() is None:
        pytest.skip("the native sampling kernels cannot be built here")
    return request.param


def test_greedy_probs_are_one_hot_of_argmax():
    logits = torch.tensor([[1.0, 5.0, -INF], [1e9, -1e9, 0.0]])
    probs = target_probs(logits, SamplingConfig(0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_top_k_one_and_tiny_top_p_reduce_to_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    argmax = torch.nn.functional.one_hot(logits.argmax(-1), 50).float()
    assert torch.equal(target_probs(logits, SamplingConfig(1.0, top_k=1)), argmax)
    assert torch.equal(target_probs(logits, SamplingConfig(1.0, top_p=1e-6)), argmax)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = target_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), SamplingConfig(1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_sampling_config_rejects_bad_values():
    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-2)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_verify_greedy_prefix_and_bonus():
    logits = torch.full((4, 6), -INF)
    for slot, tok in enumerate([2, 3, 4, 5]):
        logits[slot, tok] = 0.0
    assert verify_greedy(torch.tensor([2, 3, 4]), logits).__dict__ == {"n_accepted": 3, "next_token": 5}
    assert verify_greedy(torch.tensor([2, 0, 4]), logits).__dict__ == {"n_accepted": 1, "next_token": 3}
    assert verify_greedy(torch.tensor([1, 3, 4]), logits).__dict__ == {"n_accepted": 0, "next_token": 2}
    assert verify_greedy(torch.tensor([], dtype=torch.long), logits[:1]).__dict__ == {"n_accepted": 0, "next_token": 2}


def test_residual_removes_draft_mass():
    p_target = torch.tensor([0.5, 0.5, 0.0])
    assert residual(p_target, torch.tensor([1.0, 0.0, 0.0])).tolist() == [0.0, 1.0, 0.0]
    assert residual(p_target, p_target).tolist() == p_target.tolist()  # p == q: never reached, stays valid


def test_draft_equal_to_target_is_always_accepted():
    gen = torch.Generator().manual_seed(0)
    p_target = torch.softmax(torch.randn(5, 10, generator=gen), -1)
    for _ in range(200):
        draft = torch.multinomial(p_target[:4], 1, generator=gen)[:, 0]
        assert verify_sampled(draft, p_target, p_target[:4], gen).n_accepted == 4


def test_token_impossible_under_target_is_always_rejected_and_never_resampled():
    gen = torch.Generator().manual_seed(1)
    p_target = torch.tensor([[0.0, 0.7, 0.3], [0.2, 0.3, 0.5]])
    q_draft = torch.tensor([[1.0, 0.0, 0.0]])
    for _ in range(200):
        verdict = verify_sampled(torch.tensor([0]), p_target, q_draft, gen)
        assert verdict.n_accepted == 0 and verdict.next_token != 0
    # deterministic drafter (q = None) on a token with p = 1 is always accepted
    sure = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert verify_sampled(torch.tensor([1]), sure, None, gen).__dict__ == {"n_accepted": 1, "next_token": 0}


@pytest.mark.parametrize("q_row", [[0.98, 0.01, 0.01], [0.0, 0.0, 1.0], None])
def test_first_token_distribution_equals_target(q_row):
    """Whatever the proposal, the committed first token is distributed as p_target (Leviathan et al.)."""
    gen = torch.Generator().manual_seed(2)
    p_target = torch.tensor([[0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]])
    counts = torch.zeros(3)
    n = 20000
    for _ in range(n):
        if q_row is None:  # deterministic drafter always proposing token 0
            draft, q_draft = torch.tensor([0]), None
        else:
            q_draft = torch.tensor([q_row])
            draft = torch.multinomial(q_draft, 1, generator=gen)[:, 0]
        verdict = verify_sampled(draft, p_target, q_draft, gen)
        first = int(draft[0]) if verdict.n_accepted else verdict.next_token
        counts[first] += 1
    assert torch.allclose(counts / n, p_target[0], atol=0.015)


def test_sample_rows_draws_each_row_from_its_own_distribution_and_never_a_zero():
    """Rows sampled together each follow their own (unnormalised) distribution; a probability of 0 is never drawn,
    even at the ends of the vocabulary or beside a token that takes almost all the mass."""
    gen = torch.Generator().manual_seed(3)
    probs = torch.tensor([[0.0, 2.0, 6.0, 0.0],  # unnormalised: 1/4, 3/4
                          [1e-30, 0.0, 0.0, 1.0],
                          [0.0, 0.0, 0.0, 5.0]])  # (3, 4)
    draws = torch.stack([sample_rows(probs, gen) for _ in range(20000)])  # (n, 3)
    assert draws.shape == (20000, 3) and draws.dtype == torch.long
    assert abs(float((draws[:, 0] == 2).float().mean()) - 0.75) < 0.015
    assert set(draws[:, 0].tolist()) == {1, 2}
    assert set(draws[:, 1].tolist()) <= {0, 3} and set(draws[:, 2].tolist()) == {3}


def test_top_p_keeps_equal_probabilities_together_and_a_row_alike_alone_or_in_a_batch():
    """Ties at the edge of the top-p set are kept or dropped together (no sort order decides), the set is the one a
    full sort gives, and a row's set does not depend on the rows verified beside it (the top k grows for all rows)."""
    from core.verification.sampling import nucleus

    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2, 0.0]])
    assert torch.allclose(nucleus(probs, 0.5), probs)  # 0.4 above each 0.2: all three kept, not one or two
    assert nucleus(probs, 0.4).tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    gen = torch.Generator().manual_seed(0)
    peaked = torch.softmax(torch.randn(1, 5000, generator=gen) * 8, -1)  # its set within the first top k
    flat = torch.softmax(torch.randn(1, 5000, generator=gen) * 0.1, -1)  # its set needs thousands of tokens
    both = nucleus(torch.cat([peaked, flat]), 0.9)
    assert torch.equal(both[0] > 0, nucleus(peaked, 0.9)[0] > 0) and torch.equal(both[1] > 0, nucleus(flat, 0.9)[0] > 0)
    order = torch.sort(flat[0], descending=True).values
    assert int((both[1] > 0).sum()) == int(((order.cumsum(0) - order) < 0.9).sum())


def test_sampling_with_a_token_excluded_never_draws_it_and_keeps_the_rest_in_proportion():
    gen = torch.Generator().manual_seed(6)
    probs = torch.tensor([0.5, 0.3, 0.0, 0.2])
    draws = [sample(probs, gen, excluded=0) for _ in range(20000)]
    assert set(draws) == {1, 3}
    assert abs(draws.count(1) / len(draws) - 0.6) < 0.015


def test_verify_sampled_rows_asks_for_the_rows_up_to_the_first_rejection_only():
    gen = torch.Generator().manual_seed(7)

    def verify(draft: list[int], p_target: torch.Tensor):
        asked = []
        verdict = sampling.verify_sampled_rows(torch.tensor(draft), lambda slot: asked.append(slot) or p_target[slot],
                                               None, gen)
        return verdict.__dict__, asked

    unlikely = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])  # token 0 has p = 0: rejected
    assert verify([0, 1], unlikely) == ({"n_accepted": 0, "next_token": 2}, [0])
    sure = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert verify([1, 0], sure) == ({"n_accepted": 2, "next_token": 2}, [0, 1, 2])


def test_top_probs_are_each_rows_first_argmax_and_its_softmax_probability():
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)) * 4
    logits[1, 10] = logits[1, 700] = logits[1].max() + 1  # a tie: the first wins, as argmax's
    logits[2, 999] = 50.0  # in the row's tail, past its whole vectors
    for rows in (logits, logits.bfloat16()):
        ids, probs = sampling.top_probs(rows)
        assert ids.tolist() == rows.float().argmax(-1).tolist() and ids[1] == 10 and ids[2] == 999
        want = rows.float().softmax(-1).max(-1).values
        assert probs.dtype == torch.float32 and torch.allclose(probs, want, rtol=1e-5, atol=0)
