"""Per-slot confidence calibration: what the adaptive cut should believe about a drafter's confidence.

Shape letters: R = rounds (held-out anchors), K = block size.

The engine's adaptive cut (core.drafting.policy.offers.best_draft_length) reads each slot's confidence c_k as the
probability that slot k is accepted given that the slots before it were, and drafts the prefix with the most expected
tokens per unit of verify cost. A drafter's confidence is the largest probability of each slot's distribution; a flow
map distilled onto its teacher's sharp flow from x0 = 0 is far too sure of itself (offline on held-out responses, K =
16, T = 0: slot 1 confident 0.79 on average where 0.53 is accepted; expected accepted slots per round 2.4 where 1.0
are): the cut then drafts long and never stops drafting where drafting does not pay (chat).

Calibration maps c_k to sigmoid(a_k logit(c_k) + b_k) (Platt scaling, per slot), fitted on held-out rounds at
T = 0 by the acceptance each slot met when it was reached. It is a function of the distributions alone, never of
a sampled token, so the cut it steers stays a policy: verification keeps the output exact. A calibration belongs
to one checkpoint (the sha256 of its model.safetensors) and one way of drafting (the sampler key); anything else
is refused with the reason, and the drafter keeps its raw confidence.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "flashmap-chat-calibration/1"
FILE = "calibration.json"
MIN_REACHED = 40  # slots reached fewer times than this (or of one outcome only) borrow the slot before's map
RIDGE = 1.0  # pulls (a, b) toward the identity map (1, 0) where the data are thin


class CalibrationError(ValueError):
    """A calibration file cannot be used for this drafter; the message says why."""


@dataclass(frozen=True)
class SlotCalibration:
    """c_k -> sigmoid(slope_k logit(c_k) + bias_k), k = 1..K; slots past K use the last map."""

    slope: tuple[float, ...]
    bias: tuple[float, ...]
    # k -> the first k slots' slopes and biases (K,) each, built once per k: a call runs every drafting round
    _maps_by_k: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """confidence (..., K) in [0, 1] -> calibrated (..., K)."""
        slope, bias = self._maps(confidence.shape[-1])  # (K,) each
        logit = torch.logit(confidence.double().clamp(1e-6, 1 - 1e-6))  # (..., K)
        return torch.sigmoid(slope * logit + bias).to(confidence.dtype)

    def _maps(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k slots' slopes and biases (K,) each."""
        if k not in self._maps_by_k:
            idx = torch.arange(k).clamp_max(len(self.slope) - 1)  # (K,)
            self._maps_by_k[k] = (torch.tensor(self.slope, dtype=torch.float64)[idx],
                                  torch.tensor(self.bias, dtype=torch.float64)[idx])
        return self._maps_by_k[k]


def reached_outcomes(n_accepted: torch.Tensor, draft_len: torch.Tensor, block_size: int):
    """Per round and slot: was slot k reached (every slot before it accepted, k within the draft), and was it
    accepted. n_accepted, draft_len (R,) -> reached, accepted (R, K) bool."""
    slots = torch.arange(block_size)  # (K,)
    reached = (slots <= n_accepted[:, None]) & (slots < draft_len[:, None])  # (R, K)
    return reached, slots < n_accepted[:, None]


def fit_platt(x: torch.Tensor, y: torch.Tensor, iters: int = 50) -> tuple[float, float]:
    """Logistic regression y ~ sigmoid(a x + b), ridge-pulled toward (1, 0), by Newton's method with step halving
    (from the identity map a sure-but-wrong drafter starts where the curvature vanishes, and a full step
    overshoots). x, y (N,)."""
    design = torch.stack([x.double(), torch.ones_like(x, dtype=torch.float64)], -1)  # (N, 2)
    y = y.double()
    prior = torch.tensor([1.0, 0.0], dtype=torch.float64)

    def loss(w: torch.Tensor) -> float:
        logits = design @ w  # (N,)
        nll = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")
        return float(nll + RIDGE / 2 * ((w - prior) ** 2).sum())

    w, current = prior.clone(), loss(prior)
    for _ in range(iters):
        p = torch.sigmoid(design @ w)  # (N,)
        grad = design.T @ (p - y) + RIDGE * (w - prior)  # (2,)
        hess = design.T @ (design * (p * (1 - p))[:, None]) + RIDGE * torch.eye(2, dtype=torch.float64)  # (2, 2)
        step = torch.linalg.solve(hess, grad)
        while loss(w - step) > current and step.abs().max() > 1e-12:
            step = step / 2
        w, previous, current = w - step, current, loss(w - step)
        if previous - current < 1e-10:
            break
    return float(w[0]), float(w[1])


