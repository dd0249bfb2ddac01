"""Drafter configuration: one frozen dataclass, saved inside every checkpoint."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

KINDS = ("flashmap", "dflash")
# per sub-layer (attention, MLP) what the z-lab backbone's time modulation produces, in this order
MODULATIONS = {"shift-scale-gate": ("shift", "scale", "gate"), "scale-gate": ("scale", "gate")}


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


@dataclass(frozen=True)
class ZLabFlowConfig:
    """A FlashMap drafter whose backbone is a published z-lab DFlash network (drafter/networks/zlab_flow.py).

    `zlab` holds the published config.json as read (the backbone's shape, its target layers and mask token); the
    flow fields follow. The draft vocabulary is the target's whole vocabulary, as DFlash's LM head is."""

    zlab: dict
    kind: str = "flashmap"
    context_window: int = 256
    kappa: float = 7.0
    d_cond: int = 256  # width of the time conditioning feeding each layer's zero-initialised modulation
    # what the time conditioning sets in each sub-layer: shift-scale-gate (adaLN, the first design) or scale-gate,
    # which a fixed (s, t) folds exactly into the published network's norm and output weights
    # (drafter/formats/export.py)
    modulation: str = "shift-scale-gate"

    backbone = "zlab"  # class attribute: the checkpoint's dispatch key, not a field

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.modulation not in MODULATIONS:
            raise ValueError(f"modulation must be one of {tuple(MODULATIONS)}, got {self.modulation!r}")
        if min(self.context_window, self.d_cond) < 1:
            raise ValueError("sizes must be positive")

    @property
    def block_size(self) -> int:  # K drafted slots: the published block's first position holds the anchor
        return int(self.zlab["block_size"]) - 1

    @property
    def feature_layers(self) -> tuple[int, ...]:  # hidden_states indices: z-lab counts decoder layers from 0
        extra = self.zlab.get("dflash_config") or self.zlab
        return tuple(int(i) + 1 for i in extra["target_layer_ids"])

    @property
    def target_hidden(self) -> int:
        return int(self.zlab["hidden_size"])

    @property
    def d_model(self) -> int:
        return int(self.zlab["hidden_size"])

    @property
    def draft_vocab(self) -> int:
        return int(self.zlab["vocab_size"])

    def to_dict(self) -> dict:
        return {"backbone": self.backbone, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "ZLabFlowConfig":
        data = {k: v for k, v in data.items() if k != "backbone"}
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown drafter config fields: {sorted(unknown)}")
        return cls(**data)


def config_from_dict(data: dict) -> DrafterConfig | ZLabFlowConfig:
    """The config a checkpoint's "drafter" entry describes: the project's own network, or a z-lab backbone."""
    backbone = data.get("backbone", "dit")
    if backbone == "zlab":
        return ZLabFlowConfig.from_dict(data)
    if backbone != "dit":
        raise ValueError(f"unknown backbone {backbone!r}")
    return DrafterConfig.from_dict({k: v for k, v in data.items() if k != "backbone"})


def spread_layers(num_hidden_layers: int, count: int = 4) -> tuple[int, ...]:
    """Feature layers spread over depth, as DFlash does (the paper uses 1, 9, 17, 25, 33 of 36)."""
    if count == 1:
        return (num_hidden_layers // 2,)
    step = (num_hidden_layers - 2) / (count - 1)
    return tuple(sorted({1 + round(i * step) for i in range(count)}))
