"""The lean forward (core.runtime.lean) and its static cache, against transformers' forward; its batch invariance
(core.runtime.exactness) for each precision it offers as exact; and the engine through it."""
import copy

import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.runtime import native
from core.runtime.cpu_linear import amx_products, pack_linears
from core.runtime.exactness import check_invariance, probe_prompt
from core.runtime.forward import keep_positions, target_forward
from core.runtime.lean import KEY_BLOCK, PREFILL_ROWS, LeanForward, StaticCache, ancestor_columns, lean_supported
from core.runtime.target import NATIVE_BF16_CPU_FLAGS, TargetConfig, cpu_quant, pick_dtype
from core.runtime.threads import cpu_flags
from core.runtime.trie import ancestor_mask, build_trie, position_list, tree_positions
from lab.testing import QWEN3_TEMPLATE, make_target, tiny_llama, tiny_qwen3
from tests.test_engine import NoisyOracle

NATIVE_BF16 = bool(NATIVE_BF16_CPU_FLAGS & cpu_flags())


def native_step():
    """The compiled decode step (core.runtime.native), or skip the test with the reason it could not be built."""
    module, why = native.load()
    if module is None:
        pytest.skip(why)
    return module


def lean_target(model, weights: str = "packed", dtype=torch.float32, template=None, native_prefill=False):
    """A tiny target served by the lean forward: dtype, prepacked CPU linears, weights "packed", "q4" or
    "q4-native" (q4 with the compiled decode step, and its prefill too where native_prefill)."""
    model = copy.deepcopy(model).to(dtype)
    pack_linears(model)
    kwargs = {"template": template} if template else {}
    target = make_target(model, **kwargs)
    native_module = native_step() if weights == "q4-native" else None
    target.lean = LeanForward(model, weights=weights.removesuffix("-native"), native=native_module,
                              native_prefill=native_prefill)
    return target


def skip_unless_offered(weights: str) -> None:
    """bf16 products (packed, op-by-op q4) are offered on CPUs with native bf16 only (pick_dtype, cpu_quant); the
    native q4 step on every CPU it builds on."""
    if weights != "q4-native" and not NATIVE_BF16:
        pytest.skip("bf16 products are offered on CPUs with native bf16 only (pick_dtype); fp32 here")


def models():
    return [("llama", tiny_llama(vocab_size=64, layers=2)), ("qwen3", tiny_qwen3(vocab_size=64, layers=2))]


@pytest.mark.parametrize("name,model", models())
def test_lean_fp32_matches_transformers_prefill_steps_chain_and_tree(name, model):
    hf = make_target(model)
    lean = lean_target(model)
    layers = (0, 1, 2)  # embeddings, a middle layer and the last (normalised, as transformers records it)
    prompt, steps, chain = [5, 9, 12, 7, 30] * 6, [11, 40], [3, 8, 8, 21]  # a prompt longer than PREFILL_ROWS
    trie = build_trie([[17, 4, 9], [17, 6], [25]], 8)
    with torch.inference_mode():
        hf_cache, lean_cache = hf.new_cache(64), lean.new_cache(64)
        for ids, kw in [(prompt, {}), *[([s], {}) for s in steps], (chain, {}), ([2, *trie.tokens], {"trie": trie})]:
            want = target_forward(hf, ids, hf_cache, layers, **kw)
            got = target_forward(lean, ids, lean_cache, layers, **kw)
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
        assert lean_cache.length == hf_cache.get_seq_length() == len(prompt) + 2 + 4 + 1 + len(trie)


def test_static_cache_rewinds_by_moving_its_index_and_gathers_a_tree_path():
    cache = StaticCache.empty(n_layers=1, kv_heads=1, capacity=10, head_dim=2, dtype=torch.float32, device="cpu")
    assert cache.capacity == KEY_BLOCK  # whole key blocks
    fed = torch.arange(5.0)[None, :, None].expand(1, 5, 2)  # (G, T, D): position i holds i
    cache.write(0, fed, fed)
    cache.length = 5
    keep_positions(cache, 3, [0, 1])  # a chain: keep the anchor and one draft of the last 3
    assert cache.length == 4 and cache.keys[0][0, :4, 0].tolist() == [0, 1, 2, 3]
    cache.write(0, fed[:, :3] + 10, fed[:, :3] + 10)
    cache.length = 7
    keep_positions(cache, 3, [0, 2])  # a tree path: position 2 of the round moves next to the anchor
    assert cache.length == 6 and cache.keys[0][0, :6, 0].tolist() == [0, 1, 2, 3, 10, 12]
    with pytest.raises(RuntimeError, match="full"):
        cache.write(0, torch.zeros(1, KEY_BLOCK, 2), torch.zeros(1, KEY_BLOCK, 2))


