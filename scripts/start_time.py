"""How long `python app.py` takes to serve, and to have its verify-cost curve (start-up times).

python -m scripts.start_time [--data-dir DIR] [--port 7901]

Run it twice with the same --data-dir: the first start measures the curve in the background, the second
finds it cached. Prints both times; stops the app once the curve is there (or 120 s after it serves).
"""
from __future__ import annotations

import argparse
import time

from scripts.screenshots import start_app


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="/tmp/flashmap-start-time", help="the app's --data-dir")
    parser.add_argument("--port", type=int, default=7901)
    args = parser.parse_args(argv)
    began = time.time()
    proc, _url = start_app(args.port, "flashmap", "--data-dir", args.data_dir)
    serving = time.time() - began
    print(f"serving after {serving:.1f} s", flush=True)
    if any("Verify-cost curve: cached" in line for line in proc.log):
        print("the verify-cost curve was found cached", flush=True)
    try:
        while time.time() - began < serving + 120:
            measured = [line for line in list(proc.log) if "verify cost of 2 / 9 / 17" in line]
            if measured:
                print(f"curve measured after {time.time() - began:.1f} s: {measured[0].split('INFO ')[-1].strip()}")
                break
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
