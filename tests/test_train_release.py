"""Training a drafter in the release's architecture (drafter.training.train_release): its loss learns a tiny target's
blocks,
and what it saves is a release folder that the authors' package and this engine read alike."""
import json

import torch
from flashmap import FlashMapDraftModel

from drafter.data import Sequence, blocks_from_sequences
from drafter.formats.release import load_release_net
from drafter.networks.release import ReleaseNet
from drafter.runtime.release import ReleaseDrafter
from drafter.training.train_release import ReleaseTrainConfig, draw_jumps, release_loss, save_release


def tiny_cfg(tmp_path) -> ReleaseTrainConfig:
    return ReleaseTrainConfig(data=(), out=str(tmp_path), target="tiny-qwen3", target_layer_ids=(0, 2), block_size=4,
                              hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                              cond_dim=16, time_embed_dim=16, window=16)


def tiny_blocks(target, cfg, gen):
    """Blocks of a repeating sequence with random features at the drafter's layers."""
    tokens = [4 + (i * 7) % 20 for i in range(40)]
    seq = Sequence(tokens, 4, torch.randn(len(tokens), 32 * len(cfg.feature_layers), generator=gen))
    return blocks_from_sequences(target, [seq, seq], 8, cfg.block_size, cfg.window, cfg.feature_layers,
                                 torch.arange(target.vocab_size), gen)


def test_jumps_start_at_zero_or_the_two_step_grids_time():
    s, t = draw_jumps(400, 0.6, torch.Generator().manual_seed(0))
    assert set(s.tolist()) == {0.0, 0.8172569274902344} and ((s == 0).float().mean() - 0.6).abs() < 0.1
    assert bool((t > s).all()) and set(t[s > 0].tolist()) == {1.0}


def test_the_loss_learns_a_fixed_batch_and_the_saved_folder_reads_alike(tiny_qwen3_target, tmp_path):
    target, cfg = tiny_qwen3_target, tiny_cfg(tmp_path)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = ReleaseNet(cfg.release_config(target))
    blocks = tiny_blocks(target, cfg, gen)
    embedding = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss, stats = release_loss(net, blocks, embedding, head, cfg, torch.Generator().manual_seed(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(stats["loss"])
    assert losses[-1] < 0.7 * losses[0]
    save_release(tmp_path / "release", net, target.identity, {"log": []})
    config = json.loads((tmp_path / "release" / "config.json").read_text())
    assert config["model_type"] == config["speculators_model_type"] == "flashmap"  # what the vLLM plugin reads
    assert config["flashmap_chat"]["target"] == target.identity
    ours = ReleaseDrafter(load_release_net(tmp_path / "release", target), target)
    theirs = FlashMapDraftModel.from_pretrained(str(tmp_path / "release"), dtype=torch.float32).eval()
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.net.parameters())
    for name, param in theirs.state_dict().items():
        assert torch.equal(param, ours.net.state_dict()[name]), name


def test_a_run_resumes_from_its_folder_even_where_a_parameter_has_no_state_yet(tiny_qwen3_target, tmp_path):
    """save_state / resume: the step, the network and AdamW's moments come back; a parameter no loss has reached yet
    (no gradient, so no optimizer state) is left without state instead of failing the resume."""
    from drafter.training.train_release import resume, save_state

    target, cfg = tiny_qwen3_target, tiny_cfg(tmp_path)
    torch.manual_seed(0)
    net = ReleaseNet(cfg.release_config(target))
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    blocks = tiny_blocks(target, cfg, torch.Generator().manual_seed(0))
    embedding = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    first = next(net.parameters())
    for _ in range(2):
        loss, _ = release_loss(net, blocks, embedding, head, cfg, torch.Generator().manual_seed(1))
        opt.zero_grad()
        loss.backward()
        first.grad = None  # as for a parameter the loss does not reach
        opt.step()
    out = tmp_path / "run"
    save_release(out, net, target.identity, {"log": [{"step": 2}]})
    save_state(out, opt, 2)
    fresh = ReleaseNet(cfg.release_config(target))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=3e-3)
    step, log = resume(out, fresh, fresh_opt)
    assert step == 2 and log == [{"step": 2}]
    assert next(fresh.parameters()) not in fresh_opt.state and len(fresh_opt.state) == len(opt.state)
    for (name, saved), restored in zip(net.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(saved.to(torch.bfloat16).float(), restored), name  # the folder keeps bf16 weights
