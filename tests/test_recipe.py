"""The Qwen3 FlashMap training recipe: plan arithmetic and the commands it would run."""
from drafter.runtime.drafters import default_weights
from drafter.training import recipe


def test_dry_run_plan_for_a_4090_fits_and_names_every_stage(capsys):
    recipe.main(["--dry-run"])
    printed = capsys.readouterr().out
    assert "fits" in printed and "--quant fp8" in printed and "drafter.training.train --stage distill" in printed
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

    from drafter.runtime.drafters import build_net
    from tests.test_drafter import tiny_cfg

    cfg = tiny_cfg()
    net = build_net(cfg, tiny_target, torch.arange(-1, 15))
    assert recipe.drafter_params(cfg) == sum(p.numel() for p in net.parameters())


def test_dry_run_warm_started_from_a_published_dflash_drafter(capsys):
    """--init: the published network becomes the teacher's backbone; without its files the layout is assumed and
    said so; --trainable flow freezes it in both training stages and is what fits 24 GB."""
    recipe.main(["--dry-run", "--init", "z-lab/Qwen3-8B-DFlash-b16", "--trainable", "flow", "--anchors-per-seq", "8"])
    printed = capsys.readouterr().out
    assert "warm-started from z-lab/Qwen3-8B-DFlash-b16" in printed and "published layout assumed" in printed
    assert ": fits" in printed
    rc, _ = recipe.parse_args(["--init", "z-lab/Qwen3-8B-DFlash-b16", "--trainable", "flow"])
    teacher, distill = (" ".join(c) for c in recipe.commands(rc)[-2:])
    assert "--init z-lab/Qwen3-8B-DFlash-b16 --t0-share 0.3" in teacher and "--d-model" not in teacher
    assert "--freeze-backbone" in teacher and "--freeze-backbone" in distill
    full = recipe.plan(recipe.RecipeConfig(init="z-lab/Qwen3-8B-DFlash-b16"))
    frozen = recipe.plan(rc)
    assert full["trainable_parameters"] == full["drafter_parameters"] > 20 * frozen["trainable_parameters"]
    assert frozen["drafter"]["zlab"]["num_hidden_layers"] == 5


def test_a_local_published_folder_is_read_and_counted_exactly(tiny_qwen3_target, tmp_path):
    from drafter.runtime.drafters import zlab_warm_start
    from tests.test_zlab_dflash import write_zlab, zlab_config, zlab_tensors

    cfg = zlab_config(tiny_qwen3_target)
    folder = write_zlab(tmp_path / "zlab", cfg, zlab_tensors(cfg))
    rc = recipe.RecipeConfig(init=str(folder))
    assert recipe.published_config(rc) == (cfg, f"read from {folder}")
    net, _ = zlab_warm_start(folder, tiny_qwen3_target, context_window=8)
    assert recipe.drafter_params(net.cfg) == sum(p.numel() for p in net.parameters())
    assert recipe.drafter_params(net.cfg, "flow") == sum(p.numel() for n, p in net.named_parameters()
                                                         if not n.startswith("backbone."))
