"""Acceptance at T=0 measured offline, on held-out greedy responses, without running the target.

Shape letters: B = blocks (anchors) in a batch, K = block size, V = draft vocabulary.

python -m drafter.evaluation.evaluate --data data/smollm2-val --variants flashmap flashmap,steps=2 dflash \
    flashmap-teacher,steps=16 flashmap,best_of=4 [--stride 2] [--out runs/eval.json]

A variant is a drafter spec (drafter/spec.py): `drafter[,steps=N][,noise=shuffled][,best_of=M][,tree=M][,scale=S]
[,k=K][,lookup=1][,weights=FOLDER]` with drafter one of flashmap, flashmap-teacher, dflash (a released-format folder,
drafter.networks.release, as flashmap with its steps, k and scale; scale: the flow drafters'
initial noise scale, 0 = the deterministic draft from x0 = 0 that the app makes at T = 0; tree=M: M drafts from
independent noise merged into a trie of at most K nodes, App. D; lookup=1: prompt lookup beside the network, as
core.drafting.base.LookupHybrid drafts at T = 0 without a cost curve; the engine's second free source, the target's
phrasebook, is not modelled here: the bench measures it).

At T=0 the target's output is fixed: its greedy response, which `python -m drafter.data generate`
stored. A round anchored at position a accepts the draft's longest prefix that equals the response
after a, then adds the target's own token, so the acceptance length of that round is known from the
draft alone. This averages it over every `stride`-th anchor of each response (anchors with a full
block after them), batched, from the cached features: thousands of rounds in minutes, against the
tens that the engine bench affords here. It differs from the engine's figure only in which anchors
count (the engine's rounds sit one accepted block apart) and in the K slots it can see (the engine
also meets the end of the response). Same data = same anchors for every variant: a paired comparison.
With one --seed, `noise=shuffled` (the shuffle test, §6.2) is coupled to the shared-noise draft of the same drafter:
each slot's own noise is the same in both, only the other slots' noise differs (BlockSampler._shuffled), so their
paired difference measures the joint structure without the variance of each slot's own draw.
--walk visits the engine's anchors instead (walk_rounds): rounds crowd where drafts fail, so its tokens per
round is lower than the uniform average and is what the engine's acceptance length is without a cut.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, fields
from itertools import groupby
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from core.drafting.base import NgramDrafter, lookup_plan
from core.prompts import read_jsonl
from core.runtime.target import Target, add_target_args, load_target, target_config_from_args
from core.runtime.trie import build_trie
from core.verification.tree import depth_in, followed_branch
from drafter.blocks import block_context
from drafter.data import blocks_at, load_sequences, target_to_draft_map
from drafter.formats.release import is_release_folder, load_release_net
from drafter.networks.dit import FlowNet
from drafter.networks.release import ReleaseNet, draft_logits
from drafter.runtime.drafters import DRAFTER_MODES, default_weights, load_named_net
from drafter.runtime.drafting import BlockSampler, fold_unused, greedy_block
from drafter.spec import NET_DRAFTERS, DrafterSpec, SpecError

RELEASE_WINDOW = 1024  # context positions an offline released-format draft reads (the engine reads every one)


@dataclass(frozen=True)
class Variant:
    """A drafter spec as the evaluator runs it, labelled with its text as typed."""

    label: str
    spec: DrafterSpec

    def block_size(self, net) -> int:
        """K: the spec's, capped by the block the checkpoint was trained for; unset, the checkpoint's own."""
        return min(self.spec.block_size or net.cfg.block_size, net.cfg.block_size)


def parse_variant(text: str, block_size: int | None = None) -> Variant:
    """'flashmap,steps=2,best_of=4' -> Variant (the spec grammar of drafter/spec.py); --block-size fills k."""
    try:
        spec = DrafterSpec.parse(text, **({"block_size": block_size} if block_size else {}))
    except SpecError as err:
        raise SystemExit(f"variant {text!r}: {err}; the policy's options act on the engine's verify cost: use "
                         "python -m app.suite") from err
    if spec.name not in NET_DRAFTERS:
        raise SystemExit(f"variant {text!r}: offline evaluation drafts with a trained network, one of "
                         f"{', '.join(NET_DRAFTERS)}")
    return Variant(text, spec)


def accepted_prefix(draft: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Slots accepted at T=0: the length of the longest prefix where draft == truth, with id 0
    ("other", or past the data) never accepted. draft, truth (B, K) draft ids -> (B,)."""
    match = (draft == truth) & (truth != 0)  # (B, K)
    return match.long().cumprod(-1).sum(-1)


