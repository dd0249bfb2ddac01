"""The objects a GPU serves a reply with, on the CPU (tests/gpu_path.py's tiny Qwen3 folder and release-format
drafter, loaded as the app loads them with --graphs sim --dtype fp32): fixed-shape steps with a prefix cache, a reply
resumed from alternating threads, no tensor with a grad, every random draw on its generator's device, the released
drafter found by its target's architecture and read with or without the release's `flashmap.` prefix."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode

from core.decoding.engine import GenerationConfig, generate, generate_all
from core.decoding.prefix import PrefixCache
from core.runtime.graphs import GraphedSteps
from core.runtime.target import TargetConfig, load_target
from core.verification.sampling import SamplingConfig
from drafter.registry import build_drafter
from drafter.runtime.graphed_release import GraphedReleaseDrafter
from drafter.spec import DrafterSpec
from lab.testing import alternating
from tests.gpu_path import write_folders


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_folders(tmp_path_factory.mktemp("gpu-path"))


@pytest.fixture(scope="module")
def target(folders, tmp_path_factory):
    cfg = TargetConfig(target=str(folders[0]), graphs="sim", dtype="fp32",
                       cache_dir=str(tmp_path_factory.mktemp("gpu-path-cache")))
    return load_target(cfg)


@pytest.fixture(scope="module")
def drafter(target, folders):
    return build_drafter(DrafterSpec("flashmap", weights=str(folders[1])), target)


def prompt(target, text: str = "What is the capital of France?", thinking: bool = False) -> list[int]:
    return target.chat_ids([{"role": "user", "content": text}], enable_thinking=thinking)


def test_the_app_loads_the_gpus_objects_in_sim(target, drafter):
    assert isinstance(target.lean, GraphedSteps) and target.lean.mode == "sim"
    assert isinstance(drafter, GraphedReleaseDrafter) and drafter.mode == "sim"


def test_the_qwen3_format_opens_the_reply_with_an_empty_think_block_when_thinking_is_off(target):
    on, off = prompt(target, thinking=True), prompt(target, thinking=False)
    assert off[: len(on)] == on and target.decode(off[len(on):]) == "<think>\n\n</think>\n\n"


def test_a_reply_on_fixed_shape_steps_with_a_prefix_cache_equals_one_without(target, drafter):
    """The app hands every reply its conversation's prefix cache; the fixed-shape steps reuse none of it (their
    prefill is not bit for bit what the steps cached), so each turn equals a fresh reply."""
    gen = GenerationConfig(max_new_tokens=24)
    prefix = PrefixCache()
    first = prompt(target)
    for ids in (first, first + [11, 12, 13]):
        fresh, _ = generate_all(target, ids, gen)
        for with_drafter in (None, drafter):
            events = list(generate(target, ids, gen, with_drafter, prefix=prefix))
            assert [t for ev in events for t in ev.committed] == fresh


def test_a_reply_resumed_from_alternating_threads_runs_in_inference_mode_and_equals_one_thread(target, drafter,
                                                                                            monkeypatch):
    modes, threads = [], []
    forward = type(target.lean).__call__

    def recorded(self, *args, **kwargs):
        modes.append(torch.is_inference_mode_enabled())
        threads.append(threading.current_thread().name)
        logits, features = forward(self, *args, **kwargs)
        assert not logits.requires_grad and (features is None or not features.requires_grad)
        return logits, features

    monkeypatch.setattr(GraphedSteps, "__call__", recorded)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
        gen = GenerationConfig(max_new_tokens=24, sampling=sampling, seed=3)
        ids = prompt(target)
        one_thread = [ev.committed for ev in generate(target, ids, gen, drafter)]
        threads.clear()
        many = [ev.committed for ev in alternating(generate(target, ids, gen, drafter))]
        assert many == one_thread and len(set(threads)) == 2
    assert modes and all(modes)


def test_no_weight_of_the_target_or_the_drafter_asks_for_a_grad(target, drafter):
    assert not any(p.requires_grad for p in target.model.parameters())
    assert not any(p.requires_grad for p in drafter.net.parameters())


RANDOM_FACTORIES = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal, torch.rand_like,
                    torch.randn_like, torch.randint_like}


class DrawDevices(TorchFunctionMode):
    """Records every random draw made with a generator: (function, the device it named, the generator's device). A
    draw that names no device draws on the default (the host) whatever its generator's device: on a GPU a CUDA
    generator meets a host draw (a RuntimeError) or a host generator a device draw."""

    def __init__(self):
        super().__init__()
        self.draws: list[tuple[str, object, torch.device]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if generator is not None:
            named = kwargs.get("device")
            if func is torch.multinomial or func in (torch.Tensor.uniform_, torch.Tensor.normal_,
                                                     torch.Tensor.exponential_):
                named = args[0].device  # drawn where its input lies
            self.draws.append((getattr(func, "__name__", str(func)), named, generator.device))
        return func(*args, **kwargs)


def test_every_draw_names_its_generators_device(target, drafter, folders):
    """Structural: wherever it runs, every draw with a generator says where it draws, and that is the generator's
    device (the engine's verify generator lives on the target's device, the drafter's noise generator on the host)."""
    gen = GenerationConfig(max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), seed=1)
    gen_top_p = replace(gen, sampling=SamplingConfig(temperature=0.7, top_p=0.9))
    eager = build_drafter(DrafterSpec("flashmap", weights=str(folders[1]), steps=2), target)
    with DrawDevices() as mode:
        for with_drafter, config in ((None, gen), (drafter, gen), (drafter, gen_top_p), (eager, gen)):
            generate_all(target, prompt(target), config, with_drafter)
    names = {name for name, _, _ in mode.draws}
    assert {"rand", "randn"} <= names, names  # the target's verdicts and the drafter's noise were both seen
    wrong = [(name, named, on) for name, named, on in mode.draws
             if named is None or torch.device(named) != on]
    assert not wrong, wrong[:5]


def test_the_released_drafter_is_found_for_a_local_folder_of_its_architecture(target, folders, tmp_path,
                                                                             monkeypatch):
    """A local folder of Qwen3-8B is not named "Qwen/Qwen3-8B": the released drafter is matched by the config."""
    import huggingface_hub.constants as hub

    from drafter.runtime import drafters as runtime
    from drafter.runtime.release import ReleaseDrafter

    cfg = target.model.config
    shape = (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size)
    monkeypatch.setitem(runtime.PUBLISHED_ARCHITECTURES, shape, "test-org/Tiny-Qwen3")
    monkeypatch.setitem(runtime.PUBLISHED_FLASHMAP, "test-org/Tiny-Qwen3", "test-org/FlashMap-Tiny-Qwen3")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--test-org--FlashMap-Tiny-Qwen3"
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (repo / "snapshots" / "0123abcd" / name).write_bytes((folders[1] / name).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    assert target.name == str(folders[0]) and runtime.published_target(target) == "test-org/Tiny-Qwen3"
    assert isinstance(build_drafter(DrafterSpec("flashmap"), target), ReleaseDrafter)


def test_a_release_folder_saved_with_the_flashmap_prefix_drafts_the_same(target, drafter, folders, tmp_path):
    prefixed = tmp_path / "prefixed"
    prefixed.mkdir()
    (prefixed / "config.json").write_bytes((folders[1] / "config.json").read_bytes())
    state = load_file(str(folders[1] / "model.safetensors"))
    save_file({f"flashmap.{name}": tensor for name, tensor in state.items()}, str(prefixed / "model.safetensors"))
    other = build_drafter(DrafterSpec("flashmap", weights=str(prefixed)), target)
    for name, tensor in drafter.net.state_dict().items():
        assert torch.equal(other.net.state_dict()[name], tensor), name


def test_context_is_the_replys_limit(folders, tmp_path):
    from core.decoding.engine import PromptError

    small = load_target(TargetConfig(target=str(folders[0]), graphs="sim", dtype="fp32", context=256,
                                     cache_dir=str(tmp_path)))
    assert small.model.config.max_position_embeddings == 40960 and small.max_positions == 256
    with pytest.raises(PromptError, match="context of 256 tokens"):
        list(generate(small, list(range(100, 340)), GenerationConfig(max_new_tokens=16)))
    assert len(generate_all(small, list(range(100, 220)), GenerationConfig(max_new_tokens=16))[0]) == 16


def test_sampled_replies_on_the_gpus_objects_keep_the_target_distribution(tmp_path):
    """T = 1 through the fixed-shape steps and the graphed release proposal together (sim), the drafter built from its
    folder by the registry as the app builds it: the joint distribution of two sampled tokens is the target's."""
    from lab.testing import QWEN3_TEMPLATE, assert_sampled_distribution_exact, tiny_qwen3
    from tests.test_flashmap_release import release_model, write_release
    from tests.test_lean import lean_target

    model = tiny_qwen3(vocab_size=5, seed=3)
    target = lean_target(model, template=QWEN3_TEMPLATE)
    target.lean = GraphedSteps(target.lean, "sim", 8)
    folder = write_release(tmp_path / "v5", release_model(target, seed=2))
    drafter = build_drafter(DrafterSpec("flashmap", weights=str(folder)), target)
    assert isinstance(drafter, GraphedReleaseDrafter)
    assert_sampled_distribution_exact(target, drafter, n=1200)


class ReadBacks(TorchFunctionMode):
    """Counts the values a computation reads back to Python (each one a synchronisation on a GPU)."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
             torch.Tensor.__bool__, torch.Tensor.__index__}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.READS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_q", [False, True])
def test_a_round_on_the_device_reads_back_two_values_whatever_its_length(with_q):
    from core.verification.sampling import verify_batched

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 50, generator=gen)  # (K+1, V), K = 8
    q_draft = torch.softmax(torch.randn(8, 50, generator=gen), -1) if with_q else None
    for seed in range(20):
        with ReadBacks() as reads:
            verdict = verify_batched(list(range(8)), logits, q_draft, SamplingConfig(temperature=1.0),
                                     torch.Generator().manual_seed(seed))
        assert reads.count == 2 and 0 <= verdict.n_accepted <= 8


def test_sampled_replies_verified_in_one_batch_keep_the_target_distribution(tmp_path, monkeypatch):
    """verify_batched (the GPU's rule) run here on the CPU: with the release drafter's q and with copied drafts, the
    joint distribution of two sampled tokens is the target's."""
    from core.drafting.base import NgramDrafter
    from core.verification import sampling
    from lab.testing import QWEN3_TEMPLATE, assert_sampled_distribution_exact, make_target, tiny_qwen3
    from tests.test_flashmap_release import release_model, write_release

    monkeypatch.setattr(sampling, "BATCHED_ON", ("cpu",))
    target = make_target(tiny_qwen3(vocab_size=5, seed=3), template=QWEN3_TEMPLATE, name="tiny-qwen3")
    folder = write_release(tmp_path / "v5", release_model(target, seed=2))
    for drafter in (build_drafter(DrafterSpec("flashmap", weights=str(folder)), target), NgramDrafter()):
        assert_sampled_distribution_exact(target, drafter, n=1200)
