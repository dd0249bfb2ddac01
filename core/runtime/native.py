"""The engine's native kernels, built once per machine with the system's C++ compiler through torch's extension
builder, cached on disk, loaded on later starts in about a second: the decode step (core/runtime/csrc/lean_step.cpp) and
extensions of the packages above core (the drafter's forward, drafter/runtime/csrc/), all sharing
core/runtime/csrc/simd.h.

Why a native step: the q4 forward of the embedded target spent most of a decode step dispatching ~55 small tensor
ops a layer from Python (norms, rotary, attention pieces, casts); one native call for all layers leaves the weights'
products as the main cost. Where one cannot be built (no compiler, a build error), `load` says why and the caller
keeps its Python path: slower, equally exact.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from core.runtime.threads import cpu_flags

CSRC = Path(__file__).parent / "csrc"
# -march=native: the build is keyed by the CPU's flags, so a cache shared between machines never runs code built
# for another CPU; -ffp-contract=off: products and sums fuse only where the source says so (batch invariance);
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers, serial in a build without it (linked, the
# extension shares torch's own libgomp, loaded first under the same name)
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp")


@dataclass(frozen=True)
class Extension:
    """One native module: its name prefix, its one source file, and what it is (for the messages)."""

    name: str
    source: Path
    what: str


LEAN_STEP = Extension("flashmap_lean_step", CSRC / "lean_step.cpp", "the native decode step")


def headers() -> list[Path]:
    """The shared headers every extension may include (their text is part of every build key)."""
    return sorted(CSRC.glob("*.h"))


_loaded: dict[str, object] = {}


def build_key(ext: Extension | None = None) -> str:
    """What a compiled extension depends on: its source, the shared headers, flags, torch's build and the CPU."""
    ext = ext or LEAN_STEP
    parts = [ext.source.read_text(), *(h.read_text() for h in headers()), " ".join(CFLAGS), torch.__version__,
             " ".join(sorted(cpu_flags()))]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]


def forward_build(target) -> str:
    """The build of the decode step a target's forward runs through ("none" where it runs in Python): what a result
    cached per machine (batch invariance, the verify-cost curve) is measured again for when the step is rebuilt."""
    lean = getattr(target, "lean", None)
    return "none" if lean is None or getattr(lean, "native", None) is None else build_key()


def build_root() -> Path:
    """Where builds are kept: FLASHMAP_NATIVE_DIR, else ~/.cache/flashmap-chat/native (one build per key, shared by
    every cache folder and test run on this machine)."""
    default = Path.home() / ".cache" / "flashmap-chat" / "native"
    return Path(os.environ.get("FLASHMAP_NATIVE_DIR", default))


def load(ext: Extension | None = None) -> tuple[object | None, str]:
    """(the compiled module, "") or (None, why not), built on first use under build_root(); FLASHMAP_NATIVE=0 turns
    every extension off. Without an argument: the decode step."""
    ext = ext or LEAN_STEP
    if os.environ.get("FLASHMAP_NATIVE", "1") == "0":
        return None, "turned off (FLASHMAP_NATIVE=0)"
    key = build_key(ext)
    if key in _loaded:
        return _loaded[key], ""
    name = f"{ext.name}_{key}"
    folder = build_root() / name
    try:
        module = _import_built(name, folder) or _build(name, folder, ext)
    except Exception as err:  # noqa: BLE001 - any build failure (no compiler, no ninja, a compile error) means: eager
        return None, f"could not build {ext.what} ({type(err).__name__}: {str(err).strip()[:200]})"
    _loaded[key] = module
    return module, ""


def _import_built(name: str, folder: Path):
    """The module from an earlier build of this key, imported directly (no builder, no lock), or None."""
    import importlib.util

    library = folder / f"{name}.so"
    if not library.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError:  # a build cut short: build again
        return None


def _build(name: str, folder: Path, ext: Extension):
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    clear_stale_lock(folder)
    print(f"Compiling {ext.what} for this CPU (once, about 20 s; cached)…", flush=True)
    return cpp_extension.load(name=name, sources=[str(ext.source)], extra_cflags=list(CFLAGS),
                              extra_ldflags=["-fopenmp"], extra_include_paths=[str(CSRC)],
                              build_directory=str(folder), verbose=False)


STALE_LOCK_S = 180  # a build takes ~20-60 s; a lock older than this was left by a process that died mid-build


def clear_stale_lock(folder: Path, wait_s: float = STALE_LOCK_S) -> None:
    """torch's builder waits for its lock file for ever, and a start killed mid-build leaves one behind: wait while
    another build may hold it, then remove it once it is older than any build takes."""
    import time

    lock = Path(folder) / "lock"
    while lock.exists():
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:  # removed meanwhile
            return
        if age >= wait_s:
            lock.unlink(missing_ok=True)
            return
        time.sleep(0.5)


# argmax, softmax and CDF inversion over a row of CPU logits in one pass or two each (csrc/sampling.cpp), where torch's
# whole-row ops cost tens of microseconds each (core.verification.sampling reads them)
SAMPLING = Extension("flashmap_sampling", CSRC / "sampling.cpp", "the native sampling kernels")


@cache
def sampling_kernels():
    """The compiled sampling kernels, or None where they cannot be built (no compiler, FLASHMAP_NATIVE=0): torch's ops
    then, drawing the same tokens from the same uniforms but where float rounding differs at a step's edge. Loaded
    once a process (a failed build is not tried again each round)."""
    return load(SAMPLING)[0]
