"""The next-token head: the token after the anchor from the target's hidden states at the last verified position and
the anchor itself, in one small network pass (a Medusa-style head, conditioned on the anchor as Hydra's heads are).

Shape letters: B = rows, F = concatenated target features (len(feature_layers) * D_t), D_t = target width,
H = head width, V = draft vocabulary (row 0 = "other": every token outside it), V_t = target vocabulary.

Why: the network drafter's call costs about half a plain step on this CPU, so the policy calls it in ~1% of the
rounds, and a round where no copy pays is a plain step. The head reads what the round's forward already produced (the
features the drafter captures) and costs a few small products; where it is confident its token is verified as a
one-token draft, measured like any copy (core.policy.LookupRates, keyed by its confidence in fifths). The target
verifies it, so the output is exact at every temperature whatever the head proposes.

python -m drafter.head train --data data/smollm2-magpie data/smollm2-responses --held data/smollm2-magpie-check \
    --out weights/smollm2-135m-instruct/head     (features cached first: python -m drafter.data features ...)
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F

FORMAT = "flashmap-chat-head/1"
BUCKETS = 5  # confidence in fifths: the key its acceptance is measured by (core.drafting.HeadCopy)


class HeadError(RuntimeError):
    """A head checkpoint cannot be used; the message says why."""


@dataclass(frozen=True)
class HeadConfig:
    feature_layers: tuple[int, ...]  # the target's layers it reads (the network drafter's, so captured once)
    target_hidden: int  # D_t
    hidden: int  # H
    draft_vocab: int  # V

    def __post_init__(self):
        if not self.feature_layers or self.hidden < 1 or self.draft_vocab < 2 or self.target_hidden < 1:
            raise ValueError(f"invalid head config {self}")

    @property
    def features(self) -> int:
        return len(self.feature_layers) * self.target_hidden  # F

    def to_dict(self) -> dict:
        return {**asdict(self), "feature_layers": list(self.feature_layers)}

    @classmethod
    def from_dict(cls, raw: dict) -> "HeadConfig":
        return cls(tuple(int(i) for i in raw["feature_layers"]), int(raw["target_hidden"]), int(raw["hidden"]),
                   int(raw["draft_vocab"]))


class NextTokenHead(nn.Module):
    """features (B, F) at a verified position and the anchor token (B,) that position's logits gave -> logits (B, V)
    of the token after the anchor. The anchor enters through the target's frozen embedding rows E (V_t, D_t) and the
    logits leave through its frozen LM head rows W (V, D_t) for the draft vocabulary; row 0 ("other") is learned."""

    def __init__(self, cfg: HeadConfig, embed: torch.Tensor, head_rows: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed.float(), persistent=False)  # (V_t, D_t)
        self.register_buffer("head_rows", head_rows.float(), persistent=False)  # (V, D_t)
        self.feature_norm = nn.RMSNorm(cfg.features)
        self.inp = nn.Linear(cfg.features + cfg.target_hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.target_hidden)
        self.out_norm = nn.RMSNorm(cfg.target_hidden)
        self.other_head = nn.Parameter(torch.zeros(cfg.target_hidden))

    def hidden(self, features: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """features (B, F), anchor (B,) -> the state the LM head rows read (B, D_t)."""
        x = torch.cat([self.feature_norm(features.float()), self.embed[anchor]], dim=-1)  # (B, F + D_t)
        return self.out_norm(self.out(F.silu(self.inp(x))))  # (B, D_t)

    def head_matrix(self) -> torch.Tensor:
        return torch.cat([self.other_head[None], self.head_rows[1:]])  # (V, D_t)

    def forward(self, features: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        return self.hidden(features, anchor) @ self.head_matrix().T  # (B, V)


class FrozenHead:
    """A trained head as the engine drafts with it: its products packed once (the native drafter trunk's 8-bit or fp32
    products where that module builds: a one-row product ~10 us; torch's linear elsewhere), one row at a time, with
    each RMSNorm's weight folded into the product that reads it (RMSNorm(x) w then W is W diag(w) applied to
    x / rms(x)): after a target forward has streamed its weights through the caches, every op dispatched from Python
    costs tens of microseconds."""

    def __init__(self, head: NextTokenHead, vocab_ids: torch.Tensor, calibration: tuple[float, ...] = ()):
        from drafter import native_trunk  # the native module is built at load, never at import

        self.cfg, self.vocab_ids = head.cfg, vocab_ids.tolist()  # (V,) target id per draft id, -1 for "other"
        self.calibration = calibration  # per confidence bucket, the share of its tokens that were the target's
        self.eps = (_eps(head.feature_norm), _eps(head.out_norm))
        module, _why = native_trunk.load()
        with torch.no_grad():
            self.embed = head.embed  # (V_t, D_t)
            scale_in = torch.cat([head.feature_norm.weight, torch.ones(head.cfg.target_hidden)])  # (F + D_t,)
            layers = ((head.inp.weight * scale_in, head.inp.bias), (head.out.weight, head.out.bias),
                      (head.head_matrix() * head.out_norm.weight, None))
            if module is not None:
                self.inp, self.out, self.logits = (native_trunk.NativeLinear(module, w, b) for w, b in layers)
            else:
                self.inp, self.out, self.logits = (_torch_linear(w, b) for w, b in layers)

    @torch.inference_mode()
    def propose(self, features: torch.Tensor, anchor: int) -> tuple[int, float] | None:
        """features (F,) at the position whose logits gave `anchor` -> (the likeliest next token's target id, its
        probability under the head), or None where that is "other" (outside the draft vocabulary)."""
        x = features.float()  # (F,)
        x = torch.cat([F.rms_norm(x, x.shape, eps=self.eps[0]), self.embed[anchor]])[None]  # (1, F + D_t)
        y = self.out(F.silu(self.inp(x)))  # (1, D_t)
        logits = self.logits(F.rms_norm(y, y.shape[-1:], eps=self.eps[1]))[0]  # (V,)
        probs = torch.softmax(logits, -1)  # (V,)
        top, at = probs.max(-1)
        token = self.vocab_ids[int(at)]
        return None if token < 0 else (token, float(top))

    def bucket(self, confidence: float) -> int:
        """The confidence's fifth, 1..BUCKETS: the key its acceptance is measured by."""
        return 1 + min(BUCKETS - 1, int(BUCKETS * confidence))

    def prior(self, bucket: int) -> tuple[float, ...]:
        """The bucket's measured acceptance on held-out replies, as a one-slot prior; () where not measured."""
        return (self.calibration[bucket - 1],) if len(self.calibration) == BUCKETS else ()


