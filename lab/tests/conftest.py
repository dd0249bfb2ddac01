"""The lab's tests share the product tests' fixtures (tests/conftest.py)."""
from tests.conftest import embedded_target, pytest_configure, tiny_qwen3_target, tiny_target  # noqa: F401
