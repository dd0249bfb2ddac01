"""Typed containers of torch modules: what a type checker needs to know of a network's layer list."""
from __future__ import annotations

from typing import TYPE_CHECKING, Generic, Iterator, TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


class ModuleList(nn.ModuleList, Generic[M]):
    """nn.ModuleList whose items are all of one type: `ModuleList[Layer](Layer(c) for _ in range(n))` iterates and
    indexes as Layer for a type checker, and is an nn.ModuleList at run time (same state-dict names)."""

    if TYPE_CHECKING:
        def __iter__(self) -> Iterator[M]: ...

        def __getitem__(self, idx: int) -> M: ...  # type: ignore[override]  # (an int: the slice form is unused)
