"""The target's phrasebook: a second free drafting source, what the target itself wrote after the same few tokens.

Shape letters: N = n-grams kept, S = continuation tokens stored in all.

Prompt lookup copies from the conversation; this copies from the target's own earlier replies to other prompts
(retrieval drafting, as REST does with a datastore; He et al., 2023). Replies of one model repeat its phrasing across
prompts ("Here are some tips", "def is_prime(n):", "= 2 * 3 ="), so what most often followed an n-gram in its replies
is a draft that costs no network call. Each kept n-gram (2 to 4 tokens) maps to its majority continuation: the token
that most often came next, then the one that most often came after that among those occurrences, and so on while
at least `min_support` occurrences agree (up to `length` tokens). The policy verifies such a draft as it verifies a
conversation lookup (core.drafting.policy: measured acceptance per source and grade, the cut under the verify cost),
so the output stays exact whatever the phrasebook holds.

How far a copy can be trusted varies with the n-gram more than with its length: where few of its occurrences went on
with the stored first token, the target keeps that token rarely. Each n-gram carries an agreement class (its
occurrences' share that continued with the stored first token, and how many occurrences there were), and the book a
calibration: per match length and class, how often each copied slot was kept on held-out replies (`calibrate`). The
policy measures a copy's acceptance per that grade and starts from the calibration
(core.drafting.policy.state.Acceptance).

Stored as `config.json` (format, the target's identity, the settings, the data it was built from and the calibration)
and `index.safetensors`: `keys` (N,) the n-grams' 32-bit keys (int32 bit patterns), sorted; `lengths` (N,) uint8,
their continuations' lengths; `classes` (N,) uint8, their agreement classes; `tokens` (S,) the continuations one after
another (uint16 where every id fits, else int32). Format /2 books (before 0.44.0) have no classes: a copy's grade is
then its match length alone.
The keys were 64-bit hashes before version 0.39.0 (format /1, 2.2 of that book's 5.6 MB); 32 bits keep the shipped
book's 341,118 n-grams apart but for the 26 the build drops (n-grams whose keys collide), and a lookup of an n-gram the
book does not hold hits a key by chance once in ~12,600 probes, a draft that verification then refuses.
"""
from __future__ import annotations

import json
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FORMAT = "flashmap-chat-phrasebook/3"
UNGRADED = "flashmap-chat-phrasebook/2"  # no agreement classes: still read
_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3  # FNV-1a's 64-bit prime
KEY_BITS = 32  # a stored key: the high half of the n-gram's 64-bit hash, mixed (short_key)


class PhrasebookError(ValueError):
    """A phrasebook cannot be used with this target; the message says why (drafting goes on without it)."""


@dataclass(frozen=True)
class PhrasebookConfig:
    min_ngram: int = 2
    max_ngram: int = 4
    length: int = 8  # continuation tokens kept per n-gram
    min_support: int = 2  # occurrences that must agree on each continuation token

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram or not 1 <= self.length <= 255 or self.min_support < 1:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, 1 <= length <= 255 and min_support >= 1: {self}")


def ngram_hash(tokens: Iterable[int]) -> int:
    """A 64-bit FNV-1a hash of an n-gram of token ids (n is part of the hash: every token is mixed in)."""
    key = 0xCBF29CE484222325
    for token in tokens:
        key = ((key ^ (int(token) + 1)) * _PRIME) & _MASK
    return key


def short_key(full: int) -> int:
    """A 64-bit hash's stored key: its high KEY_BITS after MurmurHash3's finaliser (FNV-1a's own high bits barely
    change between short n-grams: all forty 2-grams of small ids shared their top 7 bits)."""
    full = ((full ^ (full >> 33)) * 0xFF51AFD7ED558CCD) & _MASK
    full = ((full ^ (full >> 33)) * 0xC4CEB9FE1A85EC53) & _MASK
    return (full ^ (full >> 33)) >> (64 - KEY_BITS)


def ngram_key(tokens: Iterable[int]) -> int:
    """An n-gram's stored key (short_key of its hash). Two n-grams sharing a key only make a worse draft, never a
    wrong output (verification decides)."""
    return short_key(ngram_hash(tokens))


