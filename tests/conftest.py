import pytest
import torch

from lab.testing import QWEN3_TEMPLATE, make_target, tiny_llama, tiny_qwen3

torch.set_num_threads(1)  # tiny models: threads only add sync cost, and CI boxes are shared


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs the embedded default target (SmolLM2-135M) on the CPU, or builds "
                                       "a native extension")


@pytest.fixture(scope="session")
def tiny_target():
    return make_target(tiny_llama(vocab_size=64))


@pytest.fixture(scope="session")
def tiny_qwen3_target():
    return make_target(tiny_qwen3(vocab_size=64), template=QWEN3_TEMPLATE, name="tiny-qwen3")


@pytest.fixture(scope="session")
def embedded_target():
    from core.runtime.target import TargetConfig, load_target

    return load_target(TargetConfig())
