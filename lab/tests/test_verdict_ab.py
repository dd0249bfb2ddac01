from dataclasses import replace

from core.decoding.engine import GenerationConfig
from core.drafting.policy.config import DEFAULTS
from core.drafting.policy.policy import DraftPolicy
from core.drafting.policy.state import PolicyState
from lab.verdict_ab import BASE, arms_for


def test_each_arm_sets_its_own_patience_and_0_40_0_s_has_none():
    arms = arms_for([8, 32])
    assert list(arms) == [BASE, "confident 8", "confident 32"]
    for label, patience in ((BASE, 0), ("confident 8", 8), ("confident 32", 32)):
        state = PolicyState()
        DraftPolicy.for_run(GenerationConfig(policy=replace(DEFAULTS, **arms[label])), state)
        assert state.copies.patience == patience  # T = 0: the patience reaches the copies' verdict
