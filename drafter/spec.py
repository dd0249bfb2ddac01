"""One drafter spec: which drafter, with which options, written one way and checked in one place.

Text form (CLIs, the suite, the evaluator, report labels): `name[,option=value]...`, e.g.
`flashmap,steps=2,tree=4,k=8`. Options:

  steps=N      flow drafters: FlashMap jumps (1 to 4; the project's network is distilled for 1 and 2, a released
               drafter offers what its jump_grids list), or the teacher's Euler steps (e.g. 16)
  noise=shared|shuffled   shuffled: independent noise per slot (the shuffle test, paper §6.2), each slot's own
               noise the shared draft's (drafting.BlockSampler._shuffled)
  best_of=M    flow drafters: draft M blocks from independent noise, keep the most confident
  tree=M       flow drafters, T = 0 only: M drafts verified together as a trie (paper App. D)
  scale=S      the initial noise scale (>= 0): the teacher's Euler integration or FlashMap's jumps
               (scale=0: the jumps from x0 = 0, a deterministic draft)
  k=K          block size; unset = the drafter's own (the block it was trained for), and never above it
  adaptive=1   cut each draft to its best expected length under the measured verify cost
  skip=N       with adaptive: a source whose rounds did not pay (a network draft whose cut did not cover its call,
               or rounds measured slower than plain steps) waits up to N rounds before it drafts again
               (core.drafting.policy.state.Verdict; 0: never; default 8)
  calibrated=0 network drafters: the cut reads the raw confidence, not the checkpoint's calibration.json
               (drafter/runtime/calibration.py; applied at T = 0 when one was fitted for this way of drafting)
  lookup=1     network drafters: prompt lookup joins each round (core.drafting.base.LookupHybrid): at T = 0 its
               continuation is one more branch of the verified trie, a strong match is copied without calling the
               network; at T > 0 a round takes one of the two
  phrasebook=0 with lookup: without the target's phrasebook (core.drafting.phrasebook), the second free source that
               copies what the target's own replies most often continue the latest tokens with
  weights=DIR  a checkpoint other than weights/<target>/<name>

adaptive, skip and lost say what the engine's policy does with the drafts, not what the drafter is: they live in
RunSpec beside the DrafterSpec (RunSpec.parse reads the whole text form). `DrafterSpec.refusal` holds every rule about
which option suits which drafter, `RunSpec.refusal` those about the policy's options; `validate(sampling)` the rules
that depend on the temperature. Building the drafter is `drafter.registry.build_drafter`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from core.drafting.base import MAX_BLOCK_SIZE
from core.drafting.policy.config import DEFAULTS
from core.verification.sampling import SamplingConfig

FLASHMAP_STEPS = (1, 2, 3, 4)  # jumps of a FlashMap draft: the release's grids (drafter.networks.release)
FLOW_DRAFTERS = ("flashmap", "flashmap-teacher")  # draw noise: steps, noise, best-of and trees apply
NET_DRAFTERS = FLOW_DRAFTERS + ("dflash",)  # trained networks with a checkpoint
ENGINE_DRAFTERS = ("none", "ngram", "copies") + NET_DRAFTERS  # copies: prompt lookup and the phrasebook, no network
HF_BASELINES = ("hf-generate", "hf-prompt-lookup")  # transformers' own generate, for comparison only
LABELS = {"flashmap": "FlashMap", "flashmap-teacher": "FlashMap teacher", "dflash": "DFlash-style",
          "ngram": "n-gram", "copies": "Copies", "none": "none (plain)", "hf-generate": "transformers generate",
          "hf-prompt-lookup": "transformers prompt lookup"}
# text key -> field; the order is the canonical text's
KEYS = {"steps": "steps", "noise": "noise", "best_of": "best_of", "tree": "tree", "scale": "noise_scale",
        "k": "block_size", "adaptive": "adaptive", "skip": "max_skip", "lost": "max_lost", "calibrated": "calibrated",
        "lookup": "lookup", "phrasebook": "phrasebook", "weights": "weights"}


class SpecError(ValueError):
    """Options that do not fit together or do not suit the drafter; the message says which and why."""


@dataclass(frozen=True)
class DrafterSpec:
    name: str = "flashmap"
    steps: int = 1
    noise: str = "shared"
    best_of: int = 1
    tree: int = 1
    noise_scale: float = 1.0
    block_size: int | None = None  # K; None: the drafter's own
    calibrated: bool = True
    lookup: bool = False
    phrasebook: bool = True  # with lookup: the target's phrasebook beside prompt lookup, where it has one
    weights: str | None = None

    def __post_init__(self):
        why = self.refusal()
        if why:
            raise SpecError(f"{self.text()}: {why}")

    def refusal(self) -> str | None:
        """Why these options cannot run together (None: they can). Temperature rules: validate()."""
        flow, name = self.name in FLOW_DRAFTERS, self.name
        if name not in ENGINE_DRAFTERS + HF_BASELINES:
            return f"unknown drafter {name!r}; choose from {', '.join(ENGINE_DRAFTERS + HF_BASELINES)}"
        if min(self.steps, self.best_of, self.tree) < 1:
            return "steps, best_of and tree must be >= 1"
        if name == "flashmap" and self.steps not in FLASHMAP_STEPS:
            return (f"FlashMap drafts in {', '.join(map(str, FLASHMAP_STEPS))} jumps (a released drafter: the ones its "
                    f"jump_grids list), got steps={self.steps}; the teacher (flashmap-teacher) takes any number")
        if self.block_size is not None and not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            return f"block size k must be in 1..{MAX_BLOCK_SIZE}, got {self.block_size}"
        if self.noise not in ("shared", "shuffled"):
            return f"noise must be shared or shuffled, got {self.noise!r}"
        if not flow and (self.steps != 1 or self.noise != "shared" or self.best_of > 1 or self.tree > 1):
            return f"steps, noise, best_of and tree apply to the flow drafters ({', '.join(FLOW_DRAFTERS)}) only"
        if self.noise_scale < 0 or (self.noise_scale != 1.0 and not flow):
            return f"scale (>= 0) applies to the flow drafters ({', '.join(FLOW_DRAFTERS)}) only"
        if self.tree > 1 and self.best_of > 1:
            return "choose best-of-M or a tree of M drafts, not both"
        if name in HF_BASELINES and self.weights:
            return "transformers' generate takes no drafter weights"
        if not self.calibrated and name not in NET_DRAFTERS:
            return f"calibrated applies to the network drafters ({', '.join(NET_DRAFTERS)}) only"
        if not self.phrasebook and not (self.lookup or name == "copies"):
            return "phrasebook=0 turns off a part of lookup; it needs lookup=1 (or the copies drafter)"
        if self.lookup and name not in NET_DRAFTERS:
            return (f"lookup joins the network drafters ({', '.join(NET_DRAFTERS)}); n-gram and copies are lookup "
                    "themselves")
        if name == "none" and self.weights:
            return "plain decoding has no drafter to give weights to"
        return None

    def validate(self, sampling: SamplingConfig) -> None:
        """Raise SpecError if the drafter cannot run exactly at these sampling settings."""
        if self.tree > 1 and not sampling.greedy:
            raise SpecError(f"{self.text()}: several network drafts verified together (tree={self.tree}) run at "
                            "temperature 0 only: at T > 0 its drafts are sampled from its q, which a tree's walk "
                            "does not use (it keeps a token only where the target draws it); use tree=1 at T > 0")

    @property
    def is_hf_baseline(self) -> bool:
        return self.name in HF_BASELINES

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def describe(self, policy: tuple[str, ...] = ()) -> str:
        """A label for people: 'FlashMap 1-step, tree of 4 drafts, K=4' (reports, the UI); `policy`: what the engine
        does with the drafts, in words after K (RunSpec.describe)."""
        teacher = "flow teacher, 1 step (its t = 0 pass)" if self.steps == 1 else f"flow teacher, {self.steps} steps"
        base = {"flashmap": f"FlashMap {self.steps}-step", "flashmap-teacher": teacher}
        words = [base.get(self.name, LABELS[self.name])]
        words += ["per-slot independent noise"] if self.noise == "shuffled" else []
        words += [f"best of {self.best_of} noise draws"] if self.best_of > 1 else []
        words += [f"tree of {self.tree} drafts"] if self.tree > 1 else []
        words += [f"noise × {self.noise_scale:g}"] if self.noise_scale != 1.0 else []
        words += [f"K={self.block_size}"] if self.block_size else []
        words += list(policy)
        words += ["raw confidence"] if not self.calibrated else []
        words += [f"with prompt lookup{' and the phrasebook' if self.phrasebook else ''}"] if self.lookup else []
        words += [f"{Path(self.weights).parent.name} checkpoint"] if self.weights else []
        return ", ".join(words)

    def text(self) -> str:
        """The canonical text form: the name, then every option that differs from its default."""
        return ",".join([self.name, *options_text(self)])

    def sampler_key(self) -> str:
        """How the drafter drafts, without what the engine does with it (K, adaptive cut, skips, weights): the
        key a confidence calibration is fitted for (drafter/runtime/calibration.py)."""
        return DrafterSpec(self.name, self.steps, self.noise, self.best_of, self.tree, self.noise_scale).text()

    @classmethod
    def parse(cls, text: str, **defaults) -> "DrafterSpec":
        """'flashmap,steps=2,tree=4' -> DrafterSpec; `defaults` fill fields the text leaves out. The policy's options
        (adaptive, skip, lost) are RunSpec.parse's."""
        name, values = parse_options(text, defaults)
        policy = sorted(set(values) & set(POLICY_FIELDS))
        if policy:
            raise SpecError(f"{text!r}: {', '.join(policy)} say what the engine does with the drafts (RunSpec), not "
                            "what the drafter is")
        return cls(name=name, **values)


