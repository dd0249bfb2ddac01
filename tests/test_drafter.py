import copy
import json

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.drafting.policy.config import PolicyConfig
from core.verification.sampling import SamplingConfig
from drafter.blocks import Blocks
from drafter.config import DrafterConfig
from drafter.data import Sequence, blocks_from_sequences, draft_vocabulary, target_to_draft_map
from drafter.flow import time_grid
from drafter.formats.checkpoint import CheckpointError, save_checkpoint
from drafter.registry import DrafterUnavailable, build_drafter
from drafter.runtime import drafting
from drafter.runtime.drafters import FlowDrafter, build_net, load_engine_drafter, load_net
from drafter.spec import DrafterSpec, SpecError
from drafter.training.losses import dflash_loss, distill_loss, teacher_loss
from lab.testing import assert_sampled_distribution_exact, make_target, tiny_llama


def tiny_cfg(kind="flashmap", vocab=16, hidden=32):
    return DrafterConfig(kind=kind, block_size=4, d_model=32, n_layers=2, n_heads=2, mlp_ratio=2,
                         feature_layers=(1, 2), target_hidden=hidden, draft_vocab=vocab, context_window=8)


def tiny_seqs(n=6, vocab=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Sequence(torch.randint(4, vocab, (20,), generator=gen).tolist(), 6) for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tiny_target):
    seqs = tiny_seqs()
    vocab_ids = draft_vocabulary(seqs, 16)
    to_draft = target_to_draft_map(vocab_ids, tiny_target.vocab_size)
    blocks = blocks_from_sequences(tiny_target, seqs, 4, 4, 8, (1, 2), to_draft, torch.Generator().manual_seed(0))
    return seqs, vocab_ids, blocks


def test_draft_vocabulary_maps_back_and_other_is_zero(setup, tiny_target):
    _seqs, vocab_ids, blocks = setup
    assert vocab_ids[0] == -1 and len(set(vocab_ids.tolist())) == 16
    to_draft = target_to_draft_map(vocab_ids, tiny_target.vocab_size)
    assert all(int(vocab_ids[to_draft[t]]) == t for t in vocab_ids[1:].tolist() if t >= 0)
    assert blocks.tokens.max() < 16 and (blocks.tokens == 0).any()  # some tokens fall outside: "other"


def test_blocks_shapes_and_context_alignment(setup):
    _seqs, _vocab, blocks = setup
    b = blocks.tokens.shape[0]
    assert blocks.features.shape == (b, 8, 64) and blocks.feature_mask.shape == (b, 8)
    assert blocks.valid.shape == (b, 4) and blocks.anchor_embed.shape == (b, 32)
    assert bool(blocks.feature_mask[:, -1].all())  # right-aligned: the position before the anchor exists


def test_network_shapes_and_masked_context_is_ignored(setup, tiny_target):
    _seqs, vocab_ids, blocks = setup
    net = build_net(tiny_cfg(), tiny_target, vocab_ids)
    for p in net.parameters():  # leave adaLN-Zero: make every path matter for this check
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(blocks.tokens.shape[0], 4, 16)
    s, t = torch.full((len(x),), 0.3), torch.full((len(x),), 0.7)
    logits = net(net.state_input(x, s, t), s, t, *blocks.context(net))
    assert logits.shape == (len(x), 4, 16)
    garbage = blocks.features.clone()
    garbage[~blocks.feature_mask] = 100.0  # garbage where there is no context
    changed = Blocks.from_windows(garbage, blocks.feature_mask, blocks.anchors, blocks.anchor_embed,
                                  blocks.tokens, blocks.valid)
    assert torch.allclose(logits, net(net.state_input(x, s, t), s, t, *changed.context(net)), atol=1e-5)
    other = net(net.state_input(x, s, t), s, t, *net.context(blocks.features + 1, blocks.feature_mask,
                                                                blocks.anchors, blocks.anchor_embed))
    assert not torch.allclose(logits, other)


def test_pooled_context_gives_the_gathered_contexts_logits_and_gradients(setup, tiny_target):
    """Training's factored context (each pool position projected once) is the same function as the gathered one,
    for a subset of blocks too (distillation indexes it)."""
    _seqs, vocab_ids, blocks = setup
    net = build_net(tiny_cfg(), tiny_target, vocab_ids)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(blocks.tokens.shape[0], 4, 16)
    s, t = torch.full((len(x),), 0.3), torch.full((len(x),), 0.7)
    rows = torch.arange(len(x)) % 3 != 0
    results = []
    for pooled in (False, True):
        net.zero_grad()
        ctx, mask = blocks.context(net, pooled=pooled)
        logits = net(net.state_input(x[rows], s[rows], t[rows]), s[rows], t[rows], ctx[rows], mask[rows])
        (logits.softmax(-1)[..., 3].sum()).backward()
        results.append((logits.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]))
    (gathered, grads), (pooled_logits, pooled_grads) = results
    assert torch.allclose(gathered, pooled_logits, atol=1e-5) and len(grads) == len(pooled_grads) > 10
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, pooled_grads))