def domain_of_sequences(folder: Path) -> list[str]:
    """The domain of each stored sequence, in load order: from the folder's domains.json (written by
    `drafter.data generate`), else from the prompt files its meta.json names."""
    if (folder / "domains.json").exists():
        return json.loads((folder / "domains.json").read_text())
    if not (folder / "meta.json").exists():
        raise SystemExit(f"{folder}: no meta.json; write the folder with python -m drafter.data generate")
    meta = json.loads((folder / "meta.json").read_text())
    start, limit = meta.get("start", 0), meta.get("limit")
    names = []
    for path in meta["prompts"]:
        try:
            rows = read_jsonl(path)[start:start + limit if limit else None]
        except OSError as err:
            raise SystemExit(f"{folder}: no domains.json and the prompt file {path} is missing ({err})") from err
        names += [Path(path).stem.removeprefix("train_")] * len(rows)
    return names


def anchors_of(seqs, block_size: int, stride: int) -> list[list[int]]:
    """Every stride-th anchor a with a full block after it: prompt_len - 1 <= a <= len - 1 - K."""
    return [list(range(max(s.prompt_len - 1, 1), len(s.tokens) - block_size, stride)) for s in seqs]


def tally(n_accepted: torch.Tensor, draft_len: torch.Tensor, block_size: int) -> dict:
    """Acceptance length and the per-slot counts behind conditional acceptance (paper Fig. 3).
    n_accepted, draft_len (R,) per round: slot k was verified when every slot before it was accepted."""
    slots = torch.arange(block_size)  # (K,)
    reached = (slots < torch.minimum(n_accepted + 1, draft_len)[:, None]).sum(0).tolist()  # (K,)
    accepted = (slots < n_accepted[:, None]).sum(0).tolist()  # (K,)
    rounds = len(n_accepted)
    return {"rounds": rounds,
            "acceptance_length": 1 + n_accepted.sum().item() / max(1, rounds),  # + the target's own token
            "per_slot_acceptance": [a / r if r else None for a, r in zip(accepted, reached)],
            "per_slot_reached": reached, "per_slot_accepted": accepted}


@dataclass(frozen=True)
class Rounds:
    """One entry per evaluated anchor (R of them)."""

    seq_index: torch.Tensor  # (R,) which sequence
    anchor: torch.Tensor  # (R,) anchor position in it
    draft: torch.Tensor  # (R, K) the T=0 draft in target ids (-1 past the first "other")
    n_accepted: torch.Tensor  # (R,) slots accepted
    draft_len: torch.Tensor  # (R,) slots proposed
    slot_nll: torch.Tensor  # (R, K) -log q(the response's token) per slot, nats (NaN for trees: M distributions)
    confidence: torch.Tensor  # (R, K) each slot's largest probability, the engine's raw confidence (NaN for trees)


def load_variant(variant: Variant, target) -> tuple[Any, torch.Tensor]:
    """(network, vocab_ids) of the variant's checkpoint, refusing one of the other kind; a released-format folder
    (drafter.networks.release) drafts the target's whole vocabulary."""
    folder = variant.spec.weights or default_weights(target.identity["name"], variant.spec.name)
    if is_release_folder(folder):
        spec = variant.spec
        if spec.name != "flashmap" or spec.tree > 1 or spec.best_of > 1 or spec.lookup or spec.noise != "shared":
            raise SystemExit(f"variant {variant.label!r}: a released-format drafter is evaluated as flashmap with "
                             "its steps, k and scale only")
        return load_release_net(folder, target), torch.arange(target.vocab_size)
    return load_named_net(variant.spec.name, folder, target)


