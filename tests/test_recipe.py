"""The Qwen3 FlashMap training recipe: plan arithmetic and the commands it would run."""
from drafter import recipe
from drafter.runtime import default_weights


def test_dry_run_plan_for_a_4090_fits_and_names_every_stage(capsys):
    recipe.main(["--dry-run"])
    printed = capsys.readouterr().out
    assert "fits" in printed and "--quant fp8" in printed and "drafter.train --stage distill" in printed
    rc, dry = recipe.parse_args(["--dry-run", "--features", "cache"])
    plan = recipe.plan(rc)
    assert dry and plan["fits"] and plan["quant"] == "fp8"
    width = 5 * 4096  # five feature layers of Qwen3-8B's hidden size
    assert plan["disk_bytes"]["feature_cache"] == plan["data_tokens"] * width * 2
    commands = [" ".join(c) for c in recipe.commands(rc)]
    assert any("drafter.data features" in c for c in commands)
    teacher = str(default_weights("Qwen/Qwen3-8B", "flashmap-teacher"))
    assert f"--out {teacher}" in commands[-2] and f"--init {teacher}" in commands[-1]  # where the app looks


def test_plan_refuses_a_small_gpu_and_picks_8bit_before_ada():
    small = recipe.plan(recipe.RecipeConfig(gpu_gb=12, capability=(8, 6)))
    assert not small["fits"] and small["quant"] == "8bit"
    assert recipe.plan(recipe.RecipeConfig(gpu_gb=32, capability=(12, 0)))["fits"]


def test_parameter_count_matches_a_built_network(tiny_target):
    import torch

    from drafter.runtime import build_net
    from tests.test_drafter import tiny_cfg

    cfg = tiny_cfg()
    net = build_net(cfg, tiny_target, torch.arange(-1, 15))
    assert recipe.drafter_params(cfg) == sum(p.numel() for p in net.parameters())
