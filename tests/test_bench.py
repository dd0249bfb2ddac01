import argparse
import json

import pytest
import torch

from app import bench
from drafter.spec import DrafterSpec
from lab.testing import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(folder)
    tiny_tokenizer(64).save_pretrained(folder)
    return folder


def prompts_file(folder, n: int):
    """A JSONL of n short prompts in the tiny tokenizer's words, with repeats the n-gram drafter can use."""
    path = folder / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"w{10 + i} w11 w12 w10 w11"}) for i in range(n)))
    return path


def test_the_bench_runs_the_apps_choices_and_refuses_what_a_choice_does_not_take(tiny_folder, tmp_path):
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts_file(tmp_path, 2)), "--choice", "copies", "--block-size", "4",
                "--max-new-tokens", "12", "--target", str(tiny_folder), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["drafter"] == "copies" and result["adaptive"] and result["identical_to_baseline"] is True
    assert sum(result["tokens_by_source"].values()) == result["new_tokens"]
    with pytest.raises(SystemExit, match="steps and drafts per round must be 1"):
        bench.parse_args(["--prompts", "heldout_math", "--choice", "none", "--steps", "2", "--out", "x.json"])
    with pytest.raises(SystemExit):  # a choice or a spec, not both
        bench.parse_args(["--prompts", "heldout_math", "--choice", "auto", "--drafter", "ngram", "--out", "x.json"])
    assert bench.parse_args(["--prompts", "heldout_math", "--drafter", "default", "--out", "x.json"])[0].spec == \
        bench.parse_args(["--prompts", "heldout_math", "--choice", "auto", "--out", "x.json"])[0].spec


def test_a_tuning_comparison_refuses_a_held_out_set_and_the_bench_reads_it():
    """scripts/ comparisons read their prompts through run_fields(args, tuning=True): a held-out set is refused there
    (core.prompts.ROLES), while the bench, which only reports, reads it."""
    parser = argparse.ArgumentParser()
    bench.add_run_args(parser)
    args = parser.parse_args(["--prompts", "tuning_math", "heldout_chat", "--out", "x.json"])
    with pytest.raises(SystemExit, match="heldout_chat.jsonl is a held-out set"):
        bench.run_fields(args, tuning=True)
    assert bench.run_fields(args)["prompts"] == ("tuning_math", "heldout_chat")


def test_bench_contract(tiny_folder, tmp_path):
    prompts = prompts_file(tmp_path, 3)
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts), "--limit", "2", "--drafter", "ngram", "--block-size", "4",
                "--max-new-tokens", "12", "--target", str(tiny_folder), "--out", str(out)])
    result = json.loads(out.read_text())
    keys = {"target", "drafter", "steps", "block_size", "temperature", "prompts", "new_tokens",
            "baseline_tokens_per_s", "tokens_per_s", "speedup", "acceptance_length", "per_slot_acceptance",
            "identical_to_baseline"}
    assert keys <= result.keys()
    assert result["prompts"] == 2 and result["identical_to_baseline"] is True
    assert len(result["per_slot_acceptance"]) == 4 and 1.0 <= result["acceptance_length"] <= 5.0
    costs = result["round_costs"]  # each kind of round: its rounds add up, its cost is in plain rounds
    assert sum(row["rounds"] for row in costs) == result["rounds"]
    assert {row["source"] for row in costs} <= {"plain", "drafter"} and all(row["plain_rounds"] > 0 for row in costs)
    assert all(row["committed"] <= row["drafted"] + 1 for row in costs)
    bench.main(["--prompts", str(prompts), "--drafter", "hf-generate", "--max-new-tokens", "12",
                "--target", str(tiny_folder), "--dtype", "fp32", "--out", str(out)])
    # our plain loop == transformers greedy in the reference precision (in bf16 the two forwards round differently)
    assert json.loads(out.read_text())["identical_to_baseline"] is True
    assert json.loads(out.read_text())["round_costs"] == []  # transformers' runs have no rounds to show
    bench.main(["--prompts", str(prompts), "--drafter", "none", "--temperature", "1", "--max-new-tokens", "8",
                "--target", str(tiny_folder), "--out", str(out)])
    assert json.loads(out.read_text())["identical_to_baseline"] is None


def test_bench_conversation_grows_one_context_turn_by_turn(tiny_folder, tmp_path):
    prompts = prompts_file(tmp_path, 3)
    out = tmp_path / "c.json"
    bench.main(["--prompts", str(prompts), "--drafter", "ngram", "--block-size", "4", "--max-new-tokens", "6",
                "--conversation", "--target", str(tiny_folder), "--out", str(out)])
    result = json.loads(out.read_text())
    lengths = [row["prompt_tokens"] for row in result["per_prompt"]]
    assert result["conversation"] is True and result["identical_to_baseline"] is True
    # each turn holds the last one's prompt, its reply and the new question
    assert all(later > earlier + row["baseline_tokens"]
               for earlier, later, row in zip(lengths, lengths[1:], result["per_prompt"]))
    bench.main(["--prompts", str(prompts), "--drafter", "ngram", "--max-new-tokens", "6", "--target",
                str(tiny_folder), "--out", str(out)])
    assert len({row["prompt_tokens"] for row in json.loads(out.read_text())["per_prompt"]}) == 1  # separate chats


