"""Plain decoding speed under each CPU thread policy, alone and beside one busy process (issue #14).

python -m scripts.thread_policy [--tokens 64] [--out docs/results/thread_policy.json]

Every configuration runs in a fresh process (OpenMP reads its wait policy once, at start): torch threads 1 or
all cores, OMP_WAIT_POLICY unset (threads spin while they wait) or PASSIVE (they sleep), each measured alone
and with one other process keeping a core busy (a single-threaded matmul loop, like a training job or a
browser). Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURE = """
import json, sys, time, torch
from core.engine import GenerationConfig, generate_all
from core.target import TargetConfig, load_target
threads, tokens = int(sys.argv[1]), int(sys.argv[2])
if threads:
    torch.set_num_threads(threads)
target = load_target(TargetConfig())
ids = target.chat_ids([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
generate_all(target, ids, GenerationConfig(max_new_tokens=8))
start = time.perf_counter()
out, _ = generate_all(target, ids, GenerationConfig(max_new_tokens=tokens))
print(json.dumps({"threads": torch.get_num_threads(), "tokens_per_s": len(out) / (time.perf_counter() - start)}))
"""
BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"


def measure(threads: int, policy: str | None, busy: bool, tokens: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        done = subprocess.run([sys.executable, "-c", MEASURE, str(threads), str(tokens)], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wait_policy": policy or "default (spin)", "busy_neighbour": busy, **result}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per measurement")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "thread_policy.json"))
    args = parser.parse_args(argv)
    rows = []
    for busy in (False, True):
        for threads in (0, 1):
            for policy in (None, "PASSIVE"):
                rows.append(measure(threads, policy, busy, args.tokens))
                print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "tokens": args.tokens, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
