"""The released FlashMap drafter as the engine calls it: the context's cross-attention keys and values projected
once per committed position, the proposal of K tokens from noise in one jump or several (the algorithm:
drafter.networks.release).

Shape letters: K = block size, V = target vocabulary, D_t = target width, D = the drafter's width, H = heads,
Hd = head dim (D / H), N = context positions, L = layers.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from core.drafting.base import Draft
from core.runtime import cpu_linear
from core.verification.sampling import SamplingConfig, sample_rows, top_probs
from drafter.networks.release import ReleaseNet, draft_logits, rms_norm
from drafter.networks.rotary import rotary, rotate_pairs
from drafter.runtime import native_trunk


class CrossKeysValues:
    """Every layer's cross-attention keys and values of context rows from one product (Attention.keys_values of each
    layer, fused): rows (N, D) at positions (N,) -> keys (normed per head, rotated), values, (L, H, N, Hd) each. For
    drafting with weights that no longer change (it copies them)."""

    def __init__(self, net: ReleaseNet):
        self.c = net.c
        attns = [layer.cross_attn for layer in net.layers]
        self.weight = torch.cat([w.weight.detach() for a in attns for w in (a.k_proj, a.v_proj)])  # (2L*D, D)
        self.k_norm = torch.stack([a.k_norm.weight.detach() for a in attns])[:, None]  # (L, 1, Hd)

    def __call__(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        kv = (rows @ self.weight.T).view(rows.shape[0], c.num_hidden_layers, 2, c.num_attention_heads, c.head_dim)
        cos, sin = rotary(positions, c.head_dim, c.rope_theta, "pairs")  # (N, 1, Hd/2) each
        keys = rotate_pairs(rms_norm(kv[:, :, 0], self.k_norm, c.qk_norm_eps), cos[:, None], sin[:, None])
        return keys.permute(1, 2, 0, 3), kv[:, :, 1].permute(1, 2, 0, 3)  # (N, L, H, Hd) -> (L, H, N, Hd)


class ContextRows:
    """Every layer's cross-attention keys and values of the committed positions, with room for the anchor's row after
    them: keys transposed, (L, H, Hd, capacity), values (L, H, capacity, Hd), the layouts the native trunk reads; both
    grow by doubling."""

    def __init__(self):
        self.keys_t: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.rows = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keys, values (L, H, N, Hd) of the next N committed positions."""
        self.write(self.rows, keys, values)
        self.rows += keys.shape[2]

    def with_anchor(self, keys: torch.Tensor, values: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The context as the DiT reads it, per layer keys, values (H, N + 1, Hd): the committed rows, then the
        anchor's, keys, values (L, H, 1, Hd) (written after them, overwritten by the next committed position)."""
        self.write(self.rows, keys, values)
        end = self.rows + 1
        keys_t, all_values = self.tensors()
        return list(zip(keys_t[..., :end].transpose(-1, -2).unbind(0), all_values[:, :, :end].unbind(0)))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers, keys transposed and values (made by the first write)."""
        if self.keys_t is None or self.values is None:
            raise RuntimeError("the context holds no rows yet")
        return self.keys_t, self.values

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = start + keys.shape[2]
        self.reserve(end + 1, keys)
        keys_t, all_values = self.tensors()
        keys_t[..., start:end] = keys.transpose(-1, -2)
        all_values[:, :, start:end] = values

    def reserve(self, rows: int, like: torch.Tensor | None = None) -> None:
        """Buffers with room for `rows` rows, shaped like `like` (L, H, N, Hd) (doubled while too small)."""
        capacity = self.values.shape[2] if self.values is not None else 0
        if rows <= capacity:
            return
        if like is None:
            raise ValueError("a first reserve needs the shape of the rows it will hold")
        capacity = max(64, 2 * capacity, rows)
        layers, heads, _, head_dim = like.shape
        keys_t = like.new_zeros(layers, heads, head_dim, capacity)
        values = like.new_zeros(layers, heads, capacity, head_dim)
        if self.keys_t is not None and self.values is not None:
            keys_t[..., :self.rows + 1] = self.keys_t[..., :self.rows + 1]
            values[:, :, :self.rows + 1] = self.values[:, :, :self.rows + 1]
        self.keys_t, self.values = keys_t, values


class ReleaseDrafter:
    """The engine's drafter (core.drafting.base.Drafter) over a released FlashMap network: the whole block of the
    config's block_size from `steps` jumps, cut to what the engine asks for (the slots attend to each other, so drafting
    fewer would change them). noise_scale multiplies the starting noise (0: the jumps from x0 = 0, a fixed draft)."""

    def __init__(self, net: ReleaseNet, target, steps: int | None = None, noise_scale: float = 1.0,
                 folder: Path | None = None, native: bool = True, products: str | None = None):
        self.net, self.c = net, net.c
        self.folder = folder  # the release folder it was read from, if any
        self.steps = steps or self.c.num_steps
        self.grid = self.c.grid(self.steps)
        self.noise_scale = noise_scale
        self.name = f"flashmap-release-{self.steps}step"
        self.feature_layers = self.c.feature_layers
        self.max_block_size = self.c.block_size
        self.context_window = None  # it reads every committed position
        self.embedding = target.model.get_input_embeddings().weight.detach()  # (V, D_t)
        # the target's LM head as its forward runs it (in q4 the 8-bit one, core.runtime.cpu_linear.Int8Linear), else
        # its own
        self.lm_head = getattr(getattr(target, "lean", None), "lm_head", None) or target.model.get_output_embeddings()
        weight = getattr(self.lm_head, "weight", None)
        self.head_dtype = weight.dtype if weight is not None else torch.bfloat16
        self.device = self.embedding.device
        # the DiT as one native call where it builds (fp32 weights on the CPU), else op by op in torch; its products
        # (native_trunk.products_for) multiply as the target's own do: 8-bit codes beside a target whose products
        # round activations to 8 bits (the q4 default's LM head, an Int8Linear, is the sign), else fp32
        products = products or ("8-bit" if isinstance(self.lm_head, cpu_linear.Int8Linear) else "fp32")
        self.trunk, self.trunk_status = self._native_trunk(products) if native else (None, "torch (not asked for)")
        self._trunk_mods: dict[tuple[float, float], torch.Tensor] = {}
        self.cross = CrossKeysValues(net)
        self.reset()

    def _native_trunk(self, products: str | None) -> tuple[native_trunk.ReleaseTrunk | None, str]:
        """(the native DiT, "native, its products") or (None, why the DiT runs in torch)."""
        if self.net.fc.weight.device.type != "cpu" or self.net.dtype != torch.float32:
            return None, "torch (the native trunk runs fp32 weights on the CPU)"
        module, why = native_trunk.load()
        if module is None:
            warnings.warn(f"the FlashMap drafter's DiT runs op by op in torch: {why}", stacklevel=3)
            return None, f"torch ({why})"
        if products == "8-bit" and module.PRODUCTS != "8-bit":  # a build without the integer products
            products = "fp32"
        trunk = native_trunk.ReleaseTrunk(self.net, module, products)
        return trunk, f"native, {trunk.products} products"

    def reset(self) -> None:
        self.reset_context()
        self.position = 0  # the next committed token's position: the anchor's when proposing

    @torch.inference_mode()
    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        """Committed tokens (N,) with the features (M, F) of the last M of them: a position without features ends the
        context, which starts again after it, every row at its own position."""
        kept = 0 if features is None else features.shape[0]
        if kept < len(token_ids):
            self.reset_context()
        start = self.position + len(token_ids) - kept
        self.position += len(token_ids)
        if kept and features is not None:
            positions = torch.arange(start, self.position, device=self.device)  # (M,)
            self.context.append(*self.cross(self.net.context_inputs(features.to(self.device)), positions))

    def reset_context(self) -> None:
        self.context = ContextRows()

    @torch.inference_mode()
    def logits(self, anchor: int, generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
               rows: int | None = None) -> torch.Tensor:
        """The block's draft logits (K, V) after `anchor` (draft_logits), from `noise` x0 (K, V) where given; rows:
        only the first `rows` slots' (K', V)."""
        anchor_embed = self.embedding[anchor][None]  # (1, D_t)
        anchor_position = torch.tensor([self.position], device=self.device)
        context = self.context.with_anchor(*self.cross(self.net.anchor_input(anchor_embed), anchor_position))
        positions = self.position + 1 + torch.arange(self.c.block_size, device=self.device)  # (K,)
        head = lambda hidden: self.lm_head(hidden.to(self.head_dtype)).float()  # noqa: E731
        return draft_logits(self.net, context, positions, self.embedding, head, self.grid, self.noise_scale,
                            generator, noise=noise, dit=self._native_dit(positions), rows=rows)

    def _native_dit(self, positions: torch.Tensor):
        """dit(inputs, s, t) through the native trunk for slots at positions (K,), or None (torch's forward)."""
        if self.trunk is None:
            return None
        cos, sin = (angles.reshape(positions.shape[0], -1).contiguous()  # (K, Hd/2) each
                    for angles in rotary(positions, self.c.head_dim, self.c.rope_theta, "pairs"))
        all_keys_t, all_values = self.context.tensors()
        keys_t, values = list(all_keys_t.unbind(0)), list(all_values.unbind(0))
        context = self.context.rows + 1
        trunk = self.trunk

        def dit(inputs: torch.Tensor, s: float, t: float) -> torch.Tensor:
            if (s, t) not in self._trunk_mods:
                self._trunk_mods[(s, t)] = native_trunk.ReleaseTrunk.modulations(self.net.modulations(s, t))
            return trunk(inputs, cos, sin, self._trunk_mods[(s, t)], keys_t, values, context)

        return dit

    @torch.inference_mode()
    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        logits = self.logits(anchor, generator, rows=block_size).cpu()  # (K', V) fp32
        greedy, confidence = top_probs(logits)  # (K',) each: the largest probability, no sampled token read
        if sampling.greedy:
            return Draft(greedy, None, confidence)
        q_draft = (logits / sampling.temperature).softmax(dim=-1)  # (K', V)
        return Draft(sample_rows(q_draft, generator), q_draft, confidence)
