"""The app's own path on the GPU, first in the arch command: the service layer the UI and the API call
(app.service.ChatService, in-process: the GPU machine has no gradio) on a random-weight Qwen3-8B-architecture target
set up as load_target sets one up (the lean forward's fixed-shape steps replayed from CUDA graphs), with a drafter in
the FlashMap release's architecture and format read from a folder as the app reads one (its proposal graphed too),
under an RTX 4090's 24 GiB: in bf16, which the memory plan picks for that card at 8,192 positions, and in FP8, the
8-bit precision it picks where bf16 does not fit.

Each precision: replies at T = 0 and T = 1 through the choices none, flashmap and auto, each reply's events asked for
from two threads in turn (as a server resumes a stream), the T = 0 drafted replies checked against plain decoding; a
conversation grown to ~8k positions; every error; the allocator's peak beside the memory plan's rows and what the app
holds by those rows (ChatService.memory_held); plain and drafted tokens/s measured inside each reply
(core.decoding.stats.ReplySpeed). In --cpu-sim the same path at tiny sizes in fp32, the steps in sim mode.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch
from safetensors.torch import save_file

from app.service import ChatService, ChatSettings
from core.runtime.plan import flashmap_drafter_bytes
from core.runtime.target import TargetConfig, _setup_forward, forward_plan
from lab.gpu.arch import (
    CARD_GIB,
    GIB,
    cap_memory,
    peak_gib,
    random_qwen3,
    random_release_net,
    release_config,
    scratch_dir,
    sizes,
    stabilise,
)
from lab.gpu.stages import Command, release_memory
from lab.testing import alternating

CONTEXT = 8192  # --context: the reply's limit and the memory plan's KV rows
CHOICES = ("none", "flashmap", "auto")


def app_sizes(cmd: Command) -> dict:
    """Replies, tokens and the conversation's length: real on the GPU, tiny in --cpu-sim."""
    if cmd.cpu_sim:
        return dict(prompts=2, new_tokens=12, context=512, turn_words=60, precisions=("fp32",))
    return dict(prompts=4, new_tokens=64, context=CONTEXT, turn_words=1500, precisions=("bf16", "fp8"))


def reply(service: ChatService, prompt_ids: list[int], settings: ChatSettings) -> dict:
    """One reply through ChatService.stream, resumed from alternating threads."""
    drafter = service.drafter_for(settings)
    tokens, speed = [], None
    for ev, speed in alternating(service.stream(prompt_ids, settings, drafter)):
        tokens += list(ev.committed)
    return {"tokens": tokens, "tokens_per_s": speed.tokens_per_s if speed else None,
            "plain_tokens_per_s": speed.plain_tokens_per_s if speed else None}


def write_release_folder(target, cmd: Command, sz: dict, folder: Path) -> Path:
    """A random drafter in the release's architecture at the target's width, saved as the release saves one."""
    net = random_release_net(target, cmd, sz)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(release_config(target, cmd.cpu_sim)))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors"))
    del net
    return folder