@dataclass(frozen=True)
class ReleaseDrafting:
    """A released-format network drafting offline blocks at T = 0, batched over anchors, each block's context read as
    training reads it (drafter.blocks.block_context: the last RELEASE_WINDOW positions, which hold the whole of these
    responses; the engine reads all)."""

    variant: Variant
    net: ReleaseNet
    target: Target
    generator: torch.Generator
    embedding: torch.Tensor  # (V, D_t) the target's, fp32, read once: its noise factor is cached by it
    head: torch.Tensor  # (V, D_t) the target's LM head, fp32

    @classmethod
    def of(cls, variant: Variant, net, target, seed: int = 0) -> "ReleaseDrafting":
        model = target.model
        return cls(variant, net, target, torch.Generator().manual_seed(seed),
                   model.get_input_embeddings().weight.detach().float(),
                   model.get_output_embeddings().weight.detach().float())

    @property
    def block_size(self) -> int:
        return self.variant.block_size(self.net)

    def at(self, seqs, jobs: list[tuple[int, int]]) -> "Rounds":
        spec, net, k, c = self.variant.spec, self.net, self.block_size, self.net.c
        grouped = [(i, [a for _, a in group]) for i, group in groupby(jobs, key=lambda job: job[0])]
        blocks = blocks_at(self.target, [seqs[i] for i, _ in grouped], [anchors for _, anchors in grouped],
                           c.block_size, RELEASE_WINDOW, c.feature_layers, torch.arange(self.target.vocab_size))
        context, mask = block_context(net, blocks)
        positions = RELEASE_WINDOW + 1 + torch.arange(c.block_size)  # (K,) after the window and the anchor
        head = lambda hidden: hidden.float() @ self.head.T  # noqa: E731
        logits = draft_logits(net, context, positions, self.embedding, head, c.grid(spec.steps),
                                               spec.noise_scale, self.generator, (len(jobs),), mask)[:, :k]  # (B, K, V)
        probs = logits.softmax(-1)
        truth, valid = blocks.tokens[:, :k], blocks.valid[:, :k]  # (B, K) target ids: the draft vocabulary is all
        draft = probs.argmax(-1)  # (B, K)
        accepted = ((draft == truth) & valid).long().cumprod(-1).sum(-1)  # (B,)
        slot_nll = -probs.gather(-1, truth[..., None])[..., 0].clamp_min(1e-12).log()  # (B, K)
        index = torch.tensor(jobs, dtype=torch.long).view(-1, 2)  # (B, 2)
        return Rounds(index[:, 0], index[:, 1], draft, accepted, torch.full((len(jobs),), k), slot_nll,
                      probs.max(-1).values)


