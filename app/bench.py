"""Benchmark CLI: plain decoding against a drafter, prompt by prompt, alternating, same settings.

python -m app.bench --prompts FILE.jsonl [--limit N] --drafter SPEC [--steps 1|2] [--block-size K]
    [--temperature T] [--max-new-tokens N] [--target ID] [--seed S] [--vs llama.cpp|flashmap-reference]
    [--conversation] --out FILE.json

SPEC is a drafter name or its text form with options (drafter/spec.py), e.g. `flashmap,steps=2,tree=4`;
the flags --steps, --noise, --block-size, --best-of, --tree, --adaptive, --max-skip and --weights set the
same options. Prompt files: a path, or a name the project ships (eval_math, eval_code, eval_chat).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from core.runtime.threads import start_policy

# the app's thread policy on this machine (core.runtime.threads), its wait policy set before torch starts OpenMP, so
# that the bench measures what `python app.py` runs
THREAD_POLICY = start_policy(Path.home() / ".flashmap-chat" / "cache")

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from app.service import engine_settings  # noqa: E402
from core.decoding.engine import (  # noqa: E402
    GenerationConfig,
    RoundEvent,
    block_size_for,
    generate,
)
from core.decoding.prefix import PrefixCache  # noqa: E402
from core.decoding.stats import AcceptanceStats, pooled_rate, speedup, speedup_se  # noqa: E402
from core.drafting.base import MAX_BLOCK_SIZE  # noqa: E402
from core.drafting.call_cost import draft_cost as measure_draft_cost  # noqa: E402
from core.drafting.policy.state import PolicyState  # noqa: E402
from core.prompts import HeldOutError, read_prompt_file, refuse_held_out, resolve_prompt_file  # noqa: E402
from core.runtime.target import Target, TargetConfig, add_target_args, load_target, target_config_from_args  # noqa: E402
from core.runtime.threads import apply_thread_policy, wait_idle, wait_policy  # noqa: E402
from core.runtime.verify_cost import cost_curves  # noqa: E402
from core.verification.sampling import SamplingConfig  # noqa: E402
from drafter.registry import DrafterUnavailable, build_drafter  # noqa: E402
from drafter.spec import (  # noqa: E402
    APP_DEFAULT,
    CHOICES,
    ENGINE_DRAFTERS,
    HF_BASELINES,
    RunSpec,
    SpecError,
    choice_spec,
)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What a bench run and a suite run share: the prompts, the sampling settings and the target."""

    prompts: tuple[str, ...]  # JSONL files with a `prompt` field (or shipped names)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    limit: int | None = None  # first N prompts of each file
    max_new_tokens: int = 128
    seed: int = 0
    target: TargetConfig = field(default_factory=TargetConfig)


@dataclass(frozen=True, kw_only=True)
class BenchConfig(RunConfig):
    spec: RunSpec
    # "llama.cpp": also run llama.cpp on the same GGUF, prompts and budget (app/llamacpp.py); "flashmap-reference":
    # the FlashMap authors' own loop with the same released-format drafter (app/flashmap_reference.py)
    vs: str | None = None
    threads: int | None = None  # torch threads; None: the app's policy on this machine (core.runtime.threads)
    # the prompts as the turns of one conversation: each turn's prompt holds the earlier turns and plain decoding's
    # replies to them, so the context grows turn by turn (each side reuses its previous turn's cache)
    conversation: bool = False

    def __post_init__(self):
        self.spec.drafter.validate(self.sampling)


def read_prompts(path: str, limit: int | None) -> list[str]:
    prompts = [row["prompt"] for row in read_prompt_file(path)]
    return prompts[:limit] if limit else prompts


@dataclass
class Run:
    """One generation's output and cost, from the engine's events or from transformers' generate."""

    tokens: list[int]
    seconds: float
    events: list[RoundEvent] = field(default_factory=list)


def run_engine(target: Target, prompt_ids: list[int], gen: GenerationConfig, drafter,
               measured: PolicyState | None = None, prefix: PrefixCache | None = None) -> Run:
    start = time.perf_counter()
    events = list(generate(target, prompt_ids, gen, drafter, measured=measured, prefix=prefix))
    seconds = time.perf_counter() - start
    return Run([t for ev in events for t in ev.committed], seconds, events)


