"""The CPU thread policy: how many threads torch uses, and how idle OpenMP threads wait — measured per machine.

OpenMP threads that spin while they wait (libgomp's default) are fastest on an idle machine and collapse beside
another busy process, which takes turns with them; threads that sleep at once (OMP_WAIT_POLICY=PASSIVE) degrade
gracefully but pay a wake-up at every parallel region. Which compromise wins depends on the CPU and on how much of a
decode step is parallel work at all, so `python -m scripts.thread_policy --save` measures every candidate alone and
beside a busy process and caches the choice (choose); `python app.py` reads it before torch starts OpenMP (the
wait policy is read once, at start). Until a machine has been measured, DEFAULT_POLICY applies (the choice on the
machines measured so far; numbers in docs/journal/engine.md).

This module does not import torch at its top: app.py calls it before torch may start.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# how idle OpenMP threads wait, as the environment that sets it before OpenMP starts: spin (libgomp's default,
# ~300,000 spins before sleeping), passive (sleep at once) and a short spin (10,000 spins, then sleep)
WAIT_POLICIES = {"spin": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "short-spin": {"GOMP_SPINCOUNT": "10000"}}
BUSY_SLOWDOWN_LIMIT = 1.5  # beside one busy process, a policy may be at most this much slower than alone


@dataclass(frozen=True)
class ThreadPolicy:
    threads: int  # torch threads; 0: one per core
    wait: str  # a WAIT_POLICIES key
    # torch threads for a reply that starts while no other process runs (0: always `threads`): spinning threads are
    # fastest on an idle machine and collapse beside a busy neighbour, so each reply looks first (machine_idle)
    idle_threads: int = 0

    def describe(self) -> str:
        idle = f" ({self.idle_threads} when nothing else runs)" if self.idle_threads else ""
        return f"{self.threads or os.cpu_count()} thread(s){idle}, {self.wait} wait"

    def threads_now(self) -> int:
        """The thread count for a reply starting now (0: one per core)."""
        return self.idle_threads if self.idle_threads and machine_idle() else self.threads

    def live(self) -> Callable[[], int]:
        """A function giving the thread count now, for a server to call before each step of its replies: the idle
        count while most of IdleWatch's latest snapshots, kept from one reply to the next, saw no other process
        runnable. A neighbour runnable only as a reply starts (the client that sent it) is outvoted; one that starts
        between replies or mid-reply takes the count down within three snapshots (0.75 s of a reply)."""
        busy_count = self.threads or os.cpu_count() or 1
        if not self.idle_threads:
            return lambda: busy_count
        watch = IdleWatch()
        return lambda: self.idle_threads if watch.idle() else busy_count


DEFAULT_POLICY = ThreadPolicy(threads=1, wait="short-spin", idle_threads=os.cpu_count() or 1)


def choose(rows: list[dict]) -> ThreadPolicy:
    """The fastest policy alone among those that stay within BUSY_SLOWDOWN_LIMIT of it beside a busy process (the
    most robust one when none does). rows: {"threads", "wait_policy", "busy_neighbour", "tokens_per_s"}, several
    runs of a configuration averaged."""
    speed: dict[tuple[int, str, int, bool], list[float]] = {}
    for row in rows:
        key = (row["threads"], row["wait_policy"], row.get("idle_threads", 0), row["busy_neighbour"])
        speed.setdefault(key, []).append(row["tokens_per_s"])
    mean = {key: sum(v) / len(v) for key, v in speed.items()}
    candidates = {(t, w, i) for t, w, i, _ in mean if (t, w, i, False) in mean and (t, w, i, True) in mean}
    if not candidates:
        raise ValueError("no configuration was measured both alone and beside a busy process")
    robust = [c for c in candidates if mean[(*c, False)] <= BUSY_SLOWDOWN_LIMIT * mean[(*c, True)]]
    best = max(robust, key=lambda c: mean[(*c, False)]) if robust else max(
        candidates, key=lambda c: mean[(*c, True)] / mean[(*c, False)])
    return ThreadPolicy(*best)


def others_running() -> int:
    """Threads of other processes runnable at this instant, each read from its own /proc/PID/task/TID/stat (0
    where /proc is absent). Not /proc/stat's procs_running less this process's runnable threads: those are two
    readings taken apart, and this process's own threads waking between them (a server's, as a reply starts) hid a
    busy neighbour."""
    me = os.getpid()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit() and int(name) != me]
    except OSError:
        return 0
    running = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as stat:
                    running += stat.read().rsplit(b")", 1)[1].split(None, 1)[0] == b"R"
            except (OSError, IndexError):
                pass
    return running


def busy_snapshots(samples: int = 5, gap_s: float = 0.002) -> list[bool]:
    """Whether another process had a thread runnable, in each of `samples` snapshots gap_s apart."""
    import time

    busy = []
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        busy.append(others_running() > 0)
    return busy


def machine_idle(samples: int = 5, gap_s: float = 0.002) -> bool:
    """Whether no other process keeps a core busy: in most of a few snapshots ~2 ms apart, nothing else is runnable
    (a busy neighbour is runnable in nearly all of them; a daemon waking now and then in few)."""
    return sum(busy_snapshots(samples, gap_s)) <= samples // 2


class IdleWatch:
    """machine_idle over time: the snapshots of its first call, then one more at most every `every_s` (taken only
    when asked: nothing runs between replies), the majority of the latest `window` deciding."""

    def __init__(self, window: int = 5, every_s: float = 0.25, clock: Callable[[], float] | None = None):
        import time

        self.every_s, self.clock = every_s, clock or time.monotonic
        self.busy: deque[bool] = deque(maxlen=window)  # per snapshot: was another process runnable
        self.last = float("-inf")

    def idle(self) -> bool:
        now = self.clock()
        if not self.busy:
            self.busy.extend(busy_snapshots(self.busy.maxlen or 1))
            self.last = now
        elif now - self.last >= self.every_s:
            self.busy.append(others_running() > 0)
            self.last = now
        return sum(self.busy) <= len(self.busy) // 2


def wait_idle(timeout_s: float = 0.5) -> bool:
    """Wait up to timeout_s for machine_idle(); whether it came. A benchmark calls it between runs: the threads of
    a run that just ended (llama.cpp's spin for a while after its reply) are not a neighbour the next run should
    see."""
    import time

    deadline = time.monotonic() + timeout_s
    while not machine_idle():
        if time.monotonic() >= deadline:
            return False
    return True


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo names; empty where it is absent: the safe answer)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(word for line in text.splitlines() if line.startswith("flags") for word in line.split()[2:])


def machine_key() -> str:
    """What the choice depends on: the number of cores and the CPU (model and flags)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = []
    return hashlib.sha1(json.dumps([os.cpu_count(), cpu]).encode()).hexdigest()[:12]


def policy_file(cache_dir: Path) -> Path:
    return Path(cache_dir) / f"thread-policy-{machine_key()}.json"


def save_policy(cache_dir: Path, policy: ThreadPolicy, rows: list[dict]) -> Path:
    path = policy_file(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"policy": asdict(policy), "rows": rows}, indent=2))
    return path


