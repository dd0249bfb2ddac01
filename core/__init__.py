"""The core: target loading, memory plan, the generate loop, verification maths, tree, drafter protocol.

oneDNN's AMX kernels (Intel Xeon from the 4th generation) give a row of a bf16 product different low bits when it is
computed alone and among other rows, so a bf16 forward through them is not batch-invariant (core.runtime.exactness
refuses it there). Capped at AVX512-BF16, oneDNN takes the kernels that CPUs without AMX run, which the check and the
tests find invariant (tests/test_lean.py); on those CPUs the cap changes nothing. oneDNN reads the cap once, at its
first product, so it is set here, before any; a cap already in the environment is kept (`ONEDNN_MAX_CPU_ISA`,
core.runtime.exactness.probe_key records it).
"""
import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
