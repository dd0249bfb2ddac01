"""drafter.training.loop: the open-ended training run measures held-out acceptance, keeps the best checkpoint and
resumes with the CPU-hours of earlier sessions carried on."""
import json

import pytest

import drafter.data as data_mod
import drafter.training.loop as loop_mod
import drafter.training.train as train_mod
from drafter.config import spread_layers
from drafter.data import write_shard
from tests.test_drafter import tiny_seqs

SHAPE = ["--block-size", "4", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--n-feature-layers", "2",
         "--draft-vocab", "16", "--context-window", "8", "--batch-seqs", "2", "--anchors-per-seq", "4"]


def folder_with_features(path, seqs, target, monkeypatch):
    path.mkdir()
    write_shard(path / "shard-00000.safetensors", [s.tokens[:6] for s in seqs], [s.tokens[6:] for s in seqs])
    (path / "domains.json").write_text(json.dumps(["math", "chat"] * (len(seqs) // 2)))
    monkeypatch.setattr(data_mod, "load_target", lambda cfg: target)
    layers = spread_layers(target.model.config.num_hidden_layers, 2)  # what a new network of SHAPE reads
    data_mod.main(["features", "--data", str(path), "--layers", *map(str, layers)])


@pytest.fixture
def loop_folders(tiny_target, tmp_path, monkeypatch):
    """Training and held-out folders with cached features, and the loop loading the tiny target."""
    folder_with_features(tmp_path / "train", tiny_seqs(n=8), tiny_target, monkeypatch)
    folder_with_features(tmp_path / "val", tiny_seqs(n=4, seed=1), tiny_target, monkeypatch)
    monkeypatch.setattr(loop_mod, "load_target", lambda cfg: tiny_target)
    return tmp_path / "train", tmp_path / "val"


def test_loop_keeps_the_best_checkpoint_and_a_resumable_curve(loop_folders, tmp_path):
    curve = tmp_path / "curve.jsonl"
    train, val = loop_folders
    argv = ["--stage", "dflash", "--data", str(train), "--val", str(val),
            "--out", str(tmp_path / "run"), "--curve", str(curve), "--save-every", "1", "--eval-every", "1",
            "--stride", "1", "--hours", "0", *SHAPE]
    loop_mod.main(argv)  # a deadline already past: one step, saved, measured
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["best"] and set(rows[0]["acceptance"]) == {"all", "math",
                                                                                                 "chat"}
    assert (tmp_path / "run/best/model.safetensors").exists() and rows[0]["drafter"] == "dflash"
    loop_mod.main(argv)  # the same command resumes at step 1 and carries the CPU-hours on
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["cpu_hours"] >= rows[0]["cpu_hours"]
    record = json.loads((tmp_path / "run/config.json").read_text())["training"]
    assert record["train_config"]["schedule"] == "constant" and record["step"] == 2


def test_a_cycle_end_between_measurements_is_measured_too(loop_folders, tmp_path):
    curve = tmp_path / "curve.jsonl"
    train, val = loop_folders
    loop_mod.main(["--stage", "dflash", "--data", str(train), "--val", str(val),
                   "--out", str(tmp_path / "run"), "--curve", str(curve), "--save-every", "1", "--eval-every", "2",
                   "--stride", "1", "--hours", "1", "--cycle-steps", "3", *SHAPE])
    assert [json.loads(line)["step"] for line in curve.read_text().splitlines()] == [2, 3]  # 3: the decayed end


def test_the_teacher_can_be_measured_as_the_flow_maps_cap(loop_folders, tmp_path):
    """--eval-spec: the teacher's curve measures its multi-step draft from x0 = 0, what the flow map learns."""
    curve = tmp_path / "curve.jsonl"
    train, val = loop_folders
    loop_mod.main(["--stage", "teacher", "--data", str(train), "--val", str(val), "--out", str(tmp_path / "run"),
                   "--curve", str(curve), "--save-every", "1", "--eval-every", "1", "--stride", "1", "--hours", "0",
                   "--eval-spec", "flashmap-teacher,steps=2,scale=0", *SHAPE])
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert [r["drafter"] for r in rows] == ["flashmap-teacher,steps=2,scale=0"] and rows[0]["acceptance"]["all"] >= 1


def test_constant_schedule_warms_up_then_stays_flat():
    cfg = train_mod.TrainConfig("dflash", ("d",), "o", steps=1_000_000, schedule="constant")
    assert train_mod.lr_factor(0, cfg) < 0.01 and train_mod.lr_factor(199, cfg) == 1.0
    assert train_mod.lr_factor(500_000, cfg) == 1.0
