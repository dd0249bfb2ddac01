"""End to end on the embedded default: `python app.py` driven through gradio_client, the real `openai` client and
headless Chromium (Debian's, through Playwright): the issue's checks of an honest speed figure, Stop, drafting
with the default settings, a streaming Compare tab, conversations that survive a restart, and a soak test."""
import os
import re
import time
from pathlib import Path

import pytest

from core.prompts import read_prompt_file
from scripts.screenshots import CHROMIUM, free_port, open_page, send, start_app

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
browser_needed = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium not installed "
                                    "(.ci/run installs it)")
SOAK_TURNS = 30
SOAK_RSS_BOUND_MB = 150  # resident memory may grow this much over the soak test's turns (warm caches, allocator)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fm-e2e")


@pytest.fixture(scope="module")
def app(data_dir):
    proc, url = start_app(free_port(), "auto", "--data-dir", str(data_dir))
    assert url.startswith("http://127.0.0.1:")  # bound to loopback only
    yield proc, url
    proc.terminate()
    proc.wait(timeout=30)


def test_chat_api_and_draft_panel(app):
    from gradio_client import Client

    client = Client(app[1], verbose=False)
    reply = client.predict("What is 2+2? Answer with the number.", api_name="/chat")
    assert "4" in reply
    assert "★" in client.predict(api_name="/draft_panel")  # one row per round, each ending with the target's token
    # a plain reply reads 1x plain decoding: over 64 steps, as a reply of a few 3 ms steps reads the jitter of the
    # server's event loop as much as the model
    plain = client.predict("Write a short poem about the sea.", drafter="none", max_new_tokens=64, api_name="/chat")
    speed = client.predict(api_name="/speed")
    assert speed["plain_steps"] >= 48 and abs(speed["ratio"] - 1.0) < 0.15 and plain


def openai_client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0)


def test_openai_client_against_the_running_app(app):
    import openai

    client = openai_client(app[1])
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Name three colours."}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=40)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=40, stream=True))
    assert whole.choices[0].message.content == streamed and whole.model_extra["speculative"]["rounds"] > 0
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=model, messages=messages, temperature=-1)


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def test_soak_thirty_turns_identical_to_plain_with_bounded_memory(app):
    """30 turns of one growing conversation through the API at T = 0, each reply checked against plain decoding
    of the same messages; the server's resident memory is sampled after the first turn and at the end."""
    proc, url = app
    client = openai_client(url)
    model = client.models.list().data[0].id
    messages, start_rss = [], None
    for turn in range(SOAK_TURNS):
        messages.append({"role": "user", "content": f"Give me fact number {turn + 1} about the sea, briefly."})
        ask = dict(model=model, messages=messages[-6:], temperature=0, max_tokens=24)
        spec = client.chat.completions.create(**ask).choices[0].message.content
        plain = client.chat.completions.create(**ask, extra_body={"drafter": "none"}).choices[0].message.content
        assert spec == plain, f"turn {turn + 1}"
        messages.append({"role": "assistant", "content": spec})
        start_rss = start_rss or rss_mb(proc.pid)
    end_rss = rss_mb(proc.pid)
    print(f"soak: {SOAK_TURNS} turns, server RSS {start_rss:.0f} -> {end_rss:.0f} MB")
    assert proc.poll() is None and end_rss - start_rss < SOAK_RSS_BOUND_MB


