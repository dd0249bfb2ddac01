"""A fresh clone timed as a new user meets it: the README's first command (`bash scripts/setup.sh`, then `python app.py`
until the page answers) with nothing of the app cached (a new HOME: no native build, no exactness verdict, no thread
policy; pip's own cache kept, so packages are not downloaded again), a later start, and optionally the README's test
command on the same clone with this machine's own caches (its native builds, as a developer's machine has them). Writes
one JSON with the machine, the commit, the date and the seconds, which the figures page reads (scripts/figures.py).

python -m lab.fresh_clone --out docs/results/start/fresh-clone-DATE.json [--tests]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from scripts.screenshots import free_port

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def machine() -> dict:
    """The CPU's model, cores and the flags that choose the engine's kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split()) if "flags" in info else set()
    return {"cpu": model.group(1).strip() if model else "unknown", "cores": os.cpu_count(),
            "flags": [flag for flag in FLAGS if flag in flags]}


def time_start(repo: Path, env: dict, limit_s: float = 900) -> float:
    """Seconds from `python app.py` to the page answering 200; the app is stopped after."""
    port = free_port()
    started = time.perf_counter()
    app = subprocess.Popen([str(repo / ".venv" / "bin" / "python"), "app.py", "--port", str(port)], cwd=repo, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        while time.perf_counter() - started < limit_s:
            if app.poll() is not None:
                raise SystemExit(f"the app exited with {app.returncode} before it answered")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.25)
        raise SystemExit(f"the app did not answer within {limit_s:.0f} s")
    finally:
        app.terminate()
        app.wait(timeout=60)


def time_tests(repo: Path, env: dict) -> dict:
    """The README's test command on the clone: its seconds and pytest's summary line."""
    started = time.perf_counter()
    run = subprocess.run(["bash", "scripts/test.sh"], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    summary = [line for line in run.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)",
                                                    summary[-1] if summary else "")}
    return {"seconds": seconds, "returncode": run.returncode, "summary": summary[-1] if summary else run.stdout[-500:],
            **counts}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tests", action="store_true", help="also time the README's test command on the clone")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="fresh-clone-") as tmp:
        repo, home = Path(tmp) / "repo", Path(tmp) / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True)
        env = {**os.environ, "HOME": str(home),
               "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))}
        env.pop("FLASHMAP_NATIVE_DIR", None)
        started = time.perf_counter()
        subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, check=True, capture_output=True)
        result = {"date": datetime.date.today().isoformat(), "commit": commit, "machine": machine(),
                  "setup_s": time.perf_counter() - started}
        result["first_start_s"] = time_start(repo, env)
        result["later_start_s"] = time_start(repo, env)
        if args.tests:
            result["tests"] = time_tests(repo, dict(os.environ))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    json.dump(result, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
