"""What a running app holds in memory, counted tensor by tensor, for the memory plan's rows (core.runtime.plan).

The walk follows the objects it is given (their attributes, modules, lists and dicts, to a bounded depth) and counts
each storage once, in the first row that reaches it: a drafter that reads the target's embedding or LM head adds
nothing for them to its own row.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

MAX_DEPTH = 8


def tensors_in(obj, depth: int = MAX_DEPTH, _seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Every tensor reachable from obj: itself, a module's parameters, buffers and plain tensor attributes, and those
    of the project's objects, containers and dataclasses it holds."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif _ours(obj) or isinstance(obj, torch.nn.Module):
        children = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
        children += [getattr(obj, name, None) for name in getattr(type(obj), "__slots__", ())]
    else:
        return
    for child in children:
        yield from tensors_in(child, depth - 1, seen)


def _ours(obj) -> bool:
    """Whether obj is one of this project's objects (the walk does not enter libraries' internals)."""
    module = type(obj).__module__ or ""
    return module.split(".")[0] in ("core", "drafter", "app") or module.startswith("flashmap")


def storage_bytes(tensors, counted: set[int]) -> int:
    """The bytes of the storages under these tensors not counted yet (their keys are added to `counted`); meta
    tensors count their size as if they were real, oneDNN's packed ones their own."""
    total = 0
    for tensor in tensors:
        if tensor.is_meta or tensor.is_mkldnn:  # no storage to read: its own size (a packed copy is one)
            key, size = id(tensor), tensor.numel() * tensor.element_size()
        else:
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0:
                continue
        if key not in counted:
            counted.add(key)
            total += size
    return total


def held_rows(parts: dict[str, object]) -> dict[str, int]:
    """{row: bytes} for {row: the objects it holds}, each storage counted in the first row that reaches it."""
    counted: set[int] = set()
    return {row: storage_bytes(tensors_in(obj), counted) for row, obj in parts.items()}


def return_freed_host_memory() -> None:
    """Hand memory freed on the host back to the system (glibc keeps large freed blocks for reuse): after a load drops
    a copy of the weights, so that the process's resident size is what it holds. A no-op off glibc."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