def choose(page, elem_id: str, label: str) -> None:
    """Pick `label` in the dropdown `elem_id`."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=label, exact=True).click()


def slots_per_row(page) -> list[int]:
    """The drafted slots of each row of the draft panel (the latest reply's rounds)."""
    return page.evaluate("() => Array.from(document.querySelectorAll('#draft-panel .fm-row')).map("
                         "r => r.querySelectorAll(\".fm-slot[title^='slot ']\").length)")


@browser_needed
def test_browser_choices_honest_ratio_stop_and_compare(app):
    from playwright.sync_api import sync_playwright

    url = app[1]
    shots = Path(os.environ.get("SCREENSHOT_DIR", "/tmp"))
    prompt = read_prompt_file("heldout_math")[2]["prompt"]
    with sync_playwright() as pw:
        browser, page = open_page(pw, url)
        # Drafter = FlashMap: the network drafts (nearly) every round, a plain step at most every 16 for the ratio
        choose(page, "chat-drafter", "FlashMap")
        send(page, prompt)
        stats = page.locator("#stats").inner_text()
        rounds = {words: int(n) for n, words in re.findall(r"(\d+) (drafted by the network|copied by prompt lookup|"
                                                          r"copied from the phrasebook|from the network's last block|"
                                                          r"plain steps)", stats)}
        assert rounds["drafted by the network"] >= 0.9 * sum(rounds.values()), stats
        wide = max(slots_per_row(page))
        page.screenshot(path=str(shots / "chat.png"), full_page=True)
        # moving K changes the width of the drafted blocks
        page.locator("#chat-block input[type=number]").fill("2")
        page.locator("#chat-block input[type=number]").press("Enter")
        send(page, prompt)
        assert wide > 2 and max(slots_per_row(page)) == 2
        # Auto: the stats give each source's share of the reply's tokens
        choose(page, "chat-drafter", "Auto")
        send(page, "Write a Python function that returns the largest of three numbers.")
        tokens_line = next(line for line in page.locator("#stats").inner_text().splitlines() if "Tokens:" in line)
        assert "% the target's own steps" in tokens_line and re.search(r"\d+% (the network|prompt lookup|the phrase)",
                                                                         tokens_line), tokens_line
        # a plain reply's ratio, measured inside it, is 1 within 0.15
        choose(page, "chat-drafter", "None (plain)")
        send(page, "Tell me about the moon.")
        stats = page.locator("#stats").inner_text()
        ratio = float(re.search(r"× ([0-9.]+) plain decoding", stats).group(1))
        assert "None (plain)" in stats and abs(ratio - 1.0) < 0.15, stats
        # Stop keeps the partial reply and lays no error over the page
        page.locator("#message textarea").fill("Write a very long story about a dragon and a knight.")
        page.locator("#send").click()
        page.wait_for_function("() => document.querySelectorAll('[data-testid=bot]').length >= 4")
        time.sleep(1.5)
        page.locator("#stop").click()
        page.wait_for_function("() => !document.querySelector('.generating, .pending')", timeout=60_000)
        assert page.locator(".error, [data-testid='error'], .toast-body.error").count() == 0
        assert page.locator("[data-testid='bot']").last.inner_text().strip()
        # Compare runs any two choices and streams: the first side shows text while the run is still going
        page.get_by_role("tab", name="Compare").click()
        choose(page, "compare-against", "Copies")
        page.locator("#compare-prompt textarea").fill("Explain what a hash map is.")
        page.locator("#compare-run").click()
        page.wait_for_function("() => document.querySelector('#compare-plain textarea').value.length > 0")
        assert "Check" not in page.locator("#compare-summary").inner_text()
        page.locator("#compare-summary").get_by_text("Check").wait_for(timeout=300_000)
        summary = page.locator("#compare-summary").inner_text()
        assert "Auto / Copies" in summary and "identical" in summary, summary
        browser.close()


@browser_needed
def test_saved_conversation_reopens_after_a_restart(app, data_dir):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, app[1])
        # the page opens with the cursor in the message box; Shift+Enter starts a new line, Enter sends
        box = page.locator("#message textarea")
        box.wait_for()
        page.wait_for_function("() => document.activeElement.closest('#message') !== null", timeout=10_000)
        box.type("Name a")
        box.press("Shift+Enter")
        box.type("planet.")
        assert box.input_value() == "Name a\nplanet." and page.locator("[data-testid='user']").count() == 0
        box.press("Enter")
        page.wait_for_function("() => document.querySelectorAll('[data-testid=bot]').length > 0", timeout=300_000)
        page.wait_for_function("() => !document.querySelector('.generating, .pending')", timeout=300_000)
        assert box.input_value() == ""
        browser.close()
    proc, url = start_app(free_port(), "copies", "--data-dir", str(data_dir), "--no-measure")  # a second server
    try:
        with sync_playwright() as pw:
            browser, page = open_page(pw, url)
            page.locator("#saved-conversations input").click()
            page.get_by_role("option", name=re.compile("Name a")).first.click()
            page.wait_for_function("() => document.querySelectorAll('[data-testid=user]').length > 0")
            assert "planet." in page.locator("[data-testid='user']").first.inner_text()
            assert page.locator("[data-testid='bot']").first.inner_text().strip()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
