"""scripts.offline_pairs: paired differences between two variants of one drafter.evaluation.evaluate run."""
import gzip
import json
import math

import pytest

from scripts import offline_pairs


def variant(name: str, sequences: list[int], accepted: list[int]) -> dict:
    anchors = list(range(len(sequences)))
    length = 1 + sum(accepted) / len(accepted)  # the bonus token included
    by_domain = {"rounds": len(accepted), "acceptance_length": length}
    return {"variant": name, "all": by_domain, "math": by_domain, "chat": by_domain,
            "rounds": {"sequence": sequences, "anchor": anchors, "n_accepted": accepted}}


def a_run() -> dict:
    sequences = [0, 0, 1, 1, 2, 2]
    base = variant("base", sequences, [1, 1, 0, 2, 1, 1])
    candidate = variant("candidate", sequences, [2, 1, 1, 2, 1, 3])
    return {"data": "x", "stride": 8, "sequence_domains": ["math", "math", "chat"], "results": [base, candidate]}


def test_the_difference_is_per_round_and_split_by_domain():
    run = a_run()
    row = offline_pairs.pair(run, *run["results"])
    assert row["all"]["difference"] == pytest.approx(4 / 6, abs=1e-4)  # gains 1, 0, 1, 0, 0, 2
    assert row["math"]["difference"] == pytest.approx(2 / 4, abs=1e-4) and row["math"]["rounds"] == 4
    assert row["chat"]["difference"] == pytest.approx(1.0, abs=1e-4)
    assert "code" not in row  # no response of that domain


def test_the_standard_error_treats_each_response_as_one_draw():
    mean, error, rounds = offline_pairs.clustered_mean([[1, 0], [1, 0], [0, 2]])
    assert rounds == 6 and mean == pytest.approx(2 / 3)
    residuals = [1 - 2 * mean, 1 - 2 * mean, 2 - 2 * mean]
    assert error == pytest.approx(math.sqrt(3 / 2 * sum(r * r for r in residuals) / 36))
    assert offline_pairs.clustered_mean([[1, 1, 1], [1, 1]])[1] == 0  # the same gain everywhere: no spread
    assert math.isnan(offline_pairs.clustered_mean([[1, 2]])[1])  # one response: no error to give


def test_variants_from_other_anchors_are_refused():
    run = a_run()
    other = dict(run["results"][1], rounds=dict(run["results"][1]["rounds"], anchor=[9, 1, 2, 3, 4, 5]))
    with pytest.raises(ValueError, match="same anchors"):
        offline_pairs.pair(run, run["results"][0], other)


def test_the_compact_copy_keeps_the_pairs_and_drops_the_rounds(tmp_path):
    source, out = tmp_path / "run.json", tmp_path / "compact.json"
    source.write_text(json.dumps(a_run()))
    offline_pairs.main([str(source), "--pairs", "0", "1", "--out", str(out), "--command", "evaluate ..."])
    kept = json.loads(out.read_text())
    assert all("rounds" not in r for r in kept["results"]) and "sequence_domains" not in kept
    assert kept["paired"][0]["candidate"] == "candidate" and kept["command"] == "evaluate ..."
    with pytest.raises(SystemExit):
        offline_pairs.main([str(source), "--pairs", "0"])
    zipped = tmp_path / "run.json.gz"  # docs/results keeps the large runs gzipped
    zipped.write_bytes(gzip.compress(source.read_bytes()))
    offline_pairs.main([str(zipped), "--pairs", "0", "1", "--out", str(out)])
    assert json.loads(out.read_text())["paired"] == kept["paired"]
