"""Training data: target-written responses stored as token ids, and blocks with target features.

Shape letters: S = sequences in a batch, T = tokens, F = feature width, B = blocks, K = block size,
W = context window.

Stage 1 (`generate`): the target answers each prompt (greedy, batched, resumable); every shard of
`shard_size` prompts is written once as safetensors (flat int32 ids + offsets), so an interrupted
run resumes at the first missing shard. Disk: about 4 bytes per token (1M tokens ~ 4 MB).
Stage 2 (`blocks_from_sequences`): target hidden states at the drafter's layers come from the
feature cache (`features`, bf16 per shard) when it exists, else they are recomputed on the fly for
the batch (one target forward per step); many anchors are sampled per sequence, as DFlash does.

python -m drafter.data generate --prompts FILE.jsonl [FILE ...] --out DIR [--start N] [--limit N]
[--max-new-tokens N]
python -m drafter.data follow-up --source DIR --out DIR [--domains chat] [--per-conversation 2]
    (second turns: each conversation of DIR, the target's answer included, gets follow-up questions the target
    answers: more, and more varied, chat-style responses than the 427 train_chat prompts give)
python -m drafter.data magpie --n N --out data/prompts/magpie_train.jsonl --check
data/prompts/magpie_check.jsonl
    (the target writes user requests itself from its chat template's user-turn opening, "Magpie"; every 10th is
    held apart as a check set; the training ones are then answered by generate)
python -m drafter.data features --data DIR --layers 1 10 20 29     (optional cache; ~4.6 KB per token)
python -m drafter.data phrasebook --data DIR [DIR ...] --out weights/<target>/phrasebook
    (the target's phrasebook, core.drafting.phrasebook: what its replies most often continue each n-gram with; a free
    drafting source beside prompt lookup)
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from core.drafting import phrasebook
from core.prompts import TUNING, HeldOutError, read_jsonl, refuse_held_out, role_of
from core.runtime.target import Target, add_target_args, load_target, target_config_from_args
from drafter.blocks import Blocks

# ---- stage 1: responses --------------------------------------------------------------------

def read_prompt_rows(paths: list[str], limit: int | None, start: int = 0, check_set: bool = False) -> list[dict]:
    """Prompts start..start+limit of each file (all from start when limit is None). Replies to train on come from
    training sets (or files of one's own) only: tuning and held-out sets are refused (core.prompts.ROLES). A check set
    (replies only offline checks read, never trained on) may answer any set."""
    if not check_set:
        refuse_held_out(paths, "training")
        tuning = [path for path in paths if role_of(path) == TUNING]
        if tuning:
            raise ValueError(f"{', '.join(tuning)}: tuning sets (core.prompts.ROLES) are never used for training")
    rows = []
    for path in paths:
        try:
            rows += read_jsonl(path)[start:start + limit if limit else None]
        except FileNotFoundError as err:
            raise SystemExit(f"no prompt file {path}: the project's prompt sets are in data/prompts/") from err
    return rows


def check_meta(out: Path, meta: dict) -> None:
    """Shards are named by position in this run's prompt list, so a folder may only be resumed with the
    same prompts, start and limit: anything else would pair existing shards with other prompts."""
    path = out / "meta.json"
    if path.exists() and json.loads(path.read_text()) != meta:
        raise SystemExit(f"{out} was generated with other settings ({path}); write to a new folder")
    path.write_text(json.dumps(meta, indent=2))


def generate_batch(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy responses for a batch of chat-formatted prompts (left padded), EOS excluded."""
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else target.eos_token_ids[0]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # (S, T)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    with torch.inference_mode():
        out = target.model.generate(
            ids.to(target.device), attention_mask=mask.to(target.device), max_new_tokens=max_new_tokens,
            do_sample=False, eos_token_id=list(target.eos_token_ids), pad_token_id=pad,
        )
    return [target.until_eos(row) for row in out[:, width:].tolist()]


def write_shard(path: Path, prompts: list[list[int]], responses: list[list[int]]) -> None:
    seqs = [p + r for p, r in zip(prompts, responses)]
    lengths = torch.tensor([len(s) for s in seqs])
    save_file({
        "tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "prompt_lens": torch.tensor([len(p) for p in prompts], dtype=torch.int32),
    }, str(path))


def generate(args) -> None:
    target = load_target(target_config_from_args(args))
    rows = read_prompt_rows(args.prompts, args.limit, args.start, args.held_apart)
    meta = {"target": target.identity, "prompts": args.prompts, "start": args.start, "limit": args.limit,
            "max_new_tokens": args.max_new_tokens, "shard_size": args.shard_size}
    if args.held_apart:  # only then: the folders generated before the flag resume with their meta unchanged
        meta["held_apart"] = True
    write_domains(Path(args.out), rows)
    generate_rows(target, rows, Path(args.out), meta, args.shard_size, args.batch_size, args.max_new_tokens)


def conversation(row: dict) -> list[dict]:
    """The messages a prompt row asks the target to answer: its `messages`, or its `prompt` as one user turn."""
    return row.get("messages") or [{"role": "user", "content": row["prompt"]}]


# Follow-up questions a user asks after an answer: generic, so that they fit any first turn; each conversation draws
# a few (seeded), so one first turn yields several different second-turn answers.
FOLLOW_UPS = (
    "Can you explain that more simply?",
    "Can you give me a concrete example?",
    "Summarize your answer in three bullet points.",
    "What are the most common mistakes people make with this?",
    "Rewrite your answer in a more formal tone.",
    "Can you make that shorter?",
    "Why is that the case?",
    "What would you do differently if you had to start over?",
    "Could you go into more detail on the first point?",
    "Is there another way to approach this?",
    "How would you explain this to a ten-year-old?",
    "What are the pros and cons?",
    "Thanks! Can you turn that into a short checklist?",
    "I am not sure I agree. Can you argue the other side?",
    "What should I read or learn next about this?",
    "Write a short email that sums this up for a colleague.",
)


def follow_up_rows(source_rows: list[dict], seqs: list["Sequence"], target: Target, domains: tuple[str, ...],
                   per_conversation: int, seed: int) -> list[dict]:
    """Second-turn prompt rows: for each first turn of `domains` (its prompt row and the target's answer, decoded),
    `per_conversation` distinct follow-up questions drawn with `seed`."""
    if len(source_rows) != len(seqs):
        raise ValueError(f"{len(source_rows)} prompt rows for {len(seqs)} sequences: not the same run")
    if not 1 <= per_conversation <= len(FOLLOW_UPS):
        raise ValueError(f"per_conversation must be in 1..{len(FOLLOW_UPS)}, got {per_conversation}")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for row, seq in zip(source_rows, seqs):
        picks = torch.randperm(len(FOLLOW_UPS), generator=gen)[:per_conversation].tolist()  # drawn for every row
        if row.get("domain", "?") not in domains:
            continue
        answer = target.decode(seq.tokens[seq.prompt_len:])
        for i in picks:
            rows.append({"id": f"{row.get('id', '?')}-turn2-{i}", "domain": row.get("domain", "?"),
                         "messages": [*conversation(row), {"role": "assistant", "content": answer},
                                      {"role": "user", "content": FOLLOW_UPS[i]}]})
    return rows


def follow_up(args) -> None:
    target = load_target(target_config_from_args(args))
    source = Path(args.source)
    made = json.loads((source / "meta.json").read_text())
    if made.get("target") != target.identity:
        raise SystemExit(f"{source} was written by another target ({made.get('target')}): its answers are not ours")
    source_rows = read_prompt_rows(made["prompts"], made["limit"], made["start"])
    rows = follow_up_rows(source_rows, load_sequences(source), target, tuple(args.domains), args.per_conversation,
                          args.seed)
    meta = {"target": target.identity, "follow_up_of": str(source), "domains": args.domains,
            "per_conversation": args.per_conversation, "seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "shard_size": args.shard_size}
    write_domains(Path(args.out), rows)
    generate_rows(target, rows, Path(args.out), meta, args.shard_size, args.batch_size, args.max_new_tokens)


def write_domains(out: Path, rows: list[dict]) -> None:
    """domains.json: each sequence's domain in order, so evaluation needs no prompt files (a clone has none)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "domains.json").write_text(json.dumps([row.get("domain", "?") for row in rows]))


def generate_rows(target: Target, rows: list[dict], out: Path, meta: dict, shard_size: int, batch_size: int,
                  max_new_tokens: int, deadline: float | None = None) -> int:
    """Answer rows shard by shard into `out` (resumable); with a deadline (time.time()), start no shard after it.
    Returns the number of complete shards."""
    out.mkdir(parents=True, exist_ok=True)
    check_meta(out, meta)
    shards = range(0, len(rows), shard_size)
    for start in tqdm(shards, desc="shards", unit="shard"):
        path = out / f"shard-{start // shard_size:05d}.safetensors"
        if path.exists():
            continue  # resume: this shard is complete
        if deadline is not None and time.time() > deadline:
            break
        chunk = rows[start:start + shard_size]
        prompts = [target.chat_ids(conversation(r)) for r in chunk]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch well
        responses: list[list[int]] = [[] for _ in prompts]
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            for i, resp in zip(idx, generate_batch(target, [prompts[i] for i in idx], max_new_tokens)):
                responses[i] = resp
        tmp = path.with_suffix(".tmp")
        write_shard(tmp, prompts, responses)
        tmp.rename(path)
    return len(shard_paths(out))


# ---- loading sequences -----------------------------------------------------------------------

@dataclass(frozen=True)
class FeatureSlice:
    """Where a sequence's cached features live: rows start..stop of a shard's feature file. Read on
    use, so training streams features from disk instead of holding the cache in memory."""

    path: Path
    start: int
    stop: int

    def load(self) -> torch.Tensor:
        with safe_open(str(self.path), framework="pt") as f:
            return f.get_slice("features")[self.start:self.stop]  # (T, F) bf16


@dataclass(frozen=True)
class Sequence:
    tokens: list[int]
    prompt_len: int
    features: torch.Tensor | FeatureSlice | None = None  # (T, F) cached target features, when extracted

    def cached_features(self) -> torch.Tensor | None:
        return self.features.load() if isinstance(self.features, FeatureSlice) else self.features


def shard_paths(folder) -> list[Path]:
    return sorted(Path(folder).glob("shard-*.safetensors"))


def features_dir(folder, layers: tuple[int, ...]) -> Path:
    return Path(folder) / ("features-" + "-".join(str(i) for i in layers))


def read_shard(path: Path, features_path: Path | None = None) -> list[Sequence]:
    shard = load_file(str(path))
    tokens, offsets = shard["tokens"].tolist(), shard["offsets"].tolist()
    cached = features_path is not None and features_path.exists()
    return [Sequence(tokens[offsets[i]:offsets[i + 1]], plen,
                     FeatureSlice(features_path, offsets[i], offsets[i + 1])
                     if cached and features_path is not None else None)
            for i, plen in enumerate(shard["prompt_lens"].tolist())]


def held_apart(folder) -> bool:
    """Whether a data folder is a check set (generate --held-apart): read by offline checks, never trained on."""
    meta = Path(folder) / "meta.json"
    return meta.is_file() and bool(json.loads(meta.read_text()).get("held_apart"))


def folder_prompt_files(folder) -> list[str]:
    """The prompt files a data folder's replies answer (a follow-up folder: those of the folder it follows); none
    where the folder records none."""
    path = Path(folder) / "meta.json"
    if not path.is_file():
        return []
    meta = json.loads(path.read_text())
    if "follow_up_of" in meta:
        return folder_prompt_files(meta["follow_up_of"])
    return list(meta.get("prompts", []))


def refuse_held_out_folders(folders, use: str) -> None:
    """HeldOutError when any data folder holds replies to a held-out set (core.prompts.refuse_held_out)."""
    for folder in folders:
        try:
            refuse_held_out(folder_prompt_files(folder), use)
        except HeldOutError as err:
            raise HeldOutError(f"{folder}: {err}") from err


def load_sequences(folder, layers: tuple[int, ...] | None = None) -> list[Sequence]:
    """All sequences; with `layers`, the cached features of those layers where they were extracted."""
    feat_dir = features_dir(folder, layers) if layers else None
    return [seq for path in shard_paths(folder)
            for seq in read_shard(path, feat_dir / path.name if feat_dir else None)]


def extract_features(args) -> None:
    """Cache target features for every shard (bf16, ~2 bytes x F per token), resumable per shard. Sequences are
    batched by length (little padding); --autocast bf16 runs the target's matmuls in bf16 (faster where measured, on
    a CPU with AMX; its features differ from fp32's a little more than storing them in bf16 does;
    docs/journal/engine.md), recorded per shard."""
    target = load_target(target_config_from_args(args))
    layers = tuple(args.layers)
    out = features_dir(args.data, layers)
    out.mkdir(parents=True, exist_ok=True)
    for path in tqdm(shard_paths(args.data), desc="features", unit="shard"):
        if (out / path.name).exists():
            continue
        seqs = read_shard(path)
        with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            feats = features_by_length(target, seqs, layers, args.batch_size)
        tmp = (out / path.name).with_suffix(".tmp")
        save_file({"features": torch.cat(feats).to(torch.bfloat16).contiguous()}, str(tmp),  # (sum T, F)
                  metadata={"autocast": args.autocast})
        tmp.rename(out / path.name)


def features_by_length(target: Target, seqs: list[Sequence], layers: tuple[int, ...], batch_size: int,
                       on_device: bool = False) -> list:
    """target_features for every sequence, batched in order of length, returned in the sequences' order."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens))
    feats: dict[int, torch.Tensor] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        feats.update(zip(idx, target_features(target, [seqs[i] for i in idx], layers, on_device)))
    return [feats[i] for i in range(len(seqs))]


def draft_vocabulary(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The size-1 most frequent response tokens, after -1 for the "other" class. (V,) target ids."""
    counts: dict[int, int] = {}
    for seq in seqs:
        for tok in seq.tokens[seq.prompt_len:]:
            counts[tok] = counts.get(tok, 0) + 1
    top = sorted(counts, key=lambda t: -counts[t])[: size - 1]
    top += [-2 - i for i in range(size - 1 - len(top))]  # pad with never-seen placeholders
    return torch.tensor([-1] + top, dtype=torch.long)


def target_to_draft_map(vocab_ids: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """(V_t,) draft id per target id, 0 ("other") outside the draft vocabulary."""
    mapping = torch.zeros(target_vocab, dtype=torch.long)
    real = vocab_ids >= 0
    mapping[vocab_ids[real]] = torch.arange(len(vocab_ids))[real]
    return mapping


# ---- stage 2: blocks with target features ---------------------------------------------------

def target_features(target: Target, seqs: list[Sequence], layers: tuple[int, ...],
                    on_device: bool = False) -> list[torch.Tensor]:
    """Hidden states (T, F) at `layers` for each sequence, one right-padded batched forward; fp32 on the CPU,
    or kept on the target's device in its dtype (on_device: a GPU run holds every feature in GPU memory)."""
    width = max(len(s.tokens) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)  # (S, T)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s.tokens)], mask[i, : len(s.tokens)] = torch.tensor(s.tokens), 1
    with torch.inference_mode():
        out = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                           output_hidden_states=True, logits_to_keep=1)
    feats = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # (S, T, F)
    feats = feats if on_device else feats.float().cpu()
    return [feats[i, : len(s.tokens)].clone() for i, s in enumerate(seqs)]


def with_features_in_memory(target: Target, seqs: list[Sequence], layers: tuple[int, ...],
                            batch_size: int = 32) -> list[Sequence]:
    """The sequences with their features (T, F) computed now and held on the target's device in bf16, as the
    feature cache stores them: a GPU run trains without a target forward per step and without disk."""
    feats = features_by_length(target, seqs, layers, batch_size, on_device=True)
    return [Sequence(seq.tokens, seq.prompt_len, f.to(torch.bfloat16)) for seq, f in zip(seqs, feats)]


def blocks_from_sequences(target: Target, seqs: list[Sequence], anchors_per_seq: int, block_size: int,
                          window: int, layers: tuple[int, ...], to_draft: torch.Tensor,
                          generator: torch.Generator) -> Blocks:
    """Sample anchors a in each response (a >= prompt_len - 1): context = features of positions < a
    (last `window`), anchor = token a, block = tokens a+1..a+K."""
    anchors = []
    for seq in seqs:
        lo, hi = max(seq.prompt_len - 1, 1), len(seq.tokens) - 1  # need context and at least one target
        anchors.append(torch.randint(lo, hi, (anchors_per_seq,), generator=generator).tolist() if hi > lo else [])
    return blocks_at(target, seqs, anchors, block_size, window, layers, to_draft)


def blocks_at(target: Target, seqs: list[Sequence], anchors: list[list[int]], block_size: int, window: int,
              layers: tuple[int, ...], to_draft: torch.Tensor) -> Blocks:
    """Blocks at the given anchor positions of each sequence. The features of all sequences form one
    pool that every block indexes (Blocks.window)."""
    if all(s.features is not None for s in seqs):
        # cached: no target forward this step
        feats = [features.float() for s in seqs if (features := s.cached_features()) is not None]
    else:
        feats = target_features(target, seqs, layers)
    embed = target.model.get_input_embeddings().weight.detach()
    rows, offset = [], 0  # (first pool row of the window, its length, anchor id, block ids)
    for seq, feat, seq_anchors in zip(seqs, feats, anchors):
        for a in seq_anchors:
            first = max(0, a - window)
            rows.append((offset + first, a - first, seq.tokens[a], seq.tokens[a + 1:a + 1 + block_size]))
        offset += len(feat)
    b = len(rows)
    index = torch.zeros(b, window, dtype=torch.long)  # (B, W) pool rows, right-aligned
    feature_mask = torch.zeros(b, window, dtype=torch.bool)
    tokens = torch.zeros(b, block_size, dtype=torch.long)
    valid = torch.zeros(b, block_size, dtype=torch.bool)
    for i, (first, n_ctx, _anchor, block) in enumerate(rows):
        index[i, window - n_ctx:] = torch.arange(first, first + n_ctx)
        feature_mask[i, window - n_ctx:] = True
        tokens[i, : len(block)] = to_draft[torch.tensor(block)]
        valid[i, : len(block)] = True
    anchor_ids = torch.tensor([r[2] for r in rows], dtype=torch.long)
    pool = torch.cat(feats)  # (P, F) on the features' device (the GPU when they are held there)
    return Blocks(pool, index, feature_mask, anchor_ids, embed[anchor_ids.to(embed.device)].float().to(pool.device),
                  tokens, valid)


# ---- Magpie: the target writes the user requests itself ---------------------------------------

def user_turn_opening(target: Target) -> list[int]:
    """The chat template's ids up to where a user message's text starts (e.g. `<|im_start|>user\n`): given only
    these, an instruction-tuned model writes a plausible user request (Magpie)."""
    mark = "\u2063MAGPIE\u2063"
    text = target.tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False)
    return target.tokenizer(text[: text.index(mark)], add_special_tokens=False)["input_ids"]


