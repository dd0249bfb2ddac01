"""Whether a change of the code changed the app's default: its replies and its speed at one commit against another,
side by side on one machine. Each side runs in its own checkout (a git worktree) and its own process, through that
checkout's own harness (lab.harness.prepare: the target, its cost curves and the app's default drafter), so each
side's code is what that commit wrote. The sides take turns, their order rotated repeat by repeat; with --control
the base runs twice per repeat, and the two base runs, the same build, say how far this harness's noise alone moves a
ratio.

For each prompt: the default's reply and plain decoding's, token ids and seconds. Summary: whether every T = 0 reply
is the same at both commits (and equal to plain decoding), and the head's tokens a second over the base's, paired by
prompt and repeat, for the default and for plain decoding, as mean and standard error.

python -m lab.commits_ab --base REV [--head REV] [--control] --prompts eval_math eval_code eval_chat --limit 8
    --repeats 2 --out docs/results/engine/commits-ab-DATE.json
(without --head: this checkout's HEAD; the working tree's uncommitted changes are not run)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKTREES = Path("/tmp/flashmap-commits")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def checkout(rev: str) -> Path:
    """A detached worktree of rev under WORKTREES (made once, reused)."""
    sha = git("rev-parse", rev)
    folder = WORKTREES / sha[:12]
    if not (folder / ".git").exists():
        WORKTREES.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(folder), sha)
    return folder


def side(argv: list[str]) -> None:
    """One side's run, inside its own checkout (the working directory): every prompt's default and plain replies."""
    from app import bench
    from lab import harness

    args, fields, target, curves, runner = harness.prepare(__doc__, argv)  # --out: this side's rows
    prompts = [prompt for path in fields["prompts"] for prompt in bench.read_prompts(path, fields["limit"])]
    rows = []
    for i, prompt in enumerate(prompts):
        ids = target.chat_ids([{"role": "user", "content": prompt}])
        plain_gen = bench.GenerationConfig(fields["max_new_tokens"], sampling=fields["sampling"],
                                           seed=fields["seed"] + i)
        gen = runner.generation(plain_gen, curves.for_reply(len(ids), fields["max_new_tokens"]))
        drafted, plain = runner.run(ids, gen), bench.run_engine(target, ids, plain_gen, None)
        rows.append({"tokens": drafted.tokens, "s": drafted.seconds, "plain_tokens": plain.tokens,
                     "plain_s": plain.seconds})
    Path(args.out).write_text(json.dumps(rows))


def run_side(folder: Path, run_args: list[str], out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    command = [sys.executable, str(Path(__file__).resolve()), "--side", *run_args, "--out", str(out)]
    subprocess.run(command, cwd=folder, env=env, check=True)
    return json.loads(out.read_text())


def default_rate(row: dict) -> float:
    return len(row["tokens"]) / row["s"]


def plain_rate(row: dict) -> float:
    return len(row["plain_tokens"]) / row["plain_s"]


def speedup(row: dict) -> float:
    """The default's speed-up over plain decoding in the same process: the drift between the sides' processes, which
    moves plain decoding too, divided out."""
    return default_rate(row) / plain_rate(row)


def paired(head: list[list[dict]], base: list[list[dict]], measure) -> dict:
    """measure(head's row) / measure(base's row), per prompt and repeat -> mean and standard error."""
    ratios = [measure(h) / measure(b) for head_rows, base_rows in zip(head, base) for h, b in zip(head_rows, base_rows)]
    mean = sum(ratios) / len(ratios)
    se = (sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1) / len(ratios)) ** 0.5 if len(ratios) > 1 else 0.0
    return {"mean": round(mean, 4), "se": round(se, 4), "pairs": len(ratios)}


def summary(runs: dict[str, list[list[dict]]]) -> dict:
    """runs: side -> per repeat, per prompt rows."""
    base, head = runs["base"], runs["head"]
    first = base[0]
    same = all(row["tokens"] == ref["tokens"] and row["plain_tokens"] == ref["plain_tokens"]
               for rows in (*base, *head, *runs.get("control", [])) for row, ref in zip(rows, first))
    out = {"replies_identical_at_both_commits": same,
           "default_equals_plain": all(row["tokens"] == row["plain_tokens"] for row in first)}
    pairs = {"head / base": head, **({"control / base (same build)": runs["control"]} if "control" in runs else {})}
    for label, side_runs in pairs.items():
        out[f"default {label}"] = paired(side_runs, base, default_rate)
        out[f"plain {label}"] = paired(side_runs, base, plain_rate)
        out[f"speed-up over plain {label}"] = paired(side_runs, base, speedup)
    return out


def main(argv=None) -> None:
    if argv is None and sys.argv[1:2] == ["--side"]:
        side(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit before the change")
    parser.add_argument("--head", default="HEAD", help="the commit after it (default HEAD)")
    parser.add_argument("--control", action="store_true", help="run the base twice a repeat (a same-build pair)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default=str(WORKTREES / "runs"),
                        help="where each side's run is kept as SIDE-REPEAT.json (default %(default)s)")
    parser.add_argument("--summarize", action="store_true", help="summarize the runs kept there, without running")
    args, run_args = parser.parse_known_args(argv)
    names = ["base", "head", *(["control"] if args.control else [])]
    shas = {"base": git("rev-parse", args.base), "head": git("rev-parse", args.head)}  # what is run, read once
    scratch = Path(args.runs)
    scratch.mkdir(parents=True, exist_ok=True)
    runs = {name: [] for name in names}
    if args.summarize:
        runs = {name: [json.loads((scratch / f"{name}-{repeat}.json").read_text()) for repeat in range(args.repeats)]
                for name in names}
    else:
        folders = {"base": checkout(shas["base"]), "head": checkout(shas["head"])}
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[: repeat % len(names)]:
                runs[name].append(run_side(folders.get(name, folders["base"]), run_args,
                                           scratch / f"{name}-{repeat}.json"))
    result = {"base": shas["base"], "head": shas["head"], "repeats": args.repeats,
              "run": run_args, **summary(runs),
              "per_prompt_seconds": {name: [[(round(r["s"], 4), round(r["plain_s"], 4)) for r in rows]
                                            for rows in side_runs] for name, side_runs in runs.items()}}
    print(json.dumps({k: v for k, v in result.items() if k != "per_prompt_seconds"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
