"""Getting the exact embedded target onto the GPU machine, whose commands carry at most 64 MiB each.

The GGUF (93.8 MiB) is split in two halves with a sha256 manifest; the first command carries half A, the last
half B, and the last reassembles the file and checks its hash before transformers loads it. Each
half's folder also holds the gguf wheel (not installed there) and copies of the prompt files (data/prompts/)
that its stages read. The drafter checkpoints (45.8 MiB) are taken out of git's index for the commands only; copies
of them (`.gpu/c`) travel in a command of their own, between the two, so that training there warm-starts from them
(the run of 2026-12-04 trained from scratch and shipped nothing, docs/gpu.md).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGING = ROOT / ".gpu"  # ignored by .gitignore; the halves' folders are carried
HALVES = ("a", "b")
INITS = "c"  # the shipped drafters, for the warm starts
INIT_NAMES = ("dflash", "flashmap-teacher", "flashmap")
MACHINE_STAGE = Path("/tmp/flashmap-stage")  # outside the tree on the GPU machine: survives between commands
GGUF_WHEEL = "gguf==0.19.0"
PROMPT_FILES = ("train_math.jsonl", "train_code.jsonl", "eval_math.jsonl", "eval_code.jsonl", "eval_chat.jsonl")
LIMIT = 64 * 2**20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_file(path: Path, folders: list[Path]) -> dict:
    """Cut path into len(folders) parts of equal size, one per folder, each with the same manifest."""
    size = path.stat().st_size
    step = -(-size // len(folders))  # ceil
    parts = []
    with open(path, "rb") as src:
        for i, folder in enumerate(folders):
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f"{path.name}.part{i}"
            part.write_bytes(src.read(step))
            parts.append({"file": part.name, "size": part.stat().st_size, "sha256": sha256(part)})
    manifest = {"name": path.name, "size": size, "sha256": sha256(path), "parts": parts}
    for folder in folders:
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def find_manifest(folders: list[Path]) -> dict:
    for folder in folders:
        if (folder / "manifest.json").is_file():
            return json.loads((folder / "manifest.json").read_text())
    raise FileNotFoundError(f"no manifest.json in {[str(f) for f in folders]}")


def missing_parts(folders: list[Path]) -> list[str]:
    manifest = find_manifest(folders)
    return [p["file"] for p in manifest["parts"] if not any((f / p["file"]).is_file() for f in folders)]


def reassemble(folders: list[Path], dest: Path) -> dict:
    """Join the parts found in any of folders into dest, checking every part's hash and the whole's."""
    manifest = find_manifest(folders)
    missing = missing_parts(folders)
    if missing:
        raise FileNotFoundError(f"parts {missing} have not arrived: send the command that carries them")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as out:
        for part in manifest["parts"]:
            path = next(f / part["file"] for f in folders if (f / part["file"]).is_file())
            if sha256(path) != part["sha256"]:
                raise ValueError(f"{path}: sha256 differs from the manifest (a broken transfer)")
            out.write(path.read_bytes())
    if sha256(tmp) != manifest["sha256"]:
        raise ValueError(f"reassembled {manifest['name']}: sha256 differs from the manifest")
    tmp.replace(dest)
    return manifest


def keep_on_machine(folders: list[Path], stage: Path = MACHINE_STAGE) -> None:
    """Copy what this command carried to a folder outside the tree, so the next command finds it."""
    stage.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        if folder.is_dir():
            for path in folder.iterdir():
                if path.is_file() and not (stage / path.name).exists():
                    shutil.copy2(path, stage / path.name)


def stage_embedded(gguf: Path, wheel_dir: Path | None = None, prompts: Path = ROOT / "data" / "prompts",
                   staging: Path = STAGING) -> dict:
    """Fill .gpu/a and .gpu/b: the GGUF halves + manifest, the gguf wheel and the prompt files in both."""
    folders = [staging / h for h in HALVES]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    manifest = split_file(gguf, folders)
    wheels = sorted(wheel_dir.glob("gguf-*.whl")) if wheel_dir else download_wheel(staging / "wheels")
    for folder in folders:
        for wheel in wheels:
            shutil.copy2(wheel, folder / wheel.name)
        for name in PROMPT_FILES:
            shutil.copy2(prompts / name, folder / name)
    return manifest


def staged(cmd) -> dict:
    """The stage command's one stage: keep what it carried (the inits) on the machine for the next command, and
    list what the machine's stage holds (in the CPU simulation, which carries nothing, an empty folder of its own)."""
    stage = (cmd.out.parent / "gpu-sim-stage") if cmd.cpu_sim else MACHINE_STAGE
    if not cmd.cpu_sim:
        keep_on_machine([STAGING / part for part in (*HALVES, INITS)], stage)
    return {"files": {p.name: p.stat().st_size for p in sorted(stage.iterdir())} if stage.is_dir() else {}}


