"""The mission's configuration as an app, on the CPU: `python app.py --target DIR --graphs sim --dtype fp32 --drafter
flashmap --weights FM_DIR` on a tiny random Qwen3 folder with a release-format drafter (tests/gpu_path.py) takes the
objects a GPU takes (the lean forward's fixed-shape steps, the release drafter's graphed proposal, in mode "sim"), and
answers through every door a user has: the OpenAI API (streamed and not, T = 0 and 1, stop strings, a conversation),
the Gradio chat and Compare tabs in a real browser (regenerate and edit included) and the bench."""
from __future__ import annotations

import json
import os

import pytest

from scripts.screenshots import CHROMIUM, free_port, open_page, send, start_app
from tests.gpu_path import write_folders
from tests.test_app_e2e import choose

pytestmark = pytest.mark.slow
CHOICES = ("none", "flashmap", "auto")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_folders(tmp_path_factory.mktemp("gpu-path-app"))


@pytest.fixture(scope="module")
def app(folders, tmp_path_factory):
    target, drafter = folders
    proc, url = start_app(free_port(), "flashmap", "--target", str(target), "--graphs", "sim", "--dtype", "fp32",
                          "--weights", str(drafter), "--data-dir", str(tmp_path_factory.mktemp("gpu-path-data")))
    yield proc, url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(app):
    import openai

    return openai.OpenAI(base_url=app[1] + "/v1", api_key="local", max_retries=0)


def ask(client, messages, drafter: str, temperature: float, stream: bool = False, **extra):
    """(reply text, finish reason, speculative stats or None) through the API."""
    model = client.models.list().data[0].id
    args = dict(model=model, messages=messages, temperature=temperature, max_tokens=32, seed=7,
                extra_body={"drafter": drafter}, **extra)
    if not stream:
        reply = client.chat.completions.create(**args)
        return reply.choices[0].message.content, reply.choices[0].finish_reason, reply.model_extra["speculative"]
    text, finish, spec = "", None, None
    for chunk in client.chat.completions.create(stream=True, **args):
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        spec = (chunk.model_extra or {}).get("speculative") or spec
    return text, finish, spec


def test_the_app_serves_with_the_gpus_objects(app):
    log = "".join(app[0].log)
    assert "lean (fixed-shape steps) forward" in log and "fp32" in log


@pytest.mark.parametrize("stream", [False, True])
def test_every_choice_answers_at_t0_and_t1_and_t0_drafted_equals_plain(client, stream):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    replies = {(d, t): ask(client, messages, d, t, stream) for d in CHOICES for t in (0.0, 1.0)}
    for (drafter, _), (text, finish, spec) in replies.items():
        assert text and finish in ("stop", "length") and spec["drafter"] == drafter
    assert replies[("flashmap", 0.0)][0] == replies[("auto", 0.0)][0] == replies[("none", 0.0)][0]
    assert replies[("flashmap", 0.0)][2]["rounds_by_source"].get("drafter", 0) > 0  # the network drafted
    assert replies[("flashmap", 1.0)][2]["rounds_by_source"].get("drafter", 0) > 0


def test_a_stop_string_ends_the_reply_before_it(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = ask(client, messages, "flashmap", 0.0)[0]
    stop = whole[len(whole) // 2: len(whole) // 2 + 3]
    for stream in (False, True):
        text, finish, _ = ask(client, messages, "flashmap", 0.0, stream, stop=[stop])
        assert text == whole[: whole.index(stop)] and finish == "stop"


def test_a_conversation_each_turn_equal_to_plain_decoding(client):
    """Each turn sends the whole conversation (the server's prefix cache meets the fixed-shape steps)."""
    messages = [{"role": "system", "content": "Answer briefly."}]
    for question in ("Hello!", "What is 2+2?", "And 3+3?"):
        messages.append({"role": "user", "content": question})
        drafted = ask(client, messages, "flashmap", 0.0)[0]
        assert drafted == ask(client, messages, "none", 0.0)[0]
        messages.append({"role": "assistant", "content": drafted})


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium not installed (.ci/run installs it)")
def test_the_chat_and_compare_tabs_in_a_browser(app):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page = open_page(pw, app[1])
        choose(page, "chat-drafter", "FlashMap")
        send(page, "Tell me about the sea.")
        first = page.locator("[data-testid='bot']").last.inner_text()
        assert first.strip() and "drafted by the network" in page.locator("#stats").inner_text()
        assert page.locator("#draft-panel .fm-row").count() > 0
        page.locator("#regenerate").click()
        page.wait_for_function("() => !document.querySelector('.generating, .pending')", timeout=120_000)
        assert page.locator("[data-testid='bot']").last.inner_text() == first  # T = 0: the same reply again
        page.locator("#edit-last").click()
        page.wait_for_function("() => document.querySelector('#message textarea').value.length > 0")
        assert page.locator("#message textarea").input_value() == "Tell me about the sea."
        send(page, "Tell me about the sky.")
        assert page.locator("[data-testid='bot']").count() == 1
        page.get_by_role("tab", name="Compare").click()
        choose(page, "compare-against", "None (plain)")
        page.locator("#compare-prompt textarea").fill("Explain what a hash map is.")
        page.locator("#compare-run").click()
        page.locator("#compare-summary").get_by_text("Check").wait_for(timeout=120_000)
        assert "identical" in page.locator("#compare-summary").inner_text()
        assert page.locator(".error, [data-testid='error'], .toast-body.error").count() == 0
        browser.close()


def test_the_bench_runs_the_same_objects(folders, tmp_path):
    from app import bench

    target, drafter = folders
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("Hello there.", "What is 2+2?")))
    out = tmp_path / "r.json"
    bench.main(["--prompts", str(prompts), "--choice", "flashmap", "--weights", str(drafter), "--target",
                str(target), "--graphs", "sim", "--dtype", "fp32", "--max-new-tokens", "16", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["identical_to_baseline"] is True and "fixed-shape steps" in result["precision"]


def test_no_traceback_in_the_apps_log(app):
    """Last in this file: nothing the requests above did left a traceback in the server's log."""
    log = "".join(app[0].log)
    assert "Traceback" not in log and " 500 " not in log, log[-3000:]
