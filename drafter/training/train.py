"""Train a drafter: the FlashMap flow teacher, the distilled flow map, or the DFlash-style baseline.

python -m drafter.training.train --stage teacher --data DIR --out weights/<target>/flashmap-teacher [--steps N]
    [--init weights/<target>/dflash --t0-share 0.3]      (warm start from the DFlash-style net)
python -m drafter.training.train --stage distill --init weights/<target>/flashmap-teacher --data DIR \
    --out weights/<target>/flashmap
    [--student-init FOLDER]      (start from an earlier flow map instead of a copy of the teacher)
python -m drafter.training.train --stage dflash  --data DIR --out weights/<target>/dflash

Every `--save-every` steps the folder gets model.safetensors + config.json (drafter config, target
identity, training record) and train_state.safetensors (optimizer moments, step); rerunning the same
command resumes from it. Optimiser (§4): AdamW (0.9, 0.95), clip 1.0; teacher and DFlash-style: weight
decay 0.1, warmup + cosine; distillation: no weight decay, warmup-stable-decay (20% decay).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.profiler import record_function
from tqdm import tqdm

from core.runtime.target import TargetConfig, add_target_args, load_target, pick_device, target_config_from_args
from core.runtime.threads import cpu_flags
from drafter.blocks import Blocks
from drafter.config import MODULATIONS, DrafterConfig, ZLabFlowConfig, spread_layers
from drafter.data import (
    blocks_from_sequences,
    draft_vocabulary,
    held_apart,
    load_sequences,
    refuse_held_out_folders,
    target_to_draft_map,
)
from drafter.formats.checkpoint import save_checkpoint
from drafter.formats.dflash import is_zlab_folder
from drafter.networks.dflash import assumed_layout
from drafter.runtime.drafters import build_net, load_net, zlab_warm_start
from drafter.training.losses import dflash_loss, distill_loss, teacher_loss

STAGES = ("teacher", "distill", "dflash")


@dataclass(frozen=True)
class TrainConfig:
    stage: str
    data: tuple[str, ...]  # folders written by drafter.data generate, pooled
    out: str
    init: str | None = None  # distill: the teacher checkpoint; teacher / dflash: a warm start
    steps: int = 2000
    batch_seqs: int = 8  # sequences per step (one target forward)
    anchors_per_seq: int = 16  # blocks per sequence
    lr: float = 6e-4
    warmup_frac: float = 0.04
    decay_frac: float = 0.2  # WSD only
    weight_decay: float = 0.1
    save_every: int = 100
    seed: int = 0
    threads: int = 0  # 0: torch default
    precision: str = "bf16"  # bf16: matmuls under autocast (faster on GPUs and AMX CPUs); fp32 (flag: auto)
    grad_checkpoint: bool = False  # recompute each drafter block in backward (large drafters on a 24 GB GPU)
    t0_share: float = 0.0  # teacher: share of blocks trained at exactly t = 0, where every draft starts
    student_init: str | None = None  # distill: start the student from this flow map instead of a copy of the teacher
    zero_noise_blocks: int = 0  # distill: blocks per step whose jump from x0 = 0 learns the teacher's flow from 0
    zero_noise_steps: int = 16  # distill: the teacher's Euler steps for that target
    zero_noise_path: bool = False  # distill: those blocks also train the 2-step draft's jumps along that flow
    noise_path_blocks: int = 0  # distill: the next blocks fit their jumps from random x0 to the teacher's flow from it
    freeze_backbone: bool = False  # z-lab backbone: train only what the flow adds (fits a 24 GB GPU)
    schedule: str = "auto"  # auto: cosine (teacher, dflash) / WSD (distill); constant: warmup, then flat (loop)

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"--stage must be one of {STAGES}")
        if self.precision not in ("bf16", "fp32"):
            raise ValueError("--precision must be bf16 or fp32")
        if self.stage == "distill" and not self.init:
            raise ValueError("--stage distill needs --init <teacher checkpoint>")
        if self.zero_noise_blocks and self.stage != "distill":
            raise ValueError("--zero-noise-blocks applies to --stage distill only")
        if self.zero_noise_blocks < 0 or self.zero_noise_steps < 1:
            raise ValueError("--zero-noise-blocks must be >= 0 and --zero-noise-steps >= 1")
        if self.zero_noise_path and (not self.zero_noise_blocks or self.zero_noise_steps % 2):
            raise ValueError("--zero-noise-path needs --zero-noise-blocks and an even --zero-noise-steps")
        if self.noise_path_blocks and (self.stage != "distill" or self.noise_path_blocks < 0
                                       or self.zero_noise_steps % 2):
            raise ValueError("--noise-path-blocks applies to --stage distill, needs an even --zero-noise-steps")
        if self.student_init and self.stage != "distill":
            raise ValueError("--student-init applies to --stage distill only")
        if self.schedule not in ("auto", "constant"):
            raise ValueError("--schedule must be auto or constant")
        if not 0.0 <= self.t0_share <= 1.0:
            raise ValueError(f"--t0-share must be in [0, 1], got {self.t0_share}")


# CPU features (Linux /proc/cpuinfo names) under which bf16 autocast trains faster than fp32. Without AVX512-BF16 torch
# emulates bf16; with it but without AMX a distillation step still took 6.0 s in bf16 against 4.4 s in fp32 (session
# 16, 2 threads, one after the other), so only AMX tiles make bf16 pay on a CPU.
FAST_BF16_CPU_FLAGS = frozenset({"amx_bf16"})


def resolve_precision(requested: str, device: torch.device, flags: frozenset[str],
                      full_vocab_head: bool = False) -> str:
    """--precision auto: bf16 autocast where the hardware multiplies bf16 fast (a GPU, a CPU with AMX), else fp32.
    Measured, one distillation step of the DiT drafter on 2 threads: AVX2 only, bf16 178 s (emulated) against fp32
    6.9 s; AVX512-BF16 without AMX, 6.0 s against 4.4 s. A drafter whose head is the target's whole vocabulary (the
    z-lab backbone) spends its step in that one large product, which AVX512-BF16 does 4x faster than fp32: a step
    0.70 s in bf16 against 1.69 s in fp32 on SmolLM2 (one thread, 2026-12-01), so there bf16 wins without AMX too."""
    if requested != "auto":
        return requested
    fast = device.type != "cpu" or bool(flags & FAST_BF16_CPU_FLAGS)
    return "bf16" if fast or (full_vocab_head and "avx512_bf16" in flags) else "fp32"


def full_vocab_head(args) -> bool:
    """Whether the network trained has the target's whole vocabulary as its head: a new z-lab backbone, a published
    DFlash folder warm start, or a checkpoint on that backbone to continue or distil."""
    if getattr(args, "backbone", "dit") == "zlab":
        return True
    init = getattr(args, "init", None)
    if not init or not (Path(init) / "config.json").is_file():
        return False
    if is_zlab_folder(init):
        return True
    try:
        return json.loads((Path(init) / "config.json").read_text())["drafter"].get("backbone") == "zlab"
    except (ValueError, KeyError, AttributeError):
        return False


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Warmup then cosine (teacher, dflash) or warmup-stable-decay (distill), as in §4; constant: at most 200
    warmup steps, then flat (an open-ended run that keeps its best checkpoint by held-out acceptance)."""
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if cfg.schedule == "constant":
        return min(1.0, (step + 1) / min(warm, 200))
    if step < warm:
        return (step + 1) / warm
    if cfg.stage == "distill":
        decay_start = int((1 - cfg.decay_frac) * cfg.steps)
        return 1.0 if step < decay_start else max(0.0, (cfg.steps - step) / max(1, cfg.steps - decay_start))
    progress = (step - warm) / max(1, cfg.steps - warm)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def save_train_state(path: Path, opt: torch.optim.Optimizer, step: int) -> None:
    """Optimizer moments as safetensors (never pickled): exp_avg.i, exp_avg_sq.i, step.i per param."""
    tensors = {"global_step": torch.tensor(step)}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"{key}.{i}"] = torch.as_tensor(value).detach().cpu().clone()
    save_file(tensors, str(path))


