"""Take the README's screenshots: start `python app.py`, chat once, run the compare tab, save PNGs.

python -m scripts.screenshots [--out docs] [--drafter auto]   (needs Debian's chromium)
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright's own browser download is not used
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def open_page(pw, url: str):
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    return browser, page


def send(page, message: str, timeout_ms: int = 300_000) -> None:
    """Send one chat message and wait until the reply is complete."""
    before = page.locator("[data-testid='bot']").count()
    page.locator("#message textarea").fill(message)
    page.locator("#send").click()
    page.wait_for_function(f"() => document.querySelectorAll('[data-testid=bot]').length > {before}",
                           timeout=timeout_ms)
    page.wait_for_function("() => !document.querySelector('.generating, .pending')", timeout=timeout_ms)


def chat_in_browser(pw, url: str, message: str, timeout_ms: int = 300_000):
    """Open the app in headless Chromium, send one chat message, wait until the reply is complete."""
    browser, page = open_page(pw, url)
    send(page, message, timeout_ms)
    return browser, page


def free_port() -> int:
    """A loopback port nothing listens on now, for an app started by start_app."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, drafter: str = "auto", *extra: str) -> tuple[subprocess.Popen, str]:
    """`python app.py` on this port; returns the process and its URL once it serves. proc.log collects every line
    it prints (read on after start-up, so a full pipe never blocks the app)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--drafter", drafter, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    proc.log = []
    for line in proc.stdout:
        print(line, end="")
        proc.log.append(line)
        if "Running on local URL:" in line:
            threading.Thread(target=lambda: proc.log.extend(proc.stdout), daemon=True).start()
            return proc, line.split("URL:")[1].strip()
    raise SystemExit("the app did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--port", type=int, default=7871)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    proc, url = start_app(args.port, args.drafter)
    try:
        with sync_playwright() as pw:
            browser, page = open_page(pw, url)
            # the default settings as a user meets them once the verify-cost curve exists (adaptive K on)
            status = "(document.querySelector('#fm-status') || {}).innerText || ''"
            page.wait_for_function(f"() => /measured|cached/.test({status})", timeout=300_000)
            send(page, "Write a Python function that returns the n-th Fibonacci number.")
            time.sleep(1)
            page.screenshot(path=f"{args.out}/screenshot-chat.png", full_page=True)
            page.get_by_role("tab", name="Compare").click()
            prompt = "Write a Python function that checks whether a number is prime."
            page.locator("#compare-prompt textarea").fill(prompt)
            page.get_by_role("button", name="Run both").click()
            page.locator("#compare-summary").get_by_text("Check").wait_for(timeout=300_000)
            time.sleep(4)  # the chart renders after the summary
            page.screenshot(path=f"{args.out}/screenshot-compare.png", full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"saved {args.out}/screenshot-chat.png and screenshot-compare.png")


if __name__ == "__main__":
    main()