@pytest.mark.parametrize("stage", ["teacher", "distill", "dflash"])
def test_a_training_step_lowers_the_loss(stage, setup, tiny_target):
    _seqs, vocab_ids, blocks = setup
    torch.manual_seed(0)
    net = build_net(tiny_cfg("dflash" if stage == "dflash" else "flashmap"), tiny_target, vocab_ids)
    teacher = copy.deepcopy(net).requires_grad_(False)

    def loss():
        gen = torch.Generator().manual_seed(5)  # same noise and times before and after the step
        if stage == "teacher":
            return teacher_loss(net, blocks, gen)
        if stage == "dflash":
            return dflash_loss(net, blocks)
        return distill_loss(net, teacher, blocks, gen)

    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3)
    before = loss()
    for _ in range(5):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < before.item()


def test_checkpoint_round_trip_and_refusals(setup, tiny_target, tmp_path):
    _seqs, vocab_ids, _blocks = setup
    net = build_net(tiny_cfg(), tiny_target, vocab_ids)
    save_checkpoint(tmp_path / "ok", net, vocab_ids, tiny_target.identity, {"steps": 0})
    loaded, loaded_vocab, meta = load_net(tmp_path / "ok", tiny_target)
    assert torch.equal(loaded_vocab, vocab_ids) and meta["training"] == {"steps": 0}
    for key, value in net.state_dict().items():
        assert torch.allclose(loaded.state_dict()[key], value.bfloat16().float())
    other = make_target(tiny_llama(vocab_size=64, layers=3), name="another-tiny")
    with pytest.raises(CheckpointError, match="trained for target"):
        load_net(tmp_path / "ok", other)
    with pytest.raises(CheckpointError, match="no drafter checkpoint"):
        load_net(tmp_path / "missing", tiny_target)
    (tmp_path / "ok" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_net(tmp_path / "ok", tiny_target)
    with pytest.raises(DrafterUnavailable, match="no drafter checkpoint"):
        build_drafter(DrafterSpec("flashmap", weights=str(tmp_path / "missing")), tiny_target)


def test_checkpoint_of_the_wrong_kind_is_refused(setup, tiny_target, tmp_path):
    _seqs, vocab_ids, _blocks = setup
    save_checkpoint(tmp_path, build_net(tiny_cfg("dflash"), tiny_target, vocab_ids), vocab_ids,
                    tiny_target.identity, {})
    with pytest.raises(CheckpointError, match="holds a dflash drafter"):
        load_engine_drafter(DrafterSpec("flashmap", weights=str(tmp_path)), tiny_target)
    config = json.loads((tmp_path / "config.json").read_text())
    config["drafter"]["block_size"] = "sixteen"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError):
        load_engine_drafter(DrafterSpec("dflash", weights=str(tmp_path)), tiny_target)


def flow_drafters(target, vocab_ids, cfg_vocab=16, products=None):
    """Each way of drafting, untrained; products (drafter.runtime.native_trunk.products_for): "fp32" where a test
    compares a frozen view's drafts with the network's own forward to float rounding (None: the build's fastest
    products)."""
    torch.manual_seed(0)
    hidden = target.model.config.hidden_size
    flow = build_net(tiny_cfg("flashmap", cfg_vocab, hidden), target, vocab_ids)
    dflash = build_net(tiny_cfg("dflash", cfg_vocab, hidden), target, vocab_ids)
    for net in (flow, dflash):  # untrained but not degenerate
        for p in net.parameters():
            torch.nn.init.normal_(p, std=0.3)
        torch.nn.init.zeros_(net.other_head)  # else "other" wins every argmax and every T=0 draft is empty
    ways = [dict(mode="flowmap", steps=1), dict(mode="flowmap", steps=2), dict(mode="teacher", steps=4),
            dict(mode="dflash"), dict(mode="flowmap", steps=1, best_of=3),
            dict(mode="flowmap", steps=1, noise_scale=0.0), dict(mode="flowmap", steps=2, noise_scale=0.0)]
    return [FlowDrafter(dflash if way["mode"] == "dflash" else flow, vocab_ids, target, **way, products=products)
            for way in ways]