def load_train_state(path: Path, opt: torch.optim.Optimizer) -> int:
    tensors = load_file(str(path))
    state = opt.state_dict()
    for name, value in tensors.items():
        if name == "global_step":
            continue
        key, i = name.rsplit(".", 1)
        state["state"].setdefault(int(i), {})[key] = value
    opt.load_state_dict(state)
    return int(tensors["global_step"])


def training_sequences(folders: tuple[str, ...], layers: tuple[int, ...] | None = None) -> list:
    """Every response with at least two tokens from all data folders (features attached with layers); a held-apart
    check set is refused."""
    for folder in folders:
        if held_apart(folder):
            raise SystemExit(f"{folder} is a check set (drafter.data generate --held-apart): never trained on")
    refuse_held_out_folders(folders, "training")
    return [s for folder in folders for s in load_sequences(folder, layers) if len(s.tokens) - s.prompt_len >= 2]


def init_record(cfg: TrainConfig, out: Path) -> dict | None:
    """The training record of the --init checkpoint (kept when resuming), so a warm-started checkpoint carries
    the whole history of the weights it started from."""
    if (out / "config.json").exists():
        kept = json.loads((out / "config.json").read_text()).get("training", {}).get("init_training")
        if kept is not None:
            return kept
    if not cfg.init or not (Path(cfg.init) / "config.json").exists():
        return None
    return {"path": cfg.init, **json.loads((Path(cfg.init) / "config.json").read_text()).get("training", {})}


