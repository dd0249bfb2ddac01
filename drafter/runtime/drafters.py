"""The FlashMap and DFlash-style drafters as the engine sees them (core.drafting.base.Drafter).

Shape letters: N = newly committed positions, W = context window, F = feature width,
K = block size, V = draft vocabulary, V_t = target vocabulary, D_t = target width.
"""
from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from core.drafting.base import Draft
from core.runtime.cpu_linear import pack_linears
from core.runtime.graphs import GraphedSteps
from core.verification.sampling import SamplingConfig
from drafter.config import DrafterConfig, ZLabFlowConfig
from drafter.formats import dflash as dflash_folder
from drafter.formats import release as release_folder
from drafter.formats.checkpoint import CheckpointError, read_checkpoint, read_checkpoint_config, read_config
from drafter.networks.dflash import ZLabConfig
from drafter.networks.dit import DraftNet, FlowNet
from drafter.networks.release import ReleaseConfig
from drafter.networks.zlab_flow import ZLabFlowNet
from drafter.runtime import calibration as calib
from drafter.runtime import drafting
from drafter.runtime.dflash import ZLabDFlashDrafter
from drafter.runtime.frozen import FrozenDraftNet
from drafter.runtime.graphed_release import GraphedReleaseDrafter
from drafter.runtime.release import ReleaseDrafter
from drafter.spec import DrafterSpec

WEIGHTS_ROOT = Path(__file__).resolve().parents[2] / "weights"
DRAFTER_MODES = {"flashmap": "flowmap", "flashmap-teacher": "teacher", "dflash": "dflash"}  # name -> BlockSampler mode


def default_weights(target_name: str, folder: str) -> Path:
    """weights/<target>/<folder>, with the target name made filesystem-safe."""
    return WEIGHTS_ROOT / re.sub(r"[^A-Za-z0-9._-]+", "--", target_name) / folder