CLASSES = 15  # agreement classes: the first token's share in fifths (5) x occurrences 2-3, 4-15, 16 or more (3)
DEPTH = 8  # copied slots a calibration reports


def agreement_class(share: float, support: int) -> int:
    """An n-gram's agreement class (0..CLASSES - 1) from the share of its occurrences that went on with the stored
    first token and their number. On held-out replies a 4-gram's first copied token was kept 0.11 of the time in the
    lowest fifth of shares and 0.91 in the highest (16 occurrences or more each), where one rate for every 4-gram read
    ~0.6 (the shipped book's calibration, docs/journal/engine.md)."""
    return 3 * min(int(share * 5), 4) + (0 if support < 4 else 1 if support < 16 else 2)


def grade(matched: int, agreement: int | None) -> int:
    """A copy's grade, the key its acceptance is measured by: the match length, and the agreement class where the
    book has them."""
    return matched if agreement is None else matched * CLASSES + agreement


def majority_continuation(followers: list[list[int]], length: int, min_support: int) -> list[int]:
    """The continuation most occurrences agree on, token by token: each step keeps the most common next token while
    at least min_support occurrences (of those that agreed so far) have it."""
    path: list[int] = []
    for step in range(length):
        counts = Counter(seq[step] for seq in followers if len(seq) > step)
        if not counts:
            break
        token, support = counts.most_common(1)[0]
        if support < min_support:
            break
        path.append(token)
        followers = [seq for seq in followers if len(seq) > step and seq[step] == token]
    return path


@dataclass(frozen=True)
class Phrasebook:
    """n-gram hash -> majority continuation, looked up longest n-gram first."""

    config: PhrasebookConfig
    keys: list[int]  # (N,) sorted hashes (the stored order)
    offsets: torch.Tensor  # (N+1,) int64, into tokens
    tokens: torch.Tensor  # (S,) the continuations, one after another
    classes: list[int] | None = None  # (N,) agreement classes; None for a format /2 book
    # grade -> each copied slot's acceptance on held-out replies given the earlier ones kept (calibrate)
    calibration: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # set in __post_init__: the lookup's own forms of keys, offsets and tokens
    _rows: dict[int, int] = field(init=False, repr=False, compare=False, default_factory=dict)
    _offsets: array = field(init=False, repr=False, compare=False, default_factory=lambda: array("q"))
    _tokens: array = field(init=False, repr=False, compare=False, default_factory=lambda: array("i"))

    def __post_init__(self):
        # the same offsets and tokens as Python arrays: a lookup slices them without a tensor op (two scalar reads and a
        # slice of tensors cost more than the lookup, docs/journal/engine.md)
        object.__setattr__(self, "_offsets", array("q", self.offsets.tolist()))
        object.__setattr__(self, "_tokens", array("i", self.tokens.tolist()))  # ids fit int32 (save's widest)
        # hash -> row: a probe reads a few cache lines where a bisect of the sorted list read ~36, each a miss right
        # after a forward (it halved a lookup's time with the caches flushed between lookups, docs/journal/engine.md)
        object.__setattr__(self, "_rows", dict(zip(self.keys, range(len(self.keys)))))

    def __len__(self) -> int:
        return len(self.keys)

    def lookup(self, history: list[int], limit: int) -> tuple[list[int], int]:
        """(the majority continuation of history's longest kept suffix, at most `limit` tokens; that suffix's length),
        ([], 0) when none is kept."""
        copied, n, _ = self._find(history, limit)
        return copied, n

    def graded(self, history: list[int], limit: int) -> tuple[list[int], int, int]:
        """lookup's continuation and suffix length with its grade (the match length and the n-gram's agreement
        class), ([], 0, 0) for none."""
        copied, n, row = self._find(history, limit)
        if not copied:
            return [], 0, 0
        return copied, n, grade(n, None if self.classes is None else self.classes[row])

    def prior(self, graded: int) -> tuple[float, ...]:
        """The calibrated acceptance of a grade's copied slots, () where the book was not calibrated for it."""
        return self.calibration.get(graded, ())

    def _find(self, history: list[int], limit: int) -> tuple[list[int], int, int]:
        """(continuation, suffix length, row) of history's longest kept suffix; ([], 0, -1) for none."""
        top = min(self.config.max_ngram, len(history))
        for n in range(top, self.config.min_ngram - 1, -1):
            row = self._rows.get(ngram_key(history[-n:]))
            if row is not None:
                start, end = self._offsets[row], self._offsets[row + 1]
                return self._tokens[start : min(end, start + limit)].tolist(), n, row
        return [], 0, -1