def earlier_runs(previous: dict, cfg: TrainConfig) -> list[dict]:
    """The training record keeps every earlier phase: a resume with other settings (more steps, more data)
    starts a new phase and files the last record of the previous one under earlier_runs."""
    previous = dict(previous)
    earlier = previous.pop("earlier_runs", [])
    same = json.loads(json.dumps(previous.get("train_config"))) == json.loads(json.dumps(asdict(cfg)))
    return earlier if same or not previous else earlier + [previous]


@dataclass(frozen=True)
class NetShape:
    """The shape of a new network (teacher / dflash from scratch); distillation and warm starts keep the shape
    of the checkpoint they start from. backbone zlab: the published DFlash layout at the target's width and heads
    (d_model, n_heads and draft_vocab do not apply: its vocabulary is the target's whole one), exportable as a
    DFlash folder (drafter/formats/export.py) when its modulation is scale-gate."""

    block_size: int = 16
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_feature_layers: int = 4  # target layers read, spread over its depth (config.spread_layers)
    draft_vocab: int = 4096
    context_window: int = 128
    backbone: str = "dit"  # dit: the project's own network | zlab: the published DFlash layout
    modulation: str = "scale-gate"  # zlab: the time modulation (config.MODULATIONS)
    mask_token_id: int = -1  # zlab: the id whose embedding fills the masked slots; -1: the tokenizer's mask or unk

    def __post_init__(self):
        if self.backbone not in ("dit", "zlab"):
            raise ValueError(f"--backbone must be dit or zlab, got {self.backbone!r}")
        if self.modulation not in MODULATIONS:
            raise ValueError(f"--modulation must be one of {tuple(MODULATIONS)}")


def network_config(cfg: TrainConfig, shape: NetShape, target) -> DrafterConfig | ZLabFlowConfig:
    """The config of a new network for this stage and target, built once."""
    layers = spread_layers(target.model.config.num_hidden_layers, shape.n_feature_layers)
    kind = "dflash" if cfg.stage == "dflash" else "flashmap"
    if shape.backbone == "zlab":
        zlab = assumed_layout(target.model.config, target.vocab_size, shape.n_layers, shape.block_size + 1,
                              mask_token(shape, target), tuple(i - 1 for i in layers))  # z-lab counts from layer 0
        return ZLabFlowConfig(zlab=zlab, kind=kind, context_window=shape.context_window, modulation=shape.modulation)
    return DrafterConfig(
        kind=kind, block_size=shape.block_size, d_model=shape.d_model,
        n_layers=shape.n_layers, n_heads=shape.n_heads, feature_layers=layers,
        target_hidden=target.model.config.hidden_size, draft_vocab=shape.draft_vocab,
        context_window=shape.context_window,
    )