def frozen_rows(target, vocab_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's embedding and LM-head rows for the draft vocabulary (V, D_t); id -1 ("other") -> 0."""
    ids = vocab_ids.clamp_min(0).to(target.device)
    embed = target.model.get_input_embeddings().weight.detach()[ids].float().cpu()
    head = target.model.get_output_embeddings().weight.detach()[ids].float().cpu()
    return embed, head


def build_net(cfg: DrafterConfig | ZLabFlowConfig, target, vocab_ids: torch.Tensor) -> FlowNet:
    """The network a config describes (the project's DiT, or a z-lab DFlash backbone), with the target's rows."""
    embed, head = frozen_rows(target, vocab_ids)
    return ZLabFlowNet(cfg, embed, head) if isinstance(cfg, ZLabFlowConfig) else DraftNet(cfg, embed, head)


def zlab_warm_start(folder, target, context_window: int) -> tuple[ZLabFlowNet, torch.Tensor]:
    """A flow network whose backbone is the published DFlash drafter in `folder`, checked against
    the target, and its vocabulary: the target's own, whole (V,)."""
    cfg, state = dflash_folder.read_zlab(folder)  # the tensors are read once: a Qwen3-8B drafter's are ~2 GB
    dflash_folder.check_target(cfg, target, folder)
    vocab_ids = torch.arange(target.vocab_size)
    zlab = json.loads((Path(folder) / "config.json").read_text())  # as published: the checkpoint keeps it whole
    try:
        net = ZLabFlowNet.from_zlab(zlab, state, *frozen_rows(target, vocab_ids), context_window=context_window)
    except ValueError as err:  # the tensors do not fit the config
        raise CheckpointError(f"{folder}: {err}") from err
    return net, vocab_ids


def load_net(folder, target) -> tuple[FlowNet, torch.Tensor, dict]:
    """Load a checkpoint for this target, or raise CheckpointError saying why not."""
    cfg, state, vocab_ids, meta = read_checkpoint(folder, target.identity)
    net = build_net(cfg, target, vocab_ids)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{folder}: weights do not match the config (missing {missing}, unexpected {unexpected})")
    return net.eval(), vocab_ids, meta


def load_named_net(name: str, folder, target) -> tuple[FlowNet, torch.Tensor]:
    """load_net, refusing a checkpoint of the other kind (a DFlash-style net drafted as a flow, or back)."""
    net, vocab_ids, _meta = load_net(folder, target)
    refuse_other_kind(net.cfg.kind, name, folder)
    return net, vocab_ids


def refuse_other_kind(kind: str, name: str, folder) -> None:
    """CheckpointError where a checkpoint of one kind (a flow, or a DFlash-style net) is asked to draft as the other."""
    if (kind == "dflash") != (DRAFTER_MODES[name] == "dflash"):
        raise CheckpointError(f"{folder} holds a {kind} drafter, not {name}")


class FlowDrafter:
    """Proposes a block from the target's context features and the anchor token.

    mode: flowmap (distilled two-time denoiser, 1 or 2 jumps), teacher (N Euler steps of the flow
    teacher, for analysis) or dflash (one pass over a fully masked block).
    """

    def __init__(self, net: FlowNet, vocab_ids: torch.Tensor, target, mode: str, steps: int = 1,
                 best_of: int = 1, tree: int = 1, shared_noise: bool = True, noise_scale: float = 1.0,
                 calibration: calib.SlotCalibration | None = None, products: str | None = None,
                 watch_weights: bool = True):
        self.net = net
        # the DiT drafts from a frozen view that keeps the time conditioning and the context's key/value maps, its
        # products native where they build (products: drafter.runtime.native_trunk.products_for; None: the fastest
        # here);
        # watch_weights=False: the weights never change (a loaded checkpoint), so the view never re-checks them
        self.frozen = FrozenDraftNet(net, products, watch_weights) if isinstance(net, DraftNet) else None
        self.calibration = calibration  # per-slot confidence map fitted at T = 0 for this way of drafting
        self.sampler = drafting.BlockSampler(self.frozen or net, mode, steps, shared_noise, best_of, noise_scale)
        self.tree = tree  # drafts from independent noise per round, verified as a tree (App. D)
        self.name = mode if mode != "flowmap" else f"flashmap-{steps}step"
        self.feature_layers = net.cfg.feature_layers
        self.max_block_size = net.cfg.block_size  # the block it was trained for: the engine never asks for more
        self.context_window = net.cfg.context_window  # the positions before the anchor it reads
        self.vocab_ids = vocab_ids  # (V,) target id per draft id, -1 for "other"
        self.target_vocab = target.vocab_size
        self.input_embeddings = target.model.get_input_embeddings().weight.detach()  # (V_t, D_t)
        # the context window, projected: ctx_in applied (<=W, D), or each position's key/value rows (<=W, 2L*D)
        self.projected: torch.Tensor | None = None
        self.pending: list[torch.Tensor] = []  # newer features (N_i, F) not projected yet, oldest first
        self.pending_rows = 0

    def reset(self) -> None:
        self.projected, self.pending, self.pending_rows = None, [], 0

    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        """Keep the new positions' features (N, F); they are projected (ctx_in, row by row) when the drafter next
        proposes, the last W at most, in one call: rounds in which the engine does not draft (a policy skip, a plain
        probe) cost no projection. Positions without features (the engine captured none while the policy could not
        call the network, core.decoding.engine.captures) end the context: it starts again after them."""
        if features is None or features.shape[0] < len(token_ids):
            self.reset()
        if features is None:
            return
        window = self.net.cfg.context_window
        self.pending.append(features)
        self.pending_rows += features.shape[0]
        while self.pending_rows - self.pending[0].shape[0] >= window:  # the oldest block is out of the window
            self.pending_rows -= self.pending.pop(0).shape[0]
        if self.pending_rows >= window:  # so is everything projected before
            self.projected = None

    def project_pending(self) -> None:
        """Project the features kept since the last proposal (N, F) -> (N, D) and keep the last W."""
        if not self.pending:
            return
        window = self.net.cfg.context_window
        with torch.inference_mode():
            features = torch.cat(self.pending)[-window:].float().cpu()  # (<=W, F)
            # ctx_in (<=W, D), or with the frozen view each position's key/value rows (<=W, 2L*D)
            projected = self.net.ctx_in(features) if self.frozen is None else self.frozen.rows(features)
        if self.projected is not None:
            projected = torch.cat([self.projected, projected])
        self.projected = projected[-window:]  # (<=W, D)
        self.pending, self.pending_rows = [], 0

    def context(self, anchor: int) -> tuple[Any, torch.Tensor]:
        self.project_pending()
        anchor_embed = self.input_embeddings[anchor].float().cpu()[None]  # (1, D_t)
        if self.frozen is not None:
            return self.frozen.context(self.projected, anchor_embed)
        if self.projected is None:
            raise RuntimeError("no context: extend the drafter with the prompt's features first")
        ctx = self.projected[None]  # (1, W, D)
        mask = torch.ones(ctx.shape[:2], dtype=torch.bool)  # (1, W)
        return self.net.context_projected(ctx, mask, anchor_embed)

    @torch.inference_mode()
    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        if self.tree > 1:
            return self.propose_tree(anchor, block_size, sampling, generator)
        # the network drafts the whole block it was trained on, then the block is cut: its slots attend to each
        # other, so drafting fewer (the end of a reply, a smaller K) would change every slot's prediction
        probs = self.sampler.probs(*self.context(anchor), self.net.cfg.block_size, generator)[0, :block_size]  # (K, V)
        real = self.vocab_ids >= 0  # (V,) False for "other" and unused padding slots of a small vocabulary
        probs = drafting.fold_unused(probs, real)  # (K, V)
        tokens, q_small = drafting.choose_tokens(probs, sampling.temperature, generator)
        target_tokens = self.vocab_ids[tokens]  # (K',) target ids
        # per-slot confidence = the largest probability of each slot's distribution, never the probability of the
        # sampled token: a cut that depended on the sampled values would bias the output at T > 0
        confidence = probs[: len(tokens)].max(-1).values  # (K',)
        if self.calibration is not None and sampling.greedy:  # fitted on T = 0 acceptance (runtime/calibration.py)
            confidence = self.calibration(confidence)  # (K',)
        if q_small is None:
            return Draft(target_tokens, None, confidence)
        q_draft = torch.zeros(len(tokens), self.target_vocab)  # (K', V_t): q = 0 outside the draft vocabulary
        q_draft[:, self.vocab_ids[real]] = q_small[:, real]
        return Draft(target_tokens, q_draft, confidence)

    @torch.inference_mode()
    def propose_tree(self, anchor: int, block_size: int, sampling: SamplingConfig, generator) -> Draft:
        """App. D: `tree` blocks from independent noise draws in one batched pass, each proposed as at T=0
        (argmax per slot, cut at the first "other"); the engine merges them into a trie (and refuses it at T > 0)."""
        whole = self.net.cfg.block_size  # drafted whole, then cut (see propose)
        probs = self.sampler.draws(*self.context(anchor), whole, generator, self.tree)[0, :, :block_size]  # (M, K, V)
        tokens, lengths = drafting.greedy_block(drafting.fold_unused(probs, self.vocab_ids >= 0))  # (M, K), (M,)
        branches = [self.vocab_ids[row[:n]].tolist() for row, n in zip(tokens, lengths.tolist())]
        return Draft(torch.tensor(branches[0], dtype=torch.long), None, None, tuple(map(tuple, branches[1:])))


PUBLISHED_DFLASH = {  # published drafters in the z-lab format, read from the local Hugging Face cache
    "Qwen/Qwen3-8B": "z-lab/Qwen3-8B-DFlash-b16",
    "Qwen/Qwen3-4B": "z-lab/Qwen3-4B-DFlash-b16",
}


PUBLISHED_FLASHMAP = {  # the FlashMap authors' released drafters (flashmap 0.1.0's format), from the local cache
    "Qwen/Qwen3-8B": "j-shen/FlashMap-Qwen3-8B",
    "Qwen/Qwen3-4B": "j-shen/FlashMap-Qwen3-4B",
}

# the published targets by architecture (model_type, hidden size, layers, MLP width, vocabulary), so that a local
# folder of Qwen3-8B (or a copy saved under another name) finds the drafters published for it
PUBLISHED_ARCHITECTURES: dict[tuple, str] = {
    ("qwen3", 4096, 36, 12288, 151936): "Qwen/Qwen3-8B",
    ("qwen3", 2560, 36, 9728, 151936): "Qwen/Qwen3-4B",
}


def published_target(target) -> str | None:
    """The hub id of the published model this target is: its own id where it is one, else the one whose architecture
    its config has (a local folder); None for any other."""
    if target.name in PUBLISHED_FLASHMAP or target.name in PUBLISHED_DFLASH:
        return target.name
    cfg = getattr(getattr(target, "model", None), "config", None)
    if cfg is None:
        return None
    shape = tuple(getattr(cfg, name, None) for name in ("model_type", "hidden_size", "num_hidden_layers",
                                                        "intermediate_size", "vocab_size"))
    return PUBLISHED_ARCHITECTURES.get(shape)


def released_flashmap(target, allow_download: bool = False) -> Path:
    """The released FlashMap drafter for this target from the local Hugging Face cache, or CheckpointError saying in
    one line how to get it."""
    repo = PUBLISHED_FLASHMAP.get(published_target(target) or "")
    if repo is None:
        raise CheckpointError(f"no released FlashMap drafter is known for {target.name}: pass --weights FOLDER")
    try:
        return resolve_weights(repo, allow_download)
    except CheckpointError as err:
        raise CheckpointError(f"the released FlashMap drafter {repo} is not in the local model cache: get it with "
                              f"`hf download {repo} --include '*.json' '*.safetensors'` (about 1 GB), or pass "
                              f"--weights FOLDER") from err


def resolve_weights(spec: str, allow_download: bool = False) -> Path:
    """A drafter folder from a local path or a hub id (local cache only unless allow_download)."""
    path = Path(spec)
    if path.exists() or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", spec):
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors"],
                                      local_files_only=not allow_download))
    except Exception as err:  # offline miss, unknown repo, network: all mean "not usable here"
        hint = "" if allow_download else "; pass --allow-download on a machine with internet, or --weights FOLDER"
        raise CheckpointError(f"no folder {spec} and hub repo {spec} is not in the local cache{hint} ({err})") from err


