"""Test helpers: tiny random targets for fast CPU tests (a few layers, a small word-level vocabulary),
round events, and the exactness check at T > 0. Importable from tests and scripts alike."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from core.decoding.engine import GenerationConfig, RoundEvent, generate_all
from core.runtime.target import Target
from core.verification.sampling import SamplingConfig

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
    " nothink{% endif %}{% endif %}"
)


def tiny_tokenizer(vocab_size: int, template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: ids 0..3 are specials, the rest are words w4, w5, ... plus chat words."""
    words = ["<unk>", "<eos>", "<pad>", "<bos>", "<system>", "<user>", "<assistant>", "nothink"]
    words += [f"w{i}" for i in range(len(words), vocab_size)]
    vocab = {w: i for i, w in enumerate(words[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = template
    return fast


def tiny_llama(vocab_size: int = 64, layers: int = 2, seed: int = 0, scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, eos_token_id=1,
        bos_token_id=3, pad_token_id=2, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # sharper logits make the T>0 tests informative
    return model


def tiny_qwen3(vocab_size: int = 64, layers: int = 4, seed: int = 0) -> Qwen3ForCausalLM:
    """Real Qwen3 config fields, tiny sizes."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=False, eos_token_id=1, bos_token_id=3, pad_token_id=2, use_sliding_window=False,
    )
    return Qwen3ForCausalLM(cfg).eval()


def make_target(model, eos: tuple[int, ...] = (), template: str = CHAT_TEMPLATE, name: str = "tiny") -> Target:
    tokenizer = tiny_tokenizer(model.config.vocab_size, template)
    return Target(model, tokenizer, name, torch.device("cpu"), eos)


def exact_joint_23(target: Target, prompt: list[int]) -> torch.Tensor:
    """Exact target probability (T=1) of output tokens 2 and 3, marginal over token 1. (V*V,)"""
    return exact_joint_last_two(target, prompt, 3)


def exact_joint_last_two(target: Target, prompt: list[int], tokens: int) -> torch.Tensor:
    """Exact target probability (T=1) of output tokens `tokens` - 1 and `tokens` (counted from 1), marginal over the
    ones before them: every prefix of tokens - 2 outputs enumerated (V^(tokens-2) of them). (V*V,)"""
    model, v = target.model, target.vocab_size

    def next_probs(ids):
        return torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)

    with torch.no_grad():
        prefixes: dict[tuple[int, ...], float] = {(): 1.0}  # output prefix -> its probability
        for _ in range(tokens - 2):
            prefixes = {prefix + (y,): weight * float(p) for prefix, weight in prefixes.items()
                        for y, p in enumerate(next_probs(prompt + list(prefix)))}
        joint = torch.zeros(v, v, dtype=torch.float64)
        for prefix, weight in prefixes.items():
            first = next_probs(prompt + list(prefix))
            for y in range(v):
                joint[y] += weight * first[y] * next_probs(prompt + [*prefix, y])
    return joint.flatten()


def assert_sampled_distribution_exact(target: Target, drafter, prompt=(4, 3), n: int = 1500,
                                      verify_cost: tuple[float, ...] = (), tokens: int = 3,
                                      block_size: int = 2) -> None:
    """Chi-square: the last two of `tokens` output tokens (2-3 by default) come from drafted, verified rounds (blocks of
    up to `block_size`); they must follow the target."""
    from scipy.stats import chisquare

    v = target.vocab_size
    exact = exact_joint_last_two(target, list(prompt), tokens).numpy()
    assert exact.max() < 0.5, "the tiny target must not be near-deterministic"
    counts = np.zeros(v * v)
    for seed in range(n):
        gen = GenerationConfig(max_new_tokens=tokens, block_size=block_size, sampling=SamplingConfig(1.0), seed=seed,
                               verify_cost=verify_cost)
        out, _ = generate_all(target, list(prompt), gen, drafter)
        counts[out[tokens - 2] * v + out[tokens - 1]] += 1
    keep = exact * n >= 5
    expected = exact[keep] * n
    observed = counts[keep]
    expected *= observed.sum() / expected.sum()
    assert chisquare(observed, expected).pvalue > 1e-3, getattr(drafter, "name", drafter)


def load_or_refused(cfg):
    """load_target for a low precision this CPU may refuse: the target, or None where the check found it not
    batch-invariant, which is allowed only where oneDNN multiplies bf16 with AMX (core.runtime.cpu_linear.amx_products);
    anywhere else a refusal fails the test."""
    from core.runtime.cpu_linear import amx_products
    from core.runtime.target import TargetLoadError, load_target

    try:
        return load_target(cfg)
    except TargetLoadError as err:
        if "not batch-invariant" not in str(err) or not amx_products():
            raise
        return None


def event(**fields) -> RoundEvent:
    """A RoundEvent for tests: a round that drafted nothing, with `fields` overriding."""
    base = dict(kind="round", drafted=(), n_accepted=0, target_token=0, committed=(), text="", draft_s=0.0,
                verify_s=0.0)
    return RoundEvent(**{**base, **fields})


def alternating(events):
    """The events, each asked for from the other of two threads in turn, as a server resumes a stream."""
    workers = [ThreadPoolExecutor(1, thread_name_prefix=f"resume-{i}") for i in range(2)]
    try:
        turn = 0
        while True:
            ev = workers[turn % 2].submit(next, events, None).result()
            if ev is None:
                return
            yield ev
            turn += 1
    finally:
        for worker in workers:
            worker.shutdown()
