"""Stages of a GPU command: each one checks the deadline before it starts, is wrapped so that a failure is
recorded and the next stage still runs, and appends one flushed line to OUT/progress.jsonl. Files reach
OUT atomically (written beside, then renamed), so a command killed at its limit still returns every file
it finished. The limits on what comes back from OUT are checked by check_out_limits.
"""
from __future__ import annotations

import gc
import json
import os
import re
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MIB = 2**20
OUT_MAX_FILES, OUT_MAX_FILE, OUT_MAX_TOTAL, OUT_MAX_DEPTH = 8, 16 * MIB, 64 * MIB, 2
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass
class Command:
    """One command's shared state: where results go, when it must end, what earlier stages produced."""

    out: Path
    deadline: float  # time.time() by which the command's last stage must be done
    cpu_sim: bool = False  # every stage at tiny sizes on the CPU with tiny random models (tests)
    device: str = "cuda"  # the real stages' device; cpu with small=True rehearses them here
    small: bool = False  # real models and files, small batches and step counts (a CPU rehearsal)
    began: float = field(default_factory=time.time)
    results: dict = field(default_factory=dict)  # stage name -> its result
    state: dict = field(default_factory=dict)  # objects stages hand on (the target, sequences, ...)

    def __post_init__(self):
        self.out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, **fields) -> None:
        """One line of progress.jsonl, flushed and synced: it is what survives a kill."""
        line = json.dumps({"t": round(time.time() - self.began, 2), **fields}, default=str)
        with open(self.out / "progress.jsonl", "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(line[:2000], flush=True)

    def stage(self, name: str, fn: Callable[["Command"], dict], need_s: float) -> dict | None:
        """Run fn(self) if at least need_s seconds are left; record ok / failed / skipped either way."""
        if self.left() < need_s:
            self.log(stage=name, status="skipped", why=f"{self.left():.0f} s left, needs ~{need_s:.0f} s")
            return None
        start = time.time()
        self.log(stage=name, status="started", left_s=round(self.left(), 1))
        try:
            result = fn(self)
        except Exception as err:  # record and go on: one failing stage must not hide the others
            self.log(stage=name, status="failed", seconds=round(time.time() - start, 1),
                     error=f"{type(err).__name__}: {err}", trace=traceback.format_exc()[-1500:])
            return None
        finally:
            release_memory()
        self.results[name] = result
        self.log(stage=name, status="ok", seconds=round(time.time() - start, 1), result=result)
        write_json(self.out / "results.json", self.results)
        return result


def release_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def tar_into(folder: Path, dest: Path, names: tuple[str, ...] | None = None) -> Path:
    """Pack a folder's files (only `names` when given) into one tar at dest, atomically: OUT takes at most
    8 files, and a checkpoint is two (weights + config)."""
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for path in sorted(folder.iterdir()):
            if path.is_file() and (names is None or path.name in names):
                tar.add(path, arcname=f"{folder.name}/{path.name}")
    tmp.replace(dest)
    return dest


def check_out_limits(out: Path) -> list[str]:
    """What would not come back from OUT: over 8 files, a file over 16 MiB, over 64 MiB in all, a file more
    than two folders down, or an odd name. Empty when everything comes back."""
    problems, files = [], [p for p in sorted(out.rglob("*")) if p.is_file()]
    for path in files:
        rel = path.relative_to(out)
        if path.stat().st_size > OUT_MAX_FILE:
            problems.append(f"{rel}: {path.stat().st_size / MIB:.1f} MiB > 16 MiB")
        if len(rel.parts) - 1 > OUT_MAX_DEPTH:
            problems.append(f"{rel}: more than {OUT_MAX_DEPTH} folders down")
        if not all(NAME.match(part) for part in rel.parts):
            problems.append(f"{rel}: a name with characters other than letters, digits, '.', '_', '-'")
    if len(files) > OUT_MAX_FILES:
        problems.append(f"{len(files)} files > {OUT_MAX_FILES}")
    total = sum(p.stat().st_size for p in files)
    if total > OUT_MAX_TOTAL:
        problems.append(f"{total / MIB:.1f} MiB in all > 64 MiB")
    return problems
