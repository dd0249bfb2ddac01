"""The README's training example runs from a clone of the repository alone: its prompt sets are in data/prompts/,
nothing is read from beside the repository."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_code_or_script_reads_prompts_from_beside_the_repository():
    done = subprocess.run(["git", "grep", "-n", "-F", "../shared", "--", ".", f":!{Path(__file__).relative_to(ROOT)}"],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        pytest.skip("not a git checkout")
    assert done.stdout == "", done.stdout


@pytest.mark.slow
def test_the_training_examples_first_step_runs_from_a_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert not (clone.parent / "shared").exists()
    out = tmp_path / "responses"
    # docs/drafter.md's first command, two prompts a file and short answers
    cmd = [sys.executable, "-m", "drafter.data", "generate", "--prompts", "data/prompts/train_math.jsonl",
           "data/prompts/train_code.jsonl", "data/prompts/train_chat.jsonl", "--limit", "2", "--max-new-tokens", "8",
           "--out", str(out)]
    subprocess.run(cmd, cwd=clone, check=True, capture_output=True, text=True)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["prompts"] == ["data/prompts/train_math.jsonl", "data/prompts/train_code.jsonl",
                               "data/prompts/train_chat.jsonl"]
    assert list(out.glob("shard-*.safetensors"))