@dataclass(frozen=True)
class RunSpec:
    """What a run drafts with: the drafter, and what the engine's policy does with its drafts (the adaptive cut under
    the measured verify cost, the skips after drafts that did not pay for the call). Its text form is the
    drafter's with these options among the others (`flashmap,adaptive=1,lookup=1`); app.service.engine_settings turns
    it into the engine's GenerationConfig."""

    drafter: DrafterSpec = DrafterSpec()
    adaptive: bool = False  # cut each draft to its best expected length under the measured verify cost
    max_skip: int = DEFAULTS.max_skip  # with adaptive: the longest wait after rounds that did not pay
    # with adaptive: the expected tokens a round the cut may give up against verifying the whole draft (0: no bound)
    max_lost: float = DEFAULTS.max_lost

    def __post_init__(self):
        why = self.refusal()
        if why:
            raise SpecError(f"{self.text()}: {why}")

    def refusal(self) -> str | None:
        """Why the policy's options do not fit this drafter (None: they do)."""
        if self.max_skip < 0:
            return "skip must be >= 0"
        if not 0 <= self.max_lost < MAX_BLOCK_SIZE:
            return f"lost must be in [0, {MAX_BLOCK_SIZE}): expected tokens a round the cut may give up"
        if self.max_lost and not self.adaptive:
            return "lost= bounds the adaptive cut; it needs adaptive=1"
        if self.drafter.is_hf_baseline and self.adaptive:
            return "transformers' generate takes no adaptive cut"
        return None

    def text(self) -> str:
        """The canonical text form: the drafter's name, then every option (the drafter's and the policy's) that
        differs from its default, in KEYS' order."""
        return ",".join([self.drafter.name, *options_text(self.drafter, self)])

    def describe(self) -> str:
        """The drafter's description with the policy's options: 'FlashMap 1-step, adaptive K (drafter skipped after
        drafts that did not pay), with prompt lookup and the phrasebook'."""
        every_round = (", drafter called every round" if self.max_skip == 0
                       else " (drafter skipped after drafts that did not pay)")
        bound = f", at most {self.max_lost:g} expected tokens a round cut" if self.max_lost else ""
        words = [f"adaptive K{bound}{every_round}"] if self.adaptive else []
        return self.drafter.describe(tuple(words))

    @classmethod
    def parse(cls, text: str, **defaults) -> "RunSpec":
        """'flashmap,steps=2,adaptive=1' -> RunSpec; `defaults` fill fields (the drafter's or the policy's) the text
        leaves out."""
        name, values = parse_options(text, defaults)
        policy = {key: values.pop(key) for key in POLICY_FIELDS if key in values}
        return cls(DrafterSpec(name=name, **values), **policy)


