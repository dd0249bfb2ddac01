"""Released FlashMap drafters (flashmap 0.1.0's format): a tiny random release folder written by the authors' own
package, read natively, drafting what the package's reference drafts, and run through the engine exactly."""
import json
from dataclasses import replace

import pytest
import torch
from flashmap import FlashMapCache, FlashMapConfig, FlashMapDraftModel
from safetensors.torch import save_file

from core.decoding.engine import GenerationConfig, generate_all
from core.verification.sampling import SamplingConfig
from drafter.networks.release import ReleaseConfig
from drafter.registry import DrafterUnavailable, build_drafter
from drafter.runtime import drafters as runtime
from drafter.runtime.release import ReleaseDrafter
from drafter.spec import DrafterSpec, SpecError
from lab.testing import QWEN3_TEMPLATE, assert_sampled_distribution_exact, make_target, tiny_qwen3

BLOCK = 4


def release_model(target, seed: int = 0, **overrides) -> FlashMapDraftModel:
    """The reference model at tiny sizes for this target, every weight random (no zero gate left from its init)."""
    fields = dict(target_model="tiny-qwen3", target_hidden_size=target.model.config.hidden_size,
                  vocab_size=target.vocab_size, target_layer_ids=[0, 2], block_size=BLOCK, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, cond_dim=16, time_embed_dim=16)
    model = FlashMapDraftModel(FlashMapConfig(**{**fields, **overrides})).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.3 * noise)
    return model


