"""core.prompts: every shipped set has a role, held-out sets are refused by name and by content, and no held-out
prompt is a near-duplicate of anything the drafters or the phrasebook were built from."""
import json

import pytest

from core import prompts
from core.prompts import HELD_OUT, ROLES, TRAINING, HeldOutError, near_duplicates, read_prompt_file, refuse_held_out


def test_every_shipped_set_has_one_role_and_sources_names_it():
    assert set(prompts.shipped_names()) == set(ROLES)
    sources = (prompts.SHIPPED / "SOURCES.md").read_text()
    for name, role in ROLES.items():
        assert f"{name}.jsonl" in sources, name
    assert {"training", "tuning", "held-out"} == set(ROLES.values())
    assert all(row["domain"] == name.split("_")[1] for name, role in ROLES.items() if role == HELD_OUT
               for row in read_prompt_file(name))


def test_held_out_sets_are_refused_by_name_and_by_content(tmp_path):
    with pytest.raises(HeldOutError, match="heldout_math is a held-out set"):
        refuse_held_out(["heldout_math"], "training")
    copied = tmp_path / "my_prompts.jsonl"
    row = read_prompt_file("heldout_chat")[3]
    copied.write_text(json.dumps({"prompt": "a prompt of my own"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(HeldOutError, match="holds prompts of a held-out set"):
        refuse_held_out([str(copied)], "calibration")
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "a prompt of my own"}) + "\n")
    refuse_held_out([str(mine), str(prompts.SHIPPED / "train_math.jsonl"), "eval_code"], "training")


def test_near_duplicates_by_jaccard_and_inside_a_longer_text():
    a = "Write a Python function that merges two sorted lists into one sorted list"
    b = "Write a Python function that merges two sorted lists into one list"
    assert near_duplicates([a], [b, "something else entirely"]) == [(0, 0, 0.75)]
    reply = "Sure! Here is how: " + a + ". First we walk both lists at once, taking the smaller head each time."
    assert near_duplicates([a], [reply]) == []  # the reply is much longer: a low Jaccard index
    assert near_duplicates([a], [reply], inside=True) == [(0, 0, 1.0)]
    assert near_duplicates(["Why?"], ["Why?"]) == [(0, 0, 1.0)]  # shorter than an n-gram


def test_no_held_out_prompt_is_a_near_duplicate_of_a_training_prompt():
    """3-gram Jaccard below 0.6 against every prompt a training set holds (the drafters' and the phrasebook's
    replies answer those)."""
    held = [row["prompt"] for name, role in ROLES.items() if role == HELD_OUT for row in read_prompt_file(name)]
    train = [row["prompt"] for name, role in ROLES.items() if role == TRAINING for row in read_prompt_file(name)]
    found = near_duplicates(held, train)
    assert not found, [(held[i][:60], train[j][:60], s) for i, j, s in found]


def test_no_held_out_prompt_is_inside_a_training_reply():
    """No held-out prompt has 60% or more of its word 3-grams inside one reply of the shipped data folders (the
    replies the drafters, the phrasebook and its calibration were built from), decoded by the target's tokenizer."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from core.runtime.target import embedded_gguf_path
    from drafter.data import load_sequences

    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folders = sorted(p.parent for p in Path(prompts.SHIPPED.parent).glob("*/meta.json"))
    replies = [tokenizer.decode(seq.tokens[seq.prompt_len:]) for folder in folders for seq in load_sequences(folder)]
    assert len(replies) > 1000
    held = [row["prompt"] for name, role in ROLES.items() if role == HELD_OUT for row in read_prompt_file(name)]
    found = near_duplicates(held, replies, inside=True)
    assert not found, [(held[i][:60], replies[j][:80], s) for i, j, s in found]
