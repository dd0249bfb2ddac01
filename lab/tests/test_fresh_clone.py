import os
import sys
import textwrap

from lab.fresh_clone import machine, time_start, time_tests


def fake_repo(tmp_path, app: str, tests: str):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "app.py").write_text(textwrap.dedent(app))
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test.sh").write_text(tests)
    return tmp_path


def test_a_start_is_timed_until_the_page_answers_and_the_tests_summary_is_read(tmp_path):
    repo = fake_repo(tmp_path, """
        import http.server, sys, time
        time.sleep(0.5)
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
        """, "echo '==== 3 passed, 1 skipped in 1.00s ===='\n")
    assert 0.5 <= time_start(repo, dict(os.environ), limit_s=30) < 30
    tests = time_tests(repo, dict(os.environ))
    assert (tests["passed"], tests["skipped"], tests["returncode"]) == (3, 1, 0)
    assert machine()["cores"] >= 1
