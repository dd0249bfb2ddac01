"""Drafters from a spec: the one place a DrafterSpec becomes a drafter the engine can call."""
from __future__ import annotations

from core.drafting import Drafter, LookupHybrid, NgramDrafter
from core.target import Target
from drafter.checkpoint import CheckpointError
from drafter.runtime import load_engine_drafter
from drafter.spec import DrafterSpec


class DrafterUnavailable(RuntimeError):
    """A drafter cannot be used with this target; the message says why (the app falls back to plain)."""


def build_drafter(spec: DrafterSpec, target: Target, allow_download: bool = False) -> Drafter | None:
    """Return a ready drafter, None for plain decoding, or raise DrafterUnavailable with the reason."""
    if spec.name == "none":
        return None
    if spec.name == "ngram":
        return NgramDrafter()
    if spec.is_hf_baseline:
        raise DrafterUnavailable(f"{spec.name} is transformers' own generate, not a drafter for this engine")
    try:
        drafter = load_engine_drafter(spec, target, allow_download=allow_download)
    except CheckpointError as err:
        raise DrafterUnavailable(str(err)) from err
    return LookupHybrid(drafter) if spec.lookup else drafter
