"""Training that never stops: one resumable run per drafter, open-ended at a constant learning rate
(or one schedule cycle of --cycle-steps, sized to a session), that measures held-out acceptance every --eval-every
steps, keeps the best checkpoint in OUT/best and appends each measurement (step, CPU-hours, acceptance per domain)
to a learning curve. It stops at --hours (the end of a working session, saving first) and the same command
resumes it; the CPU-hours carry on from the curve's last line.

python -m drafter.training.loop --stage dflash --init weights/smollm2-135m-instruct/dflash \
    --data data/smollm2-responses data/smollm2-responses-2 --val data/smollm2-val \
    --out runs/loop-dflash --curve docs/results/curve-dflash.jsonl --lr 3e-4 --threads 2 --hours 2

Acceptance is the offline evaluator's (drafter.evaluation.evaluate, K = the drafter's own, T = 0) on every --stride-th
anchor of the held-out responses; paired across measurements (same anchors).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from core.runtime.target import TargetConfig, add_target_args, load_target, target_config_from_args
from drafter.evaluation.evaluate import Variant, evaluate_variant, held_out_sequences, load_variant
from drafter.spec import DrafterSpec
from drafter.training.train import (
    NetShape,
    TrainConfig,
    add_train_args,
    config_from_args,
    network_config,
    shape_from_args,
    train_on,
    training_sequences,
)

# what each stage's measurements draft with: the flow map as the app drafts at T = 0, from x0 = 0
SPEC_OF_STAGE = {"dflash": "dflash", "teacher": "flashmap-teacher", "distill": "flashmap,scale=0"}
OPEN_ENDED_STEPS = 1_000_000  # the run stops at its deadline, never here


def read_curve(curve: Path) -> list[dict]:
    """The measurements earlier sessions of this run wrote (none for a new curve)."""
    if not curve.exists():
        return []
    return [json.loads(line) for line in curve.read_text().splitlines() if line.strip()]


class Evaluator:
    """Held-out acceptance of the run's latest save; best checkpoint kept, curve appended."""

    def __init__(self, cfg: TrainConfig, target, val: Path, stride: int, curve: Path, spec_text: str | None = None):
        self.cfg, self.target, self.stride, self.curve = cfg, target, stride, curve
        self.spec_text = spec_text or SPEC_OF_STAGE[cfg.stage]
        self.val = val
        self.seqs: list | None = None  # the held-out sequences and their domains, read at the first evaluation
        self.domains: list[str] = []
        earlier = read_curve(curve)
        self.cpu_start = time.process_time()
        self.cpu_offset = earlier[-1]["cpu_hours"] if earlier else 0.0  # carried on from earlier sessions
        self.best = max((row["acceptance"]["all"] for row in earlier), default=float("-inf"))

    def __call__(self, step: int) -> dict:
        spec = replace(DrafterSpec.parse(self.spec_text), weights=self.cfg.out)
        variant = Variant(f"{self.spec_text}@{step}", spec)
        loaded = load_variant(variant, self.target)
        if self.seqs is None:
            self.seqs, self.domains = held_out_sequences(self.val, loaded[0].cfg.feature_layers, None)
        assert self.seqs is not None
        result = evaluate_variant(variant, loaded, self.target, self.seqs, self.domains, self.stride, 128, 0)
        acceptance = {d: round(result[d]["acceptance_length"], 4) for d in ["all", *dict.fromkeys(self.domains)]}
        cpu_hours = self.cpu_offset + (time.process_time() - self.cpu_start) / 3600
        row = {"step": step, "drafter": self.spec_text, "cpu_hours": round(cpu_hours, 4),
               "time": time.strftime("%Y-%m-%d %H:%M"),
               "rounds": result["all"]["rounds"], "acceptance": acceptance, "best": acceptance["all"] > self.best}
        if row["best"]:
            self.best = acceptance["all"]
            keep_best(Path(self.cfg.out))
        self.curve.parent.mkdir(parents=True, exist_ok=True)
        with self.curve.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row


def keep_best(out: Path) -> None:
    best = out / "best"
    best.mkdir(exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copyfile(out / name, best / f"{name}.tmp")
        (best / f"{name}.tmp").replace(best / name)


def run(cfg: TrainConfig, shape: NetShape, target_cfg: TargetConfig, val: Path, curve: Path, eval_every: int,
        stride: int, hours: float, eval_spec: str | None = None) -> Path:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target = load_target(target_cfg)
    evaluate = Evaluator(cfg, target, val, stride, curve, eval_spec)
    step = [0]

    def on_save(folder):
        if step[0] % eval_every == 0:
            evaluate(step[0])

    out = train_on(cfg, target, lambda layers: training_sequences(cfg.data, layers),
                   network_config(cfg, shape, target), on_save=on_save, stop_at=time.time() + hours * 3600,
                   on_step=lambda s: step.__setitem__(0, s + 1))
    if step[0] % eval_every:  # the last save (a cycle's decayed end, or the deadline's) was not measured at save
        evaluate(step[0])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_args(parser)
    parser.add_argument("--val", required=True, help="held-out responses with cached features (drafter.data)")
    parser.add_argument("--curve", default=None, help="learning curve JSONL (default OUT/curve.jsonl)")
    parser.add_argument("--eval-every", type=int, default=300, help="steps between held-out measurements")
    parser.add_argument("--stride", type=int, default=8, help="every N-th anchor of the held-out responses")
    parser.add_argument("--eval-spec", default=None,
                        help="the drafter spec measured (default: the stage's own, e.g. flashmap-teacher; for the "
                             "teacher as the flow map's cap: flashmap-teacher,steps=16,scale=0)")
    parser.add_argument("--hours", type=float, required=True, help="stop (and save) after this long")
    parser.add_argument("--cycle-steps", type=int, default=0,
                        help="0: open-ended at a constant lr; N: one cycle of the stage's own schedule (cosine, or "
                             "WSD for distill) over N steps, sized to the session so it ends decayed")
    add_target_args(parser, cpu_precision="reference")
    args = parser.parse_args(argv)
    if args.eval_every % args.save_every:
        raise SystemExit("--eval-every must be a multiple of --save-every (it evaluates a save)")
    cfg = (config_from_args(args, steps=args.cycle_steps) if args.cycle_steps
           else config_from_args(args, steps=OPEN_ENDED_STEPS, schedule="constant"))
    curve = Path(args.curve) if args.curve else Path(cfg.out) / "curve.jsonl"
    run(cfg, shape_from_args(args), target_config_from_args(args), Path(args.val), curve, args.eval_every,
        args.stride, args.hours, args.eval_spec)


if __name__ == "__main__":
    main()