POLICY_FIELDS = ("adaptive", "max_skip", "max_lost")  # RunSpec's fields in the text form


def options_text(*specs) -> list[str]:
    """'key=value' for every field of the specs (a DrafterSpec, a RunSpec) that differs from its default, in KEYS'
    order."""
    values: dict[str, str] = {}
    for spec in specs:
        defaults = {f.name: f.default for f in fields(spec)}
        values |= {name: getattr(spec, name) for name in defaults if name in KEYS.values()
                   and getattr(spec, name) != defaults[name]}
    return [f"{key}={int(values[name]) if isinstance(values[name], bool) else values[name]}"
            for key, name in KEYS.items() if name in values]


def parse_options(text: str, defaults: dict) -> tuple[str, dict]:
    """'name,key=value,...' -> (name, fields by name, `defaults` under them)."""
    name, *options = text.strip().split(",")
    values = dict(defaults)
    for option in options:
        key, _, raw = option.partition("=")
        if key not in KEYS or not raw:
            raise SpecError(f"{text!r}: options are {', '.join(k + '=' for k in KEYS)} (see drafter/spec.py)")
        values[KEYS[key]] = _cast(KEYS[key], raw, text)
    return name, values


# The drafter choices the app offers, alike in the UI, the API and the bench (choice_spec makes each one spec):
# auto: the free sources (prompt lookup and the phrasebook) and the FlashMap network where its drafts pay, as measured
#   in the reply (the default); flashmap / dflash: that network drafts every round at a fixed K, so K, steps and
#   drafts per round act visibly; copies: auto without the network; none: plain decoding.
CHOICES = ("auto", "flashmap", "dflash", "copies", "none")
FLASHMAP_CHOICES = ("auto", "flashmap")  # the choices that draft with the FlashMap network: steps and drafts apply
ADAPTIVE_CHOICES = ("auto", "copies")  # the choices whose policy may cut and skip; the networks draft every round
CHOICE_LABELS = {"auto": "Auto", "flashmap": "FlashMap", "dflash": "DFlash-style", "copies": "Copies",
                 "none": "None (plain)"}
