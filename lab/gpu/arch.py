"""Command 1: Qwen3-8B's architecture on real hardware with random weights (no download can happen
there), and CUDA exactness of the engine on tiny models. In --cpu-sim every size shrinks to a tiny
random Qwen3 so the same code runs in the test suite.

Shape letters: T = new positions in one forward, K = block size, F = drafter feature width.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from app import bench
from core.decoding.engine import GenerationConfig, generate_all
from core.decoding.stats import AcceptanceStats
from core.drafting.base import MAX_BLOCK_SIZE, Draft, NgramDrafter
from core.runtime.plan import (
    QWEN3_FACTS,
    RELEASED_FLASHMAP_DIT,
    WORKING_BYTES,
    estimate_weight_bytes,
    facts_config,
    flashmap_drafter_bytes,
    kv_cache_bytes,
    plan_memory,
)
from core.runtime.target import Target, TargetConfig, load_target
from core.runtime.verify_cost import synchronize as sync
from core.runtime.verify_cost import verify_cost
from drafter.networks.dflash import assumed_layout
from lab.gpu.stages import Command

GIB = 2**30
QWEN3_8B = "Qwen/Qwen3-8B"
TINY_FACTS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, tie_word_embeddings=False)
ORACLE_RATES = (0.6, 0.8, 0.9, 1.0)
ORACLE_BLOCKS = (8, 16)


def sizes(cmd: Command) -> dict:
    """What each measurement runs at: real sizes on the GPU, tiny ones in the CPU simulation."""
    if cmd.cpu_sim:
        return dict(facts=TINY_FACTS, contexts=(32, 64), new_tokens=16, prompt=24, repeats=2, positions=range(1, 6),
                    device="cpu", dtype=torch.float32, zlab_layers=1)
    return dict(facts=QWEN3_FACTS[QWEN3_8B], contexts=(256, 4096), new_tokens=128, prompt=256, repeats=5,
                positions=range(1, 18), device="cuda", dtype=torch.bfloat16, zlab_layers=5)


def env(cmd: Command) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        info.update(gpu=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability(),
                    free_gib=round(free / GIB, 1), total_gib=round(total / GIB, 1))
    return info


# ---- a random Qwen3 at a real architecture -----------------------------------------------------------

def word_tokenizer(vocab_size: int):
    from lab.testing import QWEN3_TEMPLATE, tiny_tokenizer

    return tiny_tokenizer(vocab_size, QWEN3_TEMPLATE)


def random_qwen3(facts: dict, device: str, dtype: torch.dtype) -> Target:
    """Qwen3 with the given architecture facts and random normal weights (transformers' own init, std 0.02),
    built directly on the device: no checkpoint, no CPU copy of 8B parameters."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**facts, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      use_sliding_window=False, eos_token_id=151645 % facts["vocab_size"], dtype=str(dtype)[6:])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    return Target(model, word_tokenizer(facts["vocab_size"]), "qwen3-8b-arch-random", torch.device(device), ())


@torch.no_grad()
def stabilise(model) -> None:
    """Make the random model's greedy continuation reproducible across forward shapes without changing its cost:
    attention and MLP outputs scaled down 100x and the LM head set to the embedding rolled by one row, so the
    next token is the current one + 1 by a margin of ~80 logits. With plain random weights the logits are nearly
    flat, bf16 rounding differs between a 1-position and a 17-position forward, and the first H200 run saw the
    greedy path fork at once (the oracle accepted nothing and no output matched: docs/gpu.md)."""
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(0.01)
        layer.mlp.down_proj.weight.mul_(0.01)
    model.lm_head.weight.copy_(torch.roll(model.model.embed_tokens.weight, 1, dims=0))


def shared_target(cmd: Command, sz: dict, take: bool = False) -> Target:
    """The random Qwen3 the stages share (qwen3_bf16 builds it; a later stage that finds it gone builds another,
    stabilised, with new random weights); take: a stage that quantises or frees it takes it out of the shared state."""
    target = cmd.state.pop("random_target", None) if take else cmd.state.get("random_target")
    if target is None:
        target = random_qwen3(sz["facts"], sz["device"], sz["dtype"])
        stabilise(target.model)
        if not take:
            cmd.state["random_target"] = target
    return target


def random_prompt(target: Target, length: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(8, target.vocab_size, (length,), generator=gen).tolist()


def timed_run(target: Target, prompt: list[int], gen: GenerationConfig, drafter=None) -> dict:
    """One generation through the bench's engine run (its clock stops after the last event's tokens reach the
    host, so it covers the GPU's work): tokens, seconds, tokens/s, the bench's acceptance length."""
    sync(target.device)
    run = bench.run_engine(target, prompt, gen, drafter)
    return {"tokens": run.tokens, "seconds": run.seconds, "tokens_per_s": len(run.tokens) / run.seconds,
            "acceptance_length": AcceptanceStats().add_all(run.events).acceptance_length}


def hf_generate_run(target: Target, prompt: list[int], new_tokens: int) -> dict:
    ids = torch.tensor([prompt], device=target.device)
    sync(target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    sync(target.device)
    seconds = time.perf_counter() - start
    tokens = out[0, len(prompt):].tolist()
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": len(tokens) / seconds}


class OracleDrafter:
    """Proposes the target's own greedy continuation, each slot corrupted with probability 1 - rate, so a
    slot is accepted with probability `rate` given the earlier ones were: the speedup this engine gives a
    drafter of that quality (its own cost ~0)."""

    feature_layers: tuple[int, ...] = ()
    max_block_size: int = MAX_BLOCK_SIZE

    def __init__(self, reference: list[int], rate: float, vocab_size: int, seed: int = 0):
        self.reference, self.rate, self.vocab_size = reference, rate, vocab_size  # prompt + greedy output
        self.name = f"oracle-{rate}"
        self.gen = torch.Generator().manual_seed(seed)
        self.position = 0  # tokens the target has committed before the anchor

    def reset(self) -> None:
        self.position = 0

    def extend(self, token_ids: list[int], features) -> None:
        self.position += len(token_ids)

    def propose(self, anchor: int, block_size: int, sampling, generator) -> Draft:
        truth = torch.tensor(self.reference[self.position + 1 : self.position + 1 + block_size], dtype=torch.long)
        wrong = torch.rand(len(truth), generator=self.gen) >= self.rate  # (K,)
        return Draft(torch.where(wrong, (truth + 1) % self.vocab_size, truth), None)


class CostedOracle(OracleDrafter):
    """OracleDrafter with a real drafter's whole cost in the loop: the engine captures the features that drafter
    reads, it keeps its context from them, and every round it proposes (its ids and confidences read back, then
    discarded) before the oracle's draft is verified. End to end: the speedup at the oracle's acceptance when a
    drafting round costs what that drafter's does."""

    def __init__(self, reference: list[int], rate: float, vocab_size: int, drafter, seed: int = 0):
        super().__init__(reference, rate, vocab_size, seed)
        self.drafter = drafter
        self.feature_layers = drafter.feature_layers
        self.max_block_size = min(MAX_BLOCK_SIZE, drafter.max_block_size)
        self.name = f"oracle-{rate}+{drafter.name}"

    def reset(self) -> None:
        super().reset()
        self.drafter.reset()

    def extend(self, token_ids: list[int], features) -> None:
        super().extend(token_ids, features)
        self.drafter.extend(token_ids, features)

    def propose(self, anchor: int, block_size: int, sampling, generator) -> Draft:
        self.drafter.propose(anchor, block_size, sampling, generator)
        return super().propose(anchor, block_size, sampling, generator)


def qwen3_bf16(cmd: Command) -> dict:
    """Peak memory against the plan; plain decoding vs transformers' generate; the verify cost curve at two
    contexts; the engine's own overhead per round; the oracle speedup curve; the z-lab drafter's cost."""
    sz = sizes(cmd)
    from lab.gpu.stages import release_memory

    release_memory()
    torch.cuda.reset_peak_memory_stats() if sz["device"] == "cuda" else None
    before = memory_gib(sz["device"])  # what earlier stages left allocated (1.0 GiB on 2026-12-04), not the model's
    target = random_qwen3(sz["facts"], sz["device"], sz["dtype"])
    stabilise(target.model)
    result = {"allocated_before_gib": before,
              "weights_gib_measured": None if before is None else memory_gib(sz["device"]) - before,
              "weights_gib_planned": estimate_weight_bytes(facts_config(QWEN3_8B) if not cmd.cpu_sim else
                                                           _ns(sz["facts"]), sz["dtype"], "none") / GIB}
    result["plain"] = plain_vs_generate(target, sz)
    result["verify_cost"] = {c: verify_cost_synced(target, c, sz) for c in sz["contexts"]}
    step = result["plain"]["engine_s_per_token"]
    one = result["verify_cost"][sz["contexts"][0]]["seconds"][1]
    result["engine_overhead_s_per_round"] = step - one  # a plain round minus a bare one-position forward
    result["oracle"] = oracle_curve(target, sz, cmd)
    result["zlab_dflash"] = zlab_cost(target, sz)
    result["peak_gib"] = peak_gib(sz["device"])
    long_ctx = max(sz["contexts"])
    result["plan"] = plan_rows(sz, long_ctx) if not cmd.cpu_sim else None
    cmd.state["random_target"] = target
    return result


def _ns(facts: dict):
    from types import SimpleNamespace

    return SimpleNamespace(**facts)


def memory_gib(device: str) -> float | None:
    return torch.cuda.memory_allocated() / GIB if device == "cuda" else None


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None


def plan_rows(sz: dict, context: int) -> dict:
    plan = plan_memory(facts_config(QWEN3_8B), 24 * GIB, (8, 9), context)
    return {o.quant: {"weights_gib": o.weights / GIB, "total_gib": o.total / GIB} for o in plan.options}


def plain_vs_generate(target: Target, sz: dict) -> dict:
    """The engine's plain loop and transformers' generate on the same prompt, alternating, twice each."""
    prompt = random_prompt(target, sz["prompt"])
    gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
    timed_run(target, prompt[:16], GenerationConfig(max_new_tokens=4, block_size=1))  # warm-up
    engine, hf = [], []
    for _ in range(3):
        engine.append(timed_run(target, prompt, gen))
        hf.append(hf_generate_run(target, prompt, sz["new_tokens"]))
    e_tps = statistics.median(r["tokens_per_s"] for r in engine)
    h_tps = statistics.median(r["tokens_per_s"] for r in hf)
    return {"engine_tokens_per_s": e_tps, "generate_tokens_per_s": h_tps, "ratio": e_tps / h_tps,
            "engine_runs": [r["tokens_per_s"] for r in engine], "generate_runs": [r["tokens_per_s"] for r in hf],
            "engine_s_per_token": 1 / e_tps,
            "identical": engine[0]["tokens"] == hf[0]["tokens"][: len(engine[0]["tokens"])],
            "new_tokens": sz["new_tokens"], "prompt_tokens": sz["prompt"]}


def verify_cost_synced(target: Target, context: int, sz: dict) -> dict:
    seconds = verify_cost(target, context, sz["repeats"], sz["positions"])
    return {"seconds": seconds, "relative_to_one": {t: s / seconds[1] for t, s in seconds.items()}}


def oracle_curve(target: Target, sz: dict, cmd: Command) -> list[dict]:
    """Speedup of the oracle drafter over plain decoding for K x acceptance rate (plain timed once per K)."""
    prompt = random_prompt(target, sz["prompt"], seed=1)
    plain_gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
    reference = timed_run(target, prompt, plain_gen)
    full = prompt + reference["tokens"]
    rows = []
    for k in ORACLE_BLOCKS if not cmd.cpu_sim else (4,):
        plain = timed_run(target, prompt, plain_gen)
        for rate in ORACLE_RATES:
            run = timed_run(target, prompt, GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=k),
                            OracleDrafter(full, rate, target.vocab_size))
            rows.append({"block_size": k, "rate": rate, "speedup": run["tokens_per_s"] / plain["tokens_per_s"],
                         "acceptance_length": run["acceptance_length"], "plain_tokens_per_s": plain["tokens_per_s"],
                         "tokens_per_s": run["tokens_per_s"], "identical": run["tokens"] == reference["tokens"]})
    return rows


def zlab_config(target: Target, layers: int) -> dict:
    """The published z-lab DFlash config fields at the target's width (mask token 7: a real id of any target)."""
    cfg = assumed_layout(target.model.config, target.vocab_size, layers)
    return {**cfg, "dflash_config": {**cfg["dflash_config"], "mask_token_id": 7}}


def zlab_cost(target: Target, sz: dict) -> dict:
    """Seconds per proposal of a z-lab-format DFlash drafter (random weights) at the target's size."""
    from drafter.networks.dflash import ZLabConfig, ZLabDFlashNet
    from drafter.runtime.dflash import ZLabDFlashDrafter

    cfg = ZLabConfig.from_json(zlab_config(target, sz["zlab_layers"]))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(sz["dtype"])
    try:
        with torch.device(sz["device"]):
            net = ZLabDFlashNet(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    drafter = ZLabDFlashDrafter(net, target)
    width = len(drafter.feature_layers) * target.model.config.hidden_size
    drafter.extend(list(range(sz["prompt"])), torch.randn(sz["prompt"], width, device=sz["device"]))  # (N, F)
    times = []
    for _ in range(sz["repeats"] * 4 + 1):
        sync(torch.device(sz["device"]))
        start = time.perf_counter()
        drafter.propose(5, 16, _greedy(), None)
        sync(torch.device(sz["device"]))
        times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in net.parameters())
    return {"layers": cfg.num_hidden_layers, "params_m": params / 1e6,
            "seconds_per_proposal": statistics.median(times[1:])}


def _greedy():
    from core.verification.sampling import SamplingConfig

    return SamplingConfig(0.0)


# ---- the compiled step: the lean forward, eager and replayed from CUDA graphs ---------------------------------

H200_BYTES_PER_S = 4.8e12  # HBM3e bandwidth: the floor of a decode step is reading every weight once


def compiled_step(cmd: Command) -> dict:
    """Plain decoding through transformers' eager forward, the lean forward (core.runtime.lean, static cache) and its
    fixed-shape steps replayed from CUDA graphs (core.runtime.graphs; in --cpu-sim the same steps without capture) on
    the same random Qwen3-8B-architecture weights: tokens/s against the bandwidth floor, the verify cost 1..17 at both
    contexts, identical tokens, and an oracle drafter (rate 0.8) through the graphs equal to plain decoding."""
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward

    sz = sizes(cmd)
    target = shared_target(cmd, sz)
    lean = LeanForward(target.model)
    forwards = {"transformers": None, "lean": lean, "graphs": GraphedSteps(lean, "sim" if cmd.cpu_sim else "cuda")}
    prompt = random_prompt(target, sz["prompt"], seed=2)
    gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
    rows = {}
    try:
        for name, forward in forwards.items():
            target.lean = forward
            timed_run(target, prompt[:16], GenerationConfig(max_new_tokens=4, block_size=1))  # warm-up, captures
            runs = [timed_run(target, prompt, gen) for _ in range(3)]
            rows[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                          "runs": [r["tokens_per_s"] for r in runs], "tokens": runs[0]["tokens"],
                          "verify_cost": {c: verify_cost_synced(target, c, sz) for c in sz["contexts"]}}
        target.lean = forwards["graphs"]
        oracle = oracle_through_graphs(target, prompt, gen, prompt + rows["graphs"]["tokens"])
        cmd.state["graphed_step_s"] = 1 / rows["graphs"]["tokens_per_s"]  # what released_drafter compares with
    finally:
        target.lean = None
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    floor = weight_bytes / H200_BYTES_PER_S
    reference = rows["transformers"].pop("tokens")
    identical = {name: rows[name].pop("tokens") == reference for name in ("lean", "graphs")}
    oracle["identical"] = all(run.pop("tokens") == reference for run in oracle["runs"])
    return {"forwards": rows, "identical_to_transformers": identical, "captures": forwards["graphs"].captures,
            "bandwidth_floor_s_per_token": floor, "bandwidth_floor_tokens_per_s": 1 / floor,
            "of_floor": {name: row["tokens_per_s"] * floor for name, row in rows.items()},
            "oracle_through_graphs": oracle}


ORACLE_RATES = (0.6, 0.8, 0.9)  # the oracle's acceptance rates timed through the graphs


def oracle_through_graphs(target: Target, prompt: list[int], gen: GenerationConfig, reference: list[int],
                          drafter=None) -> dict:
    """Plain decoding and the oracle drafter at K = 16, a in {0.6, 0.8, 0.9}, through the graphs, side by side, each
    timed after a warm-up run of its own: every shape a run meets is captured before the timed runs (on 2026-12-04
    one warm-up of the oracle alone left plain decoding's one-position step to be captured inside its timed run,
    which read 78 tokens/s where the bare graphed steps ran 113). drafter: a real drafter whose cost every round pays
    (CostedOracle)."""
    drafted = replace(gen, block_size=MAX_BLOCK_SIZE)
    arms = [(None, gen)] + [(rate, drafted) for rate in ORACLE_RATES]

    def oracle(rate):
        if drafter is None:
            return OracleDrafter(reference, rate, target.vocab_size)
        return CostedOracle(reference, rate, target.vocab_size, drafter)

    def run(rate, config):
        return timed_run(target, prompt, config, None if rate is None else oracle(rate))

    for rate, config in arms:  # warm-up: captures
        run(rate, config)
    timed = {rate: run(rate, config) for rate, config in arms}
    plain = timed.pop(None)
    runs = [{"rate": rate, "block_size": MAX_BLOCK_SIZE, "tokens": r["tokens"],
             "acceptance_length": r["acceptance_length"], "tokens_per_s": r["tokens_per_s"],
             "speedup": r["tokens_per_s"] / plain["tokens_per_s"]} for rate, r in timed.items()]
    return {"plain_tokens_per_s": plain["tokens_per_s"], "plain_identical": plain["tokens"] == reference[len(prompt):],
            "runs": runs}


# ---- FP8 through the app's real loading path -------------------------------------------------------------

def qwen3_fp8(cmd: Command) -> dict:
    """Save the random model, load it back with load_target(--quant fp8) (core.runtime.fp8: e4m3 codes made on the GPU
    from the bf16 checkpoint, torch alone), and measure memory and speed as for bf16. In --cpu-sim the same save/load
    path runs with --quant none (tests/test_fp8.py covers the FP8 modules on the CPU)."""
    sz = sizes(cmd)
    target = shared_target(cmd, sz, take=True)
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp:
        folder = Path(tmp) / "qwen3-8b-random"
        start = time.time()
        target.model.save_pretrained(folder)
        target.tokenizer.save_pretrained(folder)
        saved_s = time.time() - start
        del target
        from lab.gpu.stages import release_memory

        release_memory()
        if sz["device"] == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = memory_gib(sz["device"])
        quant = "fp8" if sz["device"] == "cuda" else "none"
        start = time.time()
        loaded = load_target(TargetConfig(target=str(folder), dtype="bf16" if quant == "fp8" else "fp32",
                                          quant=quant, device=sz["device"]))
        load_s = time.time() - start
        loaded.eos_token_ids = ()
        result = {"quant": quant, "forward": loaded.extra.get("precision"), "save_s": saved_s, "load_s": load_s,
                  "weights_gib_measured": None if before is None else memory_gib(sz["device"]) - before,
                  "allocated_before_gib": before,
                  "weights_gib_planned": estimate_weight_bytes(loaded.model.config, torch.bfloat16, quant) / GIB}
        prompt = random_prompt(loaded, sz["prompt"])
        gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
        timed_run(loaded, prompt[:16], GenerationConfig(max_new_tokens=4, block_size=1))
        runs = [timed_run(loaded, prompt, gen)["tokens_per_s"] for _ in range(2)]
        result["plain_tokens_per_s"] = statistics.median(runs)
        result["verify_cost"] = verify_cost_synced(loaded, sz["contexts"][0], sz)
        result["peak_gib"] = peak_gib(sz["device"])
        result["unshared"] = unshared_speed(loaded, prompt, gen)
    return result


def unshared_speed(target: Target, prompt: list[int], gen: GenerationConfig) -> dict:
    """Plain decoding with every FP8 linear quantising its own input again
    (core.runtime.fp8.share_row_codes(share=False)),
    through a forward built and captured afresh, beside the shared codes' figure: what sharing q/k/v's and gate/up's
    input codes saves a step. The tokens must not change (the codes are the same)."""
    from core.runtime.fp8 import share_row_codes
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward

    before = timed_run(target, prompt, gen)["tokens"]
    share_row_codes(target.model, share=False)
    if isinstance(target.lean, GraphedSteps):
        target.lean = GraphedSteps(LeanForward(target.model), target.lean.mode)
    timed_run(target, prompt[:16], GenerationConfig(max_new_tokens=4, block_size=1))  # warm-up, captures
    runs = [timed_run(target, prompt, gen) for _ in range(2)]
    return {"plain_tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "runs": [r["tokens_per_s"] for r in runs], "identical": all(r["tokens"] == before for r in runs)}


def scratch_dir() -> str | None:
    """/dev/shm when it has room for an 8B checkpoint (a RAM disk writes fastest), else the default temp dir."""
    import shutil

    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 40 * GIB else None


# ---- exactness on CUDA ---------------------------------------------------------------------------------------

def exactness(cmd: Command) -> dict:
    """Every drafter through the engine on tiny fp32 targets on the device, against plain decoding."""
    from lab.testing import CHAT_TEMPLATE, QWEN3_TEMPLATE, make_target, tiny_llama, tiny_qwen3

    device = "cpu" if cmd.cpu_sim else "cuda"
    rows = []
    for name, model, template in (("tiny-llama", tiny_llama(vocab_size=64), CHAT_TEMPLATE),
                                  ("tiny-qwen3", tiny_qwen3(vocab_size=64), QWEN3_TEMPLATE)):
        target = make_target(model.to(device), template=template, name=name)
        target.device = torch.device(device)
        drafters = tiny_drafters(target)
        for label, drafter in drafters:
            rows.append({"target": name, "drafter": label, **compare_with_plain(target, drafter)})
        rows += through_graphs(target, name, drafters, "sim" if cmd.cpu_sim else "cuda")
    return {"device": device, "all_identical": all(r["identical"] for r in rows), "rows": rows}


def through_graphs(target: Target, name: str, drafters: list[tuple[str, object]], mode: str) -> list[dict]:
    """The same checks, for three of those drafters, through the lean forward's fixed-shape steps (core.runtime.graphs),
    and
    their plain decoding against transformers' forward."""
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward

    prompt, gen = [5, 6, 7, 5, 6, 7, 5], GenerationConfig(max_new_tokens=24)
    reference, _ = generate_all(target, prompt, gen)
    target.lean = GraphedSteps(LeanForward(target.model), mode)
    try:
        rows = [{"target": name, "drafter": "none (plain, graphs vs transformers)", "forward": "graphs",
                 "identical": generate_all(target, prompt, gen)[0] == reference}]
        for label, drafter in drafters:
            if label in ("ngram", "flashmap-1step", "flashmap-tree3"):
                rows.append({"target": name, "drafter": label, "forward": "graphs",
                             **compare_with_plain(target, drafter)})
    finally:
        target.lean = None
    return rows


def tiny_drafters(target: Target) -> list[tuple[str, object]]:
    """n-gram, the flow drafters (1- and 2-step flow map, teacher, DFlash-style, App. D tree) on a random tiny
    network, and for Qwen3 a tiny random drafter in the published z-lab format."""
    from drafter.config import DrafterConfig
    from drafter.runtime.drafters import FlowDrafter, build_net

    torch.manual_seed(0)
    hidden = target.model.config.hidden_size
    vocab_ids = torch.tensor([-1, *range(4, 19)])  # (16,) draft vocabulary
    nets = {}
    for kind in ("flashmap", "dflash"):
        cfg = DrafterConfig(kind=kind, block_size=4, d_model=32, n_layers=2, n_heads=2, mlp_ratio=2,
                            feature_layers=(1, 2), target_hidden=hidden, draft_vocab=16, context_window=8)
        nets[kind] = build_net(cfg, target, vocab_ids)
        for p in nets[kind].parameters():  # untrained but not degenerate
            torch.nn.init.normal_(p, std=0.3)
        torch.nn.init.zeros_(nets[kind].other_head)
    drafters = [("ngram", NgramDrafter()),
                ("flashmap-1step", FlowDrafter(nets["flashmap"], vocab_ids, target, "flowmap", 1)),
                ("flashmap-2step", FlowDrafter(nets["flashmap"], vocab_ids, target, "flowmap", 2)),
                ("teacher-4", FlowDrafter(nets["flashmap"], vocab_ids, target, "teacher", 4)),
                ("dflash-style", FlowDrafter(nets["dflash"], vocab_ids, target, "dflash")),
                ("flashmap-tree3", FlowDrafter(nets["flashmap"], vocab_ids, target, "flowmap", 1, tree=3))]
    if target.model.config.model_type == "qwen3":
        from drafter.networks.dflash import ZLabConfig, ZLabDFlashNet
        from drafter.runtime.dflash import ZLabDFlashDrafter

        cfg = zlab_config(target, 1)
        cfg.update(head_dim=8, block_size=4, dflash_config={"mask_token_id": 7, "target_layer_ids": [0, 2]})
        torch.manual_seed(0)
        net = ZLabDFlashNet(ZLabConfig.from_json(cfg)).to(target.device).eval()
        for p in net.parameters():
            torch.nn.init.normal_(p, std=0.3)
        drafters.append(("zlab-dflash", ZLabDFlashDrafter(net, target)))
    return drafters


def compare_with_plain(target: Target, drafter) -> dict:
    identical, drafted, accepted = True, 0, 0
    for prompt in ([5, 6, 7], [9, 10, 11, 12, 13], [20, 21, 22, 23]):
        gen = GenerationConfig(max_new_tokens=24, block_size=4)
        plain, _ = generate_all(target, prompt, gen)
        out, events = generate_all(target, prompt, gen, drafter)
        identical &= out == plain
        drafted += sum(len(ev.drafted) for ev in events)
        accepted += sum(ev.n_accepted for ev in events)
    return {"identical": identical, "drafted": drafted, "accepted": accepted}


# ---- the released FlashMap drafter's proposal on the device ---------------------------------------------------


def release_config(target: Target, cpu_sim: bool) -> dict:
    """A config.json of the FlashMap authors' released architecture at the target's width (RELEASED_FLASHMAP_DIT:
    j-shen/FlashMap-Qwen3-8B's sizes; a tiny one in --cpu-sim), reading evenly spaced target layers."""
    cfg = target.model.config
    dit = dict(layers=1, width=32, heads=4, mlp=64, cond=16, time=16, feature_layers=1) if cpu_sim else \
        RELEASED_FLASHMAP_DIT
    last = cfg.num_hidden_layers - 2  # the last layer a drafter may read (drafter.formats.release.check_target)
    count = dit["feature_layers"]
    layer_ids = sorted({round(i * last / max(1, count - 1)) for i in range(count)}) if count > 1 else [last]
    return {"model_type": "flashmap", "target_model": QWEN3_8B, "target_hidden_size": cfg.hidden_size,
            "vocab_size": target.vocab_size, "target_layer_ids": layer_ids, "block_size": 16,
            "hidden_size": dit["width"], "num_hidden_layers": dit["layers"], "num_attention_heads": dit["heads"],
            "intermediate_size": dit["mlp"], "cond_dim": dit["cond"], "time_embed_dim": dit["time"]}


def proposal_seconds(drafter, device: str, repeats: int) -> tuple[float, list[int]]:
    """Median seconds of a greedy K = 16 proposal after anchor 5 (synchronised), and the first proposal's ids."""
    times, ids = [], None
    for i in range(repeats + 1):
        sync(torch.device(device))
        start = time.perf_counter()
        draft = drafter.propose(5, 16, _greedy(), torch.Generator().manual_seed(i))
        sync(torch.device(device))
        times.append(time.perf_counter() - start)
        ids = draft.tokens.tolist() if ids is None else ids
    return statistics.median(times[1:]), ids


def random_release_net(target: Target, cmd: Command, sz: dict):
    """The released architecture at the target's width with random weights, on its device in its dtype."""
    from drafter.networks.release import ReleaseConfig, ReleaseNet

    cfg = ReleaseConfig.from_json(release_config(target, cmd.cpu_sim))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(sz["dtype"])
    try:
        with torch.device(sz["device"]):
            return ReleaseNet(cfg).eval()
    finally:
        torch.set_default_dtype(previous)


def released_drafter(cmd: Command) -> dict:
    """The released FlashMap architecture (random weights) on the target's device in its dtype, drafting after a
    4,096-position context (64 in --cpu-sim): a proposal eager (drafter.networks.release) and replayed from CUDA graphs
    (drafter.runtime.graphed_release; its sim mode in --cpu-sim), seconds against the graphed target step of
    compiled_step,
    and whether both drafted the same tokens from the same noise."""
    from drafter.runtime.graphed_release import GraphedReleaseDrafter
    from drafter.runtime.release import ReleaseDrafter

    sz = sizes(cmd)
    target = shared_target(cmd, sz)
    net = random_release_net(target, cmd, sz)
    cfg = net.c
    eager = ReleaseDrafter(net, target, native=False)
    graphed = GraphedReleaseDrafter(net, target, mode="sim" if cmd.cpu_sim else "cuda")
    context = sz["contexts"][-1]
    features = torch.randn(context, len(cfg.target_layer_ids) * target.model.config.hidden_size, device=sz["device"],
                           dtype=sz["dtype"])  # (N, F)
    for drafter in (eager, graphed):
        drafter.extend(list(range(context)), features)
    rows = {}
    for name, drafter in (("eager", eager), ("graphed", graphed)):
        seconds, ids = proposal_seconds(drafter, sz["device"], sz["repeats"] * 4)
        rows[name] = {"seconds_per_proposal": seconds, "ids": ids}
    step_s = cmd.state.get("graphed_step_s")
    params = sum(p.numel() for p in net.parameters())
    return {"params_m": params / 1e6, "context": context, "captures": graphed.captures,
            "eager_s": rows["eager"]["seconds_per_proposal"], "graphed_s": rows["graphed"]["seconds_per_proposal"],
            "graphed_step_s": step_s,
            "of_target_step": None if not step_s else rows["graphed"]["seconds_per_proposal"] / step_s,
            "same_draft": rows["eager"]["ids"] == rows["graphed"]["ids"]}


# ---- 8-bit weights read inside one kernel ---------------------------------------------------------------------

CARD_GIB = 24  # the RTX 4090's memory: the w8 stage runs under this cap


def kernel_vs_torch(layer, device: str) -> dict:
    """One W8Linear's product (the Triton kernel on a GPU) against core.runtime.w8.reference for 1 and 17 bf16 rows:
    the largest difference relative to the outputs' largest value, and whether each row came out the same both
    ways of batching."""
    from core.runtime import w8

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(17, layer.in_features, generator=gen, device=device).to(torch.bfloat16)  # (R, I)
    got = w8.product(x, layer.weight_codes, layer.weight_scale, layer.bias)
    one = w8.product(x[:1], layer.weight_codes, layer.weight_scale, layer.bias)
    want = w8.reference(x, layer.weight_codes, layer.weight_scale, layer.bias).float()
    return {"relative_error": ((got.float() - want).abs().max() / want.abs().max()).item(),
            "row_alike": bool(torch.equal(one[0], got[0]))}


def cap_memory(device: str, gib: float | None) -> float | None:
    """Cap this process's share of the GPU at `gib` (None: lift the cap); the cap in GiB, or None on a CPU."""
    if device != "cuda":
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(1.0 if gib is None else min(1.0, gib * GIB / total))
    torch.cuda.reset_peak_memory_stats()
    return gib


def qwen3_w8(cmd: Command) -> dict:
    """The random Qwen3-8B-architecture target with its decoder's linears as int8 codes with row scales, multiplied
    by bf16 activations inside one Triton kernel (core.runtime.w8; its torch product in --cpu-sim): plain decoding
    through the graphed steps (CUDA graphs; sim in --cpu-sim), tokens/s against the floor of reading these weights
    and against bf16's graphed step (compiled_step), the verify cost 1..17 after both contexts, and the oracle drafter
    through the graphs beside plain decoding, equal to it in this precision: alone, and with the released drafter's
    graphed proposal paid every round (CostedOracle). Everything runs under an RTX 4090's 24 GiB
    (torch.cuda.set_per_process_memory_fraction), and the memory plan's figures for it stand beside the allocator's
    peak. It quantises the target in place: the arch command's last stage."""
    from core.runtime import w8
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward
    from drafter.runtime.graphed_release import GraphedReleaseDrafter
    from lab.gpu.stages import release_memory

    sz = sizes(cmd)
    target = shared_target(cmd, sz, take=True)
    replaced = w8.quantize_decoder(target.model)
    release_memory()
    checked = kernel_vs_torch(target.model.model.layers[0].mlp.down_proj, sz["device"])
    cap = cap_memory(sz["device"], CARD_GIB)  # an RTX 4090's memory from here on
    graphs = GraphedSteps(LeanForward(target.model), "sim" if cmd.cpu_sim else "cuda")
    target.lean = graphs
    drafter = GraphedReleaseDrafter(random_release_net(target, cmd, sz), target, mode=graphs.mode)
    prompt = random_prompt(target, sz["prompt"], seed=2)
    gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
    try:
        timed_run(target, prompt[:16], GenerationConfig(max_new_tokens=4, block_size=1))  # warm-up, captures
        runs = [timed_run(target, prompt, gen) for _ in range(3)]
        tokens_per_s = statistics.median(r["tokens_per_s"] for r in runs)
        verify = {c: verify_cost_synced(target, c, sz) for c in sz["contexts"]}
        reference = prompt + runs[0]["tokens"]
        oracle = oracle_through_graphs(target, prompt, gen, reference)
        costed = oracle_through_graphs(target, prompt, gen, reference, drafter)  # the released drafter's cost
    finally:
        target.lean = None
        cap_memory(sz["device"], None)
    for arms in (oracle, costed):
        arms["identical"] = all(run.pop("tokens") == runs[0]["tokens"] for run in arms["runs"])
    tensors = [*target.model.parameters(), *target.model.buffers()]
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors)
    floor = weight_bytes / H200_BYTES_PER_S
    bf16_step = cmd.state.get("graphed_step_s")
    kernel = "triton" if sz["device"] == "cuda" and w8.kernel() is not None else "torch"
    config, context = target.model.config, drafter.context.capacity
    planned = {"weights": estimate_weight_bytes(config, torch.bfloat16, "8bit"), "kv_cache": kv_cache_bytes(
        config, graphs.cache.capacity), "drafter": flashmap_drafter_bytes(config.hidden_size, context),
        "working": WORKING_BYTES}
    return {"replaced": replaced, "kernel": kernel, "weights_gib": weight_bytes / GIB, "tokens_per_s": tokens_per_s,
            "runs": [r["tokens_per_s"] for r in runs], "bandwidth_floor_tokens_per_s": 1 / floor,
            "of_floor": tokens_per_s * floor, "vs_bf16_graphed": None if not bf16_step else tokens_per_s * bf16_step,
            "verify_cost": verify, "captures": graphs.captures + drafter.captures, "oracle_through_graphs": oracle,
            "oracle_with_released_drafter": costed, "memory_cap_gib": cap, "kernel_vs_torch": checked,
            "planned_gib": {k: v / GIB for k, v in planned.items()} | {"total": sum(planned.values()) / GIB},
            "peak_gib": peak_gib(sz["device"])}


# ---- the graphed step compiled: the per-layer small work fused ------------------------------------------------


def compiled_fused(cmd: Command) -> dict:
    """Plain decoding through the graphed steps (core.runtime.graphs) and through the same steps compiled first
    (GraphedSteps(compiled=True): torch.compile's inductor fuses each layer's norms, rotary, cache writes and residual
    adds into a few kernels, then the step is captured as before), on the same random bf16 weights: tokens/s against
    the floor, the seconds the compilation took, identical tokens. Only the one-position step is compiled and timed
    (the prompt's prefill runs the lean forward): each shape compiles once, which at Qwen3-8B's depth may take
    minutes."""
    from core.runtime.graphs import GraphedSteps
    from core.runtime.lean import LeanForward
    from lab.gpu.stages import release_memory

    sz = sizes(cmd)
    release_memory()
    target = shared_target(cmd, sz)
    mode = "sim" if cmd.cpu_sim else "cuda"
    prompt = random_prompt(target, sz["prompt"], seed=2)  # longer than a step: its prefill is not compiled
    gen = GenerationConfig(max_new_tokens=sz["new_tokens"], block_size=1)
    rows = {}
    try:
        for name, compiled in (("graphs", False), ("graphs compiled", True)):
            target.lean = GraphedSteps(LeanForward(target.model), mode, compiled=compiled)
            start = time.time()
            timed_run(target, prompt, GenerationConfig(max_new_tokens=2, block_size=1))  # compiles, captures T = 1
            warm_s = time.time() - start
            runs = [timed_run(target, prompt, gen) for _ in range(3)]
            rows[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                          "runs": [r["tokens_per_s"] for r in runs], "warm_up_s": warm_s, "tokens": runs[0]["tokens"]}
    finally:
        target.lean = None
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    floor = weight_bytes / H200_BYTES_PER_S
    identical = rows["graphs compiled"].pop("tokens") == rows["graphs"].pop("tokens")
    return {"forwards": rows, "identical": identical, "bandwidth_floor_tokens_per_s": 1 / floor,
            "of_floor": {name: row["tokens_per_s"] * floor for name, row in rows.items()},
            "compiled_vs_graphs": rows["graphs compiled"]["tokens_per_s"] / rows["graphs"]["tokens_per_s"]}


# the GPU issue's rows first; FP8 (measured twice: 0.55-0.58x bf16) last, on what the budget leaves. qwen3_w8
# quantises the random target in place, so the stages after it build another
STAGES = (("env", env, 1), ("exactness", exactness, 20), ("qwen3_bf16", qwen3_bf16, 60),
          ("compiled_step", compiled_step, 40), ("released_drafter", released_drafter, 25),
          ("qwen3_w8", qwen3_w8, 45), ("compiled_fused", compiled_fused, 100), ("qwen3_fp8", qwen3_fp8, 70))
