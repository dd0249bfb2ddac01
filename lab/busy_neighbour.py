"""The app's speed beside a busy neighbour and alone: a process that keeps one core busy starts first, then `python
app.py` (as a user starts it: the default drafter, the verify-cost measurement in the background), which writes a
first reply with its default drafter and then plain replies to tuning prompts through gradio_client; the neighbour
stops and the same prompts are answered again alone. Tokens a second as the app's /speed reports them, per reply,
and the median of each phase. What the live thread count is for (core.runtime.threads: ThreadPolicy.live,
with_threads): two spinning threads beside a busy neighbour each wait for the one it keeps off its core.

python -m lab.busy_neighbour --prompts tuning_chat --limit 6 --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.prompts import read_prompt_file
from scripts.screenshots import free_port, start_app


def summary(speeds: dict[str, list[float]]) -> dict:
    """Each phase's median tokens a second and its range."""
    return {phase: {"median": statistics.median(values), "min": min(values), "max": max(values)}
            for phase, values in speeds.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="tuning_chat")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from gradio_client import Client

    prompts = [row["prompt"] for row in read_prompt_file(args.prompts)[: args.limit]]
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = {"busy": [], "alone": []}
    with tempfile.TemporaryDirectory() as data_dir:
        proc, url = start_app(free_port(), "auto", "--data-dir", data_dir)
        try:
            client = Client(url, verbose=False)
            client.predict("What is 2+2? Answer with the number.", api_name="/chat")  # the default drafter's
            for phase in ("busy", "alone"):
                if phase == "alone":
                    neighbour.kill()
                    neighbour.wait()
                    time.sleep(0.3)
                for prompt in prompts:
                    client.predict(prompt, drafter="none", max_new_tokens=args.max_new_tokens, api_name="/chat")
                    rows[phase].append(client.predict(api_name="/speed")["tokens_per_s"])
                    print(phase, round(rows[phase][-1], 1), flush=True)
        finally:
            neighbour.kill()
            proc.terminate()
            proc.wait(timeout=30)
    result = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "tokens_per_s": rows, "summary": summary(rows)}
    print(json.dumps(result["summary"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