def drafter_folder(spec: DrafterSpec, target, allow_download: bool = False) -> Path:
    """The folder a network drafter's spec loads: its weights=, else weights/<target>/<name>, else the drafter
    published for the target (its id or its architecture, published_target) from the local model cache."""
    name, weights = spec.name, spec.weights
    path = resolve_weights(weights, allow_download) if weights else default_weights(target.identity["name"], name)
    published = published_target(target)
    if name == "dflash" and not weights and not path.exists() and published in PUBLISHED_DFLASH:
        path = resolve_weights(PUBLISHED_DFLASH[published], allow_download)
    if name == "flashmap" and not weights and not path.exists() and published in PUBLISHED_FLASHMAP:
        path = released_flashmap(target, allow_download)
    return path


def check_engine_drafter(spec: DrafterSpec, target, allow_download: bool = False) -> Path:
    """The folder of a network drafter, checked from its config alone against this target (no weights are read, so
    that the app lists what it offers without holding drafters nobody chose); CheckpointError says why it cannot
    serve. Loading it (load_engine_drafter) checks the weights too."""
    path = drafter_folder(spec, target, allow_download)
    if spec.name == "dflash" and dflash_folder.is_zlab_folder(path):
        dflash_folder.check_target(read_config(path, ZLabConfig.from_json, "DFlash"), target, path)
    elif release_folder.is_release_folder(path):
        if spec.name != "flashmap":
            raise CheckpointError(f"{path} holds a released FlashMap drafter: use it as flashmap, not {spec.name}")
        with warnings.catch_warnings():  # (said once, when it is loaded)
            warnings.simplefilter("ignore")
            release_folder.check_target(read_config(path, ReleaseConfig.from_json,
                                                      "FlashMap release"), target, path)
    else:
        refuse_other_kind(read_checkpoint_config(path, target.identity).kind, spec.name, path)
    return path


