from core.decoding.engine import GenerationConfig
from core.drafting.policy.policy import DraftPolicy
from lab.verdict_ab import BASE, arms_for


def test_each_arm_starts_a_state_with_its_own_patience_and_0_40_0_s_has_none():
    arms = arms_for([8, 32])
    assert list(arms) == [BASE, "confident 8", "confident 32"]
    for label, patience in ((BASE, 0), ("confident 8", 8), ("confident 32", 32)):
        state = arms[label]()
        DraftPolicy.for_run(GenerationConfig(), state)  # T = 0: the patience reaches the copies' verdict
        assert state.lookup.confident_rounds == patience
    assert arms["confident 8"]() is not arms["confident 8"]()  # a fresh state at each start
