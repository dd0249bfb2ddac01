import json

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from drafter.data import Sequence, blocks_at, draft_vocabulary, target_to_draft_map
from drafter.evaluation.evaluate import (
    Variant,
    accepted_prefix,
    domain_of_sequences,
    draft_rounds,
    load_variant,
    parse_variant,
    tally,
    tree_rounds,
)
from drafter.formats.checkpoint import save_checkpoint
from drafter.runtime.drafters import build_net, load_engine_drafter
from drafter.runtime.drafting import fold_unused, masked
from drafter.spec import DrafterSpec
from tests.test_drafter import tiny_cfg, tiny_seqs


def test_accepted_prefix_stops_at_first_mismatch_and_never_accepts_other():
    truth = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6], [0, 4, 5, 6], [3, 0, 5, 6]])
    draft = torch.tensor([[3, 4, 5, 6], [3, 9, 5, 6], [0, 4, 5, 6], [3, 0, 5, 6]])
    assert accepted_prefix(draft, truth).tolist() == [4, 1, 0, 1]


def test_tally_counts_slots_reached_and_accepted():
    out = tally(torch.tensor([0, 2, 4]), torch.tensor([4, 4, 4]), 4)
    assert out["rounds"] == 3 and out["acceptance_length"] == pytest.approx(1 + 6 / 3)
    assert out["per_slot_reached"] == [3, 2, 2, 1] and out["per_slot_accepted"] == [2, 2, 1, 1]
    short = tally(torch.tensor([1]), torch.tensor([1]), 4)  # a draft cut after one slot reaches no more
    assert short["per_slot_reached"] == [1, 0, 0, 0]


def test_tree_rounds_walk_the_merged_drafts_along_the_response():
    truth = torch.tensor([[3, 4, 5, 6], [3, 4, 0, 6], [7, 7, 7, 7]])  # 0: "other", never accepted
    draft = torch.tensor([[3, 9, 0, 0], [3, 4, 5, 1],   # anchor 0: the second draft goes furthest
                          [3, 4, 0, 0], [3, 4, 5, 6],   # anchor 1: "other" in the response stops at 2
                          [1, 2, 3, 4], [5, 6, 7, 8]])  # anchor 2: nothing matches
    length = torch.tensor([2, 4, 2, 4, 4, 4])
    shown, shown_len, accepted = tree_rounds(draft, length, truth, m=2)
    assert accepted.tolist() == [3, 2, 0]
    assert shown[0].tolist() == [3, 4, 5, 1] and shown[1].tolist() == [3, 4, 0, 0] and shown[2].tolist() == [1, 2, 3, 4]
    # tries of 4 nodes: anchor 0 keeps 3, 3-9, 3-4, 3-4-5 (the shown branch's last node did not fit);
    # anchor 2 keeps 1, 5, 1-2, 5-6
    assert shown_len.tolist() == [3, 2, 2]


def test_variant_options_parse_and_bad_ones_are_refused():
    v = parse_variant("flashmap-teacher,steps=16,scale=0.5,noise=shuffled,best_of=3,k=8", 16).spec
    assert (v.steps, v.noise_scale, v.noise, v.best_of, v.block_size) == (16, 0.5, "shuffled", 3, 8)
    assert parse_variant("flashmap,tree=4", 16).spec.tree == 4
    for bad in ("ngram", "flashmap,steps=", "flashmap,color=red", "flashmap,noise=loud", "flashmap,adaptive=1"):
        with pytest.raises(SystemExit):
            parse_variant(bad, 16)


def test_domains_follow_meta_prompt_files(tmp_path):
    for name, n in (("train_math.jsonl", 5), ("train_chat.jsonl", 2)):
        (tmp_path / name).write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(n)))
    meta = {"prompts": [str(tmp_path / "train_math.jsonl"), str(tmp_path / "train_chat.jsonl")], "start": 1, "limit": 3}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert domain_of_sequences(tmp_path) == ["math"] * 3 + ["chat"]
    (tmp_path / "domains.json").write_text(json.dumps(["code", "chat"]))  # written by generate: no prompt files needed
    (tmp_path / "train_math.jsonl").unlink()
    assert domain_of_sequences(tmp_path) == ["code", "chat"]