def test_ancestor_columns_lay_out_each_tree_row_as_its_chain():
    trie = build_trie([[1, 2, 3], [1, 5], [6]], 8)  # nodes: 1, 2, 5, 3, 6 (parents first)
    visible = ancestor_mask(trie)  # (T, T) with the anchor as row 0
    index, valid, base = ancestor_columns(70, visible)
    assert base == KEY_BLOCK and index.shape[1] % KEY_BLOCK == 0
    cached = 70 - KEY_BLOCK
    for row in range(visible.shape[0]):
        seen = visible[row].nonzero().flatten().tolist()
        assert index[row, cached:cached + len(seen)].tolist() == [cached + j for j in seen]
        assert valid[row].sum() == cached + len(seen)


def test_unsupported_architectures_are_named():
    model = tiny_llama(vocab_size=64)
    model.config.hidden_act = "gelu"
    assert "activation" in lean_supported(model)
    with pytest.raises(ValueError, match="lean forward does not serve"):
        LeanForward(model)


def invariance_cases():
    cases = []
    for name, model in models():
        cases.append((f"{name}-bf16", model, "packed"))
        cases.append((f"{name}-q4", model, "q4"))
        cases.append((f"{name}-q4-native", model, "q4-native"))
    return cases


@pytest.mark.parametrize("label,model,weights", invariance_cases())
def test_offered_low_precisions_are_batch_invariant(label, model, weights):
    """One position alone = the same position among K + 1 chain positions = in a tree, bit for bit: what makes
    drafted output equal plain decoding in that precision whatever the near-ties."""
    skip_unless_offered(weights)
    target = lean_target(model, weights, torch.bfloat16)
    report = check_invariance(target, probe_prompt(target.vocab_size, 70), steps=80)  # crosses a key block
    if not report.exact and weights != "q4-native" and amx_products():
        pytest.skip(f"oneDNN multiplies bf16 with AMX here, which the app refuses: {report.describe()}")
    assert report.exact, report.describe()


def test_fp32_is_reported_honestly():
    """fp32 stays the reference; whether it is batch-invariant depends on the CPU's kernels, and the report says
    which (its largest difference is small either way)."""
    target = lean_target(tiny_llama(vocab_size=64), "packed", torch.float32)
    report = check_invariance(target, probe_prompt(64), steps=20)
    assert report.max_abs_diff < 1e-4
    assert ("not batch-invariant" in report.describe()) == (not report.exact)


@pytest.mark.parametrize("weights,native_prefill", [("packed", False), ("q4", False), ("q4-native", False),
                                                    ("q4-native", True)])
def test_speculative_equals_plain_through_the_lean_forward_in_low_precision(weights, native_prefill):
    skip_unless_offered(weights)
    target = lean_target(tiny_qwen3(vocab_size=64, layers=2), weights, torch.bfloat16, QWEN3_TEMPLATE, native_prefill)
    for seed, prompt in enumerate([[5, 6, 7, 8], [9, 30, 31], [12] * 7, list(range(4, 40))]):  # the last: a prefill
        plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=40))
        oracle = NoisyOracle(plain, corrupt=0.3, vocab=64, seed=seed)
        oracle.prompt_len, oracle.feature_layers = len(prompt), (1, 2)
        for k in (1, 4, 16):
            out, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=40, block_size=k), oracle)
            assert out == plain


def test_pick_dtype_takes_bf16_only_where_the_cpu_multiplies_it():
    cpu = torch.device("cpu")
    assert pick_dtype("auto", cpu, {"avx2", "fma"}) == torch.float32
    assert pick_dtype("auto", cpu, {"avx2", "avx512_bf16"}) == torch.bfloat16
    assert pick_dtype("auto", cpu, {"amx_bf16"}) == torch.bfloat16
    assert pick_dtype("fp32", cpu, {"amx_bf16"}) == torch.float32


def test_q4_is_the_cpu_default_where_bf16_is_native_or_the_native_step_builds():
    cpu, cfg = torch.device("cpu"), TargetConfig()  # the embedded default, --quant auto
    avx2, avx512_bf16 = {"avx2", "fma"}, {"avx2", "avx512_bf16"}
    assert cpu_quant(cfg, cpu, avx512_bf16, native_step=lambda: False) == "q4"  # op by op if need be
    assert cpu_quant(cfg, cpu, avx2, native_step=lambda: True) == "q4"  # the step's integer products
    assert cpu_quant(cfg, cpu, avx2, native_step=lambda: False) == "auto"  # emulated bf16: fp32 instead
    assert cpu_quant(TargetConfig(dtype="fp32"), cpu, avx2, native_step=lambda: True) == "auto"
    assert cpu_quant(TargetConfig(cpu_precision="reference"), cpu, avx512_bf16, native_step=lambda: True) == "auto"