def _eps(norm: nn.RMSNorm) -> float:
    """An RMSNorm's eps as torch applies it (None: the dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps


def _torch_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)  # (N, I)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)  # (N,)
    return layer


# ---- checkpoints ----------------------------------------------------------------------------------------------

def frozen_rows(target, vocab_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's whole input embedding (V_t, D_t) and its LM head rows for the draft vocabulary (V, D_t)."""
    embed = target.model.get_input_embeddings().weight.detach().float().cpu()
    head = target.model.get_output_embeddings().weight.detach()[vocab_ids.clamp_min(0)].float().cpu()
    return embed, head


def save_head(folder, head: NextTokenHead, vocab_ids: torch.Tensor, target_identity: dict, training: dict,
              calibration: dict) -> None:
    """model.safetensors (trainable weights in bf16, the draft vocabulary) + config.json (config, target, training,
    calibration). The frozen rows are re-read from the target."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    state["vocab_ids"] = vocab_ids.to("cpu", torch.int64).contiguous()
    save_file(state, str(folder / "model.safetensors"))
    meta = {"format": FORMAT, "head": head.cfg.to_dict(), "target": target_identity, "training": training,
            "calibration": calibration}
    (folder / "config.json").write_text(json.dumps(meta, indent=2))


def load_head(folder, target) -> FrozenHead:
    """The head in `folder` for this target, frozen for drafting, or HeadError saying why not (missing, corrupt,
    trained for another target, weights that do not match the config)."""
    folder = Path(folder)
    cfg_path, weights_path = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        raise HeadError(f"no head at {folder} (need config.json and model.safetensors)")
    try:
        meta = json.loads(cfg_path.read_text())
        cfg = HeadConfig.from_dict(meta["head"])
    except (ValueError, KeyError, TypeError) as err:
        raise HeadError(f"{cfg_path} is not a valid head config: {err}") from err
    if meta.get("format") != FORMAT:
        raise HeadError(f"{cfg_path}: unknown format {meta.get('format')!r}, expected {FORMAT}")
    if meta.get("target") != target.identity:
        raise HeadError(f"the head at {folder} was trained for {meta.get('target')}, not {target.identity}")
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as err:
        raise HeadError(f"{weights_path} is corrupt: {err}") from err
    vocab_ids = state.pop("vocab_ids", None)
    if vocab_ids is None or vocab_ids.shape != (cfg.draft_vocab,) or int(vocab_ids.max()) >= target.vocab_size:
        raise HeadError(f"{weights_path}: draft vocabulary missing, of the wrong size or outside the target's")
    head = NextTokenHead(cfg, *frozen_rows(target, vocab_ids))
    try:
        head.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as err:
        raise HeadError(f"{weights_path}: weights do not match the config ({err})") from err
    rates = meta.get("calibration", {}).get("rates", [])
    calibration = tuple(float(r) for r in rates) if len(rates) == BUCKETS else ()
    return FrozenHead(head.eval(), vocab_ids, calibration)


# ---- training ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadTrainConfig:
    data: tuple[str, ...]  # data folders with cached features at the layers (drafter.data features)
    held: tuple[str, ...]  # held-apart folders: the calibration and the accuracy it reports, never trained on
    out: str
    drafter: str  # the network drafter's checkpoint whose feature layers and draft vocabulary the head shares
    hidden: int = 512
    epochs: int = 3
    batch: int = 512
    lr: float = 2e-3
    weight_decay: float = 0.05
    seed: int = 0
    threads: int = 2


def examples(folders, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every reply position t of the folders' sequences as (features at t (N, F) bf16, the token at t + 1 (N,), the
    token at t + 2 (N,)): the anchor a round's forward ends on and the token after it, from the last prompt position
    on."""
    from drafter.data import load_sequences

    feats, anchors, nexts = [], [], []
    for folder in folders:
        for seq in load_sequences(folder, layers):
            if seq.features is None:
                raise HeadError(f"{folder} has no cached features at layers {layers}: python -m drafter.data features")
            at = torch.arange(max(seq.prompt_len - 1, 0), len(seq.tokens) - 2)  # (N_s,)
            tokens = torch.tensor(seq.tokens)  # (T,)
            feats.append(seq.cached_features()[at].to(torch.bfloat16))  # (N_s, F)
            anchors.append(tokens[at + 1])
            nexts.append(tokens[at + 2])
    return torch.cat(feats), torch.cat(anchors), torch.cat(nexts)