def test_suite_runs_variants_against_one_baseline(tiny_folder, tmp_path):
    from app import suite

    prompts = prompts_file(tmp_path, 3)
    out = tmp_path / "s.json"
    suite.main(["--prompts", str(prompts), "--variants", "ngram", "ngram,k=2", "hf-generate", "--block-size", "4",
                "--max-new-tokens", "10", "--target", str(tiny_folder), "--dtype", "fp32", "--out", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [r["variant"] for r in results] == ["ngram", "ngram,k=2", "hf-generate"]
    assert all(r["identical_to_baseline"] is True and r["prompts"] == 3 for r in results)
    assert len({r["baseline_tokens_per_s"] for r in results}) == 1  # one shared plain baseline
    assert len(results[1]["per_slot_acceptance"]) == 2 and results[1]["block_size"] == 2
    with pytest.raises(SystemExit):
        suite.parse_variant("ngram,depth=3")
    v = suite.parse_variant("flashmap,tree=4,k=4,adaptive=1,skip=0", 16)
    assert (v.drafter.name, v.drafter.tree, v.drafter.block_size, v.adaptive, v.max_skip) == ("flashmap", 4, 4, True, 0)
    assert suite.parse_variant("flashmap", 8).drafter.block_size == 8
    assert suite.parse_variant("flashmap").drafter.block_size is None
    with pytest.raises(SystemExit, match="flow drafters"):
        suite.parse_variant("ngram,tree=4")
    with pytest.raises(SystemExit, match="temperature 0"):
        suite.parse_args(["--prompts", str(prompts), "--variants", "flashmap,tree=4", "--out", "y",
                          "--temperature", "1"])


def test_report_is_built_from_suite_runs(tiny_folder, tmp_path):

    from app import suite
    from scripts import report

    prompts = prompts_file(tmp_path, 2)
    results = tmp_path / "results"
    common = ["--prompts", str(prompts), "--max-new-tokens", "10", "--target", str(tiny_folder)]
    older = str(results / "drafters-math-t0-2026-11-30.json")  # the report reads the newest run of each name
    suite.main(common + ["--variants", "ngram,k=2", "--block-size", "2", "--out", older])
    suite.main(common + ["--variants", "ngram", "--block-size", "4", "--out",
                         str(results / "drafters-math-t0-2026-12-01.json")])
    suite.main(common + ["--variants", "ngram,k=2", "ngram,k=4", "--out", str(results / "k-sweep-t0-2026-12-01.json")])
    text = report.build(results, tmp_path)
    assert "| n-gram |" in text and "**math, T=0**" in text and "K=2 | K=4" in text
    assert "n-gram, K=2" not in text.split("## Acceptance length against")[0]  # the older run is not reported
    assert (tmp_path / "bench-speedup.png").stat().st_size > 1000 and (tmp_path / "bench-k-sweep.png").exists()


def test_verify_cost_cli(tiny_folder, tmp_path):
    from lab import verify_cost

    out = tmp_path / "v.json"
    verify_cost.main(["--cached", "32", "--repeats", "2", "--positions", "2", "4", "--target", str(tiny_folder),
                      "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result["seconds"]) == {"1", "2", "4"} and result["relative_to_one"]["1"] == 1.0
    verify_cost.main(["--cached", "32", "--repeats", "2", "--positions", "2", "--target", str(tiny_folder),
                      "--compare-cpu-linear", "--out", str(out)])
    both = json.loads(out.read_text())["cpu_linear"]
    assert set(both) == {"onednn", "torch"} and all(set(c["seconds"]) == {"1", "2"} for c in both.values())
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # nothing left switched on


class SleepyDrafter:
    """A drafter whose call takes a fixed time: its measured cost must show it."""

    name, feature_layers, max_block_size = "sleepy", (1,), 4

    def __init__(self, seconds: float):
        self.seconds, self.extended = seconds, 0

    def reset(self):
        self.extended = 0

    def extend(self, token_ids, features):
        assert features is not None and len(features) == len(token_ids)
        self.extended += len(token_ids)

    def propose(self, anchor, block_size, sampling, generator):
        import time

        from core.drafting.base import Draft

        assert self.extended and sampling.greedy
        time.sleep(self.seconds)
        return Draft(torch.tensor([anchor] * block_size), None, torch.full((block_size,), 0.5))


def test_draft_cost_is_the_drafter_call_against_one_target_step(tiny_folder):
    from core.drafting.call_cost import draft_cost
    from core.runtime.target import TargetConfig, load_target

    target = load_target(TargetConfig(target=str(tiny_folder)))
    fast, slow = SleepyDrafter(0.0), SleepyDrafter(0.02)
    fast_cost, slow_cost = draft_cost(target, fast, context=16, repeats=3), draft_cost(target, slow, 16, 3)
    assert 0 < fast_cost < slow_cost and slow.extended == 0  # measured after a real context, then reset
    runner = bench.Runner(bench.RunSpec(DrafterSpec("dflash"), adaptive=True), 4, lambda ids, gen: None, slow)
    measured = runner.with_draft_cost(target)
    assert measured.draft_cost > 0 and measured.generation(bench.GenerationConfig(), (1.0, 1.1)).draft_cost > 0
    hot = bench.GenerationConfig(sampling=bench.SamplingConfig(temperature=1.0))
    assert not measured.generation(hot, (1.0, 1.1)).charges_draft_cost()  # T > 0: the engine does not charge it
    plain = bench.Runner(bench.RunSpec(DrafterSpec("dflash")), 4, lambda ids, gen: None, slow)
    assert plain.with_draft_cost(target) is plain and plain.generation(bench.GenerationConfig(), ()).draft_cost == 0


def test_report_shows_what_the_cut_believes_and_the_policy_ab():
    from scripts import report

    calibration = {"stride": 16, "results": [{"variant": "flashmap,scale=0", "held_out": {
        "all": {"rounds": 1626, "accepted": 1.05, "expected_raw": 2.36, "expected_calibrated": 1.04}}}]}
    row = dict(per_prompt=[{"tokens": 10, "s": 1.0, "baseline_tokens": 10, "baseline_s": 1.2}] * 3,
               draft_cost=0.24, per_slot_reached=[5], rounds=9, identical_to_baseline=True)
    run = {"prompts_files": ["eval_math", "eval_code", "eval_chat"], "limit": 1, "temperature": 0.0, "results": [
        dict(row, variant="flashmap,scale=0.0,adaptive=1 [new]", overrides={}),
        dict(row, variant="flashmap,scale=0.0,adaptive=1,calibrated=0 [before]", overrides={"draft_cost": 0.0})]}
    text = "\n".join(report.calibration_section(calibration, [run]))
    assert "| 1,626 | 1.05 | 2.36 | 1.04 |" in text
    assert "| new | 1.20× | 1.20× | 1.20× | 1.20× | 0.24 | 5 / 9 | yes |" in text and "| 0 | FlashMap" in text
    assert "raw confidence (1 prompts each) | before |" in text and "not charged" in text


def test_report_puts_the_engines_anchors_beside_the_uniform_ones():
    from scripts import report

    def run(value):
        return {"results": [{"variant": "dflash", "weights": None, "all": {"acceptance_length": value, "rounds": 9},
                             "math": {"acceptance_length": value}}]}

    text = "\n".join(report.walk_section(run(1.738), run(2.034)))
    assert "9 rounds per drafter" in text and "| DFlash-style | 1.738 | 1.738 |" in text
    assert "DFlash-style: 2.034 → 1.738" in text


def test_report_names_how_each_shuffle_test_paired_its_noise():
    from scripts import report

    def run(shuffled, coupled):
        rows = [{"variant": v, "rounds": {"sequence": [0, 0, 1], "n_accepted": n},
                 "all": {"acceptance_length": 1 + sum(n) / 3, "rounds": 3}, "math": {"acceptance_length": 2.0}}
                for v, n in (("flashmap,steps=2", [2, 2, 2]), ("flashmap,steps=2,noise=shuffled", shuffled))]
        return {"stride": 8, "sequence_domains": ["math", "math"], "results": rows,
                **({"shuffled_noise": "coupled"} if coupled else {})}

    assert [report.ordinal(n) for n in (4, 8, 13, 21, 32, 112)] == ["4th", "8th", "13th", "21st", "32nd", "112th"]
    text = "\n".join(report.shuffle_section([(run([1, 2, 3], False), "old"), (run([2, 2, 1], True), "new")]))
    # clustered by response (sequences 0, 0, 1): old per-response sums +1, -1 -> var (1 + 1) / 9 * 2 / 1 = 4/9;
    # new sums 0, +1 around 1/3 a round -> ((0 - 2/3)^2 + (1 - 1/3)^2) / 9 * 2 = 16/81
    assert "| old, every 8th anchor, independent | +0.000 ± 0.577 | +0.000 ± 0.577 | +0.000 ± 0.667 (2 " in text
    assert "| new, every 8th anchor, coupled | +0.333 ± 0.333 | +0.333 ± 0.333 | +0.333 ± 0.444 (2 responses) |" in text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_bench_default_runs_what_the_app_runs(tmp_path, temperature):
    from app.service import ChatSettings

    prompts = prompts_file(tmp_path, 1)
    cfg, _ = bench.parse_args(["--prompts", str(prompts), "--drafter", "default", "--temperature", str(temperature),
                               "--out", str(tmp_path / "r.json")])
    assert cfg.spec == ChatSettings(temperature=temperature).spec()
    assert cfg.spec.adaptive and cfg.spec.drafter.noise_scale == 0.0  # x0 = 0 at every temperature
