"""The CPU thread policy: how many threads torch uses, and how idle OpenMP threads wait.

On a 2-core machine shared with another busy process, OpenMP threads that spin while they wait for each other
(the default, OMP_WAIT_POLICY=ACTIVE) take turns with the other process and plain decoding collapses; threads
that sleep while they wait (PASSIVE) degrade gracefully. The wait policy is read once, when the OpenMP runtime
starts, so `python app.py` sets it before torch is imported (app.py); docs and numbers: README, "Threads".
"""
from __future__ import annotations

import os

import torch


def apply_thread_policy(threads: int = 0) -> int:
    """Use `threads` torch threads (0: torch's default, one per core); returns the number in effect."""
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "default (spinning)")
