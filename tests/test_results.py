"""scripts.results: a results file reads the same plain or gzipped, and the report finds either."""
import gzip
import json

from scripts.results import read_json


def test_a_results_file_reads_the_same_plain_or_gzipped(tmp_path):
    run = {"results": [{"variant": "flashmap", "mean": 1.25}], "stride": 16}
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "run.json.gz").write_bytes(gzip.compress(json.dumps(run).encode()))
    assert read_json(tmp_path / "run.json") == read_json(tmp_path / "run.json.gz") == run


def test_the_report_takes_the_newest_run_whichever_form_it_is_in(tmp_path):
    from scripts import report

    (tmp_path / "offline-walk-2026-12-01.json.gz").write_bytes(gzip.compress(b'{"when": "first"}'))
    (tmp_path / "offline-walk-2026-11-29.json").write_text('{"when": "older"}')
    assert report.load(tmp_path, "offline-walk") == {"when": "first"}
    (tmp_path / "offline-walk-2026-12-02.json").write_text('{"when": "newest"}')
    assert report.load(tmp_path, "offline-walk") == {"when": "newest"}
    assert report.load(tmp_path, "offline-tree") is None
