"""End to end on the embedded default: launch `python app.py`, chat through gradio_client, and drive
the page in headless Chromium (Debian's, through Playwright) with a screenshot."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.screenshots import CHROMIUM, chat_in_browser

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url():
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    url, lines = None, []
    deadline = time.time() + 300
    while time.time() < deadline and url is None:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if "Running on local URL:" in line:
            url = line.split("URL:")[1].strip()
    if url is None:
        proc.kill()
        pytest.fail("app did not start:\n" + "".join(lines[-30:]))
    assert url.startswith("http://127.0.0.1:")  # bound to loopback only
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_chat_api_and_draft_panel(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    reply = client.predict("What is 2+2? Answer with the number.", api_name="/chat")
    assert "4" in reply
    panel = client.predict(api_name="/draft_panel")
    assert "★" in panel  # one row per round, each ending with the target's token


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium not installed (.ci/run installs it)")
def test_browser_chat_shows_reply_and_coloured_slots(app_url, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("SCREENSHOT_DIR", tmp_path))
    with sync_playwright() as pw:
        browser, page = chat_in_browser(pw, app_url, "Write a Python function that adds two numbers.", 180_000)
        bot = page.locator("[data-testid='bot']").last
        assert "def" in bot.inner_text()
        assert page.locator("#draft-panel .fm-acc, #draft-panel .fm-rej").count() > 0
        page.screenshot(path=str(shots / "chat.png"), full_page=True)
        assert (shots / "chat.png").stat().st_size > 10_000
        browser.close()