def words(target, count: int, seed: int) -> str:
    """A user message of `count` words of the random target's word-level vocabulary."""
    ids = torch.randint(8, target.vocab_size, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    return " ".join(f"w{i}" for i in ids)


def one_precision(cmd: Command, precision: str, folder: Path) -> dict:
    sz, run = sizes(cmd), app_sizes(cmd)
    device = sz["device"]
    cap = cap_memory(device, CARD_GIB)
    target = random_qwen3(sz["facts"], device, sz["dtype"])
    stabilise(target.model)
    quant = "none"
    if precision == "fp8":
        from core.runtime import fp8

        fp8.quantize_decoder(target.model, torch.device(device))
        quant = "fp8"
    target.model.requires_grad_(False)
    cfg = TargetConfig(target=target.name, device=device, quant=quant, graphs="sim" if cmd.cpu_sim else "cuda",
                       context=run["context"])
    plan = forward_plan(cfg, torch.device(device), sz["dtype"], target.model.config)
    _setup_forward(target, plan)
    if not (folder / "config.json").exists():
        write_release_folder(target, cmd, sz, folder)
    errors: list[str] = []
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as data:
        service = ChatService(target, {"flashmap": str(folder)}, data_dir=Path(data))
        started = time.time()
        service.measure_verify_cost(repeats=2)  # as the app does at start, then the default drafter's call cost
        draft_cost = service.prepare_drafter("auto")
        measured_s = time.time() - started
        rows, identical = [], []
        for i in range(run["prompts"]):
            prompt = service.prompt_ids([], words(target, 40, seed=i), ChatSettings())
            for temperature in (0.0, 1.0):
                got = {}
                for choice in CHOICES:
                    settings = ChatSettings(drafter=choice, temperature=temperature,
                                            max_new_tokens=run["new_tokens"], seed=i)
                    try:
                        got[choice] = reply(service, prompt, settings)
                        rows.append({"choice": choice, "temperature": temperature,
                                     **{k: v for k, v in got[choice].items() if k != "tokens"}})
                    except Exception as err:  # every error is a finding: recorded, the next reply runs
                        errors.append(f"{choice} T={temperature}: {type(err).__name__}: {err} "
                                      f"{traceback.format_exc()[-600:]}")
                if temperature == 0.0 and len(got) == len(CHOICES):
                    identical.append(all(got[c]["tokens"] == got["none"]["tokens"] for c in CHOICES))
        conversation = grow_conversation(service, target, run, errors)
        held = service.memory_held()
        service_curve = service.curve_status
        network = service.drafter_for(ChatSettings(drafter="flashmap")).c
    dit = dict(layers=network.num_hidden_layers, width=network.hidden_size, heads=network.num_attention_heads,
               mlp=network.intermediate_size, cond=network.cond_dim, time=network.time_embed_dim,
               feature_layers=len(network.target_layer_ids))
    value = torch.finfo(sz["dtype"]).bits // 8
    drafter_bytes = flashmap_drafter_bytes(target.model.config.hidden_size, run["context"] + 1, dit, value)
    planned = plan.memory_rows(target.model.config, drafter_bytes)  # what the memory plan reserves for this forward
    speeds = {(c, t): [r["tokens_per_s"] for r in rows if r["choice"] == c and r["temperature"] == t
                       and r["tokens_per_s"]] for c in CHOICES for t in (0.0, 1.0)}
    graphs = target.extra.get("graphs")
    result = {"precision": precision, "forward": f"{precision} weights, lean forward, {graphs} graphs",
              "cap_gib": cap, "errors": errors,
              "verify_cost": service_curve, "draft_cost": draft_cost, "measured_s": round(measured_s, 1),
              "replies": len(rows), "t0_identical": identical, "conversation": conversation,
              "tokens_per_s": {f"{c} T={t:g}": statistics.median(v) for (c, t), v in speeds.items() if v},
              "peak_gib": peak_gib(device), "held_gib": {row: b / GIB for row, b in held.items()},
              "plan_gib": {row: b / GIB for row, b in planned.items()}, "plan_total_gib": sum(planned.values()) / GIB}
    del service, target
    release_memory()
    cap_memory(device, None)
    return result


def grow_conversation(service: ChatService, target, run: dict, errors: list[str]) -> dict:
    """A conversation that grows turn by turn until the next turn would not fit --context: its length in
    positions, its turns and the last turn's drafted reply against plain decoding of the same messages."""
    history: list[dict] = []
    settings = ChatSettings(drafter="flashmap", max_new_tokens=run["new_tokens"] // 2)
    turns, positions, same, started = 0, 0, None, time.time()
    while True:
        message = words(target, run["turn_words"], seed=100 + turns)
        ids = service.prompt_ids(history, message, settings)
        if len(ids) + settings.max_new_tokens + 17 > run["context"]:
            break
        try:
            drafted = reply(service, ids, settings)
            if len(ids) + 2 * run["turn_words"] + 64 > run["context"]:  # the last turn: checked against plain
                plain = reply(service, ids, ChatSettings(drafter="none", max_new_tokens=settings.max_new_tokens))
                same = drafted["tokens"] == plain["tokens"]
        except Exception as err:
            errors.append(f"conversation turn {turns}: {type(err).__name__}: {err} {traceback.format_exc()[-600:]}")
            break
        history += [{"role": "user", "content": message},
                    {"role": "assistant", "content": target.decode(drafted["tokens"])}]
        turns, positions = turns + 1, len(ids) + len(drafted["tokens"])
    return {"turns": turns, "positions": positions, "last_turn_identical": same,
            "seconds": round(time.time() - started, 1)}


def app_service(cmd: Command) -> dict:
    """The stage: each precision in turn (the second skipped where too little time is left), one release folder."""
    result = {}
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp:
        folder = Path(tmp) / "flashmap-release-random"
        for precision in app_sizes(cmd)["precisions"]:
            if result and cmd.left() < 120:
                result[precision] = {"skipped": f"{cmd.left():.0f} s left"}
                continue
            result[precision] = one_precision(cmd, precision, folder)
    return result