def load_engine_drafter(spec: DrafterSpec, target, allow_download: bool = False):
    """A network drafter (flashmap | flashmap-teacher | dflash) for this spec. Raises CheckpointError with the reason.

    dflash also accepts a published z-lab DFlash folder or hub id (drafter.networks.dflash); for a target
    with a known published drafter and no local checkpoint, that one is looked up in the cache. The folder is checked
    from its config first (check_engine_drafter), then its weights are read."""
    name = spec.name
    path = check_engine_drafter(spec, target, allow_download)
    if name == "dflash" and dflash_folder.is_zlab_folder(path):
        return ZLabDFlashDrafter(dflash_folder.load_zlab_net(path, target), target)
    if release_folder.is_release_folder(path):
        return release_drafter(spec, path, target)
    net, vocab_ids = load_named_net(name, path, target)
    # frozen from here on: its linear layers prepacked for oneDNN (core.runtime.cpu_linear; docs/journal/engine.md)
    pack_linears(net)
    return FlowDrafter(net, vocab_ids, target, DRAFTER_MODES[name], steps=spec.steps, best_of=spec.best_of,
                       tree=spec.tree, shared_noise=spec.noise == "shared", noise_scale=spec.noise_scale,
                       calibration=calibration_for(spec, path), watch_weights=False)


