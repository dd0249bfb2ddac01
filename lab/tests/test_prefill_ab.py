import pytest
import torch

from core.runtime.lean import LeanForward
from lab.prefill_ab import compare
from lab.testing import tiny_qwen3
from tests.test_lean import lean_target


def test_both_prefills_are_timed_for_every_prompt_length():
    from core.runtime import native

    module, why = native.load()
    if module is None:
        pytest.skip(why)
    target = lean_target(tiny_qwen3(vocab_size=64, layers=2), "q4", torch.bfloat16)
    target.lean = LeanForward(target.model, weights="q4", native=module, native_prefill=False)
    out = compare(target, [20, 40], repeats=1)
    assert set(out) == {"native", "op by op"}
    assert all(set(per) == {20, 40} and all(ms > 0 for ms in per.values()) for per in out.values())
