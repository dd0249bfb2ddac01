"""The thread policy (core.runtime.threads): the choice rule, its per-machine cache, and the environment it sets."""
import os

import pytest

from core.runtime import threads as threads_mod
from core.runtime.threads import DEFAULT_POLICY, ThreadPolicy, choose, load_policy, save_policy, set_wait_policy


def rows(table):
    return [{"threads": t, "wait_policy": w, "busy_neighbour": busy, "tokens_per_s": tps}
            for (t, w, busy), tps in table.items()]


def test_choose_takes_the_fastest_policy_that_survives_a_busy_neighbour():
    measured = rows({(2, "spin", False): 80, (2, "spin", True): 15,  # fastest alone, collapses beside a busy process
                     (1, "passive", False): 65, (1, "passive", True): 64,
                     (2, "passive", False): 35, (2, "passive", True): 50})
    assert choose(measured) == ThreadPolicy(1, "passive")
    robust_spin = rows({(2, "spin", False): 80, (2, "spin", True): 60, (1, "passive", False): 65,
                        (1, "passive", True): 64})
    assert choose(robust_spin) == ThreadPolicy(2, "spin")
    none_robust = rows({(2, "spin", False): 80, (2, "spin", True): 10, (2, "passive", False): 40,
                        (2, "passive", True): 20})
    assert choose(none_robust) == ThreadPolicy(2, "passive")  # the smallest slowdown
    with pytest.raises(ValueError):
        choose(rows({(2, "spin", False): 80}))


def test_choose_averages_repeated_runs():
    table = rows({(2, "spin", False): 80, (2, "spin", True): 50})
    table += rows({(2, "spin", False): 40, (2, "spin", True): 50})
    assert choose(table) == ThreadPolicy(2, "spin")  # mean alone 60 <= 1.5 x 50


def test_the_measured_choice_is_cached_per_machine(tmp_path):
    assert load_policy(tmp_path)[0] == DEFAULT_POLICY and "default" in load_policy(tmp_path)[1]
    save_policy(tmp_path, ThreadPolicy(2, "short-spin"), [])
    assert load_policy(tmp_path) == (ThreadPolicy(2, "short-spin"), "measured on this machine")
    threads_mod.policy_file(tmp_path).write_text("{not json")
    assert load_policy(tmp_path)[0] == DEFAULT_POLICY  # unreadable: the default, no crash


def test_a_wait_policy_the_user_set_is_kept(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    set_wait_policy(ThreadPolicy(1, "passive"))
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    set_wait_policy(ThreadPolicy(1, "short-spin"))
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_a_policy_that_takes_all_cores_only_while_nothing_else_runs(monkeypatch, tmp_path):
    measured = rows({(2, "spin", False): 150, (2, "spin", True): 50, (1, "spin", False): 110, (1, "spin", True): 118})
    measured += [{"threads": 1, "idle_threads": 2, "wait_policy": "spin", "busy_neighbour": busy, "tokens_per_s": tps}
                 for busy, tps in ((False, 148), (True, 117))]
    policy = choose(measured)
    assert policy == ThreadPolicy(1, "spin", 2) and "2 when nothing else runs" in policy.describe()
    save_policy(tmp_path, policy, measured)
    assert load_policy(tmp_path)[0] == policy  # the idle thread count survives the cache
    snapshots = iter([0, 1, 0, 0, 0, 1, 1, 1, 0, 1])  # others runnable: rarely, then mostly
    monkeypatch.setattr(threads_mod, "others_running", lambda: next(snapshots))
    assert policy.threads_now() == 2 and policy.threads_now() == 1
    assert ThreadPolicy(1, "passive").threads_now() == 1  # no idle count: nothing is looked at


def test_the_live_count_follows_the_latest_snapshots(monkeypatch):
    """A neighbour runnable for a moment is outvoted; one that stays takes the count down once three of the five
    latest snapshots see it; snapshots are taken at most every 0.25 s."""
    snapshots = iter([1, 1, 0, 0, 0] + [0, 0, 1, 1, 1, 1])
    monkeypatch.setattr(threads_mod, "others_running", lambda: next(snapshots))
    now = [0.0]
    watch = threads_mod.IdleWatch(clock=lambda: now[0])
    seen = []
    for _ in range(13):
        seen.append(watch.idle())
        now[0] += 0.125  # a snapshot every other call (exact in binary)
    assert seen == [True] * 10 + [False] * 3
    monkeypatch.setattr(threads_mod, "IdleWatch", lambda: watch)
    assert ThreadPolicy(1, "spin", 2).live()() == 1 and ThreadPolicy(3, "spin").live()() == 3


def test_others_running_reads_this_machine():
    assert threads_mod.others_running() >= 0 and isinstance(threads_mod.machine_idle(samples=2, gap_s=0), bool)


def test_a_busy_neighbour_is_seen_whatever_this_process_runs():
    """A process spinning beside this one keeps the machine from looking idle, also while this process keeps a
    thread of its own busy."""
    import subprocess
    import sys
    import threading
    import time

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    own = threading.Thread(target=spin)
    own.start()
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert sum(threads_mod.others_running() >= 1 for _ in range(5)) >= 4 and not threads_mod.machine_idle()
    finally:
        neighbour.kill()
        neighbour.wait()
        stop.set()
        own.join()


def test_wait_idle_waits_for_a_neighbour_to_settle_and_gives_up_in_time(monkeypatch):
    answers = iter([False, False, True])
    monkeypatch.setattr(threads_mod, "machine_idle", lambda: next(answers))
    assert threads_mod.wait_idle(timeout_s=5.0)
    monkeypatch.setattr(threads_mod, "machine_idle", lambda: False)
    assert not threads_mod.wait_idle(timeout_s=0.05)


def test_a_reply_keeps_its_thread_count_in_whichever_thread_resumes_it():
    """OpenMP keeps a count per OS thread: a worker that ran an earlier reply with 2 threads resumes this one with
    its 1; closing the reply closes what it wraps."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from core.runtime.threads import with_threads

    worker = ThreadPoolExecutor(1)
    worker.submit(torch.set_num_threads, 2).result()  # an earlier reply's count, which this OS thread keeps

    def counts():
        while True:
            yield torch.get_num_threads()

    reply = with_threads(counts(), 1)
    assert [next(reply), worker.submit(next, reply).result(), worker.submit(next, reply).result()] == [1, 1, 1]
    closed = []

    def events():
        try:
            yield from counts()
        finally:
            closed.append(True)

    left = with_threads(events(), 0)
    next(left)
    left.close()
    assert closed == [True]
    worker.shutdown()
