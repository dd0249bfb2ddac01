"""Plain decoding speed under each CPU thread policy, alone and beside one busy process.

python -m scripts.thread_policy [--tokens 128] [--repeats 2] [--out FILE.json] [--save [--data-dir DIR]]

Every configuration runs in a fresh process (OpenMP reads its wait policy once, at start): torch threads 1, all
cores, or 1 that takes all cores while nothing else runs (as the app decides before each reply), each wait policy of
core.runtime.threads.WAIT_POLICIES, each measured alone and with one other process keeping a core busy (a
single-threaded
matmul loop, like a training job or a browser), `--repeats` times in turn. Run it on an otherwise idle machine.
--save caches the choice (core.runtime.threads.choose) where `python app.py` reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from core.runtime.threads import WAIT_POLICIES, choose, save_policy

ROOT = Path(__file__).resolve().parent.parent
MEASURE = """
import json, sys, time, torch
from core.decoding.engine import GenerationConfig, generate_all
from core.runtime.target import TargetConfig, load_target
from core.runtime.threads import ThreadPolicy
threads, tokens, idle = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
target = load_target(TargetConfig())
ids = target.chat_ids([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
generate_all(target, ids, GenerationConfig(max_new_tokens=8))
if idle:  # as the app does before each reply
    torch.set_num_threads(ThreadPolicy(threads, "spin", idle).threads_now())
start = time.perf_counter()
out, _ = generate_all(target, ids, GenerationConfig(max_new_tokens=tokens))
print(json.dumps({"threads": threads or torch.get_num_threads(), "idle_threads": idle,
                  "tokens_per_s": len(out) / (time.perf_counter() - start)}))
"""
BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"


def measure(threads: int, policy: str | None, busy: bool, tokens: int, idle: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(WAIT_POLICIES[policy])
    hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        done = subprocess.run([sys.executable, "-c", MEASURE, str(threads), str(tokens), str(idle)], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wait_policy": policy, "busy_neighbour": busy, **result}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration (averaged)")
    parser.add_argument("--out", default=None, help="also write every run as JSON here")
    parser.add_argument("--save", action="store_true", help="cache the choice for `python app.py` on this machine")
    parser.add_argument("--data-dir", default=str(Path.home() / ".flashmap-chat"), help="the app's --data-dir")
    args = parser.parse_args(argv)
    rows = []
    for _ in range(args.repeats):
        for busy in (False, True):
            # (threads, threads while nothing else runs): all cores, one, and one that takes all when idle
            for threads, idle in ((0, 0), (1, 0), (1, os.cpu_count() or 1)):
                for policy in WAIT_POLICIES:
                    rows.append(measure(threads, policy, busy, args.tokens, idle))
                    print(json.dumps(rows[-1]), flush=True)
    chosen = choose(rows)
    print(f"chosen: {chosen.describe()}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "tokens": args.tokens, "chosen": chosen.wait,
                                              "chosen_threads": chosen.threads, "chosen_idle_threads":
                                              chosen.idle_threads, "rows": rows}, indent=2))
    if args.save:
        print(f"saved: {save_policy(Path(args.data_dir) / 'cache', chosen, rows)}", flush=True)


if __name__ == "__main__":
    main()
