"""core.runtime.native: the compiled decode step is keyed by what it depends on, and anything that stops it from
building leaves a reason and the Python path, never a crash."""
from __future__ import annotations

import pytest
import torch

from core.runtime import native
from lab.testing import make_target, tiny_llama


def test_the_build_key_follows_the_source_and_the_cpu(monkeypatch, tmp_path):
    key = native.build_key()
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset({"sse2"}))
    assert native.build_key() != key
    monkeypatch.undo()
    source = tmp_path / "step.cpp"
    source.write_text(native.LEAN_STEP.source.read_text() + "\n// changed\n")
    monkeypatch.setattr(native, "LEAN_STEP", native.Extension("flashmap_lean_step", source, "the step"))
    assert native.build_key() != key
    monkeypatch.undo()
    header = tmp_path / "extra.h"
    header.write_text("// a shared header\n")
    monkeypatch.setattr(native, "headers", lambda: [*native.CSRC.glob("*.h"), header])
    assert native.build_key() != key


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("FLASHMAP_NATIVE", "0")
    module, why = native.load()
    assert module is None and "FLASHMAP_NATIVE=0" in why


def test_a_build_that_fails_says_why(monkeypatch, tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    monkeypatch.setenv("FLASHMAP_NATIVE_DIR", str(tmp_path / "builds"))
    module, why = native.load(native.Extension("broken", source, "the broken kernel"))
    assert module is None and why.startswith("could not build the broken kernel")


def test_a_built_step_is_imported_without_the_builder_and_a_dead_builds_lock_is_cleared(monkeypatch, tmp_path):
    import os
    import time

    from torch.utils import cpp_extension

    module, why = native.load()
    if module is None:
        pytest.skip(why)
    native._loaded.clear()

    def no_builder(**kwargs):
        raise AssertionError("rebuilt what was built")

    monkeypatch.setattr(cpp_extension, "load", no_builder)
    assert native.load()[0] is not None  # imported from the earlier build
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - native.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    native.clear_stale_lock(tmp_path)
    assert not lock.exists()
    lock.touch()  # a fresh lock: another build may hold it, so it is waited for, not removed, within the wait
    start = time.monotonic()
    native.clear_stale_lock(tmp_path, wait_s=1.0)
    assert not lock.exists() and time.monotonic() - start >= 0.9


def test_load_target_falls_back_to_the_python_step_with_one_line(monkeypatch, capsys):
    from core.runtime import target as target_module

    monkeypatch.setattr(native, "load", lambda: (None, "no compiler here"))
    tiny = make_target(tiny_llama(vocab_size=64).to(torch.bfloat16))
    module = target_module._native_step(tiny)
    assert module is None and tiny.extra["native_step"] == "no compiler here"
    assert capsys.readouterr().out.count("no compiler here") == 1


# the builds other CPUs compile (core/runtime/csrc/simd.h, products.h, lean_step.cpp), each made here by turning
# features off: AVX2 lanes and integer products (no AVX-512), plain arrays and fp32 products (no AVX2 either), AVX-512
# lanes with AVX2's integer products (AVX-512 without VNNI or BF16), bf16 pair products (AVX512-BF16 without VNNI). Each
# with the CPU flags without which it is this machine's own build or another one's here (then skipped)
LANE_BUILDS = {"avx2": (("avx512f",), ("-mno-avx512f",)), "arrays": (("avx2",), ("-mno-avx512f", "-mno-avx2")),
               "avx512-integer": (("avx512_vnni",), ("-mno-avx512vnni", "-mno-avx512bf16")),
               "avx512-bf16": (("avx512_vnni", "avx512_bf16"), ("-mno-avx512vnni",))}


def lane_build_flags(lanes: str) -> tuple[str, ...]:
    """The compiler flags of one of LANE_BUILDS, or skip the test where that build is this machine's own."""
    from core.runtime.threads import cpu_flags

    needs, flags = LANE_BUILDS[lanes]
    missing = [flag for flag in needs if flag not in cpu_flags()]
    if missing:
        pytest.skip(f"this CPU has no {', '.join(missing)}: turning features off builds what another test runs here")
    return flags


def rounding_probe() -> torch.Tensor:
    """fp32 values whose bf16 rounding is easy to get wrong: ties to even both ways, NaN, infinities, signed zeros,
    denormals, the largest finite floats (which round to infinity), and random values of every magnitude; 37 of them
    so that the last vector is partial."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001, 0x00008000, 0x7F7FFFFF,
                         0xFF7FFFFF, 0x00000001, 0x80000001, 0x7FC00001, 0xFFFFFFFF], dtype=torch.int64)
    special = ties.to(torch.int32).view(torch.float32)  # bit patterns: (wrapping to int32 keeps the bits)
    named = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    random = torch.randn(20, generator=torch.Generator().manual_seed(0)) * torch.logspace(-30, 30, 20)
    return torch.cat([special, named, random])


def test_the_steps_bf16_rounding_is_torchs():
    """Every bf16 result of the step is rounded by simd::store: to the nearest even as torch rounds, NaN to NaN."""
    module, why = native.load()
    if module is None:
        pytest.skip(f"no native step here: {why}")
    assert_rounds_as_torch(module)


def assert_rounds_as_torch(module) -> None:
    """module.round_bf16 gives torch's bf16 bits for every number of rounding_probe() and a NaN for each NaN (torch's
    own vector and scalar conversions write NaN with different bits)."""
    x = rounding_probe()
    ours, torchs = module.round_bf16(x), x.bfloat16()
    numbers = ~x.isnan()
    assert torch.equal(ours[numbers].view(torch.int16), torchs[numbers].view(torch.int16))
    assert ours[~numbers].isnan().all()


def assert_same_integer_products(first, second) -> None:
    """Two builds' q4 and q8 products of the same weights and rows, each packed in its build's layout, are equal."""
    from core.runtime.cpu_linear import Int4Linear, Int8Linear

    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 48)
    x = torch.randn(9, 96).bfloat16()
    with torch.no_grad():
        for make in (lambda module: Int4Linear(linear, native=module), lambda module: Int8Linear(linear, module)):
            assert torch.equal(make(first)(x), make(second)(x))


@pytest.mark.slow
@pytest.mark.parametrize("lanes", sorted(LANE_BUILDS))
def test_the_builds_of_other_cpus_are_exact_too(lanes, monkeypatch):
    """The step as another CPU builds it (LANE_BUILDS): the q4 forward through it is batch-invariant and agrees with
    the op-by-op forward; where it and this CPU's own build both multiply integers (AVX2's and VNNI's products), their
    q4 and q8 products are bit for bit the same."""
    from core.runtime.exactness import check_invariance, probe_prompt
    from core.runtime.lean import LeanForward
    from tests.test_lean import lean_target, models

    flags = lane_build_flags(lanes)
    own, _ = native.load()
    monkeypatch.setattr(native, "CFLAGS", (*native.CFLAGS, *flags))
    module, why = native.load()
    assert module is not None, why
    assert_rounds_as_torch(module)
    if own is not None and own.ACTIVATIONS == module.ACTIVATIONS == "8-bit":
        assert_same_integer_products(own, module)
    for _name, model in models():
        python = lean_target(model, "q4", torch.bfloat16)
        portable = lean_target(model, "q4", torch.bfloat16)
        portable.lean = LeanForward(portable.model, weights="q4", native=module)
        report = check_invariance(portable, probe_prompt(portable.vocab_size, 70), steps=40)
        assert report.exact, report.describe()
        caches = [t.lean.new_cache(128) for t in (python, portable)]
        prompt = torch.tensor(probe_prompt(64, 30))
        with torch.no_grad():
            logits = [t.lean(prompt, c) and t.lean(torch.tensor([5, 6, 7]), c)[0] for t, c in zip((python, portable),
                                                                                               caches)]
        assert torch.allclose(logits[0].float(), logits[1].float(), atol=0.008)
