"""What the UI and the API need from the engine, without any UI code: drafters for the loaded target,
settings -> GenerationConfig, one reply streamed with its honest speed figure, the verify-cost curve (cached per
machine, re-measured in the background) and saved conversations.

One model, many clients: `lock` serialises every use of the target in arrival order (the UI's queue, the
OpenAI-compatible API and the background measurement all take it).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from app.conversations import ConversationStore
from core.decoding.engine import GenerationConfig, RoundEvent, generate
from core.decoding.prefix import PrefixCache
from core.decoding.stats import ReplySpeed
from core.drafting.base import MAX_BLOCK_SIZE
from core.drafting.call_cost import draft_cost as measure_draft_cost
from core.drafting.policy.state import PolicyState
from core.runtime.target import Target
from core.runtime.threads import with_threads
from core.runtime.verify_cost import CostCurves, curve_passes, load_cached, save_cached
from core.verification.sampling import SamplingConfig
from drafter.registry import DrafterUnavailable, build_drafter, check_drafter, with_lookup
from drafter.spec import CHOICES, DrafterSpec, RunSpec, choice_spec

APP_DRAFTERS = CHOICES  # what the UI and the API offer (drafter.spec.choice_spec; the teacher is for analysis)
NO_WEIGHTS = "this app loaded the target's tokenizer alone (--backend vllm): the vLLM server writes every reply"
REMOTE = "vllm"  # the drafter choice that sends replies to the vLLM server (--backend vllm, app/remote.py)
CURVE_REPEATS = 7  # passes over 1..17 positions after each context; the curves are their per-position medians
log = logging.getLogger("flashmap")


class FairLock:
    """A lock granted in arrival order (threading.Lock is not): the UI, the API and the background
    measurement are served first come, first served."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next_ticket = self._serving = 0

    def __enter__(self):
        with self._cond:
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._cond.wait_for(lambda: self._serving == ticket)
        return self

    def __exit__(self, *exc):
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


@dataclass(frozen=True)
class ChatSettings:
    drafter: str = "auto"  # one of APP_DRAFTERS, or REMOTE
    block_size: int | None = None  # K; None: the drafter's own block (and never more than it)
    steps: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    enable_thinking: bool = False
    system_prompt: str = ""
    seed: int = 0
    adaptive: bool = True  # cut low-confidence draft tails under the measured verify cost (policy.best_draft_length)
    tree: int = 1  # FlashMap drafts per round, verified together as a tree (paper App. D; T=0 only)
    stop_strings: tuple[str, ...] = ()  # the reply ends before the first of these (the API's `stop`)

    def __post_init__(self):
        self.generation()  # validates K, max new tokens and sampling settings up front
        self.spec().drafter.validate(self.sampling())  # which options suit the drafter and the temperature (SpecError)

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p)

    def spec(self) -> RunSpec:
        """The drafter spec of this choice (drafter.spec.choice_spec, shared with the bench); the vLLM server drafts
        with its own drafter, so this engine's side of it is plain."""
        if self.drafter == REMOTE:
            return RunSpec(DrafterSpec("none"))
        return choice_spec(self.drafter, self.steps, self.tree, self.block_size, self.adaptive)

    def generation(self, verify_cost: tuple[float, ...] = (), drafting: bool = False) -> GenerationConfig:
        """The engine's settings for these choices (engine_settings, the one route the bench takes too)."""
        base = GenerationConfig(self.max_new_tokens, self.block_size, self.sampling(), self.stop_strings,
                                seed=self.seed)
        return engine_settings(self.spec(), base, verify_cost, drafting)


def engine_settings(spec: RunSpec, gen: GenerationConfig, verify_cost: tuple[float, ...] = (),
                    drafting: bool = False, draft_cost: float = 0.0) -> GenerationConfig:
    """gen (the reply's length, K, sampling, stops, seed) with what the drafter spec asks of the engine, one rule for
    the UI, the API and the bench: where the spec is adaptive, the verify-cost curve, the drafter's call cost and the
    verdicts' longest back-off (none without); a drafting reply makes a plain step at least every
    PolicyConfig.app_probe_every rounds, so its speed is always compared with plain decoding measured inside it
    (core.decoding.stats.ReplySpeed)."""
    adaptive = spec.adaptive  # the choice decides: FlashMap and DFlash-style draft every round
    policy = replace(gen.policy, max_skip=spec.max_skip if adaptive else 0, max_lost=spec.max_lost,
                     plain_probe_every=gen.policy.app_probe_every if drafting else 0)
    return replace(gen, verify_cost=verify_cost if adaptive else (), draft_cost=draft_cost if adaptive else 0.0,
                   policy=policy)


