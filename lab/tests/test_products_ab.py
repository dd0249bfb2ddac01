from types import SimpleNamespace

import pytest

from lab.products_ab import summary


def test_a_build_s_summary_reads_its_costs_against_one_position_and_names_its_products():
    module = SimpleNamespace(ACTIVATIONS="8-bit", LAYOUT="quads", prefetch_blocks=lambda: 0)
    out = summary({1: 0.004, 2: 0.005, 4: 0.008}, module)
    assert out["ms"] == {1: 4.0, 2: 5.0, 4: 8.0}
    assert out["relative_to_one"] == {1: 1.0, 2: 1.25, 4: 2.0}
    assert (out["activations"], out["layout"], out["prefetch_blocks"]) == ("8-bit", "quads", 0)


def test_a_result_is_printed_and_written_as_one_compact_json_line(tmp_path, capsys):
    import json

    from lab.harness import print_and_save

    out = tmp_path / "deeper" / "result.json"
    print_and_save({"ms": {1: 4.0}}, str(out))
    assert out.read_text() == '{"ms":{"1":4.0}}\n'
    assert json.loads(capsys.readouterr().out) == {"ms": {"1": 4.0}}


@pytest.mark.slow
def test_a_commits_step_is_built_from_that_commits_sources(tmp_path):
    """--commit builds the step from the files a commit holds under core/runtime/csrc/ (here HEAD's), every one of
    them."""
    import subprocess

    from lab.products_ab import commit_step

    module = commit_step("HEAD", tmp_path)
    names = subprocess.run(["git", "ls-tree", "--name-only", "HEAD", "core/runtime/csrc/"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n.split("/")[-1] for n in names)
    for name in names:
        shown = subprocess.run(["git", "show", f"HEAD:{name}"], capture_output=True, check=True).stdout
        assert (tmp_path / name.split("/")[-1]).read_bytes() == shown
    assert module.LAYOUT in ("quads", "bytes", "pairs") and callable(module.step)
