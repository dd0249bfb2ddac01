"""Train a FlashMap drafter in the release's architecture (drafter.networks.release) for the embedded default target
(its reference fp32 forward gives the embedding and LM head; `target` is the hub id written as the drafter's
target_model), and save it as a release folder (config.json with `model_type: "flashmap"`, model.safetensors) that
the authors' loader, plugins and this engine all read.

Shape letters: B = blocks, K = block size, W = context window, P = pooled positions, F = feature width,
D = the drafter's width, D_t = target width, V = target vocabulary, H = heads, Hd = head dim.

The objective is the flow's own: along x_s = (1 - s) x0 + s onehot(y) from noise x0 ~ N(0, I_V) to the block's
tokens y, a jump from time s lands on the distribution of y, so its logits are trained by cross-entropy against
the target's own tokens (the denoiser's loss of the paper, §2; a jump ending at t = 1 is the denoiser at s, and the
first jump of a two-step draft moves the state toward it, as an Euler step of the flow does). Each block draws its
jump: from s = 0 (the one-step draft, and a two-step draft's first jump) or from an interior time of a step grid,
to t = 1 or the grid's next time. Slots are weighted exp(-(k - 1) / slot_decay), as DFlash weights them: an early
slot's error cuts every later one. No distillation stage yet: the jumps are the flow's Euler steps.

Training data: target-written responses to training prompts (drafter.data generate) with their cached features
(drafter.data features --layers ...); check sets (held apart) are refused. The target's embedding and LM head
stay
frozen and outside the checkpoint, as in the release.

python -m drafter.training.train_release --data data/smollm2-responses --out runs/flashmap-release --steps 3000
    (rerunning the same command resumes from the folder's train_state.safetensors)
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from core.runtime.target import TargetConfig, load_target
from core.verification.sampling import draw_device
from drafter.blocks import Blocks, block_context
from drafter.data import blocks_from_sequences, held_apart, load_sequences, refuse_held_out_folders
from drafter.networks.release import ReleaseConfig, ReleaseNet

# the release's jump grids (the "decoding_error" schedule at Qwen3's vocabulary) for one and two steps
JUMP_GRIDS = {1: (0.0, 1.0), 2: (0.0, 0.8172569274902344, 1.0)}


@dataclass(frozen=True)
class ReleaseTrainConfig:
    data: tuple[str, ...]  # folders of target-written responses with cached features, pooled
    out: str
    target: str = "HuggingFaceTB/SmolLM2-135M-Instruct"  # written as the drafter's target_model
    steps: int = 3000
    batch_seqs: int = 8  # sequences per step
    anchors_per_seq: int = 8  # blocks per sequence
    window: int = 512  # context positions a training block reads (the engine reads all)
    lr: float = 5e-4
    warmup: int = 100
    weight_decay: float = 0.01
    slot_decay: float = 7.0
    zero_share: float = 0.6  # blocks jumping from s = 0
    save_every: int = 100
    seed: int = 0
    threads: int = 2
    # the DiT
    target_layer_ids: tuple[int, ...] = (0, 9, 19, 28)  # spread over a 30-layer target; hidden_states i + 1
    block_size: int = 16
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 768
    cond_dim: int = 64
    time_embed_dim: int = 64

    def release_config(self, target) -> ReleaseConfig:
        grids = tuple(JUMP_GRIDS.items())
        return ReleaseConfig(
            target_model=self.target, target_hidden_size=target.model.config.hidden_size,
            vocab_size=target.vocab_size, target_layer_ids=self.target_layer_ids, block_size=self.block_size,
            hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
            cond_dim=self.cond_dim, time_embed_dim=self.time_embed_dim, time_scale=1000.0, rope_theta=10000.0,
            rms_norm_eps=1e-6, qk_norm_eps=1e-5, layer_norm_eps=1e-6, noise_gate="jump", num_steps=1,
            jump_grids=grids)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.target_layer_ids)


def release_json(cfg: ReleaseConfig, target_identity: dict, training: dict) -> dict:
    """config.json as the release writes it (FlashMapConfig's fields), with what this project records beside them:
    the identity of the target and how the drafter was trained."""
    fields = asdict(cfg)
    fields["target_layer_ids"] = list(cfg.target_layer_ids)
    fields["jump_grids"] = {str(n): list(grid) for n, grid in cfg.jump_grids}
    # speculators_model_type: what the release's vLLM plugin reads a folder as a FlashMap drafter by
    return {"architectures": ["FlashMapDraftModel"], "model_type": "flashmap", "speculators_model_type": "flashmap",
            **fields, "time_schedule": "decoding_error", "tie_word_embeddings": False, "dtype": "bfloat16",
            "flashmap_chat": {"target": target_identity, "training": training}}


def save_release(folder: Path, net: ReleaseNet, target_identity: dict, training: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(release_json(net.c, target_identity, training), indent=2))


# ---- the loss ---------------------------------------------------------------------------------------------------


def draw_jumps(n: int, zero_share: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, t) (n,) each: from 0 to 1 or to the two-step grid's first time, or from that time to 1."""
    inner = JUMP_GRIDS[2][1]
    zero = torch.rand(n, generator=gen) < zero_share
    to_inner = torch.rand(n, generator=gen) < 1 / 3
    s = torch.where(zero, 0.0, inner)
    t = torch.where(zero & to_inner, inner, 1.0)
    return s, t


def block_inputs(net: ReleaseNet, tokens: torch.Tensor, s: torch.Tensor, t: torch.Tensor, embedding: torch.Tensor,
                 gen: torch.Generator) -> torch.Tensor:
    """The DiT's inputs (B, K, D_t) for blocks of clean tokens (B, K) at times s, jumping to t (B,): from s = 0 the
    noise as the engine draws it (z @ L^T), else the path's point x_s = (1 - s) x0 + s onehot(y) read as a state."""
    b, k = tokens.shape
    uniform, factor = net.noise_factor(embedding)
    jump = (t - s)[:, None, None]
    inputs = torch.empty(b, k, embedding.shape[1])
    zero = s == 0
    if zero.any():
        assert factor is not None  # (a one-step jump from s = 0 reads its noise through the factor)
        z = torch.randn(int(zero.sum()), k, factor.shape[0], generator=gen, device=draw_device(gen))
        inputs[zero] = net.mix_state(uniform, z @ factor.T, 0.0, jump[zero])
    if (~zero).any():
        times = s[~zero][:, None, None]
        x0 = torch.randn(int((~zero).sum()), k, embedding.shape[0], generator=gen)  # (B', K, V)
        state = (1 - times) * x0 + times * F.one_hot(tokens[~zero], embedding.shape[0]).float()
        posterior = (state * (times / (1 - times).clamp_min(1e-3) ** 2)).softmax(-1) @ embedding
        inputs[~zero] = net.mix_state(posterior, state @ embedding, times, times + jump[~zero])
    return inputs


def release_loss(net: ReleaseNet, blocks: Blocks, embedding: torch.Tensor, lm_head: torch.Tensor,
                 cfg: ReleaseTrainConfig, gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Weighted cross-entropy of every jump's landing logits against the block's tokens; also slot 1's accuracy."""
    b, k = blocks.tokens.shape
    s, t = draw_jumps(b, cfg.zero_share, gen)
    with torch.no_grad():
        inputs = block_inputs(net, blocks.tokens, s, t, embedding, gen)
    context, mask = block_context(net, blocks)
    w = blocks.window.shape[1]
    positions = w + 1 + torch.arange(k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = net(inputs, net.conditioning(s, t), positions, context, mask)  # (B, K, D_t)
        logits = hidden @ lm_head.T  # (B, K, V)
    ce = F.cross_entropy(logits.float().flatten(0, 1), blocks.tokens.flatten(), reduction="none").view(b, k)
    weights = torch.exp(-torch.arange(k) / cfg.slot_decay)[None] * blocks.valid
    loss = (ce * weights).sum() / weights.sum()
    with torch.no_grad():
        hit = (logits[:, 0].argmax(-1) == blocks.tokens[:, 0]) & blocks.valid[:, 0]
        from_zero = (s == 0) & (t == 1)
        acc = float(hit[from_zero].float().mean()) if from_zero.any() else float("nan")
    return loss, {"loss": float(loss.detach()), "slot1_acc_one_step": acc}


# ---- the loop -----------------------------------------------------------------------------------------------------


def lr_at(step: int, cfg: ReleaseTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def training_data(cfg: ReleaseTrainConfig) -> list:
    for folder in cfg.data:
        if held_apart(folder):
            raise SystemExit(f"{folder} is a check set (held apart): it is never trained on")
    refuse_held_out_folders(cfg.data, "training")
    seqs = [seq for folder in cfg.data for seq in load_sequences(folder, cfg.feature_layers)]
    if not seqs or any(seq.features is None for seq in seqs):
        layers = " ".join(map(str, cfg.feature_layers))
        raise SystemExit(f"cached features of layers {cfg.feature_layers} are missing under {cfg.data}: run "
                         f"python -m drafter.data features --data DIR --layers {layers}")
    return seqs


def resume(out: Path, net: ReleaseNet, opt: torch.optim.Optimizer) -> tuple[int, list]:
    state_path = out / "train_state.safetensors"
    if not state_path.is_file():
        return 0, []
    net.load_state_dict({k: v.float() for k, v in load_file(str(out / "model.safetensors")).items()})
    saved = load_file(str(state_path))
    for i, param in enumerate(p for group in opt.param_groups for p in group["params"]):
        if f"{i}.step" in saved:  # a parameter no loss has reached yet has no state
            opt.state[param] = {"step": saved[f"{i}.step"], "exp_avg": saved[f"{i}.exp_avg"],
                                "exp_avg_sq": saved[f"{i}.exp_avg_sq"]}
    record = json.loads((out / "config.json").read_text())["flashmap_chat"]["training"]
    return int(saved["step"]), record.get("log", [])


def save_state(out: Path, opt: torch.optim.Optimizer, step: int) -> None:
    state = {"step": torch.tensor(step)}
    for i, param in enumerate(p for group in opt.param_groups for p in group["params"]):
        for key, value in opt.state.get(param, {}).items():
            state[f"{i}.{key}"] = value.detach().clone().contiguous()
    save_file(state, str(out / "train_state.safetensors"))


def train(cfg: ReleaseTrainConfig) -> Path:
    torch.set_num_threads(cfg.threads)
    target = load_target(TargetConfig(cpu_precision="reference"))
    embedding = target.model.get_input_embeddings().weight.detach().float()  # (V, D_t)
    lm_head = target.model.get_output_embeddings().weight.detach().float()  # (V, D_t)
    seqs = training_data(cfg)
    torch.manual_seed(cfg.seed)
    net = ReleaseNet(cfg.release_config(target))
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    out = Path(cfg.out)
    step, log = resume(out, net, opt)
    gen = torch.Generator().manual_seed(cfg.seed + step)
    identity = torch.arange(target.vocab_size)  # the whole vocabulary: draft ids are target ids
    started, window = time.time(), []
    while step < cfg.steps:
        picked = torch.randint(len(seqs), (cfg.batch_seqs,), generator=gen).tolist()
        blocks = blocks_from_sequences(target, [seqs[i] for i in picked], cfg.anchors_per_seq, cfg.block_size,
                                       cfg.window, cfg.feature_layers, identity, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, stats = release_loss(net, blocks, embedding, lm_head, cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        window.append(stats)
        if step % cfg.save_every == 0 or step == cfg.steps:
            mean = {key: sum(w[key] for w in window) / len(window) for key in window[0]}
            log.append({"step": step, **{k: round(v, 4) for k, v in mean.items()},
                        "s_per_step": round((time.time() - started) / len(window), 3)})
            print(json.dumps(log[-1]), flush=True)
            training = {"objective": "flow cross-entropy (denoiser) at s = 0 and the two-step grid's time",
                        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
                        "log": log}
            save_release(out, net, target.identity, training)
            save_state(out, opt, step)
            started, window = time.time(), []
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", required=True, help="response folders with cached features")
    parser.add_argument("--out", required=True, help="the release folder written (and resumed)")
    defaults = ReleaseTrainConfig(data=(), out="")
    for name in ("steps", "batch_seqs", "anchors_per_seq", "window", "lr", "save_every", "seed", "threads",
                 "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        value = getattr(defaults, name)
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in ("data", "out")}
    train(replace(defaults, data=tuple(args.data), out=args.out, **overrides))


if __name__ == "__main__":
    main()