def test_the_drafter_tools_keep_the_reference_forward_on_a_cpu(tmp_path):
    """Training data, features and offline records are made with the fp32 transformers forward they always were;
    the app and the bench take the fastest exact precision."""
    from core.runtime.target import TargetConfig, load_target
    from lab.testing import tiny_tokenizer

    tiny_qwen3(vocab_size=64).save_pretrained(tmp_path)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(tmp_path)
    reference = load_target(TargetConfig(str(tmp_path), device="cpu", cpu_precision="reference", cache_dir=""))
    assert reference.model.dtype == torch.float32 and reference.lean is None
    fastest = load_target(TargetConfig(str(tmp_path), device="cpu", cache_dir=""))
    assert fastest.lean is not None
    # bf16 may fail the check there and be replaced by fp32 under auto (core.runtime.target._checked)
    if amx_products():
        assert fastest.model.dtype in (torch.bfloat16, torch.float32)
    else:
        assert fastest.model.dtype == (torch.bfloat16 if NATIVE_BF16 else torch.float32)


def test_a_precision_that_fails_the_check_is_refused_when_asked_and_replaced_under_auto(tmp_path, monkeypatch):
    from core.runtime import exactness
    from core.runtime.exactness import InvarianceReport
    from core.runtime.target import TargetConfig, TargetLoadError, load_target
    from lab.testing import tiny_tokenizer

    tiny_qwen3(vocab_size=64).save_pretrained(tmp_path)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(tmp_path)
    failing = lambda target, prompt, steps=48: InvarianceReport(  # noqa: E731
        str(target.model.dtype), 48, 0 if target.model.dtype != torch.float32 else 96, 0, 0.5)
    monkeypatch.setattr(exactness, "check_invariance", failing)
    monkeypatch.setattr("core.runtime.target.pick_dtype", lambda requested, device, flags=None: torch.bfloat16
                        if requested in ("auto", "bf16") else torch.float32)
    with pytest.raises(TargetLoadError, match="--dtype bf16 cannot run exactly.*not batch-invariant"):
        load_target(TargetConfig(str(tmp_path), device="cpu", dtype="bf16", cache_dir=""))
    fallback = load_target(TargetConfig(str(tmp_path), device="cpu", cache_dir=""))
    assert fallback.model.dtype == torch.float32 and "fp32" in fallback.precision


@pytest.mark.parametrize("name,model", models())
def test_the_native_step_computes_the_q4_forward(name, model):
    """The compiled step (fp32 residual, its own exp and sums) against the op-by-op q4 forward: the same logits and
    hidden states up to bf16 rounding, for steps, a chain and a tree, after a prefill the two share."""
    python, compiled = lean_target(model, "q4", torch.bfloat16), lean_target(model, "q4-native", torch.bfloat16)
    caches = [t.lean.new_cache(128) for t in (python, compiled)]
    prompt = torch.tensor(probe_prompt(64, 30))
    trie = build_trie([[7, 8, 9], [7, 10], [11]], budget=8)
    visible = ancestor_mask(trie)  # (1 + N, 1 + N): the anchor, then the nodes
    feeds = [(torch.tensor([5]), None, None), (torch.tensor([6, 7, 8, 9, 10]), None, None),
             (torch.tensor([12, *trie.tokens]), visible, tree_positions(trie, 36, "cpu"))]  # 36 cached by then
    with torch.no_grad():
        for target, cache in zip((python, compiled), caches):
            target.lean(prompt, cache)  # > 17 positions: the shared prefill path
        for ids, block, positions in feeds:
            out = [t.lean(ids, c, layers=(0, 1, 2), block_visible=block, positions=positions)
                   for t, c in zip((python, compiled), caches)]
            (logits_py, states_py), (logits_native, states_native) = out
            assert torch.allclose(logits_native.float(), logits_py.float(), atol=0.008, rtol=0), name
            assert torch.allclose(states_native.float(), states_py.float(), atol=0.04, rtol=0.02), name


