"""How long `python app.py` takes to serve, and to have its verify-cost curve (issue #14's start-up times).

python -m scripts.start_time [--data-dir DIR] [--port 7901]

Run it twice with the same --data-dir: the first start measures the curve in the background, the second
finds it cached. Prints both times; stops the app once the curve is there (or 120 s after it serves).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="/tmp/flashmap-start-time", help="the app's --data-dir")
    parser.add_argument("--port", type=int, default=7901)
    args = parser.parse_args(argv)
    began = time.time()
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port), "--data-dir", args.data_dir],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    serving = None
    try:
        for line in proc.stdout:
            if "Running on local URL" in line and serving is None:
                serving = time.time() - began
                print(f"serving after {serving:.1f} s", flush=True)
            if "Verify-cost curve: cached" in line:
                print("the verify-cost curve was found cached", flush=True)
            if "verify cost of 2 / 9 / 17" in line:
                print(f"curve measured after {time.time() - began:.1f} s: {line.split('INFO ')[-1].strip()}")
                break
            if serving and time.time() - began > serving + 120:
                break
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