def build(sequences: Iterable[list[int]], config: PhrasebookConfig) -> Phrasebook:
    """The phrasebook of some token sequences (the target's replies): every n-gram with a continuation that at
    least min_support of its occurrences share."""
    followers: dict[int, list[list[int]]] = {}  # by the n-gram's 64-bit hash
    for seq in sequences:
        for end in range(1, len(seq)):
            after = seq[end : end + config.length]
            for n in range(config.min_ngram, min(config.max_ngram, end) + 1):
                followers.setdefault(ngram_hash(seq[end - n : end]), []).append(after)
    kept: dict[int, tuple[list[int], int]] = {}  # hash -> (continuation, agreement class)
    for full, seqs in followers.items():
        if len(seqs) >= config.min_support:
            path = majority_continuation(seqs, config.length, config.min_support)
            if path:
                share = sum(1 for seq in seqs if seq and seq[0] == path[0]) / len(seqs)
                kept[full] = path, agreement_class(share, len(seqs))
    stored = {full: short_key(full) for full in kept}
    shared = Counter(stored.values())  # n-grams whose stored keys collide are dropped
    kept = {stored[full]: entry for full, entry in kept.items() if shared[stored[full]] == 1}
    keys = sorted(kept)
    lengths = torch.tensor([len(kept[key][0]) for key in keys], dtype=torch.long)  # (N,)
    tokens = torch.tensor([token for key in keys for token in kept[key][0]], dtype=torch.long)  # (S,)
    return Phrasebook(config, keys, starts(lengths), tokens, [kept[key][1] for key in keys])


def copy_counts(book: Phrasebook, replies: Iterable[tuple[list[int], int]], graded: bool = True,
                depth: int = DEPTH) -> tuple[int, dict[int, list[int]], dict[int, list[int]]]:
    """How the book's copies fare on held-out replies (tokens, prompt length) at T = 0, where the target's tokens are
    the reply's: at every position of a reply the book is looked up on the tokens before it, and a copy keeps its tokens
    up to the first that differs. -> (positions looked up, per key the copies that reached each slot, of those the ones
    that kept it); the key is the copy's grade, or its match length (graded=False)."""
    positions = 0
    reached: dict[int, list[int]] = {}
    accepted: dict[int, list[int]] = {}
    for tokens, prompt_len in replies:
        for at in range(prompt_len + 1, len(tokens)):
            positions += 1
            history = tokens[max(0, at - book.config.max_ngram) : at]
            copy, n, grade_of = book.graded(history, depth)
            key = grade_of if graded else n
            if not copy:
                continue
            reach, accept = reached.setdefault(key, [0] * depth), accepted.setdefault(key, [0] * depth)
            for slot, token in enumerate(copy[: len(tokens) - at]):
                reach[slot] += 1
                if token != tokens[at + slot]:
                    break
                accept[slot] += 1
    return positions, dict(sorted(reached.items())), dict(sorted(accepted.items()))


def calibrate(book: Phrasebook, replies: Iterable[tuple[list[int], int]],
              min_reached: int = 20) -> tuple[dict[int, tuple[float, ...]], dict[int, list[int]]]:
    """Each grade's copied slots on held-out replies (copy_counts). -> ({grade: each slot's acceptance given the
    earlier ones kept, while at least min_reached copies reached the slot}, {grade: copies that reached each slot})"""
    _, reached, accepted = copy_counts(book, replies)
    rates = {graded: tuple(round(a / r, 4) for a, r in zip(accepted[graded], reach) if r >= min_reached)
             for graded, reach in reached.items()}
    return {graded: rate for graded, rate in rates.items() if rate}, reached


def starts(lengths: torch.Tensor) -> torch.Tensor:
    """(N,) lengths -> (N+1,) offsets of each continuation in the flat tokens."""
    return torch.cat([torch.zeros(1, dtype=torch.long), lengths.long().cumsum(0)])


