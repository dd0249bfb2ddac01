"""The prepared GPU run (lab.gpu_run): the CPU simulation of every command, the staged transfer of
the GGUF and of the shipped drafters, the warm starts, and the limits on what comes back from OUT."""
import json

import pytest

from lab import gpu_run
from lab.gpu import transfer
from lab.gpu.stages import Command, check_out_limits, tar_into


def test_cpu_simulation_runs_every_stage_of_every_command_and_warm_starts_the_second_training(tmp_path):
    summary = gpu_run.cpu_sim(tmp_path / "out")
    for name, stages in [*gpu_run.COMMANDS.items(), ("train-warm", gpu_run.COMMANDS["train"])]:
        assert summary[name]["failed_or_skipped"] == [] and summary[name]["out_problems"] == []
        assert summary[name]["stages"] == [stage for stage, _fn, _need in stages]
    warm = json.loads((tmp_path / "out/train-warm/results.json").read_text())
    assert warm["train_dflash"]["init"].endswith("init/dflash") and warm["train_dflash"]["lr"] == 2e-4
    assert warm["train_flashmap"]["init"].endswith("ckpt/flashmap-teacher")  # the teacher just trained
    assert warm["train_flashmap"]["student_init"].endswith("init/flashmap")  # the student from the shipped one
    cold = json.loads((tmp_path / "out/train/results.json").read_text())
    assert cold["train_dflash"]["init"] is None and cold["train_flashmap-teacher"]["init"].endswith("ckpt/dflash")
    results = json.loads((tmp_path / "out/arch/results.json").read_text())
    assert results["exactness"]["all_identical"]
    assert all(row["identical"] for row in results["qwen3_bf16"]["oracle"])
    compiled = results["compiled_step"]  # the fixed-shape steps of the CUDA graphs, run here without capture
    assert all(compiled["identical_to_transformers"].values()) and compiled["oracle_through_graphs"]["identical"]
    assert set(compiled["forwards"]) == {"transformers", "lean", "graphs"}
    released = results["released_drafter"]  # the released architecture's proposal, eager and as the graphed step
    assert released["same_draft"] and released["captures"] == 0 and released["of_target_step"] > 0
    w8 = results["qwen3_w8"]  # int8 row-scaled weights (torch's product here), through the graphs' sim steps
    assert w8["replaced"] > 0 and w8["kernel"] == "torch" and w8["oracle_through_graphs"]["identical"]
    assert w8["kernel_vs_torch"]["relative_error"] < 1e-2 and w8["kernel_vs_torch"]["row_alike"]
    assert w8["oracle_through_graphs"]["plain_identical"] and w8["oracle_with_released_drafter"]["identical"]
    assert w8["planned_gib"]["total"] > w8["planned_gib"]["weights"] > 0  # the plan's rows beside the peak (a GPU's)
    fused = results["compiled_fused"]  # the graphed step through torch.compile (inductor's CPU code here)
    assert fused["identical"] and set(fused["forwards"]) == {"graphs", "graphs compiled"}
    names = sorted(p.name for p in (tmp_path / "out/train").iterdir())
    assert names == ["data.tar", "dflash.tar", "flashmap-teacher.tar", "flashmap.tar", "progress.jsonl", "results.json"]


def test_a_failing_stage_is_recorded_and_the_next_one_runs(tmp_path):
    cmd = Command(tmp_path, deadline=1e12)

    def broken(_cmd):
        raise RuntimeError("out of memory")

    cmd.stage("first", broken, 0)
    cmd.stage("second", lambda _cmd: {"ok": 1}, 0)
    cmd.stage("third", lambda _cmd: {}, 1e13)  # needs more time than is left
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    status = {(ln["stage"], ln["status"]) for ln in lines}
    assert {("first", "failed"), ("second", "ok"), ("third", "skipped")} <= status
    assert "out of memory" in next(ln["error"] for ln in lines if ln["status"] == "failed")


