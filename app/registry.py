"""Drafters by name, as the CLI, the bench and the UI offer them."""
from __future__ import annotations

from app.drafting import Drafter, NgramDrafter
from app.target import Target

ENGINE_DRAFTERS = ("none", "ngram", "flashmap", "dflash", "flashmap-teacher")
HF_BASELINES = ("hf-generate", "hf-prompt-lookup")  # transformers' own generate, for comparison only


class DrafterUnavailable(RuntimeError):
    """A drafter cannot be used with this target; the message says why (the app falls back to plain)."""


def build_drafter(name: str, target: Target, steps: int = 1, weights: str | None = None,
                  allow_download: bool = False, best_of: int = 1, tree: int = 1) -> Drafter | None:
    """Return a ready drafter, None for plain decoding, or raise DrafterUnavailable with the reason."""
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter()
    if name in ("flashmap", "flashmap-teacher", "dflash"):
        from drafter.checkpoint import CheckpointError
        from drafter.runtime import load_engine_drafter

        try:
            return load_engine_drafter(name, target, steps=steps, weights=weights, allow_download=allow_download,
                                       best_of=best_of, tree=tree)
        except CheckpointError as err:
            raise DrafterUnavailable(str(err)) from err
    raise DrafterUnavailable(f"unknown drafter {name!r}; choose from {ENGINE_DRAFTERS + HF_BASELINES}")