@dataclass(frozen=True)
class Drafting:
    """One variant's network made ready to draft offline blocks at T = 0."""

    variant: Variant
    net: FlowNet
    vocab_ids: torch.Tensor  # (V,) target id per draft id, -1 for "other"
    target: Target
    to_draft: torch.Tensor  # (V_t,) draft id of each target id (target_to_draft_map)
    sampler: BlockSampler
    generator: torch.Generator

    @classmethod
    def of(cls, variant: Variant, net, vocab_ids: torch.Tensor, target, seed: int = 0) -> "Drafting":
        spec = variant.spec
        sampler = BlockSampler(net, DRAFTER_MODES[spec.name], spec.steps, spec.noise == "shared", spec.best_of,
                               spec.noise_scale)
        return cls(variant, net, vocab_ids, target, target_to_draft_map(vocab_ids, target.vocab_size), sampler,
                   torch.Generator().manual_seed(seed))

    @property
    def block_size(self) -> int:
        return self.variant.block_size(self.net)

    def at(self, seqs, jobs: list[tuple[int, int]]) -> Rounds:
        """Draft at the (sequence, anchor) jobs, sorted by sequence then anchor, as the engine would at T=0."""
        spec, k, net, vocab_ids = self.variant.spec, self.block_size, self.net, self.vocab_ids
        grouped = [(i, [a for _, a in group]) for i, group in groupby(jobs, key=lambda job: job[0])]
        blocks = blocks_at(self.target, [seqs[i] for i, _ in grouped], [anchors for _, anchors in grouped],
                           k, net.cfg.context_window, net.cfg.feature_layers, self.to_draft)
        ctx, mask = blocks.context(net)
        if spec.tree > 1:  # M noise draws per anchor, flattened anchor-major to (B*M, K, V)
            probs = self.sampler.draws(ctx, mask, k, self.generator, spec.tree).flatten(0, 1)
        else:
            probs = self.sampler.probs(ctx, mask, k, self.generator)  # (B, K, V)
        probs = fold_unused(probs, vocab_ids >= 0)
        draft, length = greedy_block(probs)  # (B or B*M, K), (B or B*M,): the T=0 proposal
        if spec.tree > 1:
            draft, length, accepted = tree_rounds(draft, length, blocks.tokens, spec.tree)
            slot_nll = confidence = torch.full(blocks.tokens.shape, float("nan"))
        else:
            accepted = accepted_prefix(draft, blocks.tokens)  # (B,)
            truth = probs.gather(-1, blocks.tokens[..., None])[..., 0]  # (B, K) q of the response's token
            slot_nll, confidence = -truth.clamp_min(1e-12).log(), probs.max(-1).values  # (B, K) x2
        past_cut = torch.arange(k) >= length[:, None]  # (B, K)
        index = torch.tensor(jobs, dtype=torch.long).view(-1, 2)  # (B, 2)
        shown = torch.where(past_cut, -1, vocab_ids[draft])  # (B, K) target ids
        if spec.lookup and spec.tree == 1:
            shown, accepted, length = with_lookup(seqs, jobs, shown, accepted, length, k)
        return Rounds(index[:, 0], index[:, 1], shown, accepted, length, slot_nll, confidence)


