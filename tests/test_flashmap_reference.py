"""`--vs flashmap-reference`: the FlashMap authors' spec_generate with the same released-format drafter, target and
prompt tokens, in turn with this engine's runs."""
import json

import pytest

from app import bench
from lab.testing import QWEN3_TEMPLATE, make_target, tiny_qwen3, tiny_tokenizer
from tests.test_bench import prompts_file
from tests.test_flashmap_release import release_model, write_release


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    target_folder = tmp_path_factory.mktemp("tiny-qwen3")
    model = tiny_qwen3(vocab_size=64)
    model.save_pretrained(target_folder)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(target_folder)
    drafter = write_release(tmp_path_factory.mktemp("release"), release_model(make_target(model)))
    return target_folder, drafter


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_reference_loop_runs_beside_ours_with_the_same_drafter(folders, tmp_path, temperature):
    target_folder, drafter = folders
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts_file(tmp_path, 3)), "--drafter", "flashmap", "--weights", str(drafter),
                "--max-new-tokens", "12", "--temperature", str(temperature), "--target", str(target_folder),
                "--dtype", "fp32", "--vs", "flashmap-reference", "--out", str(out)])
    ref = json.loads(out.read_text())["flashmap_reference"]
    assert ref["prompts"] == 3 and ref["tokens_per_s"] > 0 and 1.0 <= ref["acceptance_length"] <= 5.0
    assert "float32" in ref["precision"] and ref["engine_acceptance_length"] >= 1.0
    ours = [row["acceptance_length"] for row in json.loads(out.read_text())["per_prompt"]]
    theirs = [row["acceptance_length"] for row in ref["per_prompt"]]
    pairs = [a - b for a, b in zip(ours, theirs)]
    assert ref["acceptance_difference"]["prompts"] == 3
    assert ref["acceptance_difference"]["mean"] == pytest.approx(sum(pairs) / 3)
    if temperature == 0:  # both loops in fp32: the reference's greedy replies are ours, token for token
        assert ref["identical_to_plain"] == 3 and ref["identical_to_drafted"] == 3
    else:
        assert ref["identical_to_plain"] is None


def test_the_reference_needs_a_released_format_drafter(folders, tmp_path):
    target_folder, _ = folders
    with pytest.raises(SystemExit, match="released-format folder"):
        bench.main(["--prompts", str(prompts_file(tmp_path, 1)), "--drafter", "ngram", "--target",
                    str(target_folder), "--vs", "flashmap-reference", "--out", str(tmp_path / "x.json")])
