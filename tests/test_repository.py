"""The repository's weight budgets (CONTRIBUTING.md): tracked files checked against the stated limits."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
BUDGETS = {"weights/": 20 * MIB, "docs/": 1 * MIB, "data/": 4 * MIB}  # largest tracked file under each folder
TOTAL = 105 * MIB  # all tracked files together (90 before the release-format FlashMap drafter, 10.3 MiB)


def tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def over_budget(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        limit = next((size for folder, size in BUDGETS.items() if rel.startswith(folder)), None)
        if limit is not None and path.is_file() and path.stat().st_size > limit:
            found.append(f"{rel}: {path.stat().st_size / MIB:.1f} MiB > {limit / MIB:.0f} MiB")
    return found


def test_tracked_files_stay_within_their_budgets():
    files = tracked()
    assert not over_budget(files)
    total = sum(p.stat().st_size for p in files if p.is_file())
    assert total <= TOTAL, f"tracked files total {total / MIB:.1f} MiB > {TOTAL / MIB:.0f} MiB"


def test_the_budget_check_sees_a_file_too_large(tmp_path, monkeypatch):
    big = ROOT / "docs" / "results"
    monkeypatch.setitem(BUDGETS, "docs/", 10)  # a budget every results file exceeds
    assert over_budget([p for p in big.glob("*.json")][:1])