def load_policy(cache_dir: Path | None) -> tuple[ThreadPolicy, str]:
    """(policy, where it came from): this machine's measured choice, or DEFAULT_POLICY."""
    if cache_dir is not None:
        try:
            data = json.loads(policy_file(cache_dir).read_text())["policy"]
            policy = ThreadPolicy(int(data["threads"]), str(data["wait"]), int(data.get("idle_threads", 0)))
            if policy.wait in WAIT_POLICIES:
                return policy, "measured on this machine"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return DEFAULT_POLICY, "default (not measured here: python -m scripts.thread_policy --save)"


def start_policy(cache_dir: Path | None) -> tuple[ThreadPolicy, str]:
    """load_policy, its wait policy set in the environment: call before torch starts OpenMP."""
    policy, source = load_policy(cache_dir)
    set_wait_policy(policy)
    return policy, source


def set_wait_policy(policy: ThreadPolicy) -> None:
    """Set the wait policy's environment unless the user set one; before torch starts OpenMP."""
    if not any(name in os.environ for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        os.environ.update(WAIT_POLICIES[policy.wait])


def apply_thread_policy(threads: int = 0) -> int:
    """Use `threads` torch threads (0: torch's default, one per core); returns the number in effect."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def resumed(items: Iterable[T], around: Callable[[], AbstractContextManager]) -> Iterator[T]:
    """`items` (a reply's events), each one produced, and the source closed, inside around() in whichever OS thread
    asks for it. A server resumes a streamed reply from its worker threads in turn, so per-thread state set once
    inside the reply (torch's inference mode, OpenMP's thread count) would stay behind in the first of them."""
    source = iter(items)
    try:
        while True:
            with around():
                try:
                    item = next(source)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            with around():
                close()


def with_threads(items: Iterable[T], threads: int | Callable[[], int]) -> Iterator[T]:
    """`items` (a reply's events) with `threads` torch threads (0: as set; a function: its answer before each
    item, ThreadPolicy.live) in whichever OS thread resumes it (resumed).
    OpenMP keeps a thread count per OS thread: a worker that ran an earlier reply keeps that reply's count, two
    threads beside a busy neighbour among them (each step then waits for the thread the neighbour keeps off its
    core)."""
    import torch

    count = threads if callable(threads) else (lambda: threads)

    @contextmanager
    def counted():
        now = count()
        if now and torch.get_num_threads() != now:
            torch.set_num_threads(now)
        yield

    return resumed(items, counted)


def wait_policy() -> str:
    if "GOMP_SPINCOUNT" in os.environ:
        return f"GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']}"
    return os.environ.get("OMP_WAIT_POLICY", "default (spinning)")
