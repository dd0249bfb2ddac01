"""Where a training step's time goes (learning per CPU-second), measured on the real data.

python -m scripts.profile_train --stages dflash teacher distill --steps 6 --threads 2 --jobs 2 \
    --out docs/results/train-profile-DATE.json

Three measurements per stage, each on the same batches:
- the profile below (torch.profiler roughly doubles a step's time: its shares are what to read, not its seconds);
- seconds per step without the profiler, with the context kept factored as training does (network.PooledContext)
  against the gathered (B, W+1, D) context it stands for, interleaved;
- with --jobs 2: one job on --threads threads against --threads jobs of one thread each, run at once (steps per
  second of all jobs together).

Each stage is set up as drafter.training.train sets it up (warm-started from the shipped checkpoints, the teacher at
30% t = 0),
then `--steps` steps (after two warm-up steps) run under torch.profiler. A step is split into its four parts by
record_function (batch assembly from the cached features, forward + loss, backward, optimizer), and the operators
into what they compute: attention, the LM head (a (.., D_t) x (D_t, V) product), the flow state's products with E
(a (.., V) x (V, D_t) product), other matrix products (the drafter's own layers), softmax / cross-entropy, norms /
elementwise / copies / gathers, and the rest. The figures are self CPU time of each operator, forward and backward
together.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from core.runtime.target import TargetConfig, load_target
from drafter.blocks import Blocks
from drafter.data import target_to_draft_map
from drafter.training.train import (
    TrainConfig,
    build_student,
    draw_blocks,
    make_optimizer,
    train_step,
    training_sequences,
)

WEIGHTS = "weights/smollm2-135m-instruct"
INIT = {"dflash": f"{WEIGHTS}/dflash", "teacher": f"{WEIGHTS}/dflash", "distill": f"{WEIGHTS}/flashmap-teacher"}
PHASES = ("batch", "forward_loss", "backward", "optimizer")
ELEMENTWISE = {"mul", "add", "copy", "pow", "mean", "rsqrt", "div", "sum", "fill", "sub", "gelu", "gelu_backward",
               "silu", "silu_backward", "clone", "to", "_to_copy", "index", "index_put", "_index_put_impl", "cat",
               "where", "masked_fill", "exp", "addcmul", "addcdiv", "sqrt", "zero", "neg", "lerp"}


def category(name: str, shapes: list, vocab: int, width: int) -> str:
    """What an operator computes, from its name and input shapes."""
    if "attention" in name or "sdpa" in name:
        return "attention"
    if any(k in name for k in ("softmax", "cross_entropy", "nll_loss", "log_softmax")):
        return "softmax_ce"
    if name in ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear") and len(shapes) >= 2:
        dims = [tuple(s) for s in shapes if s]
        lasts = [d[-1] for d in dims if d]
        if vocab in lasts and width in lasts:
            first = dims[0][-1] if dims[0] else None
            return "lm_head" if first == width else "state_x_E"
        return "drafter_matmul"
    if name.split("::")[-1].rstrip("_") in ELEMENTWISE:
        return "norms_elementwise_copies"
    return "other"


def setup(stage: str, target, data: tuple[str, ...], threads: int):
    cfg = TrainConfig(stage=stage, data=data, out="/nonexistent", init=INIT[stage], threads=threads,
                      t0_share=0.3 if stage == "teacher" else 0.0, lr=2e-4)
    net, teacher, vocab_ids = build_student(cfg, None, target, [])
    seqs = training_sequences(data, net.cfg.feature_layers)
    params, opt = make_optimizer(cfg, net)
    return cfg, net, teacher, seqs, target_to_draft_map(vocab_ids, target.vocab_size), params, opt


class GatheredBlocks(Blocks):
    """Blocks whose context is always the gathered tensor: the layout training used before PooledContext."""

    def context(self, net, rows=None, pooled=False):
        return super().context(net, rows, pooled=False)


def step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen, gathered: bool = False) -> None:
    """One training step as drafter.training.train takes it (its parts named for the profiler there)."""
    blocks = draw_blocks(cfg, net, target, seqs, to_draft, gen)
    train_step(cfg, net, teacher, GatheredBlocks(**vars(blocks)) if gathered else blocks, gen, params, opt)


def profile_stage(stage: str, target, data, threads: int, steps: int) -> dict:
    cfg, net, teacher, seqs, to_draft, params, opt = setup(stage, target, data, threads)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen)
    seconds = {"pooled": [], "gathered": []}
    for mode in ("gathered", "pooled") * 2:  # interleaved, the same batches for both
        gen = torch.Generator().manual_seed(len(seconds[mode]))
        began = time.perf_counter()
        for _ in range(steps):
            step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen, gathered=mode == "gathered")
        seconds[mode].append(round((time.perf_counter() - began) / steps, 3))
    began = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen)
    wall = (time.perf_counter() - began) / steps
    events = prof.key_averages(group_by_input_shape=True)
    phases = {e.key: e.cpu_time_total / 1e6 / steps for e in events if e.key in PHASES}
    parts: dict[str, float] = {}
    for e in events:
        if e.key in PHASES:
            continue
        kind = category(e.key, e.input_shapes, net.cfg.draft_vocab, net.cfg.target_hidden)
        parts[kind] = parts.get(kind, 0.0) + e.self_cpu_time_total / 1e6 / steps
    return {"stage": stage, "threads": threads, "blocks_per_step": cfg.batch_seqs * cfg.anchors_per_seq,
            "seconds_per_step": seconds, "seconds_per_step_profiled": round(wall, 3),
            "phases_s": {k: round(v, 3) for k, v in phases.items()},
            "operators_s": {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}}


def worker(stage: str, data, threads: int, steps: int, barrier: Path, n_jobs: int) -> None:
    """One timed training job (--jobs): set up, one warm-up step, wait until every job is ready, time `steps`."""
    torch.set_num_threads(threads)
    target = load_target(TargetConfig(cpu_precision="reference"))
    cfg, net, teacher, seqs, to_draft, params, opt = setup(stage, target, data, threads)
    gen = torch.Generator().manual_seed(os.getpid())
    step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen)
    (barrier / str(os.getpid())).touch()
    while len(list(barrier.iterdir())) < n_jobs:
        time.sleep(0.05)
    began = time.perf_counter()
    for _ in range(steps):
        step(cfg, net, teacher, seqs, to_draft, params, opt, target, gen)
    print(json.dumps({"seconds_per_step": (time.perf_counter() - began) / steps}), flush=True)


def compare_jobs(stage: str, data, threads: int, steps: int) -> dict:
    """Steps per second of one job on `threads` threads against `threads` one-thread jobs at once."""
    def run(n_jobs: int, job_threads: int) -> float:
        with tempfile.TemporaryDirectory() as barrier:
            env = dict(os.environ, OMP_NUM_THREADS=str(job_threads))
            cmd = [sys.executable, "-m", "scripts.profile_train", "--worker", stage, "--threads", str(job_threads),
                   "--steps", str(steps), "--barrier", barrier, "--jobs", str(n_jobs), "--data", *data]
            procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n_jobs)]
            outs = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
        return sum(1 / out["seconds_per_step"] for out in outs)

    one, many = run(1, threads), run(threads, 1)
    return {"stage": stage, f"one_job_{threads}_threads_steps_per_s": round(one, 3),
            f"{threads}_jobs_1_thread_steps_per_s": round(many, 3), "ratio": round(many / one, 3)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=["dflash", "teacher", "distill"],
                        choices=["dflash", "teacher", "distill"], help="training stages to profile")
    parser.add_argument("--data", nargs="+", default=["data/smollm2-responses"],
                        help="response folders with cached features (drafter.data features)")
    parser.add_argument("--steps", type=int, default=6, help="profiled steps per stage (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default=None, help="write the figures here (JSON)")
    parser.add_argument("--jobs", type=int, default=0, help="also compare one job against this many one-thread jobs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a job of --jobs
    parser.add_argument("--barrier", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, tuple(args.data), args.threads, args.steps, Path(args.barrier), args.jobs)
    torch.set_num_threads(args.threads)
    target = load_target(TargetConfig(cpu_precision="reference"))
    rows = [profile_stage(s, target, tuple(args.data), args.threads, args.steps) for s in args.stages]
    if args.jobs:
        rows.append(compare_jobs(args.stages[0], tuple(args.data), args.threads, args.steps))
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
