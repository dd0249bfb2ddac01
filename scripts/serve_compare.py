"""vLLM beside this project's engine, on one target and the same DFlash-format drafters, T = 0 (docs/serving.md).

python -m scripts.serve_compare --drafter EXPORT_DIR [EXPORT_DIR ...] --limit 7 --max-tokens 64 --out OUT.json

For the eval prompts (--limit of each of math, code, chat), chat-formatted by the target's template into token ids
that both engines read: this engine (the reference fp32 forward, what vLLM's fp32 computes) decodes plain and with
each exported drafter (loaded by its z-lab reader), and vLLM (.venv-vllm, scripts/vllm_dflash.py) decodes plain and
with `method: dflash` on the same folders. Reported: whether vLLM's drafted outputs equal its plain ones and this
engine's, tokens/s of every run, the acceptance length (tokens per verify round) vLLM's counters give beside this
engine's, and per-position acceptance. The target folder vLLM loads is written once under runs/serve-target/.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from core.decoding.engine import GenerationConfig, generate_all
from core.decoding.stats import AcceptanceStats
from core.prompts import read_prompt_file
from core.runtime.target import TargetConfig, load_target
from drafter.formats.dflash import is_zlab_folder
from drafter.formats.export import export_target
from drafter.registry import build_drafter
from drafter.spec import DrafterSpec

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_READY = ROOT / ".venv-vllm" / ".installed"  # written when scripts/install_vllm.sh has finished
DOMAINS = ("math", "code", "chat")


def engine_run(target, prompt_ids: list[list[int]], max_tokens: int, drafter=None) -> dict:
    """This engine over the prompts: outputs (up to EOS), tokens/s, tokens per verify round and per-slot accepts."""
    gen = GenerationConfig(max_new_tokens=max_tokens)
    outputs, stats, began = [], AcceptanceStats(), time.perf_counter()
    for ids in prompt_ids:
        out, events = generate_all(target, ids, gen, drafter)
        outputs.append(target.until_eos(out))
        stats.add_all(ev for ev in events if ev.drafted)  # verify rounds with a draft, as vLLM counts its drafts
    seconds = time.perf_counter() - began
    tokens = sum(len(o) for o in outputs)
    return {"outputs": outputs, "tok_s": tokens / seconds, "drafted_rounds": stats.rounds,
            "acceptance_length": stats.acceptance_length,
            "accepted_per_position": stats.accepted[: len(stats.per_slot())]}  # up to the last slot reached


def vllm_runs(target_dir: Path, drafters: list[str], prompt_ids, max_tokens: int) -> dict:
    if not VLLM_READY.exists():
        raise SystemExit(f"no vLLM environment at {VLLM_PYTHON.parent.parent}: bash scripts/install_vllm.sh")
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(json.dumps({"prompt_ids": prompt_ids, "max_tokens": max_tokens}))
        subprocess.run([str(VLLM_PYTHON), str(ROOT / "scripts" / "vllm_dflash.py"), "--target", str(target_dir),
                        "--requests", str(req), "--out", str(out), "--drafter", *drafters], check=True,
                       env={"VLLM_CPU_KVCACHE_SPACE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
        return json.loads(out.read_text())["runs"]


def compare(drafters: list[str], limit: int, max_tokens: int, target_dir: Path) -> dict:
    for folder in drafters:  # vLLM would fail deep in its start-up; say it here
        if not is_zlab_folder(folder):
            raise SystemExit(f"{folder} is not a DFlash-format folder (config.json with DFlashDraftModel): write one "
                             "with python -m drafter.formats.export --format dflash WEIGHTS OUT/")
    target = load_target(TargetConfig(cpu_precision="reference"))
    if not (target_dir / "config.json").exists():
        export_target(target, target_dir)
    prompt_ids = [target.chat_ids([{"role": "user", "content": row["prompt"]}])
                  for domain in DOMAINS for row in read_prompt_file(f"eval_{domain}")[:limit]]
    vllm = vllm_runs(target_dir, drafters, prompt_ids, max_tokens)
    vllm_plain = [target.until_eos(o) for o in vllm["plain"]["outputs"]]
    ours_plain = engine_run(target, prompt_ids, max_tokens)
    result = {"prompts": len(prompt_ids), "max_tokens": max_tokens, "limit_per_domain": limit,
              "vllm_plain_tok_s": vllm["plain"]["tok_s"], "engine_plain_tok_s": ours_plain["tok_s"],
              "engines_agree_plain": sum(a == b for a, b in zip(vllm_plain, ours_plain["outputs"])), "drafters": {}}
    for folder in drafters:
        ours = engine_run(target, prompt_ids, max_tokens, build_drafter(DrafterSpec("dflash", weights=folder),
                                                                        target))
        theirs = vllm[folder]
        drafted = [target.until_eos(o) for o in theirs["outputs"]]
        result["drafters"][folder] = {
            "vllm_identical_to_vllm_plain": sum(a == b for a, b in zip(drafted, vllm_plain)),
            "engine_identical_to_engine_plain": sum(a == b for a, b in zip(ours["outputs"], ours_plain["outputs"])),
            "vllm_tok_s": theirs["tok_s"], "engine_tok_s": ours["tok_s"],
            "vllm_acceptance_length": theirs["acceptance_length"],
            "engine_acceptance_length": ours["acceptance_length"],
            "vllm_accepted_per_position": theirs["spec_decode"].get("num_accepted_tokens_per_pos"),
            "vllm_drafts": theirs["spec_decode"].get("num_drafts"),
            "engine_accepted_per_position": ours["accepted_per_position"], "engine_rounds": ours["drafted_rounds"],
        }
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", nargs="+", required=True, help="folders written by drafter.formats.export")
    parser.add_argument("--limit", type=int, default=7, help="eval prompts per domain")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--target-dir", default=str(ROOT / "runs" / "serve-target"))
    parser.add_argument("--out", default=None, help="JSON file for the result (printed either way)")
    args = parser.parse_args(argv)
    result = compare(args.drafter, args.limit, args.max_tokens, Path(args.target_dir))
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
