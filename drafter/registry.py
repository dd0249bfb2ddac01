"""Drafters from a spec: the one place a DrafterSpec becomes a drafter the engine can call."""
from __future__ import annotations

import logging

from core import phrasebook
from core.drafting import Drafter, LookupHybrid, NgramDrafter
from core.target import Target
from drafter.checkpoint import CheckpointError
from drafter.head import FrozenHead, HeadError, load_head
from drafter.runtime import default_weights, load_engine_drafter
from drafter.spec import DrafterSpec

_books: dict[str, phrasebook.Phrasebook | None] = {}  # target name -> its phrasebook (None: it has none usable)
_heads: dict[str, FrozenHead | None] = {}  # target name -> its next-token head (None: it has none usable)


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
    return with_lookup(drafter, target, spec.phrasebook) if spec.lookup else drafter


def with_lookup(drafter: Drafter, target: Target, use_phrasebook: bool = True, use_head: bool = True) -> LookupHybrid:
    """The network drafter with prompt lookup beside it and, where use_phrasebook and the target has one under
    weights/<target>/phrasebook, the target's phrasebook (core.phrasebook); where use_head and it has one under
    weights/<target>/head that reads the drafter's feature layers, its next-token head (drafter.head)."""
    return LookupHybrid(drafter, phrasebook=target_phrasebook(target) if use_phrasebook else None,
                        head=target_head(target, drafter.feature_layers) if use_head else None)


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


def target_head(target: Target, feature_layers: tuple[int, ...]):
    """The target's shipped next-token head (drafter.head), loaded once a process; None where it has none, and where one
    is corrupt, built for another target or reads other layers than the drafter captures (logged once: drafting goes
    on without it, the output is exact either way)."""
    name = target.identity["name"]
    if name not in _heads:
        folder = default_weights(name, "head")
        try:
            _heads[name] = load_head(folder, target) if folder.exists() else None
        except HeadError as err:
            logging.getLogger(__name__).warning("drafting without the next-token head: %s", err)
            _heads[name] = None
    head = _heads[name]
    if head is not None and tuple(head.cfg.feature_layers) != tuple(feature_layers):
        logging.getLogger(__name__).warning("drafting without the next-token head: it reads layers %s, the drafter "
                                            "captures %s", head.cfg.feature_layers, tuple(feature_layers))
        return None
    return head