def test_the_zero_noise_jumps_are_deterministic_flow_map_jumps_from_zero(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    one, two = flow_drafters(tiny_target, vocab_ids, products="fp32")[-2:]
    for zero in (one, two):
        zero.extend(list(range(5)), torch.randn(5, 2 * tiny_target.model.config.hidden_size))
        probs = [zero.sampler.probs(*zero.context(7), 4, torch.Generator().manual_seed(seed)) for seed in (0, 1)]
        assert torch.equal(*probs)
    # two jumps from x0 = 0: X_{0,u}(0) = u delta_{0,u}(0), then delta_{u,1} of that state (eq. 5), u = tau^-1(1/2)
    net, (ctx, mask) = two.net, two.context(7)
    u = time_grid(2, net.cfg.draft_vocab)[1].view(1)
    zeros, ones = torch.zeros(1), torch.ones(1)
    x0 = torch.zeros(1, 4, net.cfg.draft_vocab)  # (1, K, V)
    with torch.no_grad():
        x_u = u * net.probs(net.state_input(x0, zeros, u), zeros, u, ctx, mask)  # (1, K, V)
        want = net.probs(net.state_input(x_u, u, ones), u, ones, ctx, mask)
        assert torch.allclose(two.sampler.probs(ctx, mask, 4, None), want, atol=1e-6)
    noisy = flow_drafters(tiny_target, vocab_ids)[0]
    noisy.extend(list(range(5)), torch.randn(5, 2 * tiny_target.model.config.hidden_size))
    assert not torch.equal(*[noisy.sampler.probs(*noisy.context(7), 4, torch.Generator().manual_seed(seed))
                             for seed in (0, 1)])
    assert DrafterSpec("flashmap", noise_scale=0.0).describe().startswith("FlashMap 1-step, noise × 0")
    for name, bad in (("flashmap", dict(noise_scale=-1.0)), ("dflash", dict(noise_scale=0.0))):
        with pytest.raises(SpecError, match="scale"):
            DrafterSpec(name, **bad)


def test_engine_is_lossless_with_flow_drafters_at_t0(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    for drafter in flow_drafters(tiny_target, vocab_ids):
        for shared in (True, False):
            drafter.sampler.shared_noise = shared
            for prompt in ([5, 6, 7], [9, 10, 11, 12, 13]):
                gen = GenerationConfig(max_new_tokens=24, block_size=4)
                plain, _ = generate_all(tiny_target, prompt, gen)
                out, events = generate_all(tiny_target, prompt, gen, drafter)
                assert out == plain, drafter.name
                assert all(len(ev.drafted) <= 4 for ev in events)


def test_engine_is_lossless_with_flow_drafters_at_t1():
    target = make_target(tiny_llama(vocab_size=5, layers=2, seed=3, scale=8.0))
    vocab_ids = torch.tensor([-1, 4, 2, 0])  # token 1 and 3 are outside the draft vocabulary: q = 0 there
    # flow map 1-step, DFlash-style, and best-of-3 (the kept draft depends on the noise, never on a token)
    drafters = flow_drafters(target, vocab_ids, cfg_vocab=4)
    for drafter in (drafters[0], drafters[3], drafters[4]):
        assert_sampled_distribution_exact(target, drafter, n=1200)
    # the adaptive length cuts between 0 and 2 slots here (the curve makes the second slot dear): still exact
    assert_sampled_distribution_exact(target, flow_drafters(target, vocab_ids, cfg_vocab=4)[0], n=1200,
                                      verify_cost=(1.0, 1.3, 2.2))


def test_best_of_keeps_the_draw_with_the_most_expected_accepted_slots(setup, tiny_target):
    _seqs, vocab_ids, blocks = setup
    drafter = flow_drafters(tiny_target, vocab_ids)[4]
    net, sampler = drafter.net, drafter.sampler
    ctx, mask = blocks.context(net)
    with torch.inference_mode():
        best = sampler.probs(ctx[:3], mask[:3], 4, torch.Generator().manual_seed(7))  # (3, K, V)
        sampler.best_of = 1  # the same noise, drawn for the 3 x 3 repeated contexts without selection
        draws = sampler.probs(ctx[:3].repeat_interleave(3, 0), mask[:3].repeat_interleave(3, 0), 4,
                              torch.Generator().manual_seed(7)).view(3, 3, 4, -1)  # (B, M, K, V)
    scores = drafting.expected_accepted(draws.max(-1).values)  # (B, M)
    assert torch.equal(best, draws[torch.arange(3), scores.argmax(-1)])
    assert (scores.max(-1).values > scores.min(-1).values).all()  # the draws differ: the choice mattered


def test_banked_two_step_equals_the_exact_two_jumps(setup, tiny_target):
    """App. B with every token corrected and the bank's own noise is the exact second-jump input."""
    from drafter.flow import flow_map_step
    from drafter.runtime import drafting

    _seqs, vocab_ids, blocks = setup
    net = flow_drafters(tiny_target, vocab_ids)[0].net
    bank = drafting.build_noise_bank(net, 1, torch.Generator().manual_seed(3), keep_noise=True)
    ctx, mask = blocks.context(net)
    ctx, mask = ctx[:1], mask[:1]
    with torch.no_grad():
        banked = drafting.two_jumps_banked(net, ctx, mask, 4, bank, torch.Generator(), top=16, redraw=False)
        x0 = bank.x0.expand(1, 4, -1)  # (1, K, V) every slot drew bank entry 0
        zero, u, one = torch.zeros(1), torch.tensor([bank.u]), torch.ones(1)
        first = torch.softmax(net(net.state_input(x0, zero, u), zero, u, ctx, mask), -1)
        x_u = flow_map_step(x0, first, zero, u)
        exact = torch.softmax(net(net.state_input(x_u, u, one), u, one, ctx, mask), -1)
        assert torch.allclose(banked, exact, atol=1e-4)
        cheap = drafting.two_jumps_banked(net, ctx, mask, 4, bank, torch.Generator(), top=4)
        assert cheap.shape == (1, 4, 16) and torch.allclose(cheap.sum(-1), torch.ones(1, 4))


def test_couple_keeps_each_draws_own_slot_and_fresh_noise_elsewhere():
    own, fresh = torch.randn(2, 3, 5), torch.randn(6, 3, 5)  # (B, K, X), (B*K, K, X) draw-major
    mixed = drafting.couple(own, fresh, 3).view(2, 3, 3, 5)  # (B, draw, K, X)
    for draw in range(3):
        for slot in range(3):
            want = own[:, slot] if draw == slot else fresh.view(2, 3, 3, 5)[:, draw, slot]
            assert torch.equal(mixed[:, draw, slot], want)


def test_the_shuffle_tests_draft_is_coupled_to_the_shared_one(setup, tiny_target):
    """Per-slot draws share each slot's own noise with the shared draft of the same seed and consume that generator
    exactly as it does (so the next batch is paired too); only the other slots' noise differs."""
    _seqs, vocab_ids, blocks = setup
    for drafter in [flow_drafters(tiny_target, vocab_ids)[i] for i in (0, 1, 2)]:  # 1 jump, 2 banked jumps, teacher
        ctx, mask = blocks.context(drafter.net)
        shared, shuffled = (drafting.BlockSampler(drafter.net, drafter.sampler.mode, drafter.sampler.steps, flag)
                            for flag in (True, False))
        g_shared, g_shuffled = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        with torch.no_grad():
            for block in (1, 4):
                a = shared.probs(ctx[:3], mask[:3], block, g_shared)  # (3, K, V)
                b = shuffled.probs(ctx[:3], mask[:3], block, g_shuffled)
                if block == 1:  # a lone slot has no other slots: the two drafts are the same draft
                    assert torch.allclose(a, b, atol=1e-6), drafter.name
                else:
                    assert not torch.allclose(a, b, atol=1e-4), drafter.name
                assert torch.equal(g_shared.get_state(), g_shuffled.get_state())


def test_tiny_qwen3_through_the_engine_with_flow_drafters(tiny_qwen3_target):
    seqs = tiny_seqs(vocab=64, seed=1)
    vocab_ids = draft_vocabulary(seqs, 16)
    for drafter in flow_drafters(tiny_qwen3_target, vocab_ids):
        gen = GenerationConfig(max_new_tokens=20, block_size=4)
        plain, _ = generate_all(tiny_qwen3_target, [5, 6, 7, 8], gen)
        out, _ = generate_all(tiny_qwen3_target, [5, 6, 7, 8], gen, drafter)
        assert out == plain, drafter.name


def test_cached_features_match_the_on_the_fly_ones(tiny_target, tmp_path, monkeypatch):
    import drafter.data as data_mod
    from drafter.data import extract_features, features_dir, load_sequences, write_shard

    seqs = tiny_seqs()
    write_shard(tmp_path / "shard-00000.safetensors", [s.tokens[:6] for s in seqs], [s.tokens[6:] for s in seqs])

    class Args:  # what argparse gives extract_features; the tiny target is injected
        data, layers, batch_size, autocast = str(tmp_path), [1, 2], 4, "none"

    monkeypatch.setattr(data_mod, "target_config_from_args", lambda args: None)
    monkeypatch.setattr(data_mod, "load_target", lambda cfg: tiny_target)
    extract_features(Args)
    assert (features_dir(tmp_path, (1, 2)) / "shard-00000.safetensors").exists()
    cached = load_sequences(tmp_path, (1, 2))
    assert [s.tokens for s in cached] == [s.tokens for s in seqs]
    vocab_ids = draft_vocabulary(seqs, 16)
    to_draft = target_to_draft_map(vocab_ids, tiny_target.vocab_size)
    fly = blocks_from_sequences(tiny_target, seqs, 4, 4, 8, (1, 2), to_draft, torch.Generator().manual_seed(0))
    hit = blocks_from_sequences(tiny_target, cached, 4, 4, 8, (1, 2), to_draft, torch.Generator().manual_seed(0))
    assert torch.equal(fly.tokens, hit.tokens) and torch.equal(fly.feature_mask, hit.feature_mask)
    assert torch.allclose(fly.features, hit.features, atol=0.05, rtol=0.02)  # bf16 cache


def test_follow_up_turns_answer_questions_about_the_targets_own_answers(tiny_target, tmp_path, monkeypatch):
    """drafter.data follow-up: each first turn of the chosen domains, with the target's answer, gets distinct
    follow-up questions; the target answers them into a resumable folder of the same format."""
    import drafter.data as data_mod
    from drafter.data import FOLLOW_UPS, load_sequences

    prompts = tmp_path / "train_mix.jsonl"
    prompt_rows = [{"id": f"p{i}", "domain": ("chat", "math")[i % 2], "prompt": f"w{10 + i} w20"} for i in range(6)]
    prompts.write_text("\n".join(json.dumps(row) for row in prompt_rows))
    monkeypatch.setattr(data_mod, "target_config_from_args", lambda args: None)
    monkeypatch.setattr(data_mod, "load_target", lambda cfg: tiny_target)
    source, out = tmp_path / "first", tmp_path / "second"
    data_mod.main(["generate", "--prompts", str(prompts), "--out", str(source), "--max-new-tokens", "4"])
    turn2 = ["follow-up", "--source", str(source), "--out", str(out), "--per-conversation", "2", "--max-new-tokens",
             "4", "--shard-size", "4"]
    data_mod.main(turn2)
    firsts, seconds = load_sequences(source), load_sequences(out)
    assert len(seconds) == 3 * 2 and json.loads((out / "domains.json").read_text()) == ["chat"] * 6
    rows = data_mod.follow_up_rows(data_mod.read_prompt_rows([str(prompts)], None), firsts, tiny_target, ("chat",),
                                   2, seed=0)
    for i, first in enumerate(firsts[::2]):  # the chat rows: both follow-ups continue the conversation with its answer
        for row, second in zip(rows[2 * i : 2 * i + 2], seconds[2 * i : 2 * i + 2]):
            answer = tiny_target.decode(first.tokens[first.prompt_len:])
            assert row["messages"][1] == {"role": "assistant", "content": answer}
            prompt = second.tokens[:second.prompt_len]
            assert prompt[:first.prompt_len] == first.tokens[:first.prompt_len] and len(prompt) > first.prompt_len
    asked = [r["messages"][-1]["content"] for r in rows]
    assert all(q in FOLLOW_UPS for q in asked) and all(asked[i] != asked[i + 1] for i in range(0, 6, 2))
    data_mod.main(turn2)  # complete: resumes to nothing
    with pytest.raises(SystemExit, match="other settings"):
        data_mod.main([*turn2, "--seed", "1"])
    with pytest.raises(ValueError, match="not the same run"):
        data_mod.follow_up_rows([], firsts, tiny_target, ("chat",), 2, seed=0)


def test_unused_vocabulary_slots_are_never_proposed(setup, tiny_target):
    """A draft vocabulary padded with placeholders (fewer distinct tokens than slots) stays valid."""
    from core.verification.sampling import SamplingConfig

    _seqs, vocab_ids, _blocks = setup
    padded = vocab_ids.clone()
    padded[8:] = -2 - torch.arange(8)  # half the slots unused
    for drafter in flow_drafters(tiny_target, padded):
        drafter.extend([5, 6, 7], torch.randn(3, 64))
        for temperature in (0.0, 1.0):
            for seed in range(20):
                draft = drafter.propose(9, 4, SamplingConfig(temperature), torch.Generator().manual_seed(seed))
                assert bool((draft.tokens >= 0).all()) and set(draft.tokens.tolist()) <= set(padded[1:8].tolist())
                if draft.q_draft is not None:
                    assert torch.allclose(draft.q_draft.sum(-1), torch.ones(len(draft.tokens)))


def test_adaptive_draft_length_stays_lossless(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    curve = (1.0, 1.2, 1.3, 1.4, 1.5)
    for drafter in flow_drafters(tiny_target, vocab_ids)[:2]:
        gen = GenerationConfig(max_new_tokens=20, block_size=4, verify_cost=curve)
        plain, _ = generate_all(tiny_target, [5, 6, 7, 8], GenerationConfig(max_new_tokens=20, block_size=4))
        out, events = generate_all(tiny_target, [5, 6, 7, 8], gen, drafter)
        assert out == plain and all(len(ev.drafted) <= 4 for ev in events)


def test_prompt_slices_and_a_folder_resumes_only_with_its_own_settings(tmp_path):
    from drafter.data import check_meta, read_prompt_rows

    path = tmp_path / "train_math.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(10)))
    assert [r["prompt"] for r in read_prompt_rows([str(path)], 3, start=4)] == ["p4", "p5", "p6"]
    assert len(read_prompt_rows([str(path)], None, start=8)) == 2
    for name in ("eval_math.jsonl", "tuning_code.jsonl", "heldout_math.jsonl"):  # tuning and held-out sets
        with pytest.raises(ValueError, match="never used for training"):
            read_prompt_rows([str(tmp_path / name)], None)
    for name in ("tuning_code.jsonl", "heldout_code.jsonl"):  # a check set's replies (offline checks): allowed
        (tmp_path / name).write_text(path.read_text())
        assert len(read_prompt_rows([str(tmp_path / name)], None, check_set=True)) == 10
    check_meta(tmp_path, {"start": 0, "limit": 3})
    check_meta(tmp_path, {"start": 0, "limit": 3})  # the same settings: resume
    with pytest.raises(SystemExit, match="other settings"):
        check_meta(tmp_path, {"start": 3, "limit": 3})  # shard 0 would hold other prompts


def test_tree_of_flow_drafts_is_lossless_at_t0_and_refused_where_it_cannot_be(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    one_step = flow_drafters(tiny_target, vocab_ids)[0]
    tree = FlowDrafter(one_step.net, vocab_ids, tiny_target, "flowmap", 1, tree=4)
    tree.reset()
    tree.extend([5, 6, 7], torch.randn(3, 2 * tiny_target.model.config.hidden_size))
    draft = tree.propose(8, 4, SamplingConfig(), torch.Generator().manual_seed(0))
    assert len(draft.alternatives) == 3 and draft.q_draft is None
    with torch.inference_mode():  # the same noise for 4 copies of the context: draft m is draw m's T=0 block
        ctx, mask = tree.context(8)
        copies, copies_mask = ctx.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)  # (4, C, D), (4, C)
        probs = tree.sampler.probs(copies, copies_mask, 4, torch.Generator().manual_seed(0))
    tokens, lengths = drafting.greedy_block(drafting.fold_unused(probs, vocab_ids >= 0))
    expected = [tuple(vocab_ids[row[:n]].tolist()) for row, n in zip(tokens, lengths.tolist())]
    assert [tuple(draft.tokens.tolist()), *draft.alternatives] == expected and len(expected[0]) > 0
    for prompt in ([5, 6, 7], [9, 10, 11, 12, 13]):
        gen = GenerationConfig(max_new_tokens=24, block_size=4)
        plain, _ = generate_all(tiny_target, prompt, gen)
        out, events = generate_all(tiny_target, prompt, gen, tree)
        assert out == plain and any(ev.branches == 4 for ev in events)
    out, _ = generate_all(tiny_target, [5, 6], GenerationConfig(8, 4, SamplingConfig(temperature=1.0)), tree)
    assert len(out) == 8  # the engine walks a tree at T > 0 by the target's draws (the app's spec keeps tree=1 there)
    with pytest.raises(SpecError, match="flow drafters"):
        DrafterSpec("dflash", tree=2)
    with pytest.raises(SpecError, match="not both"):
        DrafterSpec("flashmap", best_of=2, tree=2)
    with pytest.raises(SpecError, match="needs lookup=1"):
        DrafterSpec("flashmap", phrasebook=False)
    spec = DrafterSpec.parse("flashmap,lookup=1,phrasebook=0")
    assert spec.text() == "flashmap,lookup=1,phrasebook=0" and not spec.phrasebook
    assert "with prompt lookup" in spec.describe() and "phrasebook" not in spec.describe()
    assert "and the phrasebook" in DrafterSpec("flashmap", lookup=True).describe()


def test_frozen_matrices_are_cached_at_inference_and_follow_parameter_updates(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    net = flow_drafters(tiny_target, vocab_ids)[0].net
    with torch.no_grad():
        first = net.head_matrix()
        assert net.head_matrix() is first  # no (V, D_t) rebuild per draft
        net.other_head.add_(1.0)  # an optimizer step or a load changes the parameter in place
        updated = net.head_matrix()
        assert updated is not first and torch.equal(updated[0], net.other_head)
        assert torch.equal(net.embed_matrix()[0], net.other_embed)
    assert net.head_matrix().requires_grad  # training builds it with its graph


def test_drafter_calls_are_skipped_after_empty_adaptive_drafts(setup, tiny_target):
    _seqs, vocab_ids, _blocks = setup
    drafter = flow_drafters(tiny_target, vocab_ids)[0]
    calls = []
    original = drafter.propose
    drafter.propose = lambda *a: calls.append(1) or original(*a)
    prompt = [5, 6, 7]
    plain, _ = generate_all(tiny_target, prompt, GenerationConfig(max_new_tokens=24, block_size=4))
    costly = (1.0, 50.0, 50.0, 50.0, 50.0)  # any draft costs 50 plain steps: the cut keeps nothing
    for max_skip, want_calls in ((8, 5), (0, 22)):  # 22 rounds draft (k > 0); skipping: rounds 1, 3, 6, 11, 20
        calls.clear()
        gen = GenerationConfig(max_new_tokens=24, block_size=4, verify_cost=costly,
                               policy=PolicyConfig(max_skip=max_skip))
        out, events = generate_all(tiny_target, prompt, gen, drafter)
        assert out == plain and all(not ev.drafted for ev in events)
        assert len(calls) == want_calls


def test_a_checkpoint_trained_at_k8_asked_for_k16_is_capped_and_exact(setup, tiny_target, tmp_path):
    """K belongs to the drafter: a checkpoint trained for K = 8 asked for 16 drafts at most 8 per round, with
    output identical to plain decoding, and no crash; an unset K means its own 8."""
    from dataclasses import replace

    _seqs, vocab_ids, _blocks = setup
    torch.manual_seed(0)
    net = build_net(replace(tiny_cfg("flashmap", 16, tiny_target.model.config.hidden_size), block_size=8),
                    tiny_target, vocab_ids)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    torch.nn.init.zeros_(net.other_head)
    save_checkpoint(tmp_path, net, vocab_ids, tiny_target.identity, {})
    drafter = build_drafter(DrafterSpec("flashmap", block_size=16, weights=str(tmp_path)), tiny_target)
    assert drafter.max_block_size == 8
    for block_size in (16, None):
        gen = GenerationConfig(max_new_tokens=40, block_size=block_size)
        plain, _ = generate_all(tiny_target, [5, 6, 7], gen)
        out, events = generate_all(tiny_target, [5, 6, 7], gen, drafter)
        assert out == plain
        assert max(len(ev.drafted) for ev in events if ev.kind == "round") == 8


def test_a_shorter_draft_is_the_whole_blocks_prefix(setup, tiny_target):
    """The drafter's slots attend to each other, so a network trained on K-slot blocks drafts all K and cuts
    (the end of a reply, a smaller K): fewer slots would change every slot (the engine drafted worse there
    than the offline evaluator, which always drafts whole blocks)."""
    _seqs, vocab_ids, _blocks = setup
    greedy = SamplingConfig(0.0)
    drafters = flow_drafters(tiny_target, vocab_ids)
    for drafter in [drafters[3], *drafters[-2:]]:  # DFlash-style; FlashMap from zero noise, 1 and 2 jumps
        drafter.extend(list(range(5)), torch.randn(5, 2 * tiny_target.model.config.hidden_size))
        whole = drafter.propose(7, 4, greedy, torch.Generator().manual_seed(0))
        for k in (1, 2, 3):
            cut = drafter.propose(7, k, greedy, torch.Generator().manual_seed(0))
            assert cut.tokens.tolist() == whole.tokens[:k].tolist()
            assert torch.equal(cut.confidence, whole.confidence[:k])


def test_features_are_projected_when_the_drafter_next_proposes_within_its_window(setup, tiny_target):
    """extend only keeps features; the context a proposal sees is the last W positions projected, whatever
    mixture of single rounds, multi-token rounds and proposals came before (context_window = 8 here)."""
    _seqs, vocab_ids, _blocks = setup
    lazy = flow_drafters(tiny_target, vocab_ids, products="fp32")[0]
    feats = torch.randn(23, 2 * tiny_target.model.config.hidden_size)
    for start, stop in [(0, 5), (5, 6), (6, 7)]:
        lazy.extend(list(range(start, stop)), feats[start:stop])
    first = key_value_maps(lazy.context(3)[0])
    for start, stop in [(7, 8), (8, 11), (11, 12), (12, 20), (20, 21), (21, 23)]:  # 16 rows: beyond the window
        lazy.extend(list(range(start, stop)), feats[start:stop])
    assert lazy.pending_rows <= 8 + 7  # what the window cannot reach is dropped as it arrives
    ctx = key_value_maps(lazy.context(3)[0])
    with torch.inference_mode():
        eager_first = lazy.net.context_projected(lazy.net.ctx_in(feats[:7])[None], torch.ones(1, 7, dtype=torch.bool),
                                                 lazy.input_embeddings[3].float()[None])[0]
        eager = lazy.net.context_projected(lazy.net.ctx_in(feats[-8:])[None], torch.ones(1, 8, dtype=torch.bool),
                                           lazy.input_embeddings[3].float()[None])[0]
        for layer in lazy.frozen.kv_layers:  # the frozen view keeps each block's key and value maps of the context
            assert torch.allclose(first[layer], layer(eager_first), atol=1e-5)
            assert torch.allclose(ctx[layer], layer(eager), atol=1e-5)


def key_value_maps(cached) -> dict:
    """A copy of a CachedContext's maps (the next proposal reuses their buffer). -> layer: (C, D)"""
    return {layer: cached.linear(layer)[0].clone() for layer in cached.layers}


def test_magpie_requests_come_from_the_user_turn_opening_and_resume(tmp_path, monkeypatch, tiny_qwen3_target):
    """drafter.data magpie: the target is prompted with its template's user-turn opening only; usable requests are kept
    once each, every N-th held apart, and a rerun appends only what is missing."""
    import drafter.data as data_mod
    from core.prompts import read_jsonl

    opening = data_mod.user_turn_opening(tiny_qwen3_target)
    full = tiny_qwen3_target.chat_ids([{"role": "user", "content": "w5 w6"}])
    assert opening and full[: len(opening)] == opening and len(full) > len(opening) + 2  # the turn up to its text
    assert not data_mod.usable_request("too short", set()) and not data_mod.usable_request("a <|im_end|> b c d", set())
    assert not data_mod.usable_request("What is the best way?", {"what is the best way?"})
    texts = iter([f"Please tell me about topic number {i}." for i in range(40)])
    monkeypatch.setattr(data_mod, "sample_requests", lambda target, count, *a: [next(texts) for _ in range(count)])
    monkeypatch.setattr(data_mod, "target_config_from_args", lambda args: None)
    monkeypatch.setattr(data_mod, "load_target", lambda cfg: tiny_qwen3_target)
    out, check = tmp_path / "magpie_train.jsonl", tmp_path / "magpie_check.jsonl"
    args = ["magpie", "--n", "7", "--out", str(out), "--check", str(check), "--check-every", "3", "--batch-size", "4"]
    data_mod.main(args)
    assert len(read_jsonl(out)) == 5 and len(read_jsonl(check)) == 2  # the 3rd and 6th held apart
    data_mod.main([*args[:2], "12", *args[3:]])
    rows = read_jsonl(out) + read_jsonl(check)
    assert len(rows) == 12 and len({r["prompt"] for r in rows}) == 12 and len({r["id"] for r in rows}) == 12


def test_the_phrasebook_command_calibrates_on_held_out_folders_only(tmp_path):
    """drafter.data phrasebook --held: the book carries each grade's acceptance on the held-out replies and says what it
    was measured on; a held-out folder that is also built from is refused."""
    import json

    from core.drafting import phrasebook
    from drafter.data import main as data_main
    from drafter.data import write_shard

    target = {"name": "tiny", "model_type": "llama", "vocab_size": 64, "hidden_size": 8, "num_hidden_layers": 2}
    for name, responses in (("train", [[3, 4, 5, 6]] * 4), ("held", [[3, 4, 5, 9]] * 30)):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "shard-00000.safetensors", [[1, 2]] * len(responses), responses)
        (tmp_path / name / "meta.json").write_text(json.dumps({"target": target}))
    out = tmp_path / "book"
    data_main(["phrasebook", "--data", str(tmp_path / "train"), "--out", str(out), "--held", str(tmp_path / "held")])
    book = phrasebook.load(out, target)
    graded = book.graded([1, 2, 3], 8)[2]  # "1 2 3" -> 4 5 6: on the held-out replies 4 and 5 kept, 6 not
    assert book.prior(graded) == (1.0, 1.0, 0.0)
    measured = json.loads((out / "config.json").read_text())["calibration"]["measured"]
    assert measured["held"] == [str(tmp_path / "held")] and measured["replies"] == 30
    with pytest.raises(SystemExit, match="must not be among --data"):
        data_main(["phrasebook", "--data", str(tmp_path / "train"), "--out", str(out), "--held",
                   str(tmp_path / "train")])


def test_positions_without_features_end_the_context_and_it_starts_again_after_them(setup, tiny_target):
    """The engine captures no features while the policy cannot call the network within its window
    (core.decoding.engine.captures): told of such positions, the drafter drafts from the ones after them alone."""
    _seqs, vocab_ids, _blocks = setup
    greedy = SamplingConfig(0.0)
    feats = torch.randn(12, 2 * tiny_target.model.config.hidden_size)
    gapped, fresh = (flow_drafters(tiny_target, vocab_ids, products="fp32")[-1] for _ in range(2))
    gapped.extend(list(range(4)), feats[:4])
    gapped.propose(7, 4, greedy, torch.Generator().manual_seed(0))  # what it had projected goes too
    gapped.extend([4, 5], None)
    gapped.extend([6, 7, 8], feats[6:9])
    fresh.extend([6, 7, 8], feats[6:9])
    for _ in range(2):
        ours, theirs = (d.propose(7, 4, greedy, torch.Generator().manual_seed(0)) for d in (gapped, fresh))
        assert ours.tokens.tolist() == theirs.tokens.tolist() and torch.equal(ours.confidence, theirs.confidence)
        gapped.extend([9, 10, 11], feats[10:12])  # features for the last two of three positions: a gap before them
        fresh.reset()
        fresh.extend([10, 11], feats[10:12])