def release_drafter(spec: DrafterSpec, folder: Path, target) -> ReleaseDrafter:
    """A released FlashMap folder as the engine's drafter; refused for what the release does not draft (a DFlash-style
    pass, a tree or best-of several noise draws, per-slot shuffled noise) and for a step count without a jump grid. The
    folder is a release's, checked against the target and the spec's name (check_engine_drafter)."""
    if spec.tree > 1 or spec.best_of > 1 or spec.noise != "shared":
        raise CheckpointError(f"{folder}: a released FlashMap drafter drafts one block from shared noise; tree, "
                              "best_of and noise=shuffled apply to the project's own network")
    net = release_folder.shared_release_net(folder, target)
    if spec.steps not in net.c.steps_offered:
        raise CheckpointError(f"{folder}: steps must be one of {', '.join(map(str, net.c.steps_offered))} (the "
                              f"drafter's jump_grids), got {spec.steps}")
    if isinstance(target.lean, GraphedSteps):  # the target's steps are fixed-shape (CUDA graphs, or sim): so is this
        # its context buffers hold every position a reply may reach (--context) from the start: they never grow
        return GraphedReleaseDrafter(net, target, steps=spec.steps, noise_scale=spec.noise_scale, folder=folder,
                                     mode=target.lean.mode, capacity=target.max_positions + 1)
    return ReleaseDrafter(net, target, steps=spec.steps, noise_scale=spec.noise_scale, folder=folder)


def calibration_for(spec: DrafterSpec, folder: Path) -> calib.SlotCalibration | None:
    """The checkpoint's confidence calibration for this way of drafting, if it has one and the spec wants it. A
    corrupt one, or one fitted to other weights, is refused with a warning: the drafter keeps its raw confidence
    (the cut is a policy, so the output is exact either way; only the speed can differ)."""
    if not spec.calibrated or spec.tree > 1:  # a tree's branches are cut by the trie, not by confidence
        return None
    try:
        return calib.load(folder, spec.sampler_key())
    except calib.CalibrationError as err:
        logging.getLogger(__name__).warning("raw draft confidence for %s: %s", spec.text(), err)
        return None