def to_draft_ids(tokens: torch.Tensor, vocab_ids: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """Target ids (N,) -> draft ids (N,), 0 ("other") outside the draft vocabulary."""
    mapping = torch.zeros(target_vocab, dtype=torch.long)
    real = vocab_ids >= 0
    mapping[vocab_ids[real]] = torch.arange(len(vocab_ids))[real]
    return mapping[tokens]


def fit(head: NextTokenHead, feats, anchors, labels, cfg: HeadTrainConfig, log=print) -> list[float]:
    """Cross-entropy on the draft ids, AdamW with a one-cycle schedule -> each epoch's mean loss."""
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    per_epoch = len(labels) // cfg.batch
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=max(1, cfg.epochs * per_epoch))
    generator = torch.Generator().manual_seed(cfg.seed)
    losses = []
    for epoch in range(cfg.epochs):
        order, total, start = torch.randperm(len(labels), generator=generator), 0.0, time.time()
        for i in range(per_epoch):
            rows = order[i * cfg.batch : (i + 1) * cfg.batch]  # (B,)
            loss = F.cross_entropy(head(feats[rows], anchors[rows]), labels[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            total += loss.item()
        losses.append(total / max(1, per_epoch))
        log(f"epoch {epoch + 1}/{cfg.epochs}: loss {losses[-1]:.3f} ({time.time() - start:.0f} s)")
    return losses


@torch.no_grad()
def calibrate(head: NextTokenHead, feats, anchors, labels, chunk: int = 2048) -> dict:
    """On held-out positions: per confidence bucket (fifths of the head's top probability), how many proposals and
    the share that were the target's token (a proposal of "other" is none), and the accuracy over every position."""
    counts, hits = [0] * BUCKETS, [0] * BUCKETS
    for start in range(0, len(labels), chunk):
        probs = torch.softmax(head(feats[start : start + chunk], anchors[start : start + chunk]), -1)  # (B, V)
        top, at = probs.max(-1)  # (B,) each
        proposed = at > 0
        right = proposed & (at == labels[start : start + chunk])
        buckets = (top * BUCKETS).long().clamp(max=BUCKETS - 1)  # (B,) 0..4
        for b in range(BUCKETS):
            in_bucket = proposed & (buckets == b)
            counts[b] += int(in_bucket.sum())
            hits[b] += int((right & in_bucket).sum())
    rates = [hits[b] / counts[b] if counts[b] else (b + 0.5) / BUCKETS for b in range(BUCKETS)]
    return {"rates": rates, "counts": counts, "accuracy": sum(hits) / max(1, len(labels)), "positions": len(labels)}


def train(cfg: HeadTrainConfig, target) -> dict:
    """Train a head for the drafter's layers and vocabulary on cfg.data, calibrate it on cfg.held, save it to cfg.out.
    -> the calibration."""
    from drafter.checkpoint import read_checkpoint
    from drafter.data import held_apart

    trained_on_check = [folder for folder in cfg.data if held_apart(folder) or folder in cfg.held]
    if trained_on_check:
        raise HeadError(f"{trained_on_check} are check sets: a head is never trained on them")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    drafter_cfg, _state, vocab_ids, _meta = read_checkpoint(cfg.drafter, target.identity)
    layers = tuple(drafter_cfg.feature_layers)
    head_cfg = HeadConfig(layers, drafter_cfg.target_hidden, cfg.hidden, len(vocab_ids))
    head = NextTokenHead(head_cfg, *frozen_rows(target, vocab_ids))
    feats, anchors, nexts = examples(cfg.data, layers)
    held_feats, held_anchors, held_nexts = examples(cfg.held, layers)
    print(f"{len(nexts)} training positions, {len(held_nexts)} held-out", flush=True)
    losses = fit(head, feats, anchors, to_draft_ids(nexts, vocab_ids, target.vocab_size), cfg)
    calibration = calibrate(head.eval(), held_feats, held_anchors, to_draft_ids(held_nexts, vocab_ids,
                                                                                 target.vocab_size))
    calibration["held"] = list(cfg.held)
    training = {"train_config": {**asdict(cfg), "data": list(cfg.data), "held": list(cfg.held)},
                "positions": len(nexts), "losses": losses}
    save_head(cfg.out, head, vocab_ids, target.identity, training, calibration)
    return calibration


def main(argv=None) -> None:
    from core.target import add_target_args, load_target, target_config_from_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fit_args = sub.add_parser("train", help="train and calibrate a head on cached features")
    fit_args.add_argument("--data", nargs="+", required=True, help="data folders with cached features")
    fit_args.add_argument("--held", nargs="+", required=True, help="held-apart folders for the calibration")
    fit_args.add_argument("--out", required=True, help="e.g. weights/smollm2-135m-instruct/head")
    fit_args.add_argument("--drafter", default="weights/smollm2-135m-instruct/flashmap",
                          help="the network drafter whose feature layers and draft vocabulary the head shares")
    for name in ("hidden", "epochs", "batch", "seed", "threads"):
        fit_args.add_argument(f"--{name}", type=int, default=getattr(HeadTrainConfig, name))
    for name in ("lr", "weight_decay"):
        fit_args.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(HeadTrainConfig, name))
    add_target_args(fit_args, cpu_precision="reference")
    args = parser.parse_args(argv)
    cfg = HeadTrainConfig(tuple(args.data), tuple(args.held), args.out, args.drafter, args.hidden, args.epochs,
                          args.batch, args.lr, args.weight_decay, args.seed, args.threads)
    target = load_target(target_config_from_args(args))
    print(json.dumps(train(cfg, target), indent=1))


if __name__ == "__main__":
    main()
