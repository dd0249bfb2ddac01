"""The fixed-shape steps of core.runtime.graphs (CUDA graphs on a GPU), exercised on the CPU without capture: the same
logits as the lean forward for plain steps, chains and trees, rollback by the cache's index, drafted output equal to
plain decoding, and the modes refused where they cannot run."""
import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.drafting.base import NgramDrafter
from core.runtime.forward import keep_positions, target_forward
from core.runtime.graphs import MIN_SPAN, SPARE_SLOTS, GraphedSteps, attend_span, resolve_graphs, visible_mask
from core.runtime.lean import LeanForward
from core.runtime.trie import build_trie
from lab.testing import tiny_llama, tiny_qwen3
from tests.test_engine import NoisyOracle
from tests.test_lean import lean_target


def graphed(model, min_span: int = MIN_SPAN):
    target = lean_target(model)
    eager = lean_target(model)
    target.lean = GraphedSteps(target.lean, "sim", min_span)
    return target, eager


def test_a_step_attends_over_the_smallest_doubling_span_that_covers_its_positions():
    assert [attend_span(end, 10_000) for end in (1, 1024, 1025, 3000, 4097)] == [1024, 1024, 2048, 4096, 8192]
    assert attend_span(9_000, 9_500) == 9_500 and attend_span(20, 200, min_span=16) == 32  # capped; a smaller floor


def test_steps_across_spans_give_the_lean_forwards_logits_and_drafted_equals_plain():
    model = tiny_qwen3(vocab_size=64, layers=2)
    target, eager = graphed(model, min_span=8)
    prompt = [5, 9, 12, 7, 30, 3, 8]
    with torch.inference_mode():
        cache, eager_cache = target.new_cache(80), eager.new_cache(80)
        target_forward(target, prompt, cache, (1,)), target_forward(eager, prompt, eager_cache, (1,))
        for ids in ([11], [3, 8, 8], [40], [1, 2, 3, 4, 5, 6], [7], *([[9, 10, 11, 12]] * 8)):
            got = target_forward(target, ids, cache, (1,))
            want = target_forward(eager, ids, eager_cache, (1,))
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert {key[3] for key in target.lean.steps} == {8, 16, 32, 64}  # each span its own step, up to 59 positions
    plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=60))
    drafted, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=60, block_size=6), NgramDrafter())
    assert drafted == plain


def test_the_mask_sees_the_cache_and_the_fed_rows_each_row_may_see():
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2 branches off the anchor
    mask = visible_mask(torch.tensor(4), tree, 10)  # (3, 10)
    assert mask[:, :4].all() and not mask[:, 7:].any()
    assert mask[:, 4:7].equal(tree)


@pytest.mark.parametrize("model", [tiny_llama(vocab_size=64, layers=2), tiny_qwen3(vocab_size=64, layers=2)],
                         ids=["llama", "qwen3"])
def test_fixed_shape_steps_give_the_lean_forwards_logits_and_roll_back_by_index(model):
    target, eager = graphed(model)
    layers = (0, 1, 2)
    prompt, chain = [5, 9, 12, 7, 30] * 6, [3, 8, 8, 21]
    trie = build_trie([[17, 4, 9], [17, 6], [25]], 8)
    with torch.inference_mode():
        cache, eager_cache = target.new_cache(64), eager.new_cache(64)
        assert cache is target.lean.cache and cache.capacity >= 64 + SPARE_SLOTS
        for ids, kw in [(prompt, {}), ([11], {}), (chain, {}), ([2, *trie.tokens], {"trie": trie}), ([40], {})]:
            got = target_forward(target, ids, cache, layers, **kw)
            want = target_forward(eager, ids, eager_cache, layers, **kw)
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
            keep_positions(cache, len(ids), [0, 1] if len(ids) > 1 else [0])  # roll back: the index moves
            keep_positions(eager_cache, len(ids), [0, 1] if len(ids) > 1 else [0])
            assert cache.length == eager_cache.length
        assert target.new_cache(32) is cache and cache.length == 0  # persistent, emptied
    assert {key[0] for key in target.lean.steps} == {1, 4, len(trie.tokens) + 1}  # one step per shape