@pytest.mark.parametrize("name,model", models())
def test_the_one_call_step_computes_what_the_step_with_its_tensors_made_in_python_does(name, model):
    """ids as a list take LeanForward.native_step (embedding, rotary rows, causal mask, layers, LM head and features
    in one native call): bit for bit the logits, features and cache of the same forward fed a tensor of ids, for a
    step, a chain, a tree, every `keep` and feature layers from the embeddings (0) to the normalised last (2)."""
    target = lean_target(model, "q4-native", torch.bfloat16)
    assert target.lean._steps
    caches = [target.lean.new_cache(128) for _ in range(2)]
    trie = build_trie([[7, 8, 9], [7, 10], [11]], budget=8)
    feeds = [([5], None), ([6, 7, 8, 9, 10], None), ([12, *trie.tokens], ancestor_mask(trie))]
    with torch.no_grad():
        for cache in caches:
            target.lean(torch.tensor(probe_prompt(64, 30)), cache)
        for layers, keep in (((), 0), ((0, 1, 2), 0), ((2,), 1), ((1,), 0)):
            for ids, block in feeds:
                positions = None if block is None else tree_positions(trie, caches[0].length, "cpu")
                as_tensor = target.lean(torch.tensor(ids), caches[0], layers, keep, block, positions)
                as_list = target.lean(ids, caches[1], layers, keep, block, positions)
                assert caches[0].length == caches[1].length
                assert torch.equal(as_list[0], as_tensor[0]), (name, layers, keep, ids)
                assert (as_list[1] is None) == (as_tensor[1] is None) == (not layers)
                assert not layers or torch.equal(as_list[1], as_tensor[1])
    for by_tensor, by_list in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        assert torch.equal(by_tensor, by_list)


def test_a_tree_round_s_kept_path_moves_into_place_natively_as_the_python_gather_moves_it():
    """StaticCache.keep after a tree forward through the one-call step: the native keep_rows leaves every layer's keys
    and values exactly as the indexed copies in Python leave them, for a path through the second branch (kept
    [0, 2, 4]), and moves nothing for a prefix; tree positions given as ints feed the same forward as a tensor of
    them."""
    target = lean_target(tiny_llama(vocab_size=64, layers=2), "q4-native", torch.bfloat16)
    trie = build_trie([[7, 8], [9, 10, 11]], budget=8)  # nodes 7, 9, 8, 10, 11: the path 9 -> 10 sits at 2, 4
    caches = [target.lean.new_cache(128) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            target.lean(torch.tensor(probe_prompt(64, 30)), cache)
            target.lean([5], cache)  # a one-call step: the cache now has its native handles
        assert caches[0].move_rows is not None
        caches[1].move_rows = None  # the Python gather
        past = caches[0].length
        block = [12, *trie.tokens]
        as_ints = target.lean(block, caches[0], (), 0, ancestor_mask(trie), position_list(trie, past))
        as_tensor = target.lean(block, caches[1], (), 0, ancestor_mask(trie), tree_positions(trie, past, "cpu"))
        assert torch.equal(as_ints[0], as_tensor[0])
        for cache in caches:
            cache.keep(len(block), [0, 2, 4])
    assert caches[0].length == caches[1].length == past + 3
    for native_kept, python_kept in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        assert torch.equal(native_kept, python_kept)
    before = [t.clone() for t in caches[0].keys]
    caches[0].length += 2
    caches[0].keep(2, [0])  # a prefix: only the length moves
    assert caches[0].length == past + 4 and all(torch.equal(a, b) for a, b in zip(before, caches[0].keys))


@pytest.mark.parametrize("name,model", models())
def test_a_native_prefill_in_chunks_computes_the_op_by_op_prefill(name, model):
    """native_prefill: a prompt longer than a verify round runs through the native step a round's worth of positions
    at a time, each chunk attending to those cached before it: the logits and states of the op-by-op q4 forward fed
    the same chunks (the op-by-op prefill multiplies by the bf16 weights instead) up to bf16 rounding, and the cache
    left where a one-call prefill leaves it."""
    python = lean_target(model, "q4", torch.bfloat16)
    chunked = lean_target(model, "q4-native", torch.bfloat16, native_prefill=True)
    prompt = torch.tensor(probe_prompt(64, 2 * PREFILL_ROWS + 5))  # three chunks, the last a short one
    caches = [t.lean.new_cache(128) for t in (python, chunked)]
    with torch.no_grad():
        by_chunk = [python.lean(prompt[i : i + PREFILL_ROWS], caches[0], layers=(0, 1, 2))
                    for i in range(0, len(prompt), PREFILL_ROWS)]
        logits_py, states_py = (torch.cat(parts) for parts in zip(*by_chunk))
        logits_native, states_native = chunked.lean(prompt, caches[1], layers=(0, 1, 2))
        assert caches[0].length == caches[1].length == len(prompt)
        (next_py, _), (next_native, _) = [t.lean(torch.tensor([5]), c) for t, c in zip((python, chunked), caches)]
    assert logits_native.shape == logits_py.shape and states_native.shape == states_py.shape
    assert torch.allclose(logits_native.float(), logits_py.float(), atol=0.008, rtol=0), name
    assert torch.allclose(states_native.float(), states_py.float(), atol=0.04, rtol=0.02), name
    assert torch.allclose(next_native.float(), next_py.float(), atol=0.008, rtol=0), name
