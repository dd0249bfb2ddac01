"""app/fidelity.py: teacher-forced agreement with transformers in fp32 on the same GGUF, its arithmetic on made-up
logits, and a short run on the embedded default (fp32 agrees everywhere; the q4 default nearly everywhere)."""
import math

import pytest
import torch

from app.fidelity import FidelityConfig, compare, fidelity, pooled


def test_compare_counts_agreement_kl_and_the_references_margin_at_each_disagreement():
    reference = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9], [1.0, 0.0, 0.0]])  # (N=3, V=3)
    ours = torch.tensor([[3.0, 1.0, 0.0], [0.0, 1.0, 1.5], [1.0, 0.0, 0.0]])  # position 1 picks token 2
    row = compare(reference, ours)
    assert (row["positions"], row["agree"]) == (3, 2)
    assert row["margins"] == pytest.approx([0.1])  # the reference's 2.0 against its 1.9 for the token we chose
    assert row["kl"][0] == pytest.approx(0.0, abs=1e-7) and row["kl"][1] > 0
    p, q = reference[1].softmax(-1), ours[1].softmax(-1)
    assert row["kl"][1] == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-5)
    total = pooled([row, compare(reference, reference)])
    assert total["agreement"] == pytest.approx(5 / 6) and total["prompts_agreeing_everywhere"] == 1
    assert total["disagreements"] == 1 and total["margin_max"] == pytest.approx(0.1)
    assert total["margins_over_half_a_logit"] == 0 and math.isfinite(total["kl_mean"])


def test_unknown_precisions_are_refused():
    with pytest.raises(ValueError, match="precisions must be among"):
        FidelityConfig(("heldout_math",), precisions=("int3",))


@pytest.mark.slow
def test_the_embedded_default_against_transformers_in_fp32():
    """Two held-out prompts, 32 tokens each: the fp32 forward is the reference's at every position, the q4 default
    at nearly every one, disagreeing only where the reference itself was near a tie."""
    result = fidelity(FidelityConfig(("heldout_math", "heldout_code"), precisions=("fp32", "q4"), limit=1,
                                     max_new_tokens=32))
    fp32, q4 = result["precisions"]["fp32"], result["precisions"]["q4"]
    assert fp32["agreement"] == 1.0 and fp32["kl_median"] < 1e-6
    assert q4["agreement"] >= 0.9 and q4["kl_median"] < 5e-3 and q4["margin_max"] < 0.5
