import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.runtime import fp8
from core.runtime import target as target_mod
from core.runtime.target import TargetConfig, TargetLoadError, load_target
from lab.testing import QWEN3_TEMPLATE, load_or_refused, tiny_qwen3, tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_qwen3().save_pretrained(folder)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(folder)
    return folder


def test_local_folder_loads_with_dtype(tiny_folder):
    target = load_or_refused(TargetConfig(str(tiny_folder), dtype="bf16", device="cpu"))
    if target is None:  # refused where oneDNN multiplies bf16 with AMX: fp32 as asked instead
        target = load_target(TargetConfig(str(tiny_folder), dtype="fp32", device="cpu"))
    else:
        assert target.model.dtype == torch.bfloat16
    assert target.device.type == "cpu"
    assert target.identity["model_type"] == "qwen3" and target.identity["vocab_size"] == 64
    out, _ = generate_all(target, [5, 6, 7], GenerationConfig(max_new_tokens=5))
    assert len(out) <= 5


def test_chat_template_passes_enable_thinking(tiny_folder):
    target = load_target(TargetConfig(str(tiny_folder), device="cpu"))
    assert target.supports_thinking()
    msgs = [{"role": "user", "content": "w10 w11"}]
    off, on = target.chat_ids(msgs, enable_thinking=False), target.chat_ids(msgs, enable_thinking=True)
    assert target.tokenizer.convert_tokens_to_ids("nothink") in off and len(on) == len(off) - 1


def test_missing_model_is_a_clear_offline_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(TargetLoadError, match="neither a local folder nor in the Hugging Face cache"):
        load_target(TargetConfig("nobody/does-not-exist-7b"))


