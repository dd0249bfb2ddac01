"""What the UI needs from the engine, without any UI code: drafters for the loaded target,
settings -> GenerationConfig, a running conversation's statistics, and plain-decoding speed.

One model, many tabs: `lock` serialises every use of the target (Gradio's queue already runs
one event at a time; the lock also covers the API endpoints).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from app.engine import GenerationConfig, RoundEvent, generate
from app.registry import DrafterUnavailable, build_drafter
from app.sampling import SamplingConfig
from app.stats import AcceptanceStats
from app.target import Target
from app.verify_cost import relative_curve

DRAFTER_LABELS = {"flashmap": "FlashMap", "dflash": "DFlash-style", "ngram": "n-gram", "none": "none (plain)"}
CALIBRATION_PROMPT = "Write a short Python function that returns the sum of a list of numbers."


@dataclass(frozen=True)
class ChatSettings:
    drafter: str = "flashmap"
    block_size: int = 8
    steps: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    enable_thinking: bool = False
    system_prompt: str = ""
    seed: int = 0
    adaptive: bool = True  # cut low-confidence draft tails under the measured verify cost (engine.best_draft_length)
    tree: int = 1  # FlashMap drafts per round, verified together as a tree (paper App. D; T=0 only)

    def __post_init__(self):
        self.generation()  # validates K, max new tokens and sampling settings up front
        if self.tree < 1:
            raise ValueError(f"drafts per round must be >= 1, got {self.tree}")
        if self.tree > 1 and self.temperature > 0:
            raise ValueError("Several drafts per round (tree verification) are exact at temperature 0 only: "
                             "set temperature to 0 or drafts per round to 1.")

    def generation(self, verify_cost: tuple[float, ...] = ()) -> GenerationConfig:
        return GenerationConfig(self.max_new_tokens, self.block_size, SamplingConfig(self.temperature, self.top_p),
                                seed=self.seed, verify_cost=verify_cost if self.adaptive else ())


class ChatService:
    def __init__(self, target: Target, weights: dict[str, str] | None = None, allow_download: bool = False):
        self.target = target
        self.weights = weights or {}
        self.allow_download = allow_download
        self.lock = threading.Lock()
        self._drafters: dict[tuple[str, int, int], object] = {}
        self.unavailable: dict[str, str] = {}
        self.plain_tokens_per_s: float | None = None
        self.plain_measured = ""  # where plain_tokens_per_s comes from (speed ratios are only fair under equal load)
        self.verify_cost: tuple[float, ...] = ()  # measured by calibrate_verify_cost(); () until then
        self.last_events: list[RoundEvent] = []
        for name in ("flashmap", "dflash"):  # probe checkpoints once so the UI lists only what works
            try:
                self.drafter(name, 1)
            except DrafterUnavailable as err:
                self.unavailable[name] = str(err)

    def available(self) -> list[str]:
        return [name for name in ("flashmap", "dflash", "ngram", "none") if name not in self.unavailable]

    def drafter(self, name: str, steps: int, tree: int = 1):
        """The drafter for this target (cached), None for plain; DrafterUnavailable says why not.
        tree > 1 applies to FlashMap only (the other drafters have no noise to draw several drafts from)."""
        if name in self.unavailable:
            raise DrafterUnavailable(self.unavailable[name])
        key = (name, steps, tree if name == "flashmap" else 1)
        if key not in self._drafters:
            self._drafters[key] = build_drafter(name, self.target, steps=steps, weights=self.weights.get(name),
                                                 allow_download=self.allow_download, tree=key[2])
        return self._drafters[key]

    def prompt_ids(self, history: list[dict], message: str, settings: ChatSettings) -> list[int]:
        messages = ([{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else [])
        messages += [{"role": m["role"], "content": m["content"]} for m in history if isinstance(m.get("content"), str)]
        messages.append({"role": "user", "content": message})
        return self.target.chat_ids(messages, enable_thinking=settings.enable_thinking)

    def stream(self, prompt_ids: list[int], settings: ChatSettings, drafter, cancel=None):
        """Yield (event, tokens/s so far) for one reply, holding the model lock."""
        with self.lock:
            start, n_tokens = time.perf_counter(), 0
            self.last_events = []
            for ev in generate(self.target, prompt_ids, settings.generation(self.verify_cost), drafter, cancel):
                n_tokens += len(ev.committed)
                self.last_events.append(ev)
                yield ev, n_tokens / max(time.perf_counter() - start, 1e-9)
            if drafter is None and n_tokens >= 16:
                self.plain_tokens_per_s = n_tokens / (time.perf_counter() - start)
                self.plain_measured = "your last plain reply"

    def calibrate_plain(self, max_new_tokens: int = 48) -> float:
        """Measure plain decoding on this machine (a fixed prompt), so speed figures are not assumed."""
        ids = self.target.chat_ids([{"role": "user", "content": CALIBRATION_PROMPT}])
        settings = ChatSettings(drafter="none", max_new_tokens=max_new_tokens)
        for _ in self.stream(ids, settings, None):
            pass
        self.plain_measured = "at start-up, before any browser load"
        return self.plain_tokens_per_s or 0.0

    def calibrate_verify_cost(self) -> tuple[float, ...]:
        """Measure what a target forward over 1..K+1 positions costs here (for the adaptive draft length)."""
        with self.lock:
            self.verify_cost = relative_curve(self.target)
        return self.verify_cost

    def run_once(self, prompt_ids: list[int], settings: ChatSettings, drafter) -> tuple[str, list[int], float]:
        """Whole reply: (text, token ids, tokens/s)."""
        text, tokens, tps = "", [], 0.0
        for ev, tps in self.stream(prompt_ids, settings, drafter):
            text, tokens = ev.text, tokens + list(ev.committed)
        return text, tokens, tps