def test_offline_drafts_and_acceptance_equal_the_engine_rounds(tiny_target, tmp_path):
    """The evaluator drafts from the stored response exactly what the engine drafts from its own run,
    at every anchor the engine visited, and counts the same accepted slots."""
    torch.manual_seed(1)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    gen = GenerationConfig(max_new_tokens=40, block_size=4)
    outputs = [generate_all(tiny_target, p, gen)[0] for p in prompts]
    seqs = [Sequence(p + out, len(p)) for p, out in zip(prompts, outputs)]
    vocab_ids = draft_vocabulary(seqs + tiny_seqs(), 16)  # the responses repeat 4 tokens: pad the vocabulary out
    net = build_net(tiny_cfg("dflash", 16, tiny_target.model.config.hidden_size), tiny_target, vocab_ids)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    torch.nn.init.zeros_(net.other_head)  # else "other" wins every argmax and every draft is empty
    save_checkpoint(tmp_path, net, vocab_ids, tiny_target.identity, {})
    variant = Variant("dflash", DrafterSpec("dflash", block_size=4, weights=str(tmp_path)))
    rounds = draft_rounds(variant, *load_variant(variant, tiny_target), tiny_target, seqs)
    offline = {(int(i), int(a)): (r.tolist(), int(n))
               for i, a, r, n in zip(rounds.seq_index, rounds.anchor, rounds.draft, rounds.n_accepted)}
    drafter = load_engine_drafter(DrafterSpec("dflash", weights=str(tmp_path)), tiny_target)
    compared = 0
    for i, (prompt, seq) in enumerate(zip(prompts, seqs)):
        out, events = generate_all(tiny_target, prompt, gen, drafter)
        assert out == outputs[i]
        position = len(prompt)  # the first round's anchor is the token the prefill produced
        for ev in events[1:]:
            if (i, position) in offline:
                draft, n_accepted = offline[(i, position)]
                cut = len(ev.drafted)  # near max_new_tokens the engine drafts fewer slots: a prefix
                drafted = [t for t in draft if t >= 0]
                assert drafted[:cut] == list(ev.drafted) and min(n_accepted, cut) == ev.n_accepted
                room = len(out) - (position - len(prompt) + 1)  # output tokens still to come after the anchor
                assert cut == min(len(drafted), room - 1)  # the engine leaves one for the target's own token
                compared += 1
            position += len(ev.committed)
    assert compared >= 6
    assert (rounds.draft >= 0).any()  # non-empty drafts were compared
    # --walk visits exactly the engine's anchors and accepts what it accepted, wherever the engine drafted a full block
    walked = draft_rounds(variant, *load_variant(variant, tiny_target), tiny_target, seqs, batch=1, walk=True)
    walk = {(int(i), int(a)): int(n) for i, a, n in zip(walked.seq_index, walked.anchor, walked.n_accepted)}
    for i, (prompt, seq) in enumerate(zip(prompts, seqs)):
        _, events = generate_all(tiny_target, prompt, gen, drafter)
        position, visited = len(prompt), []
        for ev in events[1:]:
            room = len(outputs[i]) - (position - len(prompt) + 1)
            if room - 1 >= 4:  # a full block: the walk drafts here too, and nowhere the engine did not
                visited.append((i, position))
                assert walk[(i, position)] == ev.n_accepted
            position += len(ev.committed)
        extra = {a for (j, a) in walk if j == i} - {a for _, a in visited}
        assert {a for _, a in visited} <= {a for (j, a) in walk if j == i}
        assert extra <= {len(seq.tokens) - 1 - 4}  # the walk may draft one last full block where the engine keeps
        # room for its own token at max_new_tokens
    # the teacher gate's cross-entropy: -log of what the drafted distribution gave the response's token
    loaded, _ = load_variant(variant, tiny_target)
    to_draft = target_to_draft_map(vocab_ids, tiny_target.vocab_size)
    i, a = int(rounds.seq_index[3]), int(rounds.anchor[3])
    blocks = blocks_at(tiny_target, [seqs[i]], [[a]], 4, loaded.cfg.context_window, loaded.cfg.feature_layers, to_draft)
    probs = fold_unused(masked(loaded, *blocks.context(loaded), 4), vocab_ids >= 0)[0]  # (K, V)
    want = -probs[torch.arange(4), blocks.tokens[0]].log()  # (K,)
    assert torch.allclose(rounds.slot_nll[3], want, atol=1e-5)


