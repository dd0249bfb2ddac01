"""The GPU's code path on the CPU: a tiny Qwen3-architecture target folder (SmolLM2's tokenizer from the embedded GGUF,
the Qwen3 chat format of tests/data/qwen3_chat_template.jinja) and a random drafter in the FlashMap release's format
(flashmap 0.1.0's own classes), for the app run as a GPU runs it: `--graphs sim --dtype fp32`, fixed-shape steps
and the graphed release proposal, in fp32 where those steps are exact."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

TEMPLATE = Path(__file__).resolve().parent / "data" / "qwen3_chat_template.jinja"
IM_END = 2  # <|im_end|> in SmolLM2's vocabulary: the Qwen3 format's end of a turn


def smollm2_tokenizer():
    """SmolLM2's tokenizer (from the embedded GGUF) with the Qwen3 chat format."""
    from transformers import AutoTokenizer

    from core.runtime.target import embedded_gguf_path

    path = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def write_qwen3_target(folder: Path, tokenizer, layers: int = 4, seed: int = 0) -> Qwen3ForCausalLM:
    """A random Qwen3ForCausalLM at tiny sizes over the tokenizer's vocabulary, saved as a Hugging Face folder."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=40960,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, eos_token_id=IM_END,
                      bos_token_id=IM_END, pad_token_id=IM_END, use_sliding_window=False)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peaked logits: replies with structure, and drafts that are sometimes right
    model.generation_config = GenerationConfig(eos_token_id=IM_END, pad_token_id=IM_END)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def write_folders(root: Path) -> tuple[Path, Path]:
    """(the target folder, the release drafter folder) under root: the drafter random in the release's architecture
    and format (flashmap 0.1.0's classes, saved as the package saves one; tests/test_flashmap_release.py)."""
    from tests.test_flashmap_release import release_model, write_release

    tokenizer = smollm2_tokenizer()
    target_folder = root / "qwen3-tiny"
    model = write_qwen3_target(target_folder, tokenizer)
    drafter = release_model(SimpleNamespace(model=model, vocab_size=len(tokenizer)), seed=5,
                            target_model=str(target_folder), block_size=8)
    return target_folder, write_release(root / "flashmap-tiny", drafter)
