"""The released FlashMap drafter's network (the `flashmap` 0.1.0 architecture: j-shen/FlashMap-Qwen3-8B and the same
layout), and how it drafts.

Shape letters: K = block size, V = target vocabulary, D_t = target width, D = the drafter's width, H = heads,
Hd = head dim (D / H), N = context positions, F = len(target_layer_ids) * D_t, C = the time conditioning's width.

Its folders are read by drafter.formats.release (config.json with `model_type: "flashmap"` and model.safetensors;
the folder's Python files are never run); the engine's drafter over it is drafter.runtime.release.

How it drafts the K tokens after the anchor (the last committed token), as the release does:
- A block is a point x in R^{K x V} moving from Gaussian noise x0 (s = 0) to one-hot tokens (s = 1). The network is a
  flow *map*: it jumps from time s to time t and lands on per-slot logits. One step is one jump 0 -> 1; n steps jump
  over the config's grid for n (`jump_grids`), the state moving to ((1 - t) x + (t - s) softmax(logits)) / (1 - s)
  between jumps.
- The state enters through the target's embedding E (V, D_t) twice: the posterior it implies, softmax(s x / (1 - s)^2)
  @ E (uniform at s = 0), and linearly, x @ E, weighted by noise_gate * (t - s) ("jump") or noise_gate ("constant").
  A one-step draft reads its noise only as x0 @ E, a Gaussian with covariance E^T E, so it draws z ~ N(0, I_{D_t}) and
  uses z @ L^T with L L^T = E^T E: no vocabulary-sized noise.
- A DiT over the block's K slots (positions anchor + 1 ... anchor + K): each layer self-attends across the slots,
  cross-attends to the context (fc + RMSNorm of the target's features at `target_layer_ids` of every committed
  position, and the anchor's embedding through anchor_proj + RMSNorm at the anchor's position), and runs a GELU MLP,
  each behind a LayerNorm modulated by the jump's two times (AdaLN: scale, shift, gate). Queries and keys are
  RMS-normed per head and rotated by position (RoPE on interleaved channel pairs). The output goes through `head`
  (D -> D_t) and the target's LM head.
- Given the noise the slots are independent draws from softmax(logits): at T > 0 that is the proposal q the engine's
  rejection sampling checks against the target.

The context's keys and values depend only on the target's features, so they are projected once when positions are
committed (drafter.runtime.release: every layer's from one product) and kept in a buffer that grows by doubling; the
anchor's row is written after them each round. On the CPU the DiT runs as one native call where it builds
(drafter.runtime.native_trunk.ReleaseTrunk: ~150 small torch ops a call before), op by op in torch elsewhere; on a
target with fixed-shape steps (core.runtime.graphs) the whole proposal is one (drafter.runtime.graphed_release).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from core.runtime.modules import ModuleList
from core.verification.sampling import draw_device
from drafter.networks.rotary import rotary, rotate_pairs

MODEL_TYPE = "flashmap"
BASE_PREFIX = "flashmap."  # the release model's base_model_prefix: on the tensor names of a folder saved through it
NOISE_GATES = ("jump", "constant")
# the release's grids of the "decoding_error" schedule at the Qwen3 vocabulary, used where a config omits them
DEFAULT_JUMP_GRIDS = {
    "1": (0.0, 1.0),
    "2": (0.0, 0.8172569274902344, 1.0),
    "3": (0.0, 0.8010796308517456, 0.8310279846191406, 1.0),
    "4": (0.0, 0.7906050682067871, 0.8172569274902344, 0.8379518389701843, 1.0),
}


@dataclass(frozen=True)
class ReleaseConfig:
    """The fields of a released config.json the drafter runs by (FlashMapConfig's, validated here)."""

    target_model: str
    target_hidden_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]  # target decoder layers: outputs, i.e. hidden_states[i + 1]
    block_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    cond_dim: int
    time_embed_dim: int
    time_scale: float
    rope_theta: float
    rms_norm_eps: float
    qk_norm_eps: float
    layer_norm_eps: float
    noise_gate: str
    num_steps: int
    jump_grids: tuple[tuple[int, tuple[float, ...]], ...]  # (steps, grid of steps + 1 times from 0 to 1)

    @classmethod
    def from_json(cls, data: dict) -> "ReleaseConfig":
        if data.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type is {data.get('model_type')!r}, not {MODEL_TYPE!r}")
        grids = {int(k): tuple(float(t) for t in v) for k, v in (data.get("jump_grids") or DEFAULT_JUMP_GRIDS).items()}
        cfg = cls(
            target_model=str(data.get("target_model", "")), target_hidden_size=int(data["target_hidden_size"]),
            vocab_size=int(data["vocab_size"]), target_layer_ids=tuple(int(i) for i in data["target_layer_ids"]),
            block_size=int(data["block_size"]), hidden_size=int(data["hidden_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]), num_attention_heads=int(data["num_attention_heads"]),
            intermediate_size=int(data["intermediate_size"]), cond_dim=int(data.get("cond_dim", 256)),
            time_embed_dim=int(data.get("time_embed_dim", 256)), time_scale=float(data.get("time_scale", 1000.0)),
            rope_theta=float(data.get("rope_theta", 10000.0)), rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            qk_norm_eps=float(data.get("qk_norm_eps", 1e-5)), layer_norm_eps=float(data.get("layer_norm_eps", 1e-6)),
            noise_gate=str(data.get("noise_gate", "jump")), num_steps=int(data.get("num_steps", 1)),
            jump_grids=tuple(sorted(grids.items())),
        )
        why = cfg.refusal()
        if why:
            raise ValueError(why)
        return cfg

    def refusal(self) -> str | None:
        """Why these fields cannot describe a drafter (None: they can)."""
        head_dim, rest = divmod(self.hidden_size, self.num_attention_heads)
        if rest or head_dim % 2:
            return f"hidden_size {self.hidden_size} must split into {self.num_attention_heads} heads of even width"
        if self.time_embed_dim % 2 or min(self.block_size, self.num_hidden_layers, len(self.target_layer_ids)) < 1:
            return "time_embed_dim must be even; block_size, num_hidden_layers and target_layer_ids at least 1"
        if self.noise_gate not in NOISE_GATES:
            return f"noise_gate {self.noise_gate!r} is not one of {', '.join(NOISE_GATES)}"
        for steps, grid in self.jump_grids:
            inner = grid[1:-1]
            if len(grid) != steps + 1 or grid[0] != 0.0 or grid[-1] != 1.0 or list(inner) != sorted(set(inner)) or (
                    inner and not 0.0 < inner[0] <= inner[-1] < 1.0):
                return f"jump_grids[{steps}] must be {steps + 1} increasing times from 0 to 1, got {list(grid)}"
        if self.num_steps not in self.steps_offered:
            return f"num_steps {self.num_steps} has no jump grid"
        return None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's hidden_states it reads (hidden_states[0] is the embeddings, so layer i's output is i + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def steps_offered(self) -> tuple[int, ...]:
        return tuple(steps for steps, _ in self.jump_grids)

    def grid(self, steps: int) -> tuple[float, ...]:
        for n, grid in self.jump_grids:
            if n == steps:
                return grid
        raise ValueError(f"steps must be one of {', '.join(map(str, self.steps_offered))} (the drafter's jump_grids), "
                         f"got {steps}")


# ---- small pure functions -------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * (weight / rms(x)), the scale rounded to x's dtype before it multiplies (the order the release trains in)."""
    scale = weight.float() * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)
    return x * scale.to(x.dtype)


def time_features(t: float | torch.Tensor, dim: int, scale: float, device) -> torch.Tensor:
    """(B, dim) sinusoidal features of times (B,) in [0, 1] (a float: B = 1): cos then sin of t * scale at dim / 2
    frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=device).float() / half)  # (dim/2,)
    times = t.float() if isinstance(t, torch.Tensor) else torch.tensor([t], device=device)
    args = (times * scale)[..., None] * freqs  # fp32 like the release's times
    return torch.cat([args.cos(), args.sin()], dim=-1)


def jump_target(state: torch.Tensor, logits: torch.Tensor, s: float, t: float) -> torch.Tensor:
    """Where a jump from s to t moves the state (K, V): ((1 - t) x + (t - s) softmax(logits)) / (1 - s)."""
    return ((1.0 - t) * state + (t - s) * logits.float().softmax(dim=-1)) / (1.0 - s)


# ---- the network (parameter names are the released tensors' names) --------------------------------------------------


class TimeMLP(nn.Module):
    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.c = c
        self.linear_1 = nn.Linear(c.time_embed_dim, c.cond_dim)
        self.linear_2 = nn.Linear(c.cond_dim, c.cond_dim)

    def forward(self, t: float | torch.Tensor) -> torch.Tensor:
        features = time_features(t, self.c.time_embed_dim, self.c.time_scale, self.linear_1.weight.device)
        return self.linear_2(F.silu(self.linear_1(features.to(self.linear_1.weight.dtype))))  # (B, C)


class AdaNorm(nn.Module):
    """LayerNorm (no affine) scaled, shifted and gated by the jump's time conditioning."""

    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.eps = c.layer_norm_eps
        self.linear = nn.Linear(c.cond_dim, 3 * c.hidden_size)

    def modulation(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scale, shift, gate), each (..., D), for the conditioning cond (..., C)."""
        return self.linear(F.silu(cond)).chunk(3, dim=-1)

    def forward(self, x: torch.Tensor, modulation) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift, gate = modulation
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale) + shift, gate


class HeadNorm(nn.Module):
    """An RMSNorm's weight per head dimension (Hd,), applied by rms_norm with the config's epsilon (the release's
    q_norm / k_norm: their tensors are `...q_norm.weight`)."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))


class Attention(nn.Module):
    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.q_norm, self.k_norm = HeadNorm(c.head_dim), HeadNorm(c.head_dim)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.c.num_attention_heads, self.c.head_dim))  # (..., N, D) -> (..., N, H, Hd)

    def unrotated_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (..., N, D) -> normed keys before rotation and values, (..., N, H, Hd) each."""
        return rms_norm(self.heads(self.k_proj(x)), self.k_norm.weight, self.c.qk_norm_eps), self.heads(self.v_proj(x))

    def keys_values(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x (..., N, D) -> rotated keys and values (..., H, N, Hd) each."""
        keys, values = self.unrotated_keys_values(x)
        return rotate_pairs(keys, *rope).transpose(-3, -2), values.transpose(-3, -2)

    def forward(self, x: torch.Tensor, rope, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Slots x (..., K, D) at the positions of rope attend to keys, values (..., H, N, Hd) (mask (..., 1, 1, N):
        False where a key is padding) -> (..., K, D)."""
        queries = rotate_pairs(rms_norm(self.heads(self.q_proj(x)), self.q_norm.weight, self.c.qk_norm_eps), *rope)
        out = F.scaled_dot_product_attention(queries.transpose(-3, -2), keys, values, attn_mask=mask)  # (..., H, K, Hd)
        return self.o_proj(out.transpose(-3, -2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    """Self-attention across the block, cross-attention to the context, an MLP: each behind an AdaNorm, gated."""

    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.self_attn_adaln, self.self_attn = AdaNorm(c), Attention(c)
        self.cross_attn_adaln, self.cross_attn = AdaNorm(c), Attention(c)
        self.mlp_adaln, self.mlp = AdaNorm(c), MLP(c)

    def forward(self, x, modulations, rope, context: tuple[torch.Tensor, torch.Tensor], mask=None) -> torch.Tensor:
        self_mod, cross_mod, mlp_mod = modulations
        h, gate = self.self_attn_adaln(x, self_mod)
        x = x + gate * self.self_attn(h, rope, *self.self_attn.keys_values(h, rope))
        h, gate = self.cross_attn_adaln(x, cross_mod)
        x = x + gate * self.cross_attn(h, rope, *context, mask)
        h, gate = self.mlp_adaln(x, mlp_mod)
        return x + gate * self.mlp(h)


class ReleaseNet(nn.Module):
    """The released DiT. Everything the target lends (its embedding E, its LM head) is passed in, never kept here."""

    def __init__(self, c: ReleaseConfig):
        super().__init__()
        self.c = c
        d, dt = c.hidden_size, c.target_hidden_size
        self.fc = nn.Linear(len(c.target_layer_ids) * dt, d, bias=False)
        self.anchor_proj = nn.Linear(dt, d)
        self.x_embed = nn.Linear(dt, d)
        for name, width in (("hidden_norm", d), ("anchor_norm", d), ("state_norm", dt), ("noise_norm", dt)):
            norm = nn.Module()
            norm.weight = nn.Parameter(torch.ones(width))
            setattr(self, name, norm)
        self.noise_gate = nn.Parameter(torch.ones(1))
        self.time_embed, self.jump_embed = TimeMLP(c), TimeMLP(c)  # the jump's start s and end t
        self.layers = ModuleList[Layer](Layer(c) for _ in range(c.num_hidden_layers))
        self.final_adaln = AdaNorm(c)
        self.head = nn.Linear(d, dt)
        self._modulations: dict[tuple[float, float], tuple] = {}
        self._noise_factor: dict[tuple, tuple[torch.Tensor, torch.Tensor | None]] = {}

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def cfg(self) -> ReleaseConfig:
        return self.c

    def norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        eps = self.c.rms_norm_eps
        return rms_norm(x, getattr(self, name).weight, eps)

    def conditioning(self, s: float | torch.Tensor, t: float | torch.Tensor):
        """Every AdaNorm's (scale, shift, gate), each (B, 1, D), for jumps s -> t (floats: B = 1; or (B,) tensors):
        per layer (self-attention, cross-attention, MLP), then the final norm's."""
        cond = (self.time_embed(s) + self.jump_embed(t))[:, None]  # (B, 1, C)
        layers = [[norm.modulation(cond) for norm in (layer.self_attn_adaln, layer.cross_attn_adaln, layer.mlp_adaln)]
                  for layer in self.layers]
        return layers, self.final_adaln.modulation(cond)

    @torch.no_grad()
    def modulations(self, s: float, t: float):
        """conditioning(s, t) for one jump, computed once per pair of times, each (1, D): for drafting with weights that
        no longer change (training reads conditioning)."""
        if (s, t) not in self._modulations:
            layers, final = self.conditioning(s, t)
            self._modulations[(s, t)] = ([[tuple(m[0] for m in mod) for mod in layer] for layer in layers],
                                         tuple(m[0] for m in final))
        return self._modulations[(s, t)]

    def context_rows(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Target features (N, F) at positions (N,) -> per layer the cross-attention keys, values (H, N, Hd)."""
        context, rope = self.context_inputs(features), rotary(positions, self.c.head_dim, self.c.rope_theta, "pairs")
        return [layer.cross_attn.keys_values(context, rope) for layer in self.layers]

    def context_inputs(self, features: torch.Tensor) -> torch.Tensor:
        """Target features (N, F) -> the context rows (N, D) every layer's cross-attention projects."""
        return self.norm("hidden_norm", self.fc(features.to(self.dtype)))

    def anchor_input(self, anchor_embed: torch.Tensor) -> torch.Tensor:
        """The anchor's embedding (1, D_t) -> its context row (1, D)."""
        return self.norm("anchor_norm", self.anchor_proj(anchor_embed.to(self.dtype)))

    def noise_factor(self, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the uniform posterior embedded, (1, D_t); L (D_t, D_t) with L L^T = E^T E, or None where E^T E is
        singular), once per embedding. The Gram matrix is summed in fp32 where E is, its Cholesky factor taken in
        float64 on the CPU."""
        key = (embedding.data_ptr(), tuple(embedding.shape), embedding.dtype, str(embedding.device))
        if key not in self._noise_factor:
            vocab = embedding.shape[0]
            uniform = torch.full((1, vocab), 1.0 / vocab, device=embedding.device).to(embedding.dtype) @ embedding
            gram = sum(rows.float().T @ rows.float() for rows in embedding.split(16384))
            factor, info = torch.linalg.cholesky_ex(gram.cpu().double())
            # a vocabulary narrower than the width (tiny test targets) has no factor: such a draft draws x0 itself
            self._noise_factor = {key: (uniform, factor.to(embedding.device, self.dtype) if info == 0 else None)}
        return self._noise_factor[key]

    def mix_state(self, posterior_embeds: torch.Tensor, state_embeds: torch.Tensor, s, t) -> torch.Tensor:
        """The DiT's input (..., K, D_t): the posterior's embedding, normed, plus the state's linear embedding, normed
        and weighted by the noise gate (times the jump where noise_gate is "jump"); s, t floats, or (B, 1, 1)
        tensors for a batch of blocks."""
        jump = 1.0 if self.c.noise_gate == "constant" else t - s
        gate = (self.noise_gate.float() * jump).to(self.dtype)
        return self.norm("state_norm", posterior_embeds.to(self.dtype)) + gate * self.norm(
            "noise_norm", state_embeds.to(self.dtype))

    def state_inputs(self, state: torch.Tensor, s: float, t: float, embedding: torch.Tensor) -> torch.Tensor:
        """A vocabulary-sized state (K, V) at time s, about to jump to t -> the DiT's input (K, D_t)."""
        if s == 0:
            posterior_embeds = self.noise_factor(embedding)[0]
        else:
            posterior = (state.float() * (s / max(1.0 - s, 1e-3) ** 2)).softmax(dim=-1)  # (K, V)
            posterior_embeds = posterior.to(embedding.dtype) @ embedding
        return self.mix_state(posterior_embeds, state.to(embedding.dtype) @ embedding, s, t)

    def forward(self, inputs: torch.Tensor, modulations, positions: torch.Tensor, context, mask=None) -> torch.Tensor:
        """The DiT under given modulations (conditioning / modulations): inputs (..., K, D_t) -> (..., K, D_t); mask
        (..., 1, 1, N) False at padded context rows."""
        layer_mods, final_mod = modulations
        rope = rotary(positions, self.c.head_dim, self.c.rope_theta, "pairs")
        h = self.x_embed(inputs)
        for layer, mods, layer_context in zip(self.layers, layer_mods, context):
            h = layer(h, mods, rope, layer_context, mask)
        return self.head(self.final_adaln(h, final_mod)[0])


def draft_logits(net: ReleaseNet, context, positions: torch.Tensor, embedding: torch.Tensor, lm_head, grid,
                 noise_scale: float = 1.0, generator: torch.Generator | None = None, batch: tuple[int, ...] = (),
                 mask: torch.Tensor | None = None, noise: torch.Tensor | None = None, dit=None,
                 rows: int | None = None, embedded_noise: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits (*batch, K, V) of blocks at positions (K,) attending to context (per layer keys, values
    (*batch, H, N, Hd); mask (*batch, 1, 1, N) False at padding), jumping over `grid`. The starting noise x0 is
    `noise` (*batch, K, V) where given, else drawn from `generator` and scaled by noise_scale (0: x0 = 0): for one
    step only its embedding, z @ L^T with z (*batch, K, D_t) ~ N(0, I) (embedded_noise: z drawn and scaled by the
    caller); for more the whole state. lm_head: the target's, hidden states (..., D_t) -> fp32 logits (..., V).
    dit(inputs, s, t): the DiT at one jump where another implementation runs it (the native trunk, a static step),
    else the network's forward. rows: the last jump's logits of the first `rows` slots only (every slot attends to the
    others, so all of them are drafted; only the LM head's rows are spared)."""
    k, device = positions.shape[0], positions.device
    draw_on = draw_device(generator, device)
    if dit is None:
        def dit(inputs, s, t):
            return net(inputs, net.modulations(s, t), positions, context, mask)
    uniform, factor = net.noise_factor(embedding)
    state, inputs = noise, None
    if state is None and len(grid) == 2 and factor is not None:
        z = embedded_noise
        if z is None:
            z = noise_scale * torch.randn((*batch, k, factor.shape[0]), dtype=factor.dtype, generator=generator,
                                          device=draw_on).to(device)
        inputs = net.mix_state(uniform, z @ factor.T, 0.0, grid[1])
    elif state is None:
        state = noise_scale * torch.randn((*batch, k, embedding.shape[0]), generator=generator, device=draw_on)
        state = state.to(device)
    for s, t in zip(grid[:-1], grid[1:]):
        if state is not None:
            inputs = net.state_inputs(state, s, t, embedding)
        hidden = dit(inputs, s, t)  # (*batch, K, D_t)
        if t < 1.0:
            assert state is not None  # (more than one jump: the state is drawn or given, never embedded noise alone)
            state = jump_target(state, lm_head(hidden), s, t)
    return lm_head(hidden if rows is None else hidden[..., :rows, :])  # (*batch, K or rows, V)