def test_offline_prompt_lookup_accepts_what_the_engines_hybrid_accepts(tiny_target, tmp_path):
    """`dflash,lookup=1` offline: at each anchor the engine's LookupHybrid round visited with room for a whole block,
    the same accepted slots (a strong lookup copied alone, else one more branch of the K-node trie); on these
    repetitive responses it accepts more than the network alone."""
    from drafter.registry import build_drafter

    torch.manual_seed(2)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    gen = GenerationConfig(max_new_tokens=40, block_size=4)
    outputs = [generate_all(tiny_target, p, gen)[0] for p in prompts]
    seqs = [Sequence(p + out, len(p)) for p, out in zip(prompts, outputs)]
    vocab_ids = draft_vocabulary(seqs + tiny_seqs(), 16)
    net = build_net(tiny_cfg("dflash", 16, tiny_target.model.config.hidden_size), tiny_target, vocab_ids)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    torch.nn.init.zeros_(net.other_head)
    save_checkpoint(tmp_path, net, vocab_ids, tiny_target.identity, {})
    plain_v, hybrid_v = (Variant(t, DrafterSpec("dflash", block_size=4, lookup=lk, weights=str(tmp_path)))
                         for t, lk in (("dflash", False), ("dflash,lookup=1", True)))
    plain = draft_rounds(plain_v, *load_variant(plain_v, tiny_target), tiny_target, seqs)
    hybrid = draft_rounds(hybrid_v, *load_variant(hybrid_v, tiny_target), tiny_target, seqs)
    assert hybrid.n_accepted.sum() > plain.n_accepted.sum()
    offline = {(int(i), int(a)): int(n) for i, a, n in zip(hybrid.seq_index, hybrid.anchor, hybrid.n_accepted)}
    drafter = build_drafter(DrafterSpec("dflash", lookup=True, weights=str(tmp_path)), tiny_target)
    compared = 0
    for i, prompt in enumerate(prompts):
        out, events = generate_all(tiny_target, prompt, gen, drafter)
        assert out == outputs[i]
        position = len(prompt)
        for ev in events[1:]:
            room = len(out) - (position - len(prompt) + 1)
            if (i, position) in offline and room - 1 >= 4:
                assert offline[(i, position)] == ev.n_accepted
                compared += 1
            position += len(ev.committed)
    assert compared >= 4


def test_a_released_format_drafter_drafts_offline_what_the_engine_drafts(tiny_qwen3_target, tmp_path):
    """Offline (batched, each block's window as training reads it) and in the engine (its context grown position by
    position), a released-format drafter from x0 = 0 proposes the same blocks at the engine's anchors."""
    from tests.test_flashmap_release import release_model, write_release

    target = tiny_qwen3_target
    folder = write_release(tmp_path / "release", release_model(target, seed=4))
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]
    gen = GenerationConfig(max_new_tokens=30, block_size=4)
    outputs = [generate_all(target, p, gen)[0] for p in prompts]
    seqs = [Sequence(p + out, len(p)) for p, out in zip(prompts, outputs)]
    variant = parse_variant(f"flashmap,scale=0,weights={folder}")
    rounds = draft_rounds(variant, *load_variant(variant, target), target, seqs, batch=8)
    offline = {(int(i), int(a)): r.tolist() for i, a, r in zip(rounds.seq_index, rounds.anchor, rounds.draft)}
    drafter = load_engine_drafter(DrafterSpec("flashmap", noise_scale=0.0, weights=str(folder)), target)
    compared = 0
    for i, prompt in enumerate(prompts):
        out, events = generate_all(target, prompt, gen, drafter)
        position = len(prompt)
        for ev in events[1:]:
            if (i, position) in offline and ev.drafted:
                assert offline[(i, position)][:len(ev.drafted)] == list(ev.drafted)
                compared += 1
            position += len(ev.committed)
    assert compared >= 5
    with pytest.raises(SystemExit, match="steps, k and scale only"):
        load_variant(parse_variant(f"flashmap,best_of=2,weights={folder}"), target)
