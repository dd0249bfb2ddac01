from core.decoding.engine import GenerationConfig, captures, generate_all
from core.drafting.base import LookupHybrid
from core.drafting.policy.config import PolicyConfig
from core.drafting.policy.policy import DraftPolicy
from lab.capture_ab import BASE, arms
from tests.test_engine import Clock, WindowedSlowDrafter


def test_the_arms_capture_as_the_policy_wants_in_every_forward_and_never(tiny_target):
    drafters = arms(LookupHybrid(WindowedSlowDrafter(Clock())))
    assert list(drafters) == ["as needed", BASE, "copies only"]
    gen = GenerationConfig(max_new_tokens=8, verify_cost=(1.0, 1.1), policy=PolicyConfig(plain_probe_every=16))
    layers = drafters["as needed"].feature_layers
    policies = {arm: DraftPolicy.for_run(gen, window=drafters[arm].context_window) for arm in ("as needed", BASE)}
    assert captures(policies["as needed"], layers) == ()  # no round has wanted the network
    assert captures(policies[BASE], layers) == layers
    assert drafters["copies only"].feature_layers == ()
    gen = GenerationConfig(max_new_tokens=24, block_size=4)
    plain, _ = generate_all(tiny_target, [5, 6, 7, 5, 6, 7], gen)
    for drafter in drafters.values():  # every arm is exact
        drafter.main.reset()
        assert generate_all(tiny_target, [5, 6, 7, 5, 6, 7], gen, drafter)[0] == plain