def write_release(folder, model: FlashMapDraftModel):
    """A release folder as the package saves one: config.json and model.safetensors (no remote code is needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(model.config.to_json_string())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def reference(tiny_qwen3_target):
    return release_model(tiny_qwen3_target)


@pytest.fixture(scope="module")
def folder(reference, tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("release"), reference)


def reference_context(reference, features: torch.Tensor, chunks) -> FlashMapCache:
    cache = FlashMapCache(reference.config, 1, 64)
    for start, stop in chunks:
        reference.extend_context(cache, features[None, start:stop])
    return cache


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_draft_logits_equal_the_reference_for_the_same_weights_and_noise(steps, reference, folder, tiny_qwen3_target):
    target = tiny_qwen3_target
    drafter = build_drafter(DrafterSpec("flashmap", steps=steps, weights=str(folder)), target)
    assert isinstance(drafter, ReleaseDrafter) and drafter.feature_layers == (1, 3)  # hidden_states[i + 1]
    features = torch.randn(9, 64, generator=torch.Generator().manual_seed(1))  # (N, F): two layers of width 32
    chunks = ((0, 5), (5, 6), (6, 9))  # the prompt, then rounds: the context grows as the reference's does
    cache = reference_context(reference, features, chunks)
    drafter.reset()
    for start, stop in chunks:
        drafter.extend(list(range(start, stop)), features[start:stop])
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    for anchor in (5, 17):
        noise = torch.randn(1, BLOCK, target.vocab_size, generator=torch.Generator().manual_seed(anchor))
        want = reference.draft(torch.tensor([anchor]), cache, embed, head, num_steps=steps, noise=noise)[0]
        assert torch.allclose(drafter.logits(anchor, noise=noise[0]), want, atol=1e-5, rtol=0)
        # the noise drawn from a generator: for one step only its embedding, as the reference draws it
        want = reference.draft(torch.tensor([anchor]), cache, embed, head, num_steps=steps,
                               generator=torch.Generator().manual_seed(3))[0]
        got = drafter.logits(anchor, generator=torch.Generator().manual_seed(3))
        assert torch.allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("steps", [1, 2])
def test_the_native_dit_drafts_what_torchs_does(steps, folder, tiny_qwen3_target):
    """drafter.runtime.native_trunk.ReleaseTrunk (the DiT in one native call) against the DiT op by op in torch, on the
    same context and noise: equal in fp32, and the 8-bit products' drafts close to them; only the asked rows' logits."""
    from drafter.runtime import native_trunk

    module, why = native_trunk.load()
    if module is None:
        pytest.skip(why)
    target = tiny_qwen3_target
    eager = build_drafter(DrafterSpec("flashmap", steps=steps, weights=str(folder)), target)
    net = eager.net
    eager = ReleaseDrafter(net, target, steps=steps, native=False)
    assert eager.trunk is None
    products = ["fp32"] + (["8-bit"] if module.PRODUCTS == "8-bit" else [])
    natives = [ReleaseDrafter(net, target, steps=steps, products=p) for p in products]
    assert [d.trunk_status for d in natives] == [f"native, {p} products" for p in products]
    features = torch.randn(70, 64, generator=torch.Generator().manual_seed(4))  # past the buffers' first 64 rows
    for drafter in (eager, *natives):
        drafter.reset()
        for start, stop in ((0, 3), (3, 68), (68, 70)):
            drafter.extend(list(range(start, stop)), features[start:stop])
    for anchor in (3, 40):
        noise = torch.randn(BLOCK, target.vocab_size, generator=torch.Generator().manual_seed(anchor))
        want = eager.logits(anchor, noise=noise)
        assert torch.allclose(natives[0].logits(anchor, noise=noise), want, atol=1e-5, rtol=0)
        # the first rows alone: torch's fp32 product blocks 2 rows and 16 differently on some CPUs (AVX-512 without
        # AMX), so equal up to its rounding
        first = natives[0].logits(anchor, noise=noise, rows=2)
        assert first.shape[0] == 2
        assert torch.allclose(first, natives[0].logits(anchor, noise=noise)[:2], atol=1e-5, rtol=0)
        for drafter in natives[1:]:  # weights and inputs rounded to 8-bit codes: a proposal, verified by the target
            got = drafter.logits(anchor, noise=noise)
            assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_the_context_restarts_after_positions_without_features_at_their_own_positions(folder, tiny_qwen3_target):
    drafter = build_drafter(DrafterSpec("flashmap", weights=str(folder)), tiny_qwen3_target)
    features = torch.randn(7, 64)
    drafter.reset()
    drafter.extend([1, 2, 3], features[:3])
    drafter.extend([4, 5], None)
    drafter.extend([6, 7], features[5:7])
    assert drafter.position == 7 and drafter.context.rows == 2
    want = drafter.net.context_rows(features[5:7], torch.arange(5, 7))  # each layer's own projections
    for keys_t, values, (k, v) in zip(drafter.context.keys_t, drafter.context.values, want):
        assert torch.allclose(keys_t[..., :2].transpose(-1, -2), k, atol=1e-6)
        assert torch.allclose(values[:, :2], v, atol=1e-6)


def test_greedy_replies_equal_plain_decoding(folder, tiny_qwen3_target):
    for steps in (1, 2):
        drafter = build_drafter(DrafterSpec("flashmap", steps=steps, weights=str(folder)), tiny_qwen3_target)
        gen = GenerationConfig(max_new_tokens=24, block_size=8)  # asks for more than the drafter's block of 4
        for prompt in ([5, 6, 7, 8], [9, 10, 11, 12, 13, 14]):
            plain, _ = generate_all(tiny_qwen3_target, prompt, gen)
            out, events = generate_all(tiny_qwen3_target, prompt, gen, drafter)
            assert out == plain
            assert any(ev.drafted for ev in events) and all(len(ev.drafted) <= BLOCK for ev in events)


def test_sampled_output_keeps_the_target_distribution(tmp_path):
    target = make_target(tiny_qwen3(vocab_size=5, seed=3), template=QWEN3_TEMPLATE, name="tiny-qwen3")
    folder = write_release(tmp_path / "v5", release_model(target, seed=2))
    drafter = build_drafter(DrafterSpec("flashmap", weights=str(folder)), target)
    draft = drafter.propose(2, BLOCK, SamplingConfig(1.0), torch.Generator().manual_seed(0))
    assert draft.q_draft.shape == (BLOCK, 5) and torch.allclose(draft.q_draft.sum(-1), torch.ones(BLOCK))
    assert_sampled_distribution_exact(target, drafter, n=1200)


def test_the_released_drafter_is_found_in_the_model_cache_for_its_target(reference, tiny_qwen3_target, tmp_path,
                                                                         monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setitem(runtime.PUBLISHED_FLASHMAP, tiny_qwen3_target.name, "test-org/FlashMap-tiny")
    with pytest.raises(DrafterUnavailable, match="hf download test-org/FlashMap-tiny"):
        build_drafter(DrafterSpec("flashmap"), tiny_qwen3_target)
    repo = tmp_path / "models--test-org--FlashMap-tiny"
    write_release(repo / "snapshots" / "0123abcd", reference)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    drafter = build_drafter(DrafterSpec("flashmap"), tiny_qwen3_target)
    assert isinstance(drafter, ReleaseDrafter) and drafter.c.target_model == "tiny-qwen3"


def test_refuses_what_does_not_fit_and_never_runs_the_folders_code(reference, folder, tiny_target, tiny_qwen3_target,
                                                                   tmp_path):
    with pytest.raises(DrafterUnavailable, match="target_layer_ids"):  # the tiny Llama has 2 layers, not 4
        build_drafter(DrafterSpec("flashmap", weights=str(folder)), tiny_target)
    with pytest.raises(SpecError, match="1, 2, 3, 4 jumps"):
        DrafterSpec("flashmap", steps=5, weights=str(folder))
    two = write_release(tmp_path / "two-grids", release_model(tiny_qwen3_target, jump_grids={"1": [0.0, 1.0],
                                                                                           "2": [0.0, 0.8, 1.0]}))
    with pytest.raises(DrafterUnavailable, match="steps must be one of 1, 2 "):
        build_drafter(DrafterSpec("flashmap", steps=3, weights=str(two)), tiny_qwen3_target)
    with pytest.raises(DrafterUnavailable, match="tree"):
        build_drafter(DrafterSpec("flashmap", tree=2, weights=str(folder)), tiny_qwen3_target)
    with pytest.raises(DrafterUnavailable, match="use it as flashmap"):
        build_drafter(DrafterSpec("dflash", weights=str(folder)), tiny_qwen3_target)
    broken = write_release(tmp_path / "corrupt", reference)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    (broken / "modeling_flashmap.py").write_text("raise SystemExit('remote code must never run')")
    with pytest.raises(DrafterUnavailable, match="cannot read"):
        build_drafter(DrafterSpec("flashmap", weights=str(broken)), tiny_qwen3_target)
    cfg = json.loads((folder / "config.json").read_text())
    for bad, why in (({"noise_gate": "sometimes"}, "noise_gate"), ({"hidden_size": 30}, "heads"),
                     ({"jump_grids": {"2": [0.0, 1.2, 1.0]}}, "jump_grids")):
        with pytest.raises(ValueError, match=why):
            ReleaseConfig.from_json({**cfg, **bad})


def test_the_apps_default_settings_draft_with_a_release_folder(folder, tiny_qwen3_target):
    """The app's default (drafter.spec.choice_spec("auto"): adaptive cut, prompt lookup and copies beside the network,
    x0 = 0) over a released-format network: replies equal plain decoding at T = 0."""
    from drafter.spec import choice_spec

    spec = choice_spec()
    drafter = build_drafter(replace(spec.drafter, weights=str(folder)), tiny_qwen3_target)
    assert isinstance(drafter.main, ReleaseDrafter) and drafter.main.noise_scale == 0.0
    gen = GenerationConfig(max_new_tokens=30, block_size=BLOCK, verify_cost=(1.0, 1.1, 1.2, 1.3, 1.4))
    for prompt in ([5, 6, 7, 5, 6, 7, 5], [9, 10, 11, 12]):
        plain, _ = generate_all(tiny_qwen3_target, prompt, gen)
        out, events = generate_all(tiny_qwen3_target, prompt, gen, drafter)
        assert out == plain


def test_each_proposal_sits_at_its_anchors_position_in_the_reply(folder, tiny_qwen3_target, monkeypatch):
    """The engine tells the drafter every committed position (features or not), so the anchor's rotary position is
    its index in prompt + reply, as in the reference loop."""
    drafter = build_drafter(DrafterSpec("flashmap", weights=str(folder)), tiny_qwen3_target)
    seen, logits = [], drafter.logits
    monkeypatch.setattr(drafter, "logits", lambda anchor, *a, **k: seen.append((drafter.position, anchor))
                        or logits(anchor, *a, **k))
    prompt = [9, 10, 11, 12, 13, 14]
    out, _ = generate_all(tiny_qwen3_target, prompt, GenerationConfig(max_new_tokens=20), drafter)
    assert len(seen) > 3 and all((prompt + out)[position] == anchor for position, anchor in seen)


@pytest.mark.slow
def test_the_shipped_release_format_drafter_reads_in_their_loader_and_drafts_exactly(embedded_target):
    """weights/<embedded target>/flashmap-release/: a release folder the authors' loader reads (the same parameters as
    ours) and this engine drafts with; at T = 0 its replies are plain decoding's, with drafted tokens kept."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "weights" / "smollm2-135m-instruct" / "flashmap-release"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == config["speculators_model_type"] == "flashmap"
    assert config["flashmap_chat"]["target"] == embedded_target.identity
    drafter = build_drafter(DrafterSpec("flashmap", noise_scale=0.0, weights=str(folder)), embedded_target)
    theirs = FlashMapDraftModel.from_pretrained(str(folder), dtype=torch.float32)
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in drafter.net.parameters())
    prompt = embedded_target.chat_ids([{"role": "user", "content": "List the first five prime numbers."}])
    plain, _ = generate_all(embedded_target, prompt, GenerationConfig(max_new_tokens=48))
    out, events = generate_all(embedded_target, prompt, GenerationConfig(max_new_tokens=48), drafter)
    assert out == plain and sum(ev.n_accepted for ev in events) > 0