STAGES = (("staged", staged, 0),)


def stage_inits(weights: Path, folder: Path, names: tuple[str, ...] = INIT_NAMES) -> list[str]:
    """Fill `folder` with init-NAME.safetensors and init-NAME.json (a checkpoint's weights, stored in bf16, and its
    config.json) for every checkpoint of `names` found under `weights`; returns the names staged."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    staged = []
    for name in names:
        source = weights / name
        if (source / "model.safetensors").is_file():
            shutil.copy2(source / "model.safetensors", folder / f"init-{name}.safetensors")
            shutil.copy2(source / "config.json", folder / f"init-{name}.json")
            staged.append(name)
    return staged


def restore_init(folders: list[Path], name: str, dest: Path) -> Path | None:
    """The checkpoint folder (model.safetensors, config.json) of a staged init, written to `dest`; None where no
    folder holds one (training then starts from scratch)."""
    source = next((f for f in folders if (f / f"init-{name}.safetensors").is_file()), None)
    if source is None:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / f"init-{name}.safetensors", dest / "model.safetensors")
    shutil.copy2(source / f"init-{name}.json", dest / "config.json")
    return dest


def download_wheel(dest: Path) -> list[Path]:
    """The gguf wheel for the GPU machine's Python 3.12 (pure Python; numpy, pyyaml, requests, tqdm are there)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                    "-d", str(dest), GGUF_WHEEL], check=True)
    return sorted(dest.glob("gguf-*.whl"))


# ---- what travels ----------------------------------------------------------------------------------

CHECKPOINTS = tuple(f"weights/smollm2-135m-instruct/{name}/model.safetensors"
                    for name in ("flashmap", "flashmap-teacher", "dflash"))
# out of the index for the run: the checkpoints (the run trains its own), the published-layout drafters in training
# (20 MiB, read by nothing there), the embedded default's phrasebook (5.6 MiB; drafting goes on without it where it is
# absent), docs/ (the measurement records, 7 MiB by 2026-12-01, read by nothing there; with them the two GGUF halves
# no longer fit) and the response folders the run does not train on (train.CPU_DATA names those it does; 3.7 MiB)
NOT_TRAINED_THERE = ("data/smollm2-magpie", "data/smollm2-magpie-2", "data/smollm2-magpie-3",
                     "data/smollm2-responses-4")
WITHHELD = (*CHECKPOINTS, "weights/smollm2-135m-instruct/zlab", "weights/smollm2-135m-instruct/phrasebook",
            "weights/smollm2-135m-instruct/flashmap-release", "docs", *NOT_TRAINED_THERE)


def is_withheld(path: str, withheld: tuple[str, ...] = WITHHELD) -> bool:
    return any(path == w or path.startswith(w + "/") for w in withheld)


def git_files(*args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *args], check=True, capture_output=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def folder_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def transfer_size(carry: list[str], withheld: tuple[str, ...] = WITHHELD) -> dict:
    """Bytes one command sends: tracked files (less the withheld ones) + untracked files git does not
    ignore + the carried paths."""
    tracked = [p for p in git_files() if not is_withheld(p, withheld) and (ROOT / p).is_file()]
    untracked = [p for p in git_files("--others", "--exclude-standard") if not is_withheld(p, withheld)]
    sizes = {"tracked": sum((ROOT / p).stat().st_size for p in tracked),
             "untracked": sum((ROOT / p).stat().st_size for p in untracked),
             "carried": sum(folder_size(ROOT / c) for c in carry if (ROOT / c).exists())}
    sizes["total"] = sum(sizes.values())
    sizes["fits"] = sizes["total"] <= LIMIT
    return sizes


def withhold_from_index() -> None:
    """Before the commands: the checkpoints and docs/ leave git's index (not the commit) and are excluded locally."""
    subprocess.run(["git", "-C", str(ROOT), "rm", "-q", "-r", "--cached", "--", *WITHHELD], check=True)
    exclude = ROOT / ".git/info/exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    exclude.write_text("\n".join(lines + [f"/{p}" for p in WITHHELD if f"/{p}" not in lines]) + "\n")


def restore_index() -> str:
    """After the commands: the index and the exclude file as they were; returns `git status --short`."""
    subprocess.run(["git", "-C", str(ROOT), "reset", "-q", "--", *WITHHELD], check=True)
    exclude = ROOT / ".git/info/exclude"
    if exclude.exists():
        keep = [line for line in exclude.read_text().splitlines() if line.lstrip("/") not in WITHHELD]
        exclude.write_text("\n".join(keep) + "\n")
    return subprocess.run(["git", "-C", str(ROOT), "status", "--short"], capture_output=True, text=True).stdout