APP_DEFAULT = "default"  # the bench's older name for the app's default choice, auto


def choice_spec(choice: str = "auto", steps: int = 1, tree: int = 1, block_size: int | None = None,
                adaptive: bool = True) -> RunSpec:
    """The spec of one of the app's drafter choices (CHOICES) with the options a user sets; SpecError says what the
    choice allows where an option does not fit it. Auto: adaptive K under the measured verify cost, skips after drafts
    that did not pay, prompt lookup and the target's phrasebook beside the network at every temperature (its speed:
    docs/figures.md). FlashMap's jumps start from x0 = 0 at every temperature, measured at least as good as drawn
    noise (docs/drafter.md, docs/figures.md), while a tree needs its drafts' noise."""
    if choice not in CHOICES:
        raise SpecError(f"unknown drafter {choice!r}; choose from {', '.join(CHOICES)}")
    network = "flashmap" if choice in FLASHMAP_CHOICES else "dflash" if choice == "dflash" else None
    if network is None and (steps != 1 or tree != 1):
        raise SpecError(f"{CHOICE_LABELS[choice]} drafts without a network: steps and drafts per round must be 1 "
                        f"(FlashMap's choices: steps {', '.join(map(str, FLASHMAP_STEPS))}, any number of drafts)")
    if choice == "none":
        return RunSpec(DrafterSpec("none"))
    if choice == "copies":
        return RunSpec(DrafterSpec("copies", block_size=block_size), adaptive=adaptive)
    noise = 0.0 if network == "flashmap" and tree == 1 else 1.0
    if choice == "auto":
        return RunSpec(DrafterSpec("flashmap", steps=steps, tree=tree, block_size=block_size, noise_scale=noise,
                                   lookup=True), adaptive=adaptive)
    assert network is not None  # (the choices without a network returned above)
    return RunSpec(DrafterSpec(network, steps=steps, tree=tree, block_size=block_size, noise_scale=noise))


def _cast(field: str, raw: str, text: str):
    try:
        if field in ("noise", "weights"):
            return raw
        if field in ("noise_scale", "max_lost"):
            return float(raw)
        if field in ("adaptive", "calibrated", "lookup", "phrasebook"):
            return bool(int(raw))
        return int(raw)
    except ValueError as err:
        raise SpecError(f"{text!r}: {raw!r} is not a valid value for {field}") from err