def test_split_and_reassemble_check_every_hash_and_name_a_missing_half(tmp_path):
    blob = tmp_path / "model.gguf"
    blob.write_bytes(bytes(range(256)) * 1001)
    halves = [tmp_path / "a", tmp_path / "b"]
    manifest = transfer.split_file(blob, halves)
    assert [p["size"] for p in manifest["parts"]] == [128128, 128128]
    transfer.reassemble(halves, tmp_path / "joined.gguf")
    assert (tmp_path / "joined.gguf").read_bytes() == blob.read_bytes()
    with pytest.raises(FileNotFoundError, match="part1"):
        transfer.reassemble(halves[:1], tmp_path / "again.gguf")
    part = halves[1] / "model.gguf.part1"
    part.write_bytes(part.read_bytes()[:-1] + b"x")  # a broken transfer
    with pytest.raises(ValueError, match="sha256"):
        transfer.reassemble(halves, tmp_path / "again.gguf")


def test_out_limits_name_every_problem(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    (tmp_path / "a/b/c").mkdir(parents=True)
    (tmp_path / "a/b/c/deep.txt").write_text("x")
    (tmp_path / "odd name.txt").write_text("x")
    (tmp_path / "big.bin").write_bytes(b"\0" * (16 * 2**20 + 1))
    problems = " | ".join(check_out_limits(tmp_path))
    for needle in ("files > 8", "more than 2 folders down", "odd name.txt", "big.bin"):
        assert needle in problems
    tar_into(tmp_path / "a/b/c", tmp_path / "packed.tar")
    assert (tmp_path / "packed.tar").stat().st_size > 0


def test_dry_run_sizes_count_tracked_untracked_and_carried(tmp_path):
    size = transfer.transfer_size([])
    assert size["total"] == size["tracked"] + size["untracked"] + size["carried"]
    assert size["tracked"] < 20 * 2**20  # without the three checkpoints and docs/ the tree is small
    weights = sum((transfer.ROOT / p).stat().st_size for p in transfer.CHECKPOINTS)
    assert weights > 40 * 2**20  # the checkpoints are what must stay behind
    assert transfer.is_withheld("docs/results/offline-walk-2026-12-01.json.gz") and not transfer.is_withheld("docsx/a")
    assert transfer.transfer_size([".git/HEAD"])["carried"] == (transfer.ROOT / ".git/HEAD").stat().st_size


def test_each_command_still_fits_with_its_gguf_half():
    """What a command sends: the tracked tree (less what is withheld) + one GGUF half + the staged prompts, wheel and
    manifest (3.5 MiB when measured on 2026-12-01; 4 allowed). docs/ growing had once pushed it to 64.1 MiB."""
    from core.runtime.target import embedded_gguf_path

    half = -(-embedded_gguf_path().stat().st_size // 2)
    assert transfer.transfer_size([])["tracked"] + half + 4 * 2**20 <= transfer.LIMIT


def test_the_folders_withheld_from_a_run_are_none_it_trains_on():
    from lab.gpu import train

    assert not set(transfer.NOT_TRAINED_THERE) & set(train.CPU_DATA)
    assert all(transfer.is_withheld(f"{folder}/meta.json") for folder in transfer.NOT_TRAINED_THERE)


def test_the_shipped_drafters_are_staged_as_they_are_and_restored_only_where_carried(tmp_path):
    weights = tmp_path / "weights"
    for name in ("dflash", "flashmap"):
        (weights / name).mkdir(parents=True)
        (weights / name / "model.safetensors").write_bytes(name.encode() * 100)
        (weights / name / "config.json").write_text(json.dumps({"name": name}))
    assert transfer.stage_inits(weights, tmp_path / "c") == ["dflash", "flashmap"]  # no teacher there: left out
    restored = transfer.restore_init([tmp_path / "elsewhere", tmp_path / "c"], "flashmap", tmp_path / "init/flashmap")
    assert (restored / "model.safetensors").read_bytes() == b"flashmap" * 100
    assert json.loads((restored / "config.json").read_text()) == {"name": "flashmap"}
    assert transfer.restore_init([tmp_path / "c"], "flashmap-teacher", tmp_path / "init/t") is None


def test_every_command_of_the_plan_fits_with_what_it_carries():
    """The stage command carries the three shipped drafters (45.8 MiB) beside the tracked tree."""
    weights = sum((transfer.ROOT / p).stat().st_size for p in transfer.CHECKPOINTS)
    assert [plan.command for plan in gpu_run.PLAN] == ["arch", "stage", "train"]
    assert transfer.transfer_size([])["tracked"] + weights + 2**20 <= transfer.LIMIT
