"""Drafters from a spec: the one place a DrafterSpec becomes a drafter the engine can call."""
from __future__ import annotations

import logging

from core.drafting import phrasebook
from core.drafting.base import Drafter, LookupHybrid, NgramDrafter, NoNetwork
from core.runtime.target import Target
from drafter.formats.checkpoint import CheckpointError
from drafter.runtime.drafters import check_engine_drafter, default_weights, load_engine_drafter
from drafter.spec import DrafterSpec

_books: dict[str, phrasebook.Phrasebook | None] = {}  # target name -> its phrasebook (None: it has none usable)


class DrafterUnavailable(RuntimeError):
    """A drafter cannot be used with this target; the message says why (the app falls back to plain)."""


def build_drafter(spec: DrafterSpec, target: Target, allow_download: bool = False) -> Drafter | None:
    """Return a ready drafter, None for plain decoding, or raise DrafterUnavailable with the reason."""
    if spec.name == "none":
        return None
    if spec.name == "ngram":
        return NgramDrafter()
    if spec.name == "copies":  # the free sources alone: prompt lookup and, where the target has one, its phrasebook
        return LookupHybrid(NoNetwork(), phrasebook=target_phrasebook(target) if spec.phrasebook else None)
    if spec.is_hf_baseline:
        raise DrafterUnavailable(f"{spec.name} is transformers' own generate, not a drafter for this engine")
    try:
        drafter = load_engine_drafter(spec, target, allow_download=allow_download)
    except CheckpointError as err:
        raise DrafterUnavailable(str(err)) from err
    return with_lookup(drafter, target, spec.phrasebook) if spec.lookup else drafter


def check_drafter(spec: DrafterSpec, target: Target, allow_download: bool = False) -> None:
    """Raise DrafterUnavailable where build_drafter could not serve this spec, from the drafter's config alone: what
    the app offers is listed without loading a drafter that nobody chose."""
    if spec.name not in ("flashmap", "flashmap-teacher", "dflash"):
        return
    try:
        check_engine_drafter(spec, target, allow_download)
    except CheckpointError as err:
        raise DrafterUnavailable(str(err)) from err


def with_lookup(drafter: Drafter, target: Target, use_phrasebook: bool = True) -> LookupHybrid:
    """The network drafter with prompt lookup beside it and, where use_phrasebook and the target has one under
    weights/<target>/phrasebook, the target's phrasebook (core.drafting.phrasebook)."""
    return LookupHybrid(drafter, phrasebook=target_phrasebook(target) if use_phrasebook else None)


def target_phrasebook(target: Target) -> phrasebook.Phrasebook | None:
    """The target's shipped phrasebook, loaded once a process; None where it has none, and where one is corrupt or
    built for another target (logged once: drafting goes on without it, the output is exact either way)."""
    name = target.identity["name"]
    if name not in _books:
        folder = default_weights(name, "phrasebook")
        try:
            _books[name] = phrasebook.load(folder, target.identity) if folder.exists() else None
        except phrasebook.PhrasebookError as err:
            logging.getLogger(__name__).warning("drafting without the phrasebook: %s", err)
            _books[name] = None
    return _books[name]
