"""Fit a drafter's per-slot confidence calibration on held-out responses, show what it changes, and write it.

Shape letters: R = rounds (held-out anchors), K = block size.

python -m drafter.evaluation.calibrate --data data/smollm2-val --variants flashmap,scale=0 dflash --stride 16 \
    [--write] [--out runs/calibration.json]

For each variant (a drafter spec, drafter/spec.py) this drafts at every stride-th anchor as drafter.evaluation.evaluate
does
(T = 0), then reports, per domain, the expected accepted slots per round that the engine's adaptive cut would
believe (sum_k prod_{j<=k} c_k) against the slots the target accepted: with the raw confidence, and with a
calibration fitted on the other half of the sequences (two folds, split by sequence: an honest held-out figure).
--write fits on every round and stores the map in the checkpoint's calibration.json, keyed by the way of drafting
(drafter/runtime/calibration.py); the engine applies it at T = 0 unless the spec says calibrated=0.
"""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch

from core.runtime.target import add_target_args, load_target, target_config_from_args
from drafter.data import refuse_held_out_folders
from drafter.evaluation.evaluate import draft_rounds, held_out_sequences, load_variant, parse_variant
from drafter.runtime import calibration as calib
from drafter.runtime.drafters import default_weights


def two_fold(confidence: torch.Tensor, n_accepted: torch.Tensor, draft_len: torch.Tensor,
             fold: torch.Tensor) -> torch.Tensor:
    """Calibrated confidence of every round from a map fitted on the other fold. fold (R,) bool -> (R, K)."""
    out = torch.empty_like(confidence)
    for held in (fold, ~fold):
        fitted = calib.fit(confidence[~held], n_accepted[~held], draft_len[~held])
        out[held] = fitted(confidence[held])
    return out


def report_rows(confidence, calibrated, n_accepted, domain_of_round: list[str]) -> dict:
    """Per domain and over all: expected accepted slots under raw and calibrated confidence, and accepted."""
    rows = {}
    for name in ["all", *dict.fromkeys(domain_of_round)]:
        keep = torch.tensor([name in ("all", d) for d in domain_of_round])  # (R,)
        raw = calib.expected_vs_accepted(confidence[keep], n_accepted[keep])
        cal = calib.expected_vs_accepted(calibrated[keep], n_accepted[keep])
        rows[name] = {"rounds": int(keep.sum()), "accepted": raw["accepted"],
                      "expected_raw": raw["expected_accepted"], "expected_calibrated": cal["expected_accepted"]}
    return rows


def calibrate_variant(text: str, target, folder: Path, stride: int, write: bool, sequences=held_out_sequences) -> dict:
    """sequences(folder, layers, limit) -> (seqs, domains): held_out_sequences, or a cache of it across variants."""
    variant = parse_variant(text)
    if variant.spec.tree > 1:
        raise SystemExit(f"variant {text!r}: a tree's drafts are cut by the trie, not by confidence")
    net, vocab_ids = load_variant(variant, target)
    seqs, domains = sequences(folder, net.cfg.feature_layers, None)
    rounds = draft_rounds(variant, net, vocab_ids, target, seqs, stride)
    fold = rounds.seq_index % 2 == 0  # (R,) split by sequence: no response on both sides
    calibrated = two_fold(rounds.confidence, rounds.n_accepted, rounds.draft_len, fold)  # (R, K)
    domain_of_round = [domains[i] for i in rounds.seq_index.tolist()]
    result = {"variant": text, "sampler": variant.spec.sampler_key(),
              "held_out": report_rows(rounds.confidence, calibrated, rounds.n_accepted, domain_of_round)}
    fitted = calib.fit(rounds.confidence, rounds.n_accepted, rounds.draft_len)
    result["calibration"] = {"slope": list(fitted.slope), "bias": list(fitted.bias)}
    if write:
        weights = variant.spec.weights or default_weights(target.identity["name"], variant.spec.name)
        fitted_on = {"data": str(folder), "stride": stride, "rounds": len(rounds.n_accepted), "temperature": 0}
        result["written"] = str(calib.save(weights, variant.spec.sampler_key(), fitted, fitted_on))
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="check-set responses with cached features (drafter.data "
                        "generate --held-apart), never a held-out set's")
    parser.add_argument("--variants", nargs="+", required=True, help="drafter specs, e.g. flashmap,scale=0 dflash")
    parser.add_argument("--stride", type=int, default=16, help="every N-th anchor of each response")
    parser.add_argument("--write", action="store_true", help="store each fit in its checkpoint's calibration.json")
    parser.add_argument("--out", default=None, help="JSON report")
    add_target_args(parser, cpu_precision="reference")
    args = parser.parse_args(argv)
    if args.stride < 1:
        raise SystemExit("--stride must be >= 1")
    refuse_held_out_folders([args.data], "calibration")
    target = load_target(target_config_from_args(args))
    sequences = functools.lru_cache(maxsize=None)(held_out_sequences)  # read once for variants of the same layers
    results = [calibrate_variant(text, target, Path(args.data), args.stride, args.write, sequences)
               for text in args.variants]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"data": args.data, "stride": args.stride, "results": results}, indent=1))
    for row in results:
        print(json.dumps({"variant": row["variant"], **row["held_out"]}))
        if "written" in row:
            print(f"wrote {row['written']}")


if __name__ == "__main__":
    main()