def run_hf(target: Target, prompt_ids: list[int], gen: GenerationConfig, prompt_lookup: bool) -> Run:
    """transformers' own generate (optionally with prompt-lookup assisted generation), same settings."""
    s = gen.sampling
    kwargs = dict(max_new_tokens=gen.max_new_tokens, do_sample=not s.greedy, eos_token_id=list(target.eos_token_ids))
    if not s.greedy:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
    if prompt_lookup:
        kwargs.update(prompt_lookup_num_tokens=gen.block_size)
    torch.manual_seed(gen.seed)
    input_ids = torch.tensor([prompt_ids], device=target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    seconds = time.perf_counter() - start
    return Run(target.until_eos(out[0, len(prompt_ids):].tolist()), seconds)


@dataclass(frozen=True)
class Runner:
    """One drafter spec made runnable: run(prompt_ids, gen) -> Run, and the block size K it drafts."""

    spec: RunSpec
    block_size: int  # K resolved: the spec's, capped by the drafter's own (engine.block_size_for); 0 for plain
    run: Callable[[list[int], GenerationConfig], Run]
    drafter: object | None = None  # the engine drafter it runs, if any
    draft_cost: float = 0.0  # one drafter call relative to a one-position target forward (measured: with_draft_cost)

    def with_draft_cost(self, target: Target) -> "Runner":
        """This runner with its drafter's cost measured now (core.drafting.call_cost.draft_cost), when its spec is
        adaptive: the skip policy charges each draft for it (core.drafting.policy.policy.DraftPolicy.call_cost)."""
        if not self.spec.adaptive or self.drafter is None:
            return self
        return replace(self, draft_cost=measure_draft_cost(target, self.drafter))

    def generation(self, gen: GenerationConfig, verify_cost: tuple[float, ...]) -> GenerationConfig:
        """gen with this drafter's K and what its spec asks of the engine (app.service.engine_settings, the app's
        own route): the cost curve, drafter cost (charged at T = 0 only: GenerationConfig.charges_draft_cost), skips
        and plain-step probes."""
        return engine_settings(self.spec, replace(gen, block_size=self.block_size or None), verify_cost,
                               self.drafter is not None, self.draft_cost)


def round_costs(base: list[Run], spec: list[Run]) -> list[dict]:
    """What each kind of drafted round cost and committed, by source and drafted length (the branch followed): its
    rounds, mean drafting and verifying milliseconds, both in plain rounds (the mean round of the plain runs beside it)
    and tokens committed. A round pays where it commits more tokens than it costs plain rounds. [] without events
    (transformers' runs)."""
    plain = [ev.draft_s + ev.verify_s for run in base for ev in run.events if ev.kind == "round"]
    kinds: dict[tuple[str, int], list] = {}
    for ev in (ev for run in spec for ev in run.events if ev.kind == "round"):
        kinds.setdefault((ev.source, len(ev.drafted)), []).append(ev)
    if not plain or not kinds:
        return []
    step = sum(plain) / len(plain)
    rows = []
    for (source, drafted), events in sorted(kinds.items()):
        draft_s = sum(ev.draft_s for ev in events) / len(events)
        verify_s = sum(ev.verify_s for ev in events) / len(events)
        rows.append({"source": source, "drafted": drafted, "rounds": len(events), "draft_ms": 1e3 * draft_s,
                     "verify_ms": 1e3 * verify_s, "plain_rounds": (draft_s + verify_s) / step,
                     "committed": sum(len(ev.committed) for ev in events) / len(events)})
    return rows


def summarize(runner: Runner, sampling: SamplingConfig, target: Target, base: list[Run], spec: list[Run]) -> dict:
    stats = AcceptanceStats()
    for run in spec:
        stats.add_all(run.events)
    base_runs, spec_runs = ([(len(r.tokens), r.seconds) for r in runs] for runs in (base, spec))  # (tokens, s) each
    base_tps, spec_tps = pooled_rate(base_runs), pooled_rate(spec_runs)
    k, run_spec = runner.block_size, runner.spec
    d = run_spec.drafter
    return {
        "target": target.name,
        "precision": target.precision,
        "threads": f"{torch.get_num_threads()} (OpenMP wait: {wait_policy()})",
        "drafter": d.name,
        "spec": run_spec.text(),
        "steps": d.steps,
        "noise": d.noise,
        "block_size": k,
        "adaptive": run_spec.adaptive,
        "best_of": d.best_of,
        "tree": d.tree,
        "max_skip": run_spec.max_skip,
        "max_lost": run_spec.max_lost,
        "draft_cost": runner.draft_cost,
        "temperature": sampling.temperature,
        "prompts": len(spec),
        "new_tokens": sum(tokens for tokens, _ in spec_runs),
        "baseline_tokens_per_s": base_tps,
        "tokens_per_s": spec_tps,
        "speedup": speedup(base_runs, spec_runs),
        "speedup_se": speedup_se(base_runs, spec_runs),
        "acceptance_length": stats.acceptance_length,
        "per_slot_acceptance": stats.per_slot(k) if stats.rounds else None,
        "rounds": stats.rounds,  # with the counts below, runs pool exactly (docs/benchmarks.md)
        "rounds_by_source": stats.sources,  # plain steps, the network's drafts, prompt-lookup drafts
        "plain_rounds_by_reason": stats.plain_reasons,  # why those plain steps drafted nothing (the policy's decisions)
        "tokens_by_source": stats.tokens,  # the replies' tokens: accepted drafts by source, the target's own
        "round_costs": round_costs(base, spec),  # what each kind of round cost, in plain rounds, and committed
        "per_slot_reached": stats.reached[:k],
        "per_slot_accepted": stats.accepted[:k],
        "identical_to_baseline": all(b.tokens == s.tokens for b, s in zip(base, spec)) if sampling.greedy else None,
        "per_prompt": [
            {"baseline_tokens": len(b.tokens), "baseline_s": b.seconds, "tokens": len(s.tokens), "s": s.seconds,
             "identical": b.tokens == s.tokens,
             "acceptance_length": AcceptanceStats().add_all(s.events).acceptance_length}
            for b, s in zip(base, spec)
        ],
    }


def make_runner(run_spec: RunSpec, target: Target, allow_download: bool = False) -> Runner:
    """The runner for one spec; the baseline is always the engine with no drafter."""
    spec = run_spec.drafter
    if spec.is_hf_baseline:
        lookup = spec.name == "hf-prompt-lookup"
        k = spec.block_size or MAX_BLOCK_SIZE
        return Runner(run_spec, k, lambda ids, gen: run_hf(target, ids, gen, lookup))
    try:
        drafter = build_drafter(spec, target, allow_download)
    except DrafterUnavailable as err:
        raise SystemExit(f"{spec.text()}: {err}") from err
    k = block_size_for(GenerationConfig(block_size=spec.block_size), drafter)
    measured = PolicyState()  # carried from prompt to prompt, as the app carries it from reply to reply
    prefix = PrefixCache()  # each runner reuses its own previous prompt's cache, as the app and llama.cpp do
    return Runner(run_spec, k, lambda ids, gen: run_engine(target, ids, gen, drafter, measured, prefix), drafter)


def warm_up(target: Target) -> None:
    """One short generation first, so one-time costs (allocations, kernel choice) hit no measured run."""
    warm = target.chat_ids([{"role": "user", "content": "Hi"}])
    run_engine(target, warm, GenerationConfig(max_new_tokens=8), None)


def threads_now(cfg: BenchConfig) -> int:
    """Before each run, the thread count the app would take for a reply starting now (ThreadPolicy.threads_now),
    unless --threads fixed it. The previous run's threads are let go first (wait_idle): right after a llama.cpp
    reply its spinning threads made 2 of 3 next runs take the busy machine's thread count."""
    if cfg.threads is not None:
        return apply_thread_policy(cfg.threads)
    wait_idle()
    return apply_thread_policy(THREAD_POLICY[0].threads_now())


def bench(cfg: BenchConfig) -> dict:
    apply_thread_policy(cfg.threads if cfg.threads is not None else THREAD_POLICY[0].threads)
    target = load_target(cfg.target)
    prompts = [p for path in cfg.prompts for p in read_prompts(path, cfg.limit)]
    runner = make_runner(cfg.spec, target, cfg.target.allow_download)
    warm_up(target)
    curves = cost_curves(target) if cfg.spec.adaptive else None
    runner = runner.with_draft_cost(target)
    native, anchor = llama_cpp(cfg, target) if cfg.vs == "llama.cpp" else (None, reference(cfg, runner))
    base, spec, anchored, native_seconds = [], [], [], []
    plain_prefix = PrefixCache()  # plain decoding's own, like each runner's
    used: dict[int, int] = {}  # torch threads -> runs of this engine (and llama.cpp's turns) started with them
    messages: list[dict] = []  # the conversation so far (--conversation)
    lengths: list[int] = []  # each prompt's tokens
    previous: list[int] = []  # the previous prompt and plain decoding's reply to it
    for i, prompt in enumerate(tqdm(prompts, desc=f"bench {cfg.spec.text()}", unit="prompt")):
        messages = (messages if cfg.conversation else []) + [{"role": "user", "content": prompt}]
        ids = target.chat_ids(messages)
        curve = curves.for_reply(len(ids), cfg.max_new_tokens) if curves else ()  # the cost after this prompt
        gen = runner.generation(GenerationConfig(cfg.max_new_tokens, sampling=cfg.sampling, seed=cfg.seed + i), curve)
        if cfg.vs == "flashmap-reference":  # the reference drafts every round: no plain step to measure speed by
            gen = replace(gen, policy=replace(gen.policy, plain_probe_every=0))
        runs = [lambda: base.append(run_engine(target, ids, gen, None, prefix=plain_prefix)),
                lambda: spec.append(runner.run(ids, gen))]
        if anchor is not None:
            seed = {"seed": cfg.seed + i} if cfg.vs == "flashmap-reference" else {}
            runs.append(lambda: anchored.append(anchor.run(ids, cfg.max_new_tokens, **seed)))
        for k in range(len(runs)):  # rotate the order so drift on a noisy machine hits every side alike
            threads = threads_now(cfg)  # as the app before each reply (llama.cpp, in its own process, keeps its own)
            used[threads] = used.get(threads, 0) + 1
            runs[(i + k) % len(runs)]()
        if native is not None:  # llama.cpp's own binary: this prompt's new tokens, then plain decoding's reply length
            depth = min(shared_prefix(ids, previous), len(ids) - 1)  # from its cache, as every runner reuses its own
            native_seconds.append(native.seconds(len(ids) - depth, len(base[-1].tokens), depth))
        if cfg.conversation:
            messages.append({"role": "assistant", "content": target.decode(base[-1].tokens)})
        lengths.append(len(ids))
        previous = ids + base[-1].tokens
    result = summarize(runner, cfg.sampling, target, base, spec)
    result["conversation"] = cfg.conversation
    for row, length in zip(result["per_prompt"], lengths):
        row["prompt_tokens"] = length
    result["threads_per_run"] = {str(n): count for n, count in sorted(used.items())}  # torch threads: runs
    if anchor is not None and cfg.vs == "flashmap-reference":
        from app import flashmap_reference

        plain, drafted = ([target.until_eos(run.tokens) for run in runs] for runs in (base, spec))
        result["flashmap_reference"] = flashmap_reference.summary(
            anchored, plain, drafted, result["baseline_tokens_per_s"], result["tokens_per_s"],
            result["acceptance_length"], cfg.sampling.greedy, anchor.precision,
            [row["acceptance_length"] for row in result["per_prompt"]])
        result["flashmap_reference"]["per_prompt"] = [
            {"tokens": len(run.tokens), "s": run.seconds, "acceptance_length": run.acceptance} for run in anchored]
    elif native is not None:
        if anchor is not None:
            anchor.close()
        result["llama_cpp"] = llama_cpp_summary(target, base, native_seconds, anchored, result, native.threads)
    return result


def llama_cpp_summary(target: Target, base: list[Run], native_seconds: list[float], anchored: list, result: dict,
                      threads: int) -> dict:
    """llama.cpp's figures beside this run's (app.llamacpp.summary), per prompt: the binary's seconds for plain
    decoding's reply length, and llama-cpp-python's own reply where it ran."""
    from app.llamacpp import summary

    texts, replies = [target.decode(run.tokens) for run in base], [len(run.tokens) for run in base]
    out = summary(native_seconds, replies, anchored, texts, result["baseline_tokens_per_s"], result["tokens_per_s"],
                  threads)
    out["per_prompt"] = [
        {"tokens": n, "s": s, **({"python_tokens": run.tokens, "python_s": run.seconds} if anchored else {})}
        for n, s, run in zip(replies, native_seconds, anchored or [None] * len(replies))]
    return out


def reference(cfg: BenchConfig, runner: Runner):
    """The FlashMap authors' loop with the runner's drafter when --vs flashmap-reference asks for it (SystemExit
    saying why when it cannot run), else None."""
    if cfg.vs != "flashmap-reference":
        return None
    from app.flashmap_reference import FlashMapReference, ReferenceUnavailable
    from drafter.runtime.release import ReleaseDrafter

    if not isinstance(runner.drafter, ReleaseDrafter) or runner.drafter.folder is None:
        raise SystemExit("--vs flashmap-reference runs the same drafter in both loops: give --drafter flashmap a "
                         "released-format folder (--weights DIR), without lookup")
    try:
        return FlashMapReference(runner.drafter.folder, cfg.target, cfg.sampling, runner.drafter.steps)
    except ReferenceUnavailable as err:
        raise SystemExit(f"--vs flashmap-reference: {err}") from err


def llama_cpp(cfg: BenchConfig, target: Target):
    """For --vs llama.cpp: llama.cpp's own binary (SystemExit saying why when it cannot run) and llama-cpp-python's
    runner beside it (None, with a line saying why, where it is not installed)."""
    from app.llamacpp import LlamaCpp, LlamaCppUnavailable, NativeLlamaCpp

    try:
        native = NativeLlamaCpp(target)
    except LlamaCppUnavailable as err:
        raise SystemExit(f"--vs llama.cpp: {err}") from err
    try:
        return native, LlamaCpp(target)
    except LlamaCppUnavailable as err:
        print(f"--vs llama.cpp: llama-cpp-python's figure is left out: {err}")
        return native, None


def shared_prefix(ids: list[int], before: list[int]) -> int:
    """How many leading tokens ids shares with before (what a cache of before serves again)."""
    n = 0
    while n < min(len(ids), len(before)) and ids[n] == before[n]:
        n += 1
    return n


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    """The drafter options as flags; each sets the same field as the spec text's option (drafter/spec.py)."""
    parser.add_argument("--steps", type=int, default=None,
                        help="FlashMap jumps (1 or 2; teacher: Euler steps, e.g. 16)")
    parser.add_argument("--noise", default=None, choices=["shared", "shuffled"],
                        help="shuffled: independent noise per slot (the shuffle test, paper §6.2)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="K, tokens drafted per round (default and upper limit: the drafter's own block)")
    parser.add_argument("--best-of", type=int, default=None,
                        help="flow drafters: draft M blocks from independent noise, keep the most confident")
    parser.add_argument("--tree", type=int, default=None,
                        help="flow drafters, T=0: draft M blocks from independent noise and verify them together "
                             "as a trie of at most K nodes (paper App. D)")
    parser.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                        help="cut each draft to its best expected length under this machine's verify cost curve")
    parser.add_argument("--max-skip", type=int, default=None,
                        help="with --adaptive: skip the drafter for up to N rounds after drafts that did not pay for "
                             "its call (0: never; 8)")
    parser.add_argument("--max-lost", type=float, default=None,
                        help="with --adaptive: the expected tokens a round the cut may give up against verifying the "
                             "whole draft (0: no bound, the cut weighs verify cost alone)")
    parser.add_argument("--weights", default=None,
                        help="drafter checkpoint folder or hub id (default: weights/<target>/<drafter>)")


def choice_from_args(choice: str, args) -> RunSpec:
    """One of the app's drafter choices (drafter.spec.choice_spec) with the flags a user sets in the app."""
    adaptive = True if args.adaptive is None else args.adaptive
    try:
        spec = choice_spec(choice, args.steps or 1, args.tree or 1, args.block_size, adaptive)
        if args.max_lost is not None:
            spec = replace(spec, max_lost=args.max_lost)
        return replace(spec, drafter=replace(spec.drafter, weights=args.weights)) if args.weights else spec
    except SpecError as err:
        raise SystemExit(f"--choice {choice}: {err}") from err


def spec_from_args(text: str, args) -> RunSpec:
    """The spec text (a name, or name,option=value...) with the flags that were given filled in; `default` is the
    app's default choice, auto (choice_from_args)."""
    if text == APP_DEFAULT:
        return choice_from_args("auto", args)
    flags = {"steps": args.steps, "noise": args.noise, "block_size": args.block_size, "best_of": args.best_of,
             "tree": args.tree, "adaptive": args.adaptive, "max_skip": args.max_skip, "max_lost": args.max_lost,
             "weights": args.weights}
    try:
        return RunSpec.parse(text, **{k: v for k, v in flags.items() if v is not None})
    except SpecError as err:
        raise SystemExit(f"--drafter {text}: {err}") from err


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, identical to plain decoding")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (T > 0)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens (T > 0; 0: all)")


def sampling_from_args(args) -> SamplingConfig:
    try:
        return SamplingConfig(args.temperature, args.top_p, args.top_k)
    except ValueError as err:
        raise SystemExit(str(err)) from err


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The RunConfig flags (and --out), shared by the bench and the suite."""
    parser.add_argument("--prompts", nargs="+", required=True,
                        help="JSONL files with a `prompt` field, or shipped names: eval_math eval_code eval_chat")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each file")
    add_sampling_args(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per reply (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="prompt i runs with seed S + i")
    parser.add_argument("--out", required=True, help="where the JSON results are written")
    add_target_args(parser)


def run_fields(args, tuning: bool = False) -> dict:
    """RunConfig's fields from the flags of add_run_args (the prompt files checked first). tuning: for a comparison
    that chooses a setting (scripts/), which never reads a held-out set (core.prompts.ROLES)."""
    check_prompt_files(args.prompts)
    if tuning:
        try:
            refuse_held_out([str(resolve_prompt_file(name)) for name in args.prompts], "a tuning comparison")
        except HeldOutError as err:
            raise SystemExit(f"--prompts: {err}") from err
    return dict(prompts=tuple(args.prompts), sampling=sampling_from_args(args), limit=args.limit,
                max_new_tokens=args.max_new_tokens, seed=args.seed, target=target_config_from_args(args))


def parse_args(argv=None) -> tuple[BenchConfig, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--choice", choices=list(CHOICES),
                       help="one of the app's drafter choices, as the UI and the API make it (auto: prompt lookup, "
                            "the phrasebook and the FlashMap network where it pays, the app's default; flashmap / "
                            "dflash: that network every round; copies: auto without the network; none: plain), "
                            "with --steps, --tree, --block-size and --adaptive as set in the app")
    which.add_argument("--drafter",
                       help=f"a drafter spec: '{APP_DEFAULT}' (= --choice auto), or one of "
                            f"{', '.join(ENGINE_DRAFTERS + HF_BASELINES)}, optionally with options, e.g. "
                            "flashmap,steps=2 (a bare name: that drafter's plain settings)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: the app's thread policy on this machine, core.runtime.threads)")
    parser.add_argument("--vs", default=None, choices=["llama.cpp", "flashmap-reference"],
                        help="llama.cpp: also run llama.cpp (llama-cpp-python, an optional extra) on the same GGUF, "
                             "prompt tokens, threads and budget, in turn with this engine's runs; its tokens/s beside "
                             "ours. flashmap-reference: the FlashMap authors' spec_generate with the same released-"
                             "format drafter (--drafter flashmap --weights DIR), target in fp32, same prompt tokens")
    parser.add_argument("--conversation", action="store_true",
                        help="the prompts as the turns of one conversation (each turn's prompt holds the earlier "
                             "turns and plain decoding's replies), so the context grows turn by turn")
    add_spec_args(parser)
    add_run_args(parser)
    args = parser.parse_args(argv)
    try:
        spec = choice_from_args(args.choice, args) if args.choice else spec_from_args(args.drafter, args)
        cfg = BenchConfig(spec=spec, vs=args.vs, threads=args.threads,
                          conversation=args.conversation, **run_fields(args))
    except SpecError as err:
        raise SystemExit(str(err)) from err
    return cfg, args.out


def check_prompt_files(names: list[str]) -> None:
    for name in names:
        try:
            resolve_prompt_file(name)
        except FileNotFoundError as err:
            raise SystemExit(f"--prompts: {err}") from err


def main(argv=None) -> None:
    cfg, out = parse_args(argv)
    result = bench(cfg)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}))


if __name__ == "__main__":
    main()
