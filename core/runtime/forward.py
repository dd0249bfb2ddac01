"""One target forward after a KV cache, and the cache's rollback: the two calls the generate loop
(core.decoding.engine), the verify-cost measurement and the batch-invariance check make of a target, whichever forward
serves it (core.runtime.lean's on a static cache, or transformers' on its DynamicCache).

Shape letters: T = positions fed in one forward, P = cached positions, V = vocabulary, F = feature width.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from core.runtime.lean import StaticCache
from core.runtime.trie import Trie, ancestor_mask, is_chain, position_list, tree_inputs


def target_forward(target, ids: list[int], cache: DynamicCache | StaticCache, layers: tuple[int, ...],
                   keep: int = 0, trie: Trie | None = None):
    """Feed ids (T,) after the cache; return logits (T or keep, V) and features (T, F) or None.
    With a trie that is not a chain, ids are [anchor, *trie.tokens] and attend along the tree."""
    if isinstance(cache, StaticCache):
        return _lean_forward(target, ids, cache, layers, keep, trie)
    input_ids = torch.tensor([ids], device=target.device)  # (1, T)
    tree = {}
    if trie is not None and not is_chain(trie):
        mask, positions = tree_inputs(trie, cache.get_seq_length(), input_ids.device)  # (1,1,T,P+T), (1,T)
        additive = torch.zeros(mask.shape, dtype=target.model.dtype, device=mask.device)
        tree = {"attention_mask": additive.masked_fill(~mask, torch.finfo(additive.dtype).min),
                "position_ids": positions}  # an additive mask works for both sdpa and eager attention
    out = target.model(
        input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=bool(layers),
        logits_to_keep=keep, **tree,  # keep=0 keeps all; prefill keeps only the last position's logits
    )
    logits = out.logits[0]  # (T, V)
    if not layers:
        return logits, None
    features = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # (T, F)
    return logits, features


def _lean_forward(target, ids: list[int], cache: StaticCache, layers: tuple[int, ...], keep: int,
                  trie: Trie | None):
    """target_forward through the lean forward (core.runtime.lean) on its static cache."""
    ids = list(ids)  # (T,) as ints: the lean forward makes its tensors natively where it can (LeanForward.native_step)
    if trie is None or is_chain(trie):
        return target.lean(ids, cache, layers, keep)
    return target.lean(ids, cache, layers, keep, block_visible=ancestor_mask(trie).to(target.device),
                       positions=position_list(trie, cache.length))


def keep_positions(cache: DynamicCache | StaticCache, fed: int, kept: list[int]) -> None:
    """After a forward over `fed` positions, keep only those at indices `kept` (increasing, 0 = the
    anchor) in the cache. A static cache moves its index back (gathering a tree path into place); a dynamic one
    crops (transformers 5 crops by a negative count), a tree path gathered into place first, touching only this
    round's positions."""
    if isinstance(cache, StaticCache):
        cache.keep(fed, kept)
        return
    if kept != list(range(len(kept))):
        past = cache.get_seq_length() - fed
        for layer in cache.layers:  # keys, values (B, H, P+T, D_h)
            keys, values = getattr(layer, "keys"), getattr(layer, "values")  # (an attention layer's: a full cache)
            src = torch.tensor(kept, device=keys.device) + past  # (N_kept,)
            keys[..., past : past + len(kept), :] = keys[..., src, :]
            values[..., past : past + len(kept), :] = values[..., src, :]
    if fed > len(kept):
        cache.crop(-(fed - len(kept)))
