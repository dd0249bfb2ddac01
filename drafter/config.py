"""Drafter configuration: one frozen dataclass, saved inside every checkpoint."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

KINDS = ("flashmap", "dflash")


@dataclass(frozen=True)
class DrafterConfig:
    kind: str = "flashmap"  # flashmap (flow teacher / flow map) | dflash (one-pass masked baseline)
    block_size: int = 16  # K
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    feature_layers: tuple[int, ...] = (1, 10, 20, 30)  # indices into the target's hidden_states tuple
    target_hidden: int = 576  # D of the target (width of E and the LM head)
    draft_vocab: int = 4096  # V_d: slot 0 is "other" (any token outside the draft vocabulary)
    context_window: int = 256  # context positions before the anchor that cross-attention reads
    kappa: float = 7.0  # slot loss decay w_k = exp(-(k-1)/kappa)

    def __post_init__(self):
        for f in fields(self):
            value, want = getattr(self, f.name), type(f.default)
            ok = isinstance(value, want) or (want is float and isinstance(value, int))
            if not ok or isinstance(value, bool):
                raise ValueError(f"drafter config field {f.name} must be {want.__name__}, got {value!r}")
        if any(not isinstance(i, int) or i < 0 for i in self.feature_layers):
            raise ValueError(f"feature_layers must be non-negative ints, got {self.feature_layers}")
        if min(self.block_size, self.d_model, self.n_layers, self.n_heads, self.draft_vocab, self.context_window) < 1:
            raise ValueError("sizes must be positive")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be divisible by n_heads")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DrafterConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown drafter config fields: {sorted(unknown)}")
        data = dict(data)
        if "feature_layers" in data:
            data["feature_layers"] = tuple(data["feature_layers"])
        return cls(**data)


def spread_layers(num_hidden_layers: int, count: int = 4) -> tuple[int, ...]:
    """Feature layers spread over depth, as DFlash does (the paper uses 1, 9, 17, 25, 33 of 36)."""
    if count == 1:
        return (num_hidden_layers // 2,)
    step = (num_hidden_layers - 2) / (count - 1)
    return tuple(sorted({1 + round(i * step) for i in range(count)}))