def test_drafted_output_through_fixed_shape_steps_equals_plain_decoding():
    target, _ = graphed(tiny_qwen3(vocab_size=64, layers=2))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=40))
    for drafter in (NgramDrafter(), NoisyOracle(plain, corrupt=0.4, vocab=64, seed=2)):
        drafter.prompt_len = len(prompt)
        drafter.feature_layers = () if isinstance(drafter, NgramDrafter) else (1, 2)
        out, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=40, block_size=6), drafter)
        assert out == plain


def test_modes_that_cannot_run_are_refused_with_the_reason():
    target, _ = graphed(tiny_llama(vocab_size=64, layers=2))
    lean = target.lean.lean
    cpu = lean.device

    def mode(requested: str, forward=lean) -> str:  # (None: transformers' forward)
        return resolve_graphs(requested, cpu, forward is not None, getattr(forward, "fixed_order", False),
                              getattr(forward, "native", None) is not None)

    assert mode("auto") == "off" and mode("auto", None) == "off"  # a CPU: no graphs by default
    assert mode("sim") == "sim"
    with pytest.raises(ValueError, match="CUDA device"):
        mode("cuda")
    with pytest.raises(ValueError, match="lean forward"):
        mode("sim", None)
    bf16 = lean_target(tiny_llama(vocab_size=64, layers=2), dtype=torch.bfloat16).lean
    if bf16.fixed_order:
        with pytest.raises(ValueError, match="fixed-order"):
            mode("sim", bf16)
    with pytest.raises(ValueError, match="must be one of"):
        mode("always")


@pytest.mark.slow
def test_compiled_steps_trace_whole_and_give_the_eager_steps_logits():
    """GraphedSteps(compiled=True): each shape's step through torch.compile (fullgraph: no break left for a capture to
    trip on), here inductor's CPU code, with the lean forward's modules as a GPU runs them (weights "modules")."""
    import copy

    from core.runtime.lean import LeanForward
    from lab.testing import make_target

    model = tiny_qwen3(vocab_size=64, layers=2)
    target, eager = make_target(copy.deepcopy(model)), make_target(copy.deepcopy(model))
    target.lean = GraphedSteps(LeanForward(target.model, fixed_order=False, weights="modules"), "sim", 8,
                               compiled=True)
    eager.lean = LeanForward(eager.model, fixed_order=False, weights="modules")
    with torch.inference_mode():
        cache, eager_cache = target.new_cache(80), eager.new_cache(80)
        for ids in ([5, 9, 12, 7, 30], [11], [3, 8, 8], [40]):
            got = target_forward(target, ids, cache, (1,))
            want = target_forward(eager, ids, eager_cache, (1,))
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert target.lean.compiled and sorted(target.lean.steps) == [(1, (1,), 0, 8), (1, (1,), 0, 16), (3, (1,), 0, 16),
                                                                  (5, (1,), 0, 8)]  # (positions, layers, keep, span)


def test_the_persistent_cache_is_let_go_before_a_larger_one_is_made(monkeypatch):
    """The fixed-shape steps' cache grows by a new allocation: the old one (and the graphs over it) go first, so that
    the two are never held at once."""
    model = tiny_qwen3(vocab_size=64).eval()
    steps = GraphedSteps(LeanForward(model), "sim", min_span=4)
    held_when_made = []
    make = steps.lean.new_cache

    def recorded(capacity):
        held_when_made.append(steps.cache is not None)
        return make(capacity)

    monkeypatch.setattr(steps.lean, "new_cache", recorded)
    for capacity in (8, 8, 300, 1000):
        steps.new_cache(capacity)
    assert held_when_made == [False, False, False]  # three allocations, none beside the old cache