def mask_token(shape: NetShape, target) -> int:
    """--mask-token-id, else the tokenizer's mask token, else its unknown token, else 0."""
    if shape.mask_token_id >= 0:
        if shape.mask_token_id >= target.vocab_size:
            raise ValueError(f"--mask-token-id {shape.mask_token_id} is outside the vocabulary ({target.vocab_size})")
        return shape.mask_token_id
    tok = getattr(target, "tokenizer", None)
    for name in ("mask_token_id", "unk_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int) and 0 <= value < target.vocab_size:
            return value
    return 0


def build_student(cfg: TrainConfig, net_cfg: DrafterConfig | ZLabFlowConfig, target, seqs):
    """Returns (net, frozen teacher or None, vocab_ids). With --init, the network starts from that checkpoint:
    distillation from its teacher; a teacher warm-started from a DFlash-style net (same architecture:
    the one-pass regime it learned is the flow's t = 0) or from a published z-lab DFlash drafter (its network
    becomes the teacher's backbone, drafter/networks/zlab_flow.py); DFlash-style continued from an earlier one."""
    if cfg.init and is_zlab_folder(cfg.init):  # a published DFlash drafter: the flow teacher's backbone
        if cfg.stage != "teacher":
            raise ValueError(f"--init {cfg.init} is a published DFlash drafter: it warm-starts --stage teacher only")
        warm, vocab_ids = zlab_warm_start(cfg.init, target, net_cfg.context_window)
        return warm.train(), None, vocab_ids
    if cfg.init:
        net, vocab_ids, _ = load_net(cfg.init, target)
        if cfg.stage == "teacher" and net.cfg.kind == "dflash":
            net.start_from_mask()  # its t = 0 pass starts as the DFlash-style pass
        kind = "dflash" if cfg.stage == "dflash" else "flashmap"
        net.cfg = replace(net.cfg, kind=kind)
        if cfg.stage == "distill":
            teacher = net.requires_grad_(False)
            return distill_student(cfg, teacher, vocab_ids, target), teacher, vocab_ids
        return net.train().requires_grad_(True), None, vocab_ids
    vocab_ids = (torch.arange(target.vocab_size) if isinstance(net_cfg, ZLabFlowConfig)  # DFlash's: the whole one
                 else draft_vocabulary(seqs, net_cfg.draft_vocab))
    return build_net(net_cfg, target, vocab_ids).train(), None, vocab_ids


def distill_student(cfg: TrainConfig, teacher, vocab_ids: torch.Tensor, target):
    """A copy of the teacher, or with --student-init an earlier flow map: it keeps the jumps it learned
    (the off-diagonal path a teacher never trains) while the new teacher's diagonal is distilled into it."""
    if not cfg.student_init:
        return copy.deepcopy(teacher).train().requires_grad_(True)
    student, student_vocab, _ = load_net(cfg.student_init, target)
    if not torch.equal(student_vocab, vocab_ids) or replace(student.cfg, kind="flashmap") != teacher.cfg:
        raise ValueError(f"--student-init {cfg.student_init}: its shape or draft vocabulary differs from the teacher's")
    return student.train().requires_grad_(True)


def loss_for(cfg: TrainConfig, net, teacher, blocks, gen):
    if cfg.stage == "teacher":
        return teacher_loss(net, blocks, gen, cfg.t0_share)
    if cfg.stage == "dflash":
        return dflash_loss(net, blocks)
    return distill_loss(net, teacher, blocks, gen, cfg.zero_noise_blocks, cfg.zero_noise_steps, cfg.zero_noise_path,
                        cfg.noise_path_blocks)


def make_optimizer(cfg: TrainConfig, net) -> tuple[list, torch.optim.Optimizer]:
    """The trainable parameters and AdamW over them (§4: betas 0.9, 0.95; no weight decay for distillation)."""
    decay = 0.0 if cfg.stage == "distill" else cfg.weight_decay
    params = [p for p in net.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=decay, foreach=True)


def draw_blocks(cfg: TrainConfig, net, target, seqs, to_draft, data_gen) -> Blocks:
    """One step's batch: batch_seqs random sequences, anchors_per_seq blocks from each, on the target's device."""
    with record_function("batch"):  # the step's parts are named for scripts/profile_train.py
        idx = torch.randint(len(seqs), (cfg.batch_seqs,), generator=data_gen).tolist()
        return blocks_from_sequences(target, [seqs[i] for i in idx], cfg.anchors_per_seq, net.cfg.block_size,
                                     net.cfg.context_window, net.cfg.feature_layers, to_draft,
                                     data_gen).to(target.device)


def train_step(cfg: TrainConfig, net, teacher, blocks: Blocks, noise_gen, params, opt) -> torch.Tensor:
    """Loss, backward, clip at 1.0 and an optimizer step; returns the loss."""
    with record_function("forward_loss"), torch.autocast(blocks.tokens.device.type, dtype=torch.bfloat16,
                                                         enabled=cfg.precision == "bf16"):
        loss = loss_for(cfg, net, teacher, blocks, noise_gen)  # weights and optimizer stay fp32
    with record_function("backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    with record_function("optimizer"):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return loss


def train(cfg: TrainConfig, shape: NetShape, target_cfg: TargetConfig) -> Path:
    """The CLI's run: load the target and the data folders (with their feature caches), then train_on."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target = load_target(target_cfg)
    seqs = training_sequences(cfg.data)
    if not seqs:
        raise SystemExit(f"no training sequences in {cfg.data}; run python -m drafter.data generate first")
    return train_on(cfg, target, lambda layers: training_sequences(cfg.data, layers),
                    network_config(cfg, shape, target))


def train_on(cfg: TrainConfig, target, sequences, net_cfg: DrafterConfig | ZLabFlowConfig, on_save=None,
             stop_at: float | None = None, save_every_s: float | None = None, on_step=None) -> Path:
    """Train on the target's device (the CPU here, a GPU when --device cuda); resumes from cfg.out.
    sequences(layers) gives the training sequences, with features of those layers where cached (layers None:
    tokens only, for the draft vocabulary); on_save(folder) runs after every save (lab.gpu copies it out).
    A run with a deadline (stop_at, time.time()) saves and stops there even short of cfg.steps, and saves every
    save_every_s seconds besides every cfg.save_every steps; on_step(step) is called after each step."""
    device = target.device
    out = Path(cfg.out)
    net, teacher, vocab_ids = build_student(cfg, net_cfg, target, sequences(None))
    seqs = sequences(net.cfg.feature_layers)  # now with the cached features of those layers
    saved_step, earlier = 0, []
    if (out / "config.json").exists():  # resume: weights (and vocabulary) from the last save
        net, vocab_ids, meta = load_net(out, target)
        saved_step = int(meta.get("training", {}).get("step", 0))
        earlier = earlier_runs(meta.get("training", {}), cfg)
    net = net.to(device).train()
    net.grad_checkpoint = cfg.grad_checkpoint
    if cfg.freeze_backbone:
        if not hasattr(net, "backbone"):
            raise ValueError("--freeze-backbone applies to a z-lab DFlash backbone (--init <published folder>)")
        net.backbone.requires_grad_(False)
    teacher = teacher.to(device) if teacher is not None else None
    to_draft = target_to_draft_map(vocab_ids, target.vocab_size)
    params, opt = make_optimizer(cfg, net)
    state_path = out / "train_state.safetensors"
    # optimizer moments are not committed (too large); without them a resumed run keeps the weights and
    # the step from config.json and restarts the moments
    start = load_train_state(state_path, opt) if state_path.exists() else saved_step
    for group in opt.param_groups:
        group.setdefault("initial_lr", cfg.lr)  # LambdaLR resumes from last_epoch only with this set
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg), last_epoch=start - 1)
    data_gen = torch.Generator().manual_seed(cfg.seed + start)  # batches and anchors; a resumed run draws fresh ones
    noise_gen = torch.Generator(device=device).manual_seed(cfg.seed + start + 1)  # times and noise, on the device
    training = {"train_config": asdict(cfg), "data": list(cfg.data), "sequences": len(seqs), "resumed_from": start,
                "device": str(device), "earlier_runs": earlier, "init_training": init_record(cfg, out)}
    progress = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"train {cfg.stage}",
                    mininterval=5.0)
    began, running = time.time(), None
    last_save = began
    for step in progress:
        blocks = draw_blocks(cfg, net, target, seqs, to_draft, data_gen)
        loss = train_step(cfg, net, teacher, blocks, noise_gen, params, opt)
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        progress.set_postfix(loss=f"{running:.3f}", lr=f"{sched.get_last_lr()[0]:.2e}", refresh=False)
        if on_step is not None:
            on_step(step)
        late = stop_at is not None and time.time() > stop_at
        timed = save_every_s is not None and time.time() - last_save > save_every_s
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps or late or timed:
            record = dict(training, step=step + 1, loss_ema=running,
                          seconds_this_run=round(time.time() - began, 1))
            save_checkpoint(out, net, vocab_ids, target.identity, record)
            save_train_state(state_path, opt, step + 1)
            last_save = time.time()
            if on_save is not None:
                on_save(out)
        if late:
            break
    return out


def add_train_args(parser: argparse.ArgumentParser, with_steps: bool = True) -> None:
    """The TrainConfig and NetShape flags (drafter.training.loop reuses them without --steps: its runs are
    open-ended)."""
    parser.add_argument("--stage", required=True, choices=STAGES, help="what to train")
    parser.add_argument("--data", nargs="+", required=True,
                        help="folders written by python -m drafter.data generate (pooled)")
    parser.add_argument("--out", required=True, help="checkpoint folder (an existing one resumes)")
    parser.add_argument("--init", default=None, help="start from this checkpoint: the teacher (distill), a "
                        "DFlash-style net or a published z-lab DFlash folder (teacher warm start), an earlier run "
                        "(dflash)")
    ints = [("steps", 2000)] if with_steps else []
    ints += [("batch-seqs", 8), ("anchors-per-seq", 16), ("save-every", 100), ("seed", 0), ("threads", 0)]
    for flag, default in ints:
        parser.add_argument(f"--{flag}", type=int, default=default, help=f"default {default}")
    floats: list[tuple[str, float | None]] = [("lr", None), ("warmup-frac", 0.04), ("decay-frac", 0.2),
                                              ("weight-decay", 0.1)]
    for flag, value in floats:
        parser.add_argument(f"--{flag}", type=float, default=value,
                            help="default 6e-4 (5e-5 for distill)" if flag == "lr" else f"default {value}")
    # network shape (new teacher / dflash only; distill and --init keep their checkpoint's)
    choices = {"backbone": ["dit", "zlab"], "modulation": list(MODULATIONS)}
    for field in fields(NetShape):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default,
                            choices=choices.get(field.name), help="new networks only: " + field.name.replace("_", " "))
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                        help="bf16: matmuls under bf16 autocast; auto (default): bf16 on a GPU or a CPU with AMX, "
                             "else fp32 (faster there, measured)")
    parser.add_argument("--grad-checkpoint", action="store_true", help="recompute drafter blocks in backward")
    parser.add_argument("--student-init", default=None,
                        help="distill: start the student from this flow map (else a copy of the teacher)")
    parser.add_argument("--zero-noise-blocks", type=int, default=0,
                        help="distill: blocks per step whose full jump from x0 = 0 learns the teacher's flow from 0 "
                             "(the zero-noise T = 0 draft, `flashmap,scale=0`)")
    parser.add_argument("--zero-noise-steps", type=int, default=16,
                        help="distill: the teacher's Euler steps for the zero-noise and noise-path targets")
    parser.add_argument("--zero-noise-path", action="store_true",
                        help="distill: those blocks also fit the 2-step draft's two jumps along the teacher's flow "
                             "from 0 (`flashmap,steps=2,scale=0`)")
    parser.add_argument("--noise-path-blocks", type=int, default=0,
                        help="distill: the next blocks per step fit their full jump and 2-step jumps from random x0 "
                             "onto the teacher's flow from that x0 (`flashmap,steps=2`, the shuffle test's draft)")
    parser.add_argument("--freeze-backbone", action="store_true",
                        help="z-lab backbone: train only the time modulation and state input the flow adds")
    parser.add_argument("--t0-share", type=float, default=0.0,
                        help="teacher: share of blocks trained at t = 0 (e.g. 0.3 with --init from a DFlash-style net)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_args(parser)
    add_target_args(parser, cpu_precision="reference")
    return parser.parse_args(argv)


def config_from_args(args, **overrides) -> TrainConfig:
    lr = args.lr if args.lr is not None else (5e-5 if args.stage == "distill" else 6e-4)
    values = dict(stage=args.stage, data=tuple(args.data), out=args.out, init=args.init,
                  steps=getattr(args, "steps", None), batch_seqs=args.batch_seqs, anchors_per_seq=args.anchors_per_seq,
                  lr=lr, warmup_frac=args.warmup_frac, decay_frac=args.decay_frac, weight_decay=args.weight_decay,
                  save_every=args.save_every, seed=args.seed, threads=args.threads,
                  precision=resolve_precision(args.precision, pick_device(args.device), cpu_flags(),
                                              full_vocab_head(args)),
                  grad_checkpoint=args.grad_checkpoint, t0_share=args.t0_share, student_init=args.student_init,
                  freeze_backbone=args.freeze_backbone, zero_noise_blocks=args.zero_noise_blocks,
                  zero_noise_steps=args.zero_noise_steps, zero_noise_path=args.zero_noise_path,
                  noise_path_blocks=args.noise_path_blocks)
    return TrainConfig(**{**values, **overrides})


def shape_from_args(args) -> NetShape:
    return NetShape(**{field.name: getattr(args, field.name) for field in fields(NetShape)})


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"saved {train(config_from_args(args), shape_from_args(args), target_config_from_args(args))}")


if __name__ == "__main__":
    main()