def with_lookup(seqs, jobs: list[tuple[int, int]], shown: torch.Tensor, accepted: torch.Tensor, length: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rounds as LookupHybrid makes them at T = 0 (core.drafting.base.lookup_plan): prompt lookup over the sequence
    before the anchor, proposed alone when strong (the network's draft is then not made), else one more branch of
    the trie of at most K nodes verified in the round (the engine's round_trie). shown (B, K) target ids, accepted,
    length (B,) -> the same three."""
    shown, accepted, length = shown.clone(), accepted.clone(), length.clone()
    for row, (i, a) in enumerate(jobs):
        tokens = [int(t) for t in seqs[i].tokens]
        lookup = NgramDrafter()
        lookup.extend(tokens[:a], None)  # the engine's drafter history: everything committed before the anchor
        alone, branch = lookup_plan(*lookup.lookup(tokens[a], k))
        truth = tokens[a + 1 : a + 1 + k]
        main = [t for t in shown[row].tolist() if t >= 0]
        trie = build_trie([list(branch)] if alone else [main, list(branch)], k)
        accepted[row] = depth_in(trie, truth)
        if alone:
            shown[row] = -1
            shown[row, : len(branch)] = torch.tensor(branch[:k])
            length[row] = len(branch)
    return shown, accepted, length


def concat(parts: list[Rounds]) -> Rounds:
    return Rounds(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(Rounds)))


@torch.inference_mode()
def draft_rounds(variant: Variant, net, vocab_ids: torch.Tensor, target, seqs, stride: int = 1, batch: int = 128,
                 seed: int = 0, walk: bool = False) -> Rounds:
    """Draft at every stride-th anchor of each sequence (walk: at the anchors the engine's rounds visit), as the
    engine would at T=0."""
    drafting: ReleaseDrafting | Drafting
    if isinstance(net, ReleaseNet):
        drafting = ReleaseDrafting.of(variant, net, target, seed)
    else:
        drafting = Drafting.of(variant, net, vocab_ids, target, seed)
    if walk:
        return concat(list(walk_rounds(drafting, seqs, batch)))
    jobs = [(i, a) for i, seq_anchors in enumerate(anchors_of(seqs, drafting.block_size, stride)) for a in seq_anchors]
    return concat([drafting.at(seqs, jobs[start:start + batch])
                   for start in tqdm(range(0, len(jobs), batch), desc=variant.label, unit="batch", leave=False)])


def walk_rounds(drafting: Drafting | ReleaseDrafting, seqs, batch: int):
    """The engine's own walk through each response at T = 0 without a cut: the first anchor is the token the prefill
    produced (position prompt_len), and each round's next anchor is the target's token after the accepted prefix
    (a + n_accepted + 1), while a full block follows it. Rounds then fall as densely as the engine's do, many where
    drafts fail and few where they succeed, so tokens per round here is what the engine's acceptance length is at K
    (the uniform-anchor average overstates it). Yields the rounds of each batch of sequences, one round per sequence
    at a time."""
    k = drafting.block_size
    position = {i: s.prompt_len for i, s in enumerate(seqs) if s.prompt_len < len(s.tokens) - k}  # the prefill's token
    progress = tqdm(desc=f"{drafting.variant.label} (walk)", unit="round", leave=False)
    while position:
        active = sorted(position.items())
        for start in range(0, len(active), batch):
            part = drafting.at(seqs, active[start:start + batch])
            for i, a, n in zip(part.seq_index.tolist(), part.anchor.tolist(), part.n_accepted.tolist()):
                position[i] = a + n + 1
                if position[i] > len(seqs[i].tokens) - 1 - k:  # no full block after it: the walk ends here
                    del position[i]
            progress.update(len(part.n_accepted))
            yield part
    progress.close()


def tree_rounds(draft: torch.Tensor, length: torch.Tensor, truth: torch.Tensor, m: int):
    """T=0 tree verification offline: the M drafts of each anchor merged into a trie of at most K nodes; the
    target walks it along its greedy response. draft (B*M, K), length (B*M,), truth (B, K) draft ids ->
    the branch shown (the first holding the accepted path, as far as the trie has it) (B, K), its length (B,)
    and the accepted slots (B,)."""
    b, k = truth.shape
    shown, shown_len, accepted = torch.zeros(b, k, dtype=torch.long), torch.zeros(b, dtype=torch.long), []
    for row in range(b):
        branches = [draft[row * m + j, : length[row * m + j]].tolist() for j in range(m)]
        trie = build_trie(branches, k)
        response = truth[row].tolist()
        n = depth_in(trie, response[: response.index(0)] if 0 in response else response)  # "other" never accepted
        branch = next(br for br in branches if br[:n] == response[:n])  # the full draft, for the record
        shown_len[row] = len(followed_branch(trie, branches, response[:n]))
        shown[row, : len(branch)] = torch.tensor(branch, dtype=torch.long)
        accepted.append(n)
    return shown, shown_len, torch.tensor(accepted)


def evaluate_variant(variant: Variant, loaded: tuple[Any, torch.Tensor], target, seqs, domains: list[str],
                     stride: int, batch: int, seed: int, walk: bool = False) -> dict:
    k = variant.block_size(loaded[0])
    began = time.perf_counter()
    net, vocab_ids = loaded
    rounds = draft_rounds(variant, net, vocab_ids, target, seqs, stride, batch, seed, walk)
    seconds = time.perf_counter() - began
    domain_of_round = [domains[i] for i in rounds.seq_index.tolist()]
    by_domain = {}
    for name in dict.fromkeys(domains):
        keep = torch.tensor([d == name for d in domain_of_round])  # (R,)
        by_domain[name] = tally(rounds.n_accepted[keep], rounds.draft_len[keep], k)
    return {"variant": variant.label, "weights": variant.spec.weights, "block_size": k, "seconds": round(seconds, 1),
            "all": tally(rounds.n_accepted, rounds.draft_len, k), **by_domain,
            # the teacher gate: how well each slot's distribution predicts the response, in nats
            "per_slot_cross_entropy": [round(x, 4) for x in rounds.slot_nll.mean(0).tolist()],
            # per round, for paired comparisons between variants of one K (same data -> same anchors; not in a walk,
            # where each variant's anchors follow its own acceptances)
            "rounds": {"sequence": rounds.seq_index.tolist(), "anchor": rounds.anchor.tolist(),
                       "n_accepted": rounds.n_accepted.tolist()}}


def held_out_sequences(folder: Path, layers: tuple[int, ...], limit: int | None) -> tuple[list, list[str]]:
    """The folder's sequences with their cached features and domains, the first `limit` of each domain."""
    domains = domain_of_sequences(folder)
    seqs = load_sequences(folder, layers)
    if len(seqs) != len(domains):
        raise SystemExit(f"{folder}: {len(seqs)} sequences but meta.json names {len(domains)} prompts")
    if any(s.features is None for s in seqs):
        raise SystemExit(f"{folder}: no feature cache; run python -m drafter.data features --data {folder} "
                         f"--layers {' '.join(map(str, layers))}")
    keep = [i for i, d in enumerate(domains) if limit is None or domains[:i].count(d) < limit]
    return [seqs[i] for i in keep], [domains[i] for i in keep]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder written by drafter.data generate, "
                                                           "with features")
    parser.add_argument("--variants", nargs="+", required=True,
                        help="drafter specs (drafter/spec.py), e.g. flashmap flashmap,steps=2 dflash flashmap,tree=4")
    parser.add_argument("--block-size", type=int, default=None,
                        help="K for variants without k= (default and upper limit: the checkpoint's own block)")
    parser.add_argument("--stride", type=int, default=2, help="every N-th anchor of each response")
    parser.add_argument("--walk", action="store_true",
                        help="instead, the anchors the engine's rounds visit (each one accepted block after the "
                             "last; no cut): tokens per round as the engine counts them")
    parser.add_argument("--batch", type=int, default=128, help="blocks per drafter pass")
    parser.add_argument("--limit", type=int, default=None, help="first N sequences of each domain")
    parser.add_argument("--seed", type=int, default=0, help="noise seed of the flow drafters")
    parser.add_argument("--out", default=None, help="JSON with per-domain tallies and per-round counts")
    add_target_args(parser, cpu_precision="reference")
    args = parser.parse_args(argv)
    variants = [parse_variant(text, args.block_size) for text in args.variants]
    if args.stride < 1:
        raise SystemExit("--stride must be >= 1")
    target = load_target(target_config_from_args(args))
    folder = Path(args.data)
    loaded = [load_variant(v, target) for v in variants]  # (net, vocab_ids) each, loaded once
    layers = {net.cfg.feature_layers for net, _ in loaded}
    if len(layers) != 1:
        raise SystemExit(f"variants read different target layers {sorted(layers)}: evaluate them separately")
    seqs, domains = held_out_sequences(folder, layers.pop(), args.limit)
    results = [evaluate_variant(v, net_vocab, target, seqs, domains, args.stride, args.batch, args.seed, args.walk)
               for v, net_vocab in zip(variants, loaded)]
    report = {"data": str(folder), "stride": None if args.walk else args.stride, "walk": args.walk,
              "block_size": args.block_size, "sequences": len(seqs),
              "sequence_domains": domains,
              "shuffled_noise": "coupled",  # per-slot draws keep each slot's own shared-draft noise (since 2026-12-01)
              "results": results}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, separators=(",", ":")))  # compact: per-round lists
    for row in results:
        print(json.dumps({"variant": row["variant"], "seconds": row["seconds"],
                          **{d: round(row[d]["acceptance_length"], 3) for d in ["all", *dict.fromkeys(domains)]}}))


if __name__ == "__main__":
    main()