def fit(confidence: torch.Tensor, n_accepted: torch.Tensor, draft_len: torch.Tensor) -> SlotCalibration:
    """Per-slot Platt maps from held-out T = 0 rounds. confidence (R, K); n_accepted, draft_len (R,)."""
    k = confidence.shape[1]
    reached, accepted = reached_outcomes(n_accepted, draft_len, k)  # (R, K) x2
    logit = torch.logit(confidence.double().clamp(1e-6, 1 - 1e-6))  # (R, K)
    slope: list[float] = []
    bias: list[float] = []
    for slot in range(k):
        rows = reached[:, slot]  # (R,)
        y = accepted[rows, slot]
        if rows.sum() < MIN_REACHED or y.all() or not y.any():
            if not slope:
                raise CalibrationError(f"too few rounds to calibrate: slot 1 reached {int(rows.sum())} times, "
                                       f"with both outcomes needed and at least {MIN_REACHED}")
            slope.append(slope[-1])
            bias.append(bias[-1])
            continue
        a, b = fit_platt(logit[rows, slot], y)
        slope.append(round(a, 5))
        bias.append(round(b, 5))
    return SlotCalibration(tuple(slope), tuple(bias))


def expected_vs_accepted(confidence: torch.Tensor, n_accepted: torch.Tensor) -> dict:
    """What the cut believes (sum_k prod_{j<=k} c_j, the expected accepted slots of a full draft) against what
    the target accepted, averaged over rounds. confidence (R, K), n_accepted (R,)."""
    expected = confidence.double().cumprod(-1).sum(-1)  # (R,)
    return {"expected_accepted": round(expected.mean().item(), 4),
            "accepted": round(n_accepted.double().mean().item(), 4)}


def weights_digest(folder) -> str:
    """sha256 of the checkpoint's model.safetensors: a calibration belongs to these weights only."""
    digest = hashlib.sha256()
    with open(Path(folder) / "model.safetensors", "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save(folder, sampler: str, calibration: SlotCalibration, fitted_on: dict) -> Path:
    """Add (or replace) the calibration of one sampler key in FOLDER/calibration.json."""
    path = Path(folder) / FILE
    digest = weights_digest(folder)
    record = read_record(path) if path.exists() else {}
    samplers = record.get("samplers", {}) if record.get("weights_sha256") == digest else {}
    samplers[sampler] = {"slope": list(calibration.slope), "bias": list(calibration.bias), "fitted_on": fitted_on}
    path.write_text(json.dumps({"format": FORMAT, "weights_sha256": digest, "samplers": samplers}, indent=1))
    return path


def read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CalibrationError(f"{path} is unreadable: {err}") from err
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CalibrationError(f"{path}: not a calibration file of format {FORMAT}")
    return record


def load(folder, sampler: str) -> SlotCalibration | None:
    """The calibration of `sampler` for the checkpoint in folder; None when the folder has none for it.
    Raises CalibrationError for a corrupt file or one fitted to other weights."""
    path = Path(folder) / FILE
    if not path.exists():
        return None
    record = read_record(path)
    if record.get("weights_sha256") != weights_digest(folder):
        raise CalibrationError(f"{path} was fitted to other weights than {Path(folder) / 'model.safetensors'}")
    entry = record.get("samplers", {}).get(sampler)
    if entry is None:
        return None
    try:
        slope, bias = tuple(map(float, entry["slope"])), tuple(map(float, entry["bias"]))
    except (KeyError, TypeError, ValueError) as err:
        raise CalibrationError(f"{path}: the entry for {sampler} is malformed ({err})") from err
    if not slope or len(slope) != len(bias):
        raise CalibrationError(f"{path}: the entry for {sampler} has {len(slope)} slopes and {len(bias)} biases")
    return SlotCalibration(slope, bias)
