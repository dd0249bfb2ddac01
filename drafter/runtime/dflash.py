"""A published DFlash network as the engine's drafter: the block [anchor, mask, ..., mask] in one pass over the
context's keys and values, projected once per committed position.

Shape letters: N = context positions, K = block size, V = target vocabulary.
"""
from __future__ import annotations

import torch

from core.drafting.base import Draft
from core.verification.sampling import SamplingConfig, sample_rows
from drafter.networks.dflash import ZLabDFlashNet


class ZLabDFlashDrafter:
    """The engine's drafter over a published DFlash network: drafts block_size - 1 tokens per pass."""

    def __init__(self, net: ZLabDFlashNet, target):
        self.net, self.c = net, net.c
        self.name = "dflash (published)"
        self.feature_layers = tuple(i + 1 for i in self.c.target_layer_ids)  # hidden_states[0] = embeddings
        self.max_block_size = self.c.block_size - 1  # the anchor takes the block's first position
        self.embed = target.model.get_input_embeddings()
        self.head = target.model.get_output_embeddings()
        self.device = next(net.parameters()).device
        self.ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.n_ctx = 0

    def reset(self) -> None:
        self.ctx_kv, self.n_ctx = [], 0

    @torch.inference_mode()
    def extend(self, token_ids: list[int], features: torch.Tensor | None) -> None:
        missing = len(token_ids) - (0 if features is None else features.shape[0])
        if missing:  # positions without features (it reads all, so the engine captures all; a reused prefix may lack
            self.ctx_kv, self.n_ctx = [], self.n_ctx + missing  # them): the context starts again after them
        if features is None:
            return
        dtype = next(self.net.parameters()).dtype
        positions = torch.arange(self.n_ctx, self.n_ctx + features.shape[0], device=self.device)  # (M,)
        new = self.net.context_kv(features.to(self.device, dtype), positions)
        self.ctx_kv = new if not self.ctx_kv else [
            (torch.cat([k, nk], dim=1), torch.cat([v, nv], dim=1)) for (k, v), (nk, nv) in zip(self.ctx_kv, new)]
        self.n_ctx += features.shape[0]

    @torch.inference_mode()
    def propose(self, anchor: int, block_size: int, sampling: SamplingConfig, generator: torch.Generator) -> Draft:
        k = min(block_size, self.c.block_size - 1)
        ids = torch.tensor([anchor] + [self.c.mask_token_id] * (self.c.block_size - 1), device=self.device)  # (K,)
        positions = torch.arange(self.n_ctx, self.n_ctx + self.c.block_size, device=self.device)  # anchor first
        hidden = self.net(self.embed(ids), positions, self.ctx_kv)  # (K, D)
        logits = self.head(hidden[1 : 1 + k]).float().cpu()  # (k, V): the slots after the anchor
        confidence, greedy = torch.softmax(logits, dim=-1).max(-1)  # (k,) each: independent of any sampled token
        if sampling.greedy:
            return Draft(greedy, None, confidence)
        q_draft = torch.softmax(logits / sampling.temperature, dim=-1)  # (k, V)
        return Draft(sample_rows(q_draft, generator), q_draft, confidence)