def describe(curves: CostCurves) -> str:
    """What the curves say in a few words: 4 positions against one after each measured context."""
    costs = [f"{curves.at(c)[min(3, len(curves.seconds[0]) - 1)]:.2f}× after {c:,} cached" for c in curves.contexts]
    return ": 4 positions cost " + ", ".join(costs)


class ChatService:
    def __init__(self, target: Target, weights: dict[str, str] | None = None, allow_download: bool = False,
                 data_dir: Path | None = None, thread_policy=None, remote=None):
        self.target = target
        self.remote = remote  # app.remote.VllmServer (checked) or None: the "vllm" choice writes replies there
        self.last_remote: dict | None = None  # what the server's spec-decode counters moved by in its last reply
        # core.runtime.threads.ThreadPolicy: the thread count while replies run; None: left as set
        self.thread_policy = thread_policy
        self.thread_count = thread_policy.live() if thread_policy is not None else None  # asked before each step
        self.weights = weights or {}
        self.allow_download = allow_download
        self.lock = FairLock()
        self.data_dir = Path(data_dir) if data_dir else None
        self.conversations = ConversationStore(self.data_dir / "conversations") if self.data_dir else None
        self._drafters: dict[DrafterSpec, Any] = {}  # a drafter (core.drafting.base.Drafter), or None for plain
        self._draft_costs: dict[int, float] = {}  # id(drafter) -> its call's cost relative to a target step
        # id(drafter) -> what drafting measured against plain steps in the replies so far
        # (core.drafting.policy.state.PolicyState)
        self._measured: dict[int, PolicyState] = {}
        self.prefix = PrefixCache()  # what the last reply left in its cache: the next prompt's prefill starts after it
        self.unavailable: dict[str, str] = {}
        self.cost_curves: CostCurves | None = None  # what 1..17 positions cost after short and long contexts
        self.curve_status = "not measured yet: adaptive K is off until it is"
        self.cancel_event = threading.Event()
        self.last_events: list[RoundEvent] = []
        self.last_speed = ReplySpeed()
        if not self.local:  # --backend vllm: the server holds the weights, every reply is its
            self.unavailable = {name: NO_WEIGHTS for name in APP_DRAFTERS}
            self.curve_status = "not used: the vLLM server writes every reply"
            return
        cached = load_cached(self.data_dir / "cache", target) if self.data_dir else None
        if cached:
            self.cost_curves = cached[0]
            when = time.strftime('%Y-%m-%d %H:%M', time.localtime(cached[1]))
            self.curve_status = f"cached from {when}{describe(self.cost_curves)}"
        for name in ("flashmap", "dflash"):  # the UI lists what works, read from the configs; loaded when chosen
            try:
                check_drafter(DrafterSpec(name, weights=self.weights.get(name)), target, allow_download)
            except DrafterUnavailable as err:
                self.unavailable[name] = str(err)

    @property
    def local(self) -> bool:
        """Whether this app holds the target's weights (not where --backend vllm loaded its text side alone,
        core.runtime.target.ServedTarget)."""
        return self.target.model is not None

    def fallback(self):
        """What a reply runs when the drafter it asked for is unavailable: plain decoding (None), or the vLLM server
        where this app holds no weights."""
        return None if self.local else self.remote

    def available(self) -> list[str]:
        remote = [REMOTE] if self.remote is not None else []
        return [name for name in APP_DRAFTERS if name not in self.unavailable] + remote

    def drafter_for(self, settings: ChatSettings):
        """The drafter these settings ask for: the vLLM server for "vllm", else drafter(settings.spec()); Auto
        without the FlashMap network (no checkpoint for this target) drafts with the free sources alone."""
        if settings.drafter == REMOTE:
            if self.remote is None:
                raise DrafterUnavailable("no vLLM server: start the app with --backend vllm --vllm-url URL")
            return self.remote
        if not self.local:
            raise DrafterUnavailable(NO_WEIGHTS)
        if settings.drafter == "auto" and "flashmap" in self.unavailable:
            return self.drafter(replace(settings, drafter="copies", steps=1, tree=1).spec().drafter)
        return self.drafter(settings.spec().drafter)

    def drafter(self, spec: DrafterSpec):
        """The drafter for this spec on this target (cached; K is the engine's business, not the drafter's),
        None for plain; DrafterUnavailable says why not."""
        if spec.name in self.unavailable:
            raise DrafterUnavailable(self.unavailable[spec.name])
        key = DrafterSpec(spec.name, steps=spec.steps, tree=spec.tree, noise_scale=spec.noise_scale,
                          phrasebook=spec.phrasebook if spec.name == "copies" else True,
                          weights=self.weights.get(spec.name))
        if key not in self._drafters:
            self._drafters[key] = build_drafter(key, self.target, self.allow_download)  # (DrafterUnavailable: why)
        if not spec.lookup:
            return self._drafters[key]
        hybrid = replace(key, lookup=True, phrasebook=spec.phrasebook)  # the same network, free sources beside it
        if hybrid not in self._drafters:
            self._drafters[hybrid] = with_lookup(self._drafters[key], self.target, spec.phrasebook)
        return self._drafters[hybrid]

    def max_block_size(self, name: str) -> int:
        """The largest K the drafter can propose (its trained block); the engine's limit when unavailable."""
        if name == REMOTE:
            return MAX_BLOCK_SIZE  # the server's drafter sets its own block
        try:
            drafter = self.drafter_for(ChatSettings(drafter=name))
        except DrafterUnavailable:
            drafter = None
        return drafter.max_block_size if drafter is not None else MAX_BLOCK_SIZE

    def messages(self, history: list[dict], message: str | None, settings: ChatSettings) -> list[dict]:
        """System prompt, the conversation so far and the new user message (none: the conversation alone)."""
        messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else [])
        messages += [{"role": m["role"], "content": m["content"]} for m in history if isinstance(m.get("content"), str)]
        return messages + ([{"role": "user", "content": message}] if message is not None else [])

    def prompt_ids(self, history: list[dict], message: str, settings: ChatSettings) -> list[int]:
        return self.target.chat_ids(self.messages(history, message, settings), enable_thinking=settings.enable_thinking)

    def stream(self, prompt_ids: list[int], settings: ChatSettings, drafter, cancel=None):
        """Yield (event, ReplySpeed so far) for one reply, holding the model lock. Stop (cancel()) or the given
        cancel flag ends it after the current round, with what was written kept."""
        with self.lock:
            self.cancel_event = cancel = cancel or threading.Event()
            speed, self.last_events = ReplySpeed(), []
            if drafter is not None and drafter is self.remote:  # the server drafts: no cost curve, no probes here
                yield from self._remote_stream(prompt_ids, settings.generation(), cancel, speed)
                return
            if not self.local:
                raise DrafterUnavailable(NO_WEIGHTS)
            gen = settings.generation(self.verify_cost(len(prompt_ids), settings.max_new_tokens),
                                      drafting=drafter is not None)
            if gen.charges_draft_cost() and drafter is not None:  # measured only where the engine charges it
                gen = replace(gen, draft_cost=self.draft_cost(drafter))
            measured = None if drafter is None else self._measured.setdefault(id(drafter), PolicyState())
            # more threads only while nothing else runs (ThreadPolicy.live), in every thread that resumes the reply
            events = generate(self.target, prompt_ids, gen, drafter, cancel, measured=measured, prefix=self.prefix)
            for ev in with_threads(events, self.thread_count or 0):
                speed.add(ev, time.perf_counter())
                self.last_events.append(ev)
                yield ev, speed
            self.last_speed = speed

    def _remote_stream(self, prompt_ids: list[int], gen: GenerationConfig, cancel, speed: ReplySpeed):
        """One reply written by the vLLM server, and what its spec-decode counters moved by meanwhile."""
        from app.remote import reply_acceptance

        before, self.last_remote = self.remote.spec_counters(), None
        for ev in self.remote.events(self.target, prompt_ids, gen, cancel):
            speed.add(ev, time.perf_counter())
            self.last_events.append(ev)
            if ev.finished:  # read before the last event goes out, so that its stats show this reply's
                self.last_remote = reply_acceptance(before, self.remote.spec_counters())
            yield ev, speed
        self.last_speed = speed

    def draft_cost(self, drafter) -> float:
        """One call of this drafter relative to a one-position target step, measured on its first adaptive reply
        (about a second; the caller holds the model lock) and kept: what the skip policy charges each draft."""
        if drafter is None:
            return 0.0
        key = id(drafter)
        if key not in self._draft_costs:
            self._draft_costs[key] = measure_draft_cost(self.target, drafter)
            log.info("%s: one call costs %.2f x a one-position target step", drafter.name, self._draft_costs[key])
        return self._draft_costs[key]

    def cancel(self) -> None:
        """Stop the reply being written (a no-op when none is)."""
        self.cancel_event.set()

    def run_once(self, prompt_ids: list[int], settings: ChatSettings, drafter) -> tuple[str, list[int], ReplySpeed]:
        """Whole reply: (text, token ids, speed)."""
        text, tokens, speed = "", list[int](), ReplySpeed()
        for ev, speed in self.stream(prompt_ids, settings, drafter):
            text, tokens = ev.text, tokens + list(ev.committed)
        return text, tokens, speed

    def verify_cost(self, prompt_tokens: int, max_new_tokens: int) -> tuple[float, ...]:
        """The relative cost of 1..17 positions a reply after this prompt meets (CostCurves.for_reply); () until
        measured."""
        curves = self.cost_curves
        return curves.for_reply(prompt_tokens, max_new_tokens) if curves is not None else ()

    def measure_verify_cost(self, repeats: int = CURVE_REPEATS) -> CostCurves:
        """Measure what a target forward over 1..17 positions costs here after a short and a long context, one pass
        at a time so that replies are served in between; keep the curves (medians per position) and cache them on
        disk."""
        passes = curve_passes(self.target, repeats)
        for done in range(1, repeats + 1):
            self.curve_status = f"measuring the verify cost ({done}/{repeats})…"
            with self.lock:
                curves = next(passes)
        self.cost_curves = curves
        if self.data_dir:
            save_cached(self.data_dir / "cache", self.target, curves)
        self.curve_status = f"measured {time.strftime('%H:%M')}{describe(curves)}"
        log.info("verify cost curves: %s", self.curve_status)
        return curves

    def measure_in_background(self, drafter: str = "auto") -> threading.Thread:
        """The verify-cost curves, then the call cost of the given drafter choice (built and run once meanwhile),
        measured between replies, so that the first adaptive reply waits for neither."""
        thread = threading.Thread(target=self._measure_logged, args=(drafter,), name="verify-cost", daemon=True)
        thread.start()
        return thread

    def _measure_logged(self, drafter: str) -> None:
        try:
            self.measure_verify_cost()
        except Exception:  # a real fault: keep serving (adaptive K keeps the cached curve or stays off)
            self.curve_status = "measurement failed (see the server log)"
            log.exception("verify cost measurement failed")
            return
        try:
            self.prepare_drafter(drafter)
        except Exception:  # the first adaptive reply measures it instead
            log.exception("measuring the %s drafter's call cost failed", drafter)

    def prepare_drafter(self, choice: str) -> float:
        """Build the drafter this choice drafts with and measure its call cost (draft_cost; 0 for plain or an
        unavailable one): its first call, slower than the rest, then falls in no reply."""
        with self.lock:
            try:
                drafter = self.drafter_for(ChatSettings(drafter=choice))
            except DrafterUnavailable:
                return 0.0
            return self.draft_cost(drafter) if drafter is not self.remote else 0.0

    def memory_held(self) -> dict[str, int]:
        """The bytes this app holds in tensors, by the memory plan's rows (core.runtime.plan.plan_rows): the target's
        weights, its KV caches (the fixed-shape steps' persistent one and what the prefix cache keeps), every drafter
        built so far (its network and context buffers), and under working memory the forward's and the drafters'
        tables and static inputs and outputs (the row also holds what no tensor shows: activations, the CUDA
        context); each storage counted once."""
        from core.runtime.memory import held_rows

        lean = self.target.lean
        caches = [getattr(lean, "cache", None), self.prefix.cache]
        drafters = list(self._drafters.values())
        networks = [(getattr(d, "net", None), getattr(d, "context", None))  # weights and context buffers
                    for d in (getattr(d, "main", d) for d in drafters)]  # (a LookupHybrid's network drafter)
        return held_rows({"weights": self.target.model, "kv cache": caches, "drafter": networks,
                          "working": [lean, drafters]})

    def threads(self) -> str:
        """The thread policy in effect for the status line: the measured one, else torch's own count."""
        from core.runtime.threads import wait_policy

        if self.thread_policy is not None:
            return self.thread_policy.describe()
        return f"{torch.get_num_threads()} thread(s), {wait_policy()} wait"