def save(folder, book: Phrasebook, target_identity: dict, built_from: dict, calibrated_on: dict | None = None) -> Path:
    """Write a graded book (format /3; calibrated_on: how its calibration was measured, kept beside it)."""
    if book.classes is None:
        raise ValueError("only a book with agreement classes is saved (build one)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # unsigned keys travel as int32 bit patterns (what every safetensors reader round-trips)
    keys = torch.tensor([key - (1 << 32) if key >= 1 << 31 else key for key in book.keys], dtype=torch.int32)  # (N,)
    small = book.tokens.numel() == 0 or int(book.tokens.max()) < 1 << 16
    save_file({"keys": keys, "lengths": book.offsets.diff().to(torch.uint8),
               "classes": torch.tensor(book.classes, dtype=torch.uint8),
               "tokens": book.tokens.to(torch.uint16 if small else torch.int32)}, str(folder / "index.safetensors"))
    meta = {"format": FORMAT, "target": target_identity, "phrasebook": asdict(book.config), "ngrams": len(book),
            "built_from": built_from,
            "calibration": {"measured": calibrated_on or {},
                            "rates": {str(graded): list(rates) for graded, rates in book.calibration.items()}}}
    (folder / "config.json").write_text(json.dumps(meta, indent=1))
    return folder


def load(folder, target_identity: dict) -> Phrasebook:
    """The phrasebook in `folder` for this target, or PhrasebookError saying why not (missing, corrupt, built for
    another target)."""
    folder = Path(folder)
    cfg_path, index_path = folder / "config.json", folder / "index.safetensors"
    if not cfg_path.is_file() or not index_path.is_file():
        raise PhrasebookError(f"no phrasebook at {folder} (need config.json and index.safetensors)")
    try:
        meta = json.loads(cfg_path.read_text())
        config = PhrasebookConfig(**meta["phrasebook"])
    except (ValueError, KeyError, TypeError) as err:
        raise PhrasebookError(f"{cfg_path} is not a valid phrasebook config: {err}") from err
    if meta.get("format") not in (FORMAT, UNGRADED):
        raise PhrasebookError(f"{cfg_path}: unknown format {meta.get('format')!r}, expected {FORMAT} (rebuild it: "
                              "python -m drafter.data phrasebook)")
    try:
        calibration = {int(graded): tuple(float(rate) for rate in rates)
                       for graded, rates in meta.get("calibration", {}).get("rates", {}).items()}
    except (ValueError, TypeError, AttributeError) as err:
        raise PhrasebookError(f"{cfg_path} has an invalid calibration: {err}") from err
    if meta.get("target") != target_identity:
        raise PhrasebookError(f"the phrasebook at {folder} was built for target {meta.get('target')}, but the "
                              f"loaded target is {target_identity}")
    try:
        index = load_file(str(index_path))
        keys, lengths, tokens = index["keys"], index["lengths"], index["tokens"].long()
        classes = index["classes"] if meta["format"] == FORMAT else None
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise PhrasebookError(f"{index_path} is corrupt: {err}") from err
    offsets = starts(lengths)  # (N+1,)
    if keys.dim() != 1 or lengths.shape != keys.shape or int(offsets[-1]) != tokens.shape[0]:
        raise PhrasebookError(f"{index_path} is corrupt: the lengths do not add up to the tokens")
    if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < target_identity["vocab_size"]:
        raise PhrasebookError(f"{index_path} is corrupt: token ids outside the target's vocabulary")
    if keys.dtype != torch.int32:
        raise PhrasebookError(f"{index_path} is corrupt: keys must be int32")
    if classes is not None and (classes.shape != keys.shape or classes.numel() and int(classes.max()) >= CLASSES):
        raise PhrasebookError(f"{index_path} is corrupt: the agreement classes do not fit the n-grams")
    unsigned = [key + (1 << 32) if key < 0 else key for key in keys.tolist()]
    if any(a >= b for a, b in zip(unsigned, unsigned[1:])):
        raise PhrasebookError(f"{index_path} is corrupt: keys are not sorted")
    return Phrasebook(config, unsigned, offsets, tokens, None if classes is None else classes.tolist(), calibration)
