"""core.runtime.memory against core.runtime.plan: what the app holds, counted storage by storage, is what the memory
plan reserves, row by row: after a scripted 8k-token conversation on the GPU's code path in sim (tests/gpu_path.py),
and at Qwen3-8B's and the released drafter's real shapes (meta tensors) against the plan for a 24 GiB card."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from app.service import ChatService, ChatSettings
from core.runtime.memory import held_rows
from core.runtime.plan import GIB, QWEN3_FACTS, RELEASED_FLASHMAP_DIT, flashmap_drafter_bytes, plan_memory, plan_rows
from core.runtime.target import TargetConfig, load_target
from drafter.networks.release import ReleaseConfig, ReleaseNet
from tests.gpu_path import write_folders

CONTEXT = 8192


def release_config(width: int, vocab: int, dit: dict, feature_ids: list[int]) -> ReleaseConfig:
    return ReleaseConfig.from_json(dict(
        model_type="flashmap", target_hidden_size=width, vocab_size=vocab, target_layer_ids=feature_ids,
        block_size=16, hidden_size=dit["width"], num_hidden_layers=dit["layers"], num_attention_heads=dit["heads"],
        intermediate_size=dit["mlp"], cond_dim=dit["cond"], time_embed_dim=dit["time"]))


def dit_of(cfg: ReleaseConfig) -> dict:
    return dict(layers=cfg.num_hidden_layers, width=cfg.hidden_size, heads=cfg.num_attention_heads,
                mlp=cfg.intermediate_size, cond=cfg.cond_dim, time=cfg.time_embed_dim,
                feature_layers=len(cfg.target_layer_ids))


def test_the_walk_counts_each_storage_once_in_the_first_row_that_reaches_it():
    shared = torch.zeros(10)
    module = torch.nn.Linear(4, 4, bias=False)  # 64 bytes

    class Holder:  # a plain object of a library: not entered
        pass

    holder = Holder()
    holder.big = torch.zeros(1000)
    rows = held_rows({"a": [module, shared, shared[:5]], "b": {"again": shared, "view": module.weight.T},
                      "c": holder})
    assert rows == {"a": 64 + 40, "b": 0, "c": 0}


@pytest.mark.slow
def test_after_an_8k_conversation_the_app_holds_what_the_plan_reserves(tmp_path):
    target_dir, drafter_dir = write_folders(tmp_path)
    target = load_target(TargetConfig(target=str(target_dir), graphs="sim", dtype="fp32", context=CONTEXT,
                                      cpu_linear="torch", cache_dir=str(tmp_path / "cache")))  # as on a GPU
    service = ChatService(target, {"flashmap": str(drafter_dir)}, data_dir=tmp_path / "data")
    assert service.memory_held()["drafter"] == 0  # listed, not loaded: nothing chose it yet
    settings = ChatSettings(drafter="flashmap", max_new_tokens=24)
    history: list[dict] = []
    words = "the sea and the sky hold every colour of the morning light".split()
    while True:
        message = " ".join(words[i % len(words)] for i in range(1500))
        ids = service.prompt_ids(history, message, settings)
        if len(ids) + settings.max_new_tokens + 17 > CONTEXT:
            break
        text, _, _ = service.run_once(ids, settings, service.drafter_for(settings))
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": text}]
    assert len(ids) > 7000  # the last reply ran past 7k positions
    for choice in (ChatSettings(drafter="flashmap", steps=2, max_new_tokens=8),  # the UI's toggle: a second drafter
                   ChatSettings(drafter="auto", max_new_tokens=8)):  # the first, with prompt lookup beside it
        service.run_once(service.prompt_ids([], "Hello!", choice), choice, service.drafter_for(choice))
    held = service.memory_held()
    drafter_cfg = service.drafter_for(settings).c
    plan = plan_rows(target.model.config, "none", CONTEXT, dtype=torch.float32, working=0,
                     drafter_bytes=flashmap_drafter_bytes(32, CONTEXT + 1, dit_of(drafter_cfg), 4))
    weights = sum(p.numel() * 4 for p in target.model.parameters())
    assert plan["weights"] <= held["weights"] <= 1.01 * plan["weights"] and held["weights"] >= weights
    assert 0.9 * plan["kv cache"] <= held["kv cache"] <= plan["kv cache"]  # the steps' one cache, never two
    # one network for both step counts and for auto; each drafter's context buffers preallocated to --context
    network = flashmap_drafter_bytes(32, 0, dit_of(drafter_cfg), 4)
    assert 1 <= held["drafter"] / (network + 2 * (plan["drafter"] - network)) < 1.01, held


def test_at_qwen3_8bs_real_shapes_the_counts_are_the_plans_24_gib_rows():
    facts = QWEN3_FACTS["Qwen/Qwen3-8B"]
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**facts)).to(torch.bfloat16)
        net = ReleaseNet(release_config(facts["hidden_size"], facts["vocab_size"], RELEASED_FLASHMAP_DIT,
                                        [1, 9, 17, 25, 33])).to(torch.bfloat16)
    dit = RELEASED_FLASHMAP_DIT
    context_buffers = 2 * dit["layers"] * dit["width"] * CONTEXT * 2  # keys and values, bf16
    held = held_rows({"weights": model, "drafter": net})
    plan = plan_memory(type("Cfg", (), facts), 24 * GIB, (8, 9), CONTEXT)
    rows = {quant: plan_rows(type("Cfg", (), facts), quant, CONTEXT) for quant in ("none", "fp8")}
    assert abs(held["weights"] - rows["none"]["weights"]) < 1e-3 * rows["none"]["weights"]
    linears = sum(m.weight.numel() for layer in model.model.layers for m in layer.modules()
                  if isinstance(m, torch.nn.Linear))
    eight_bit = held["weights"] - linears  # each decoder linear's weight in 1 byte instead of 2
    assert abs(eight_bit - rows["fp8"]["weights"]) < 1e-3 * rows["fp8"]["weights"]
    assert held["drafter"] + context_buffers == rows["none"]["drafter"]
    assert 0.95e9 < held["drafter"] < 1.1e9  # the released drafter: ~500M parameters in bf16
    by_quant = {option.quant: option for option in plan.options}
    assert by_quant["none"].total == sum(rows["none"].values())
    assert plan.quant == "none" and by_quant["none"].total < 24 * GIB  # bf16 fits a 24 GiB card at 8k positions
    assert plan_memory(type("Cfg", (), facts), 18 * GIB, (8, 9), CONTEXT).quant == "fp8"  # 19.2 GiB in bf16
