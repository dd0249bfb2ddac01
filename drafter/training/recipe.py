"""Training a FlashMap drafter for a large target (Qwen3-8B) on one consumer GPU: plan, then run.

python -m drafter.training.recipe --target Qwen/Qwen3-8B --gpu-gb 24 --dry-run      (prints the plan, runs nothing)
python -m drafter.training.recipe --target Qwen/Qwen3-8B --gpu-gb 24                (runs every stage; rerun resumes)

Stages (each the project's own CLI, each resumable): the target writes responses to the train_*
prompts (python -m drafter.data generate, target in FP8 or 8-bit as the memory plan picks); the flow
teacher trains on them with target features recomputed on the fly by the resident target (a cache
would cost F x 2 bytes per token on disk, see the plan) or streamed from a feature cache on disk;
then the flow map is distilled. The drafter trains in bf16 autocast with gradient checkpointing.

The plan's memory and disk numbers are arithmetic on the architecture; its hours are estimates
from throughput figures given as flags (defaults are assumptions, not measurements: replace them
with the tokens/s the generate progress bar and the s/step the training bar show on your GPU).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache

import torch

from core.runtime.plan import GIB, QWEN3_FACTS, estimate_weight_bytes, facts_config
from drafter.config import DrafterConfig, ZLabFlowConfig, spread_layers
from drafter.formats.checkpoint import CheckpointError
from drafter.networks.dflash import assumed_layout
from drafter.networks.dit import DraftNet
from drafter.networks.zlab_flow import ZLabFlowNet
from drafter.runtime.drafters import default_weights, resolve_weights

PROMPT_FILES = ("train_math.jsonl", "train_code.jsonl", "train_chat.jsonl")


@dataclass(frozen=True)
class RecipeConfig:
    target: str = "Qwen/Qwen3-8B"
    gpu_gb: float = 24.0
    capability: tuple[int, int] = (8, 9)  # RTX 4090 (Ada); a 5090 is (12, 0)
    quant: str = "auto"  # auto: fp8 when the GPU supports it, else 8bit
    prompts_dir: str = "data/prompts"
    prompts: int = 14252  # all train_* rows
    prompt_tokens: int = 120  # mean chat-formatted prompt length (assumed)
    max_new_tokens: int = 1024
    response_tokens: int = 450  # mean response length under max_new_tokens (assumed)
    features: str = "fly"  # fly: recomputed by the resident target each step | cache: on disk
    d_model: int = 1024
    n_layers: int = 6
    n_heads: int = 16
    draft_vocab: int = 32768  # keeps the flow state (B, K, V) small against Qwen3's 151,936 tokens
    batch_seqs: int = 8
    anchors_per_seq: int = 32
    teacher_steps: int = 60000
    distill_steps: int = 20000
    gen_tokens_per_s: float = 900.0  # batched FP8 generation on one GPU (assumed)
    step_seconds: float = 0.6  # teacher step with on-the-fly features (assumed)
    out: str = ""  # default: weights/<target>/, where the app and the bench look
    data: str = "data/qwen3-8b-responses"
    init: str = ""  # a published z-lab DFlash drafter (folder or hub id) whose network becomes the teacher's backbone
    trainable: str = "all"  # with --init: all | flow (the backbone frozen; only the time modulation and state input)
    t0_share: float = 0.3  # with --init: share of teacher blocks at t = 0, where the backbone already is

    def __post_init__(self):
        if self.features not in ("fly", "cache"):
            raise ValueError("--features must be fly or cache")
        if self.trainable not in ("all", "flow"):
            raise ValueError("--trainable must be all or flow")
        if self.trainable == "flow" and not self.init:
            raise ValueError("--trainable flow needs --init <published DFlash drafter>")
        if self.target not in QWEN3_FACTS:
            raise ValueError(f"no built-in facts for {self.target}; known: {sorted(QWEN3_FACTS)}")

    def pick_quant(self) -> str:
        if self.quant != "auto":
            return self.quant
        return "fp8" if self.capability >= (8, 9) else "8bit"

    def drafter_config(self) -> DrafterConfig | ZLabFlowConfig:
        if self.init:
            return ZLabFlowConfig(zlab=published_config(self)[0], context_window=256)
        facts = QWEN3_FACTS[self.target]
        return DrafterConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                             feature_layers=spread_layers(facts["num_hidden_layers"], 5),
                             target_hidden=facts["hidden_size"], draft_vocab=self.draft_vocab, context_window=256)


def drafter_params(cfg: DrafterConfig | ZLabFlowConfig, trainable: str = "all") -> int:
    """Parameters of the network for this config (trainable: all, or flow = those outside a z-lab backbone),
    counted on the meta device (no memory)."""
    with torch.device("meta"):
        rows = torch.empty(cfg.draft_vocab, cfg.target_hidden)
        net = ZLabFlowNet(cfg, rows, rows) if isinstance(cfg, ZLabFlowConfig) else DraftNet(cfg, rows, rows)
        return sum(p.numel() for name, p in net.named_parameters()
                   if trainable == "all" or not name.startswith("backbone."))


@lru_cache(maxsize=8)
def published_config(rc: RecipeConfig) -> tuple[dict, str]:
    """The --init drafter's config.json and where it came from: the folder or local hub cache, else the published
    layout assumed at the target's width (the plan is arithmetic; the run itself reads the real file). Looked up
    once per recipe: the plan, its drafter config and its commands all ask."""
    try:
        folder = resolve_weights(rc.init)
        return json.loads((folder / "config.json").read_text()), f"read from {folder}"
    except (CheckpointError, OSError, ValueError):
        facts = facts_config(rc.target)
        return assumed_layout(facts, facts.vocab_size), "not at hand: published layout assumed (5 layers)"


def plan(rc: RecipeConfig) -> dict:
    facts = facts_config(rc.target)
    dcfg = rc.drafter_config()
    quant = rc.pick_quant()
    tokens = rc.prompts * (rc.prompt_tokens + rc.response_tokens)
    seq_len = rc.prompt_tokens + rc.max_new_tokens  # longest sequences in a batch
    feature_width = len(dcfg.feature_layers) * dcfg.target_hidden
    blocks = rc.batch_seqs * rc.anchors_per_seq
    params, trainable = drafter_params(dcfg), drafter_params(dcfg, rc.trainable)
    memory = {
        "target_weights": estimate_weight_bytes(facts, torch.bfloat16, quant),
        "drafter_weights_grads_adam": params * 4 + trainable * 12,  # fp32 weights; grads and two moments if trained
        "flow_state": blocks * dcfg.block_size * dcfg.draft_vocab * 4 * 8,  # ~8 live (B, K, V) fp32 tensors
        # the target's forward for on-the-fly features returns every layer's hidden states (bf16)
        "target_hidden_states": rc.batch_seqs * seq_len * facts.hidden_size * (facts.num_hidden_layers + 1) * 2,
        "features_and_activations": rc.batch_seqs * seq_len * feature_width * 4
        + blocks * (dcfg.context_window + dcfg.block_size) * dcfg.d_model * 4 * 4,  # with checkpointing
        "cuda_context_and_slack": int(1.5 * GIB),
    }
    total = sum(memory.values())
    return {
        "recipe": asdict(rc),
        "drafter": dcfg.to_dict(),
        "drafter_parameters": params,
        "trainable_parameters": trainable,
        "warm_start": published_config(rc)[1] if rc.init else None,
        "quant": quant,
        "data_tokens": tokens,
        "disk_bytes": {"token_shards": tokens * 4,
                       "feature_cache": tokens * feature_width * 2 if rc.features == "cache" else 0,
                       "feature_cache_if_enabled": tokens * feature_width * 2,
                       "checkpoint": params * 2 + dcfg.draft_vocab * 8},
        "gpu_memory_bytes": memory,
        "gpu_memory_total": total,
        "fits": total <= rc.gpu_gb * GIB,
        "hours": {"generate": rc.prompts * rc.response_tokens / rc.gen_tokens_per_s / 3600,
                  "teacher": rc.teacher_steps * rc.step_seconds / 3600,
                  "distill": rc.distill_steps * rc.step_seconds * 1.6 / 3600},  # 2 extra no-grad passes
    }


def commands(rc: RecipeConfig) -> list[list[str]]:
    py, quant = sys.executable, rc.pick_quant()
    dcfg = rc.drafter_config()
    target = ["--target", rc.target, "--device", "cuda", "--dtype", "bf16", "--quant", quant]
    teacher_dir = rc.out + "/flashmap-teacher" if rc.out else str(default_weights(rc.target, "flashmap-teacher"))
    flowmap_dir = rc.out + "/flashmap" if rc.out else str(default_weights(rc.target, "flashmap"))
    prompts = [f"{rc.prompts_dir}/{f}" for f in PROMPT_FILES]
    layers = [str(i) for i in dcfg.feature_layers]
    shape = ["--d-model", str(rc.d_model), "--n-layers", str(rc.n_layers), "--n-heads", str(rc.n_heads),
             "--n-feature-layers", str(len(dcfg.feature_layers)), "--draft-vocab", str(rc.draft_vocab),
             "--context-window", str(dcfg.context_window)]
    common = ["--data", rc.data, "--batch-seqs", str(rc.batch_seqs), "--anchors-per-seq", str(rc.anchors_per_seq),
              "--grad-checkpoint", "--save-every", "500", *target]
    steps = [[py, "-m", "drafter.data", "generate", "--prompts", *prompts, "--out", rc.data,
              "--max-new-tokens", str(rc.max_new_tokens), "--batch-size", "32", "--shard-size", "256", *target]]
    if rc.features == "cache":
        steps.append([py, "-m", "drafter.data", "features", "--data", rc.data, "--layers", *layers, *target])
    frozen = ["--freeze-backbone"] if rc.trainable == "flow" else []
    if rc.init:  # the published network is the backbone: its shape is the checkpoint's, not flags
        shape = ["--init", rc.init, "--t0-share", str(rc.t0_share), "--context-window", str(dcfg.context_window),
                 *frozen]
    steps.append([py, "-m", "drafter.training.train", "--stage", "teacher", "--out", teacher_dir,
                  "--steps", str(rc.teacher_steps), *shape, *common])
    steps.append([py, "-m", "drafter.training.train", "--stage", "distill", "--init", teacher_dir,
                  "--out", flowmap_dir, "--steps", str(rc.distill_steps), *frozen, *common])
    return steps


def describe(p: dict, cmds: list[list[str]]) -> str:
    gb = lambda n: f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"  # noqa: E731
    rc = p["recipe"]
    lines = [f"FlashMap drafter for {rc['target']} on a {rc['gpu_gb']:g} GB GPU (compute capability "
             f"{rc['capability'][0]}.{rc['capability'][1]}), target weights in {p['quant']}",
             f"data: {rc['prompts']} prompts x ({rc['prompt_tokens']} prompt + ~{rc['response_tokens']} response "
             f"tokens) = {p['data_tokens'] / 1e6:.1f}M tokens",
             describe_drafter(p),
             "disk: " + ", ".join(f"{k} {gb(v)}" for k, v in p["disk_bytes"].items()),
             "GPU memory: " + ", ".join(f"{k} {gb(v)}" for k, v in p["gpu_memory_bytes"].items())
             + f" -> {gb(p['gpu_memory_total'])} of {rc['gpu_gb']:g} GB: " + ("fits" if p["fits"] else "DOES NOT FIT"),
             "hours (estimates from --gen-tokens-per-s / --step-seconds): "
             + ", ".join(f"{k} {v:.1f}" for k, v in p["hours"].items()) + f", total {sum(p['hours'].values()):.1f}",
             "commands:"]
    return "\n".join(lines + ["  " + " ".join(c[1:] if c[0] == sys.executable else c) for c in cmds])


def describe_drafter(p: dict) -> str:
    rc, d = p["recipe"], p["drafter"]
    if not rc["init"]:
        return (f"drafter: {p['drafter_parameters'] / 1e6:.0f}M parameters, d_model {rc['d_model']}, {rc['n_layers']} "
                f"layers, draft vocabulary {rc['draft_vocab']}, feature layers {list(d['feature_layers'])}")
    z = d["zlab"]
    return (f"drafter: warm-started from {rc['init']} (config {p['warm_start']}): its {z['num_hidden_layers']} "
            f"layers of width {z['hidden_size']} become the flow teacher's backbone, plus zero-initialised time "
            f"modulation and state input; {p['drafter_parameters'] / 1e6:.0f}M parameters, "
            f"{p['trainable_parameters'] / 1e6:.0f}M trained (--trainable {rc['trainable']}), block "
            f"{z['block_size'] - 1} + anchor, the target's whole vocabulary ({z['vocab_size']}), "
            f"{rc['t0_share']:.0%} of teacher blocks at t = 0")


def parse_args(argv=None) -> tuple[RecipeConfig, bool]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = RecipeConfig()
    for name, value in asdict(defaults).items():
        flag, about = "--" + name.replace("_", "-"), f"RecipeConfig.{name} (default {value})"
        if isinstance(value, tuple):
            parser.add_argument(flag, type=int, nargs=2, default=list(value), help=about)
        else:
            parser.add_argument(flag, type=type(value), default=value, help=about)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and commands; run nothing")
    args = vars(parser.parse_args(argv))
    dry = args.pop("dry_run")
    args["capability"] = tuple(args["capability"])
    return RecipeConfig(**args), dry


def main(argv=None) -> None:
    rc, dry = parse_args(argv)
    p, cmds = plan(rc), commands(rc)
    print(describe(p, cmds))
    if dry:
        return
    if not p["fits"]:
        raise SystemExit("the plan does not fit this GPU: lower --batch-seqs, --draft-vocab or --d-model")
    for cmd in cmds:
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