def test_quantisation_needs_cuda_and_fp8_needs_ada(tiny_folder, monkeypatch):
    with pytest.raises(TargetLoadError, match="needs a CUDA GPU"):
        load_target(TargetConfig(str(tiny_folder), quant="8bit", device="cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    with pytest.raises(TargetLoadError, match="compute capability >= 8.9"):
        target_mod.check_quant_supported("fp8", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(fp8, "probe_product", lambda device: None)
    target_mod.check_quant_supported("fp8", torch.device("cuda"))
    monkeypatch.setattr(fp8, "probe_product", lambda device: "no row-wise FP8 product here")
    with pytest.raises(TargetLoadError, match="no row-wise FP8 product here. Use --quant 8bit"):
        target_mod.check_quant_supported("fp8", torch.device("cuda"))


def test_int8_needs_a_gpu_and_triton_and_loads_each_linear_as_int8_codes(tiny_folder, monkeypatch):
    from core.runtime import w8

    with pytest.raises(TargetLoadError, match="needs a CUDA GPU"):
        load_target(TargetConfig(str(tiny_folder), quant="int8", device="cpu"))
    monkeypatch.setattr(w8, "triton_available", lambda: False)
    with pytest.raises(TargetLoadError, match="Triton is not installed here"):
        target_mod.check_quant_supported("int8", torch.device("cuda"))
    # the loading path itself, here on the CPU (the kernel's torch product) with the GPU's checks passed
    monkeypatch.setattr(target_mod, "check_quant_supported", lambda quant, device: None)
    cfg = TargetConfig(str(tiny_folder), quant="int8", dtype="fp32", engine="transformers")
    target = target_mod._load_hf(cfg, torch.device("cpu"), torch.float32)
    linears = [m for m in target.model.modules() if isinstance(m, w8.W8Linear)]
    assert len(linears) == 7 * target.model.config.num_hidden_layers  # q, k, v, o, gate, up, down
    assert target_mod._weights(cfg, torch.bfloat16, target).startswith("int8 weights")
    out, _ = generate_all(target, [5, 6, 7], GenerationConfig(max_new_tokens=6))
    assert len(out) == 6


def test_a_prequantised_fp8_checkpoint_without_the_kernels_package_is_refused_before_loading(monkeypatch):
    import transformers.utils

    config = tiny_qwen3().config
    target_mod.check_prequantised_fp8(config)  # a bf16 checkpoint: quantised by core.runtime.fp8, nothing to fetch
    config.quantization_config = {"quant_method": "fp8"}
    monkeypatch.setattr(transformers.utils, "is_kernels_available", lambda: False)
    with pytest.raises(TargetLoadError, match="kernels.*--quant fp8"):
        target_mod.check_prequantised_fp8(config)
    monkeypatch.setattr(transformers.utils, "is_kernels_available", lambda: True)
    target_mod.check_prequantised_fp8(config)


def test_weights_that_do_not_fit_are_refused_before_loading(tiny_folder, monkeypatch):
    monkeypatch.setattr(target_mod, "free_memory_bytes", lambda device: 1000)
    with pytest.raises(TargetLoadError, match="GiB on cpu but only"):
        load_target(TargetConfig(str(tiny_folder), device="cpu"))


def test_bad_flags_are_refused():
    with pytest.raises(ValueError, match="--quant"):
        TargetConfig(quant="int3")
    with pytest.raises(ValueError, match="--dtype"):
        TargetConfig(dtype="fp64")
    if not torch.cuda.is_available():
        with pytest.raises(TargetLoadError, match="no CUDA GPU"):
            target_mod.pick_device("cuda")


def test_weight_estimate_matches_qwen3_8b_facts():
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
    assert 16.0e9 < target_mod.estimate_weight_bytes(cfg, torch.bfloat16, "none") < 16.8e9
    assert 8.5e9 < target_mod.estimate_weight_bytes(cfg, torch.bfloat16, "fp8") < 10.0e9


@pytest.mark.slow
def test_embedded_default_loads_offline_and_chats(embedded_target):
    ids = embedded_target.chat_ids([{"role": "user", "content": "What is 2+2?"}])
    out, events = generate_all(embedded_target, ids, GenerationConfig(max_new_tokens=24))
    assert embedded_target.identity["vocab_size"] == 49152
    assert "4" in events[-1].text


def test_decode_takes_the_rust_backend_only_where_it_returns_the_tokenizers_text(embedded_target):
    """Target.decode reads the fast tokenizer's backend directly where transformers' decode would return its text
    unchanged (no space clean-up): every span of a reply with specials, multi-byte characters and blank lines decodes
    as the tokenizer decodes it. A tokenizer that cleans up spaces keeps its own decode."""
    tokenizer = embedded_target.tokenizer
    ids = tokenizer("Héllo there,  a sentence 😀 about\n\n the sea. <|im_end|> Done.")["input_ids"]
    assert embedded_target._decoder == tokenizer.backend_tokenizer.decode
    for start in range(len(ids)):
        for end in range(start, len(ids) + 1):
            assert embedded_target.decode(ids[start:end]) == tokenizer.decode(ids[start:end], skip_special_tokens=True)
    cleaning = tiny_tokenizer(64)
    cleaning.clean_up_tokenization_spaces = True
    target = target_mod.Target(tiny_qwen3(), cleaning, "tiny", torch.device("cpu"), (1,))
    assert target._decoder == cleaning.decode


def test_the_prefill_runs_through_the_native_step_where_its_products_are_integer_or_bf16_is_not_native():
    """native_prefill: AVX2-only CPUs and AVX512-VNNI ones (integer products, no AMX) prefill through the step, which
    keeps the prefill batch-invariant (core.decoding.prefix reuses it); AVX512-BF16 with the step's bf16 products, or
    AMX,
    prefill op by op."""
    from types import SimpleNamespace

    integer, pairs = SimpleNamespace(ACTIVATIONS="8-bit"), SimpleNamespace(ACTIVATIONS="bf16")
    assert target_mod.native_prefill(integer, frozenset({"avx2"}))
    assert target_mod.native_prefill(integer, frozenset({"avx2", "avx512_vnni", "avx512_bf16"}))
    assert not target_mod.native_prefill(pairs, frozenset({"avx512_bf16"}))
    assert not target_mod.native_prefill(integer, frozenset({"avx512_vnni", "avx512_bf16", "amx_bf16"}))
    assert target_mod.native_prefill(pairs, frozenset({"avx2"}))  # fp32 products, no bf16 in hardware
    assert not target_mod.native_prefill(None, frozenset({"avx512_bf16"}))


def test_the_embedded_defaults_text_side_loads_alone_and_formats_as_the_loaded_target(embedded_target):
    """load_served_target (what `--backend vllm` reads): the GGUF's tokenizer, chat template and config without its
    weights, formatting a chat and ending a reply as the loaded target does."""
    served = target_mod.load_served_target(TargetConfig(), "http://127.0.0.1:8000")
    messages = [{"role": "user", "content": "Name three primes."}]
    assert served.model is None and served.chat_ids(messages) == embedded_target.chat_ids(messages)
    assert served.eos_token_ids == embedded_target.eos_token_ids and served.identity == embedded_target.identity
    assert "http://127.0.0.1:8000" in served.precision


def test_an_fp8_the_card_refuses_falls_back_to_the_next_precision_with_a_line_saying_so(monkeypatch, capsys):
    from core.runtime.target import supported_quant

    cuda = torch.device("cuda")
    monkeypatch.setattr(fp8, "why_not_fp8", lambda device: "FP8 needs compute capability 8.9, this GPU has 8.6")
    assert supported_quant("fp8", cuda) == "8bit"
    out = capsys.readouterr().out
    assert "compute capability 8.9" in out and "--quant 8bit instead" in out
    monkeypatch.setattr(fp8, "why_not_fp8", lambda device: None)
    assert supported_quant("fp8", cuda) == "fp8" and supported_quant("none", cuda) == "none"
    with pytest.raises(TargetLoadError, match="needs a CUDA GPU"):
        supported_quant("fp8", torch.device("cpu"))  # nothing to fall back to off a GPU


def test_weights_that_stay_in_their_precision_load_straight_onto_the_card():
    from core.runtime.target import pretrained_kwargs

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pretrained_kwargs("none", cuda, torch.bfloat16, True)["device_map"] == {"": cuda}
    assert "device_map" not in pretrained_kwargs("none", cpu, torch.float32, True)
    assert pretrained_kwargs("8bit", cuda, torch.bfloat16, True)["device_map"] == {"": cuda}
    for host_first in ("fp8", "int8"):  # read on the host, each linear quantised onto the card as it goes
        assert "device_map" not in pretrained_kwargs(host_first, cuda, torch.bfloat16, True)
    assert all(kwargs["use_safetensors"] for kwargs in (pretrained_kwargs(q, cuda, torch.bfloat16, False)
                                                         for q in ("none", "fp8", "8bit", "int8")))


def test_the_forward_plan_is_resolved_and_validated_once_and_read_by_the_memory_plan(tmp_path):
    from core.runtime.plan import plan_rows
    from core.runtime.target import ForwardPlan, forward_plan

    qwen3 = tiny_qwen3().config
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    plan = forward_plan(TargetConfig("x", graphs="sim", context=4096), cpu, torch.float32, qwen3)
    assert plan == ForwardPlan(cpu, torch.float32, "auto", "lean", "sim", "onednn", 4096)
    assert forward_plan(TargetConfig("x"), cuda, torch.bfloat16, qwen3).graphs == "cuda"  # auto: graphs on a GPU
    assert forward_plan(TargetConfig("x"), cpu, torch.bfloat16, qwen3).graphs == "off"
    assert forward_plan(TargetConfig("x", engine="transformers"), cuda, torch.bfloat16, qwen3).engine == "transformers"
    refused = [(TargetConfig("x", graphs="sim"), cpu, torch.bfloat16, "fixed-order"),  # exact only in a fixed order
               (TargetConfig("x", graphs="sim", quant="q4"), cpu, torch.bfloat16, "native step"),
               (TargetConfig("x", graphs="cuda"), cpu, torch.float32, "CUDA device"),
               (TargetConfig("x", graphs="sim", engine="transformers"), cpu, torch.float32, "lean forward")]
    for cfg, device, dtype, why in refused:
        with pytest.raises(TargetLoadError, match=why):
            forward_plan(cfg, device, dtype, qwen3)
    rows = forward_plan(TargetConfig("x", quant="fp8", context=2048), cuda, torch.bfloat16, qwen3).memory_rows(qwen3, 0)
    assert rows == plan_rows(qwen3, "fp8", 2048, 0)
    folder = tmp_path / "qwen3"
    tiny_qwen3().save_pretrained(folder)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(folder)
    target = load_target(TargetConfig(str(folder), graphs="sim", dtype="fp32", context=300, cache_dir=str(tmp_path)))
    assert target.plan.graphs == "sim" and target.plan.engine == "lean" and target.max_positions == 300


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_the_precisions_auto_tries_are_casts_of_one_read_and_the_one_kept_is_what_a_direct_load_reads(
        tmp_path, monkeypatch, capsys, stored):
    """--quant and --dtype auto on a CPU try q4, then bf16, then fp32, keeping the first that is exact here: the
    weights are read from disk once (in the widest precision a rung needs, or the checkpoint's own where every rung
    is at least as wide), each rung is set up on a copy cast from that read, and the one kept holds bit for bit the
    weights a direct load in its precision reads."""
    from transformers import AutoModelForCausalLM

    from core.runtime import exactness
    from core.runtime.exactness import InvarianceReport

    folder = tmp_path / "qwen3"
    tiny_qwen3().to(stored).save_pretrained(folder)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(folder)
    checked = []

    def only_fp32_exact(target, prompt, steps=48):
        checked.append("q4" if getattr(target.lean, "weights", None) == "q4" else str(target.model.dtype))
        exact = target.model.dtype == torch.float32
        return InvarianceReport(str(target.model.dtype), 48, 96 if exact else 0, 48 if exact else 0, 0 if exact else .5)

    monkeypatch.setattr(exactness, "check_invariance", only_fp32_exact)
    monkeypatch.setattr(target_mod, "pick_dtype", lambda requested, device, flags=None: torch.bfloat16
                        if requested in ("auto", "bf16") else torch.float32)
    monkeypatch.setattr(target_mod, "cpu_quant", lambda cfg, device, *args, **kwargs:
                        "q4" if cfg.quant == "auto" else cfg.quant)  # as on a CPU with int4 kernels
    read = AutoModelForCausalLM.from_pretrained
    reads = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: reads.append(kwargs["dtype"]) or read(*args, **kwargs))
    target = load_target(TargetConfig(str(folder), device="cpu", cache_dir=""))
    assert checked == ["q4", "torch.bfloat16", "torch.float32"] and target.model.dtype == torch.float32
    assert reads == [stored], "the weights were read more than once, or in a precision that loses bits"
    out = capsys.readouterr().out
    assert "q4" in out and "not batch-invariant" in out and "fp32" in out  # each step down said
    direct = read(folder, dtype=torch.float32).state_dict()
    kept = target.model.state_dict()
    assert kept.keys() == direct.keys()
    assert all(kept[name].dtype == direct[name].dtype and torch.equal(kept[name], direct[name]) for name in direct)
    # a rung that is exact is kept, in its own precision, and no further rung is set up
    checked.clear()
    monkeypatch.setattr(exactness, "check_invariance", lambda target, prompt, steps=48: checked.append(
        str(target.model.dtype)) or InvarianceReport(str(target.model.dtype), 48, 96, 48, 0))
    bf16 = load_target(TargetConfig(str(folder), device="cpu", quant="none", cache_dir=""))
    assert checked == ["torch.bfloat16"] and bf16.model.dtype == torch.bfloat16
    direct = read(folder, dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(bf16.model.state_dict()[name], direct[name]) for name in direct)


def test_the_ladder_tries_lower_precisions_only_under_auto(monkeypatch):
    """--quant q4 or --dtype bf16 asked for is a ladder of one (refused where it is not exact); auto on a CPU steps
    down to fp32."""
    from core.runtime.target import precision_ladder

    cpu = torch.device("cpu")
    monkeypatch.setattr(target_mod, "pick_dtype", lambda requested, device, flags=None: torch.bfloat16
                        if requested in ("auto", "bf16") else torch.float32)
    monkeypatch.setattr(target_mod, "cpu_quant", lambda cfg, device, *args, **kwargs:
                        "q4" if cfg.quant == "auto" else cfg.quant)
    rungs = lambda cfg: [(rung.quant, rung.dtype) for rung in precision_ladder(cfg, cpu)]  # noqa: E731
    assert rungs(TargetConfig()) == [("q4", "auto"), ("none", "auto"), ("none", "fp32")]
    assert rungs(TargetConfig(quant="q4")) == [("q4", "auto")]
    assert rungs(TargetConfig(dtype="bf16")) == [("q4", "bf16"), ("none", "bf16")]
    assert rungs(TargetConfig(quant="none", dtype="bf16")) == [("none", "bf16")]
    assert rungs(TargetConfig(quant="none")) == [("none", "auto"), ("none", "fp32")]
    assert rungs(TargetConfig(dtype="fp32", quant="none")) == [("none", "fp32")]
    assert rungs(TargetConfig(quant="auto")) == rungs(TargetConfig())


def test_a_rung_auto_cannot_set_up_here_gives_way_to_the_next(tmp_path, monkeypatch, capsys):
    """--graphs sim under auto: q4 has no fixed-shape steps and bf16's are not exact on a CPU, so fp32 serves (as
    before the ladder, where a q4 that could not load fell back to the dense precisions)."""
    folder = tmp_path / "qwen3"
    tiny_qwen3().save_pretrained(folder)
    tiny_tokenizer(64, QWEN3_TEMPLATE).save_pretrained(folder)
    monkeypatch.setattr(target_mod, "pick_dtype", lambda requested, device, flags=None: torch.bfloat16
                        if requested in ("auto", "bf16") else torch.float32)
    monkeypatch.setattr(target_mod, "cpu_quant", lambda cfg, device, *args, **kwargs:
                        "q4" if cfg.quant == "auto" else cfg.quant)
    target = load_target(TargetConfig(str(folder), device="cpu", graphs="sim", cache_dir=""))
    assert target.model.dtype == torch.float32 and target.plan.graphs == "sim" and target.plan.quant == "none"
    out = capsys.readouterr().out
    assert "trying bf16 weights" in out and "trying fp32 weights" in out  # each step down said, with why