def sample_requests(target: Target, count: int, max_tokens: int, temperature: float, top_p: float,
                    seed: int) -> list[str]:
    """`count` requests sampled from the user-turn opening, EOS (end of the turn) excluded, stripped."""
    opening = torch.tensor([user_turn_opening(target)] * count, device=target.device)  # (S, T)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = target.model.generate(opening, attention_mask=torch.ones_like(opening), max_new_tokens=max_tokens,
                                    do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                    eos_token_id=list(target.eos_token_ids), pad_token_id=target.eos_token_ids[0])
    rows = out[:, opening.shape[1]:].tolist()
    return [target.decode(target.until_eos(row)).strip() if len(target.until_eos(row)) < len(row) else ""
            for row in rows]  # a request cut by max_tokens is dropped ("")


def request_key(text: str) -> str:
    """What two requests share when they are the same one: the words, lower-cased."""
    return " ".join(text.lower().split())


def usable_request(text: str, seen: set[str]) -> bool:
    """Long enough to be a request, finished, not a template fragment, not seen before."""
    key = request_key(text)
    return len(key.split()) >= 4 and "<|" not in text and key not in seen


def magpie(args) -> None:
    """Append self-written requests to --out (training) and every --check-every-th one to --check (held apart),
    resuming where the files end; each batch is seeded by how many requests were drawn before it."""
    target = load_target(target_config_from_args(args))
    out, check = Path(args.out), Path(args.check)
    rows = [row for path in (out, check) if path.exists() for row in read_jsonl(path)]
    seen = {request_key(row["prompt"]) for row in rows}
    drawn = max((int(row["id"].rsplit("-", 1)[1]) + 1 for row in rows), default=0)
    progress = tqdm(total=args.n, initial=len(rows), desc="magpie requests")
    while len(rows) < args.n:
        for text in sample_requests(target, args.batch_size, args.max_request_tokens, args.temperature, args.top_p,
                                    args.seed + drawn):
            drawn += 1
            if len(rows) >= args.n or not usable_request(text, seen):
                continue
            seen.add(request_key(text))
            row = {"id": f"magpie-{drawn - 1}", "domain": "magpie", "prompt": text,
                   "source": f"written by {target.name} from its chat template's user-turn opening (Magpie)"}
            rows.append(row)
            with open(check if len(rows) % args.check_every == 0 else out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            progress.update(1)


def add_generation_args(parser: argparse.ArgumentParser) -> None:
    """What generate and follow-up share: how the target answers, and the target."""
    parser.add_argument("--max-new-tokens", type=int, default=256, help="longest response (default 256)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts answered together (default 16)")
    parser.add_argument("--shard-size", type=int, default=128, help="responses per shard file (default 128)")
    add_target_args(parser, cpu_precision="reference")


def build_phrasebook(args) -> None:
    """The phrasebook of the replies in some data folders (one target's): each reply with the prompt's last tokens
    before it (the chat template's opening of the assistant turn), so a reply's first words are in it too."""
    config = phrasebook.PhrasebookConfig(args.min_ngram, args.max_ngram, args.length, args.min_support)
    refuse_held_out_folders(args.data + (args.held or []), "the phrasebook or its calibration")
    targets = [json.loads((Path(folder) / "meta.json").read_text())["target"] for folder in args.data]
    if any(target != targets[0] for target in targets):
        raise SystemExit(f"--data folders were written by different targets: {targets}")
    replies = [seq.tokens[max(0, seq.prompt_len - config.max_ngram):] for folder in args.data
               for seq in load_sequences(folder)]
    book = phrasebook.build(tqdm(replies, desc="phrasebook", unit="reply"), config)
    built_from = {"data": list(args.data), "replies": len(replies), "tokens": sum(map(len, replies)),
                  "date": time.strftime("%Y-%m-%d")}
    calibrated_on = None
    if args.held:  # each grade's acceptance on replies the book was not built from: the policy's starting point
        if set(args.held) & set(args.data):
            raise SystemExit("--held folders must not be among --data (the calibration would read its own replies)")
        held = [(seq.tokens, seq.prompt_len) for folder in args.held for seq in load_sequences(folder)]
        rates, reached = phrasebook.calibrate(book, tqdm(held, desc="calibration", unit="reply"))
        book = replace(book, calibration=rates)
        calibrated_on = {"held": list(args.held), "replies": len(held),
                         "reached": {str(graded): counts for graded, counts in reached.items()}}
    print(phrasebook.save(args.out, book, targets[0], built_from, calibrated_on), f"{len(book)} n-grams")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="the target writes responses to training prompts")
    gen.add_argument("--prompts", nargs="+", required=True, help="train_*.jsonl prompt files (never eval_*)")
    gen.add_argument("--out", required=True, help="data folder (an existing one resumes, same settings only)")
    gen.add_argument("--start", type=int, default=0, help="skip the first N prompts of each file")
    gen.add_argument("--limit", type=int, default=None, help="N prompts of each file (from --start)")
    gen.add_argument("--held-apart", action="store_true",
                     help="a check set: tuning and held-out sets allowed (offline checks); training refuses "
                          "the folder")
    add_generation_args(gen)
    turn2 = sub.add_parser("follow-up", help="the target answers follow-up questions to its own earlier answers")
    turn2.add_argument("--source", required=True, help="a data folder written by generate (its prompts and answers)")
    turn2.add_argument("--out", required=True, help="data folder (an existing one resumes, same settings only)")
    turn2.add_argument("--domains", nargs="+", default=["chat"], help="first turns of these domains (default chat)")
    turn2.add_argument("--per-conversation", type=int, default=2, help="follow-ups per first turn (default 2)")
    turn2.add_argument("--seed", type=int, default=0, help="which follow-ups each conversation draws")
    add_generation_args(turn2)
    mag = sub.add_parser("magpie", help="the target writes user requests itself (prompts for generate)")
    mag.add_argument("--n", type=int, required=True, help="requests in both files together")
    mag.add_argument("--out", required=True, help="JSONL of training requests (appended; resumes)")
    mag.add_argument("--check", required=True, help="JSONL of held-apart requests, never trained on")
    mag.add_argument("--check-every", type=int, default=10, help="every N-th request goes to --check")
    mag.add_argument("--batch-size", type=int, default=16)
    mag.add_argument("--max-request-tokens", type=int, default=160)
    mag.add_argument("--temperature", type=float, default=1.0)
    mag.add_argument("--top-p", type=float, default=0.99)
    mag.add_argument("--seed", type=int, default=0)
    add_target_args(mag, cpu_precision="reference")
    feat = sub.add_parser("features", help="cache the target's hidden states at the drafter's layers")
    feat.add_argument("--data", required=True, help="a data folder written by generate")
    feat.add_argument("--layers", type=int, nargs="+", required=True, help="e.g. 1 10 20 29 for SmolLM2-135M")
    feat.add_argument("--batch-size", type=int, default=8, help="sequences per target forward (default 8)")
    feat.add_argument("--autocast", default="none", choices=["none", "bf16"],
                      help="bf16: the target's matmuls in bf16 (faster where measured, on a CPU with AMX; "
                           "features a little further from fp32's)")
    add_target_args(feat, cpu_precision="reference")
    book = sub.add_parser("phrasebook", help="the target's phrasebook from its replies (core.drafting.phrasebook)")
    book.add_argument("--data", nargs="+", required=True, help="data folders written by generate / follow-up "
                      "(replies to training prompts only, never to eval or check prompts)")
    book.add_argument("--out", required=True, help="e.g. weights/smollm2-135m-instruct/phrasebook")
    book.add_argument("--held", nargs="*", default=[], help="held-out data folders (replies to check prompts) to "
                      "calibrate each grade's acceptance on (core.drafting.phrasebook.calibrate)")
    defaults = phrasebook.PhrasebookConfig()
    book.add_argument("--min-ngram", type=int, default=defaults.min_ngram)
    book.add_argument("--max-ngram", type=int, default=defaults.max_ngram)
    book.add_argument("--length", type=int, default=defaults.length, help="continuation tokens kept per n-gram")
    book.add_argument("--min-support", type=int, default=defaults.min_support,
                      help="occurrences that must agree on each continuation token")
    args = parser.parse_args(argv)
    if args.cmd == "phrasebook":
        build_phrasebook(args)
    elif args.cmd == "generate":
        generate(args)
    elif args.cmd == "follow-up":
        follow_up(args)
    elif args.cmd == "magpie":
        magpie(args)
    else:
        extract_features(args)


if __name__ == "__main__":
    main()
