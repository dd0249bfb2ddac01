"""drafter.runtime.graphed_release: the released FlashMap drafter as a fixed-shape proposal over static context
buffers, in
mode "sim" (the CUDA-graph step run without capture), drafts what the eager drafter drafts, through buffer growth and
context restarts, and keeps replies exact."""
import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.verification.sampling import SamplingConfig
from drafter.formats.release import load_release_net
from drafter.runtime.graphed_release import GraphedReleaseDrafter
from drafter.runtime.release import ReleaseDrafter
from tests.test_flashmap_release import BLOCK, release_model, write_release


@pytest.fixture(scope="module")
def folder(tiny_qwen3_target, tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("graphed-release"), release_model(tiny_qwen3_target, seed=5))


def pair(folder, target, steps: int):
    """(the eager drafter, the graphed one in sim mode with small buffers and spans, so that both grow here)."""
    net = load_release_net(folder, target)
    return (ReleaseDrafter(net, target, steps=steps, native=False),
            GraphedReleaseDrafter(net, target, steps=steps, mode="sim", capacity=8, min_span=4))


def extend_both(drafters, features, chunks):
    for drafter in drafters:
        drafter.reset()
        for start, stop, with_features in chunks:
            drafter.extend(list(range(start, stop)), features[start:stop] if with_features else None)


@pytest.mark.parametrize("steps", [1, 2])
def test_the_static_proposal_drafts_what_the_eager_drafter_does(steps, folder, tiny_qwen3_target):
    eager, graphed = pair(folder, tiny_qwen3_target, steps)
    features = torch.randn(40, 64, generator=torch.Generator().manual_seed(2))
    # within the first capacity (8: span 4), past it (grown to 32), then a restart after positions without features
    spans = []
    for chunks in (((0, 3, True),), ((0, 5, True), (5, 6, True), (6, 20, True)),
                   ((0, 3, True), (3, 5, False), (5, 30, True))):
        extend_both((eager, graphed), features, chunks)
        assert graphed.context.rows == eager.context.rows and graphed.position == eager.position
        for anchor in (3, 17):
            seed = 10 + anchor
            want = eager.logits(anchor, generator=torch.Generator().manual_seed(seed))
            got = graphed.logits(anchor, generator=torch.Generator().manual_seed(seed))
            assert torch.allclose(got, want, atol=1e-5, rtol=0)
            for sampling in (SamplingConfig(), SamplingConfig(temperature=0.8)):
                d_eager = eager.propose(anchor, 3, sampling, torch.Generator().manual_seed(seed))
                d_graphed = graphed.propose(anchor, 3, sampling, torch.Generator().manual_seed(seed))
                assert torch.equal(d_graphed.tokens, d_eager.tokens)
                assert torch.allclose(d_graphed.confidence, d_eager.confidence, atol=1e-6)
                if not sampling.greedy:
                    assert torch.allclose(d_graphed.q_draft, d_eager.q_draft, atol=1e-6)
        spans.append(sorted({key[0] for key in graphed.proposals}))
    assert spans == [[4], [32], [32]]  # the steps over the first buffers were dropped when they grew
    assert graphed.context.capacity == 32 and graphed.context.generation == 2 and graphed.captures == 0  # sim


def test_replies_through_the_static_proposal_equal_plain_decoding(folder, tiny_qwen3_target):
    _, graphed = pair(folder, tiny_qwen3_target, 1)
    gen = GenerationConfig(max_new_tokens=30, block_size=BLOCK)
    for prompt in ([5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]):
        plain, _ = generate_all(tiny_qwen3_target, prompt, gen)
        out, events = generate_all(tiny_qwen3_target, prompt, gen, graphed)
        assert out == plain and any(ev.drafted for ev in events)


def test_bad_modes_are_refused(folder, tiny_qwen3_target):
    net = load_release_net(folder, tiny_qwen3_target)
    with pytest.raises(ValueError, match="mode"):
        GraphedReleaseDrafter(net, tiny_qwen3_target, mode="eager")
    with pytest.raises(ValueError, match="CUDA device"):
        GraphedReleaseDrafter(net, tiny_qwen3_target, mode="cuda")


def test_a_target_on_fixed_shape_steps_gets_the_graphed_drafter_and_exact_replies(folder):
    """drafter.runtime.drafters: a target whose steps are core.runtime.graphs' (CUDA graphs on a GPU; sim here) drafts
    with the graphed proposal, in the same mode, through the registry."""
    from core.runtime.graphs import GraphedSteps
    from drafter.registry import build_drafter
    from drafter.spec import DrafterSpec
    from lab.testing import QWEN3_TEMPLATE, make_target, tiny_qwen3
    from tests.test_lean import lean_target

    model = tiny_qwen3(vocab_size=64)
    target = lean_target(model)
    target.lean = GraphedSteps(target.lean, "sim", 8)
    plain_target = make_target(model, template=QWEN3_TEMPLATE, name="tiny-qwen3")
    target.name = plain_target.name
    drafter = build_drafter(DrafterSpec("flashmap", weights=str(folder)), target)
    assert isinstance(drafter, GraphedReleaseDrafter) and drafter.mode == "sim"
    gen = GenerationConfig(max_new_tokens=24, block_size=BLOCK)
    prompt = [5, 6, 7, 8, 9]
    plain, _ = generate_all(plain_target, prompt, gen)
    out, events = generate_all(target, prompt, gen, drafter)
    assert out == plain and any(ev.drafted for ev in events)


def test_sampled_output_through_the_static_proposal_keeps_the_target_distribution(tmp_path):
    """At T > 0 the proposal's q stays where the drafter runs and the engine's rejection reads it there: the joint
    distribution of two sampled tokens is the target's (chi-squared)."""
    from lab.testing import QWEN3_TEMPLATE, assert_sampled_distribution_exact, make_target, tiny_qwen3

    target = make_target(tiny_qwen3(vocab_size=5, seed=3), template=QWEN3_TEMPLATE, name="tiny-qwen3")
    folder = write_release(tmp_path / "v5", release_model(target, seed=2))
    drafter = GraphedReleaseDrafter(load_release_net(folder, target), target, mode="sim", capacity=8, min_span=4)
    assert_sampled_distribution_exact(target, drafter, n=1200)
