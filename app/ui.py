"""The Gradio app: chat with live draft panels and stats, and a side-by-side compare tab.

Every callback is a plain function of (service, inputs) so tests can call it without a browser.
"""
from __future__ import annotations

import html
import time
from contextlib import contextmanager

import gradio as gr
import torch

from app.engine import PromptError, RoundEvent
from app.prompts import read_jsonl
from app.registry import DrafterUnavailable
from app.service import DRAFTER_LABELS, ChatService, ChatSettings
from app.stats import AcceptanceStats

PANEL_ROUNDS = 12
CHART_EVERY = 32  # rounds between redraws of the per-slot chart while a reply streams
UPDATE_EVERY_S = 0.1  # at most ~10 screen updates a second: the browser shares the CPU with the model
CSS = """
.fm-panel {font-family: ui-monospace, monospace; font-size: 12px; line-height: 1.9}
.fm-row {display: flex; flex-wrap: wrap; gap: 3px; align-items: center; margin-bottom: 4px}
.fm-round {color: #666; width: 3.2em}
.fm-slot {padding: 1px 5px; border-radius: 4px; border: 1px solid transparent; white-space: pre}
.fm-acc {background: #c9f2d0; border-color: #2e9e48; color: #0b4d1c}
.fm-rej {background: #ffd0d0; border-color: #c62828; color: #6b0d0d; text-decoration: line-through}
.fm-unr {background: #eeeeee; border-color: #bbbbbb; color: #888888}
.fm-bonus {background: #cfe3ff; border-color: #1f5fbf; color: #0b2e66; font-weight: bold}
"""
LEGEND = (
    "<div class='fm-row'><span class='fm-slot fm-acc'>✓ accepted</span><span class='fm-slot fm-rej'>✗ rejected</span>"
    "<span class='fm-slot fm-unr'>· not reached</span><span class='fm-slot fm-bonus'>★ target token</span></div>"
)


def token_text(service: ChatService, token: int) -> str:
    text = service.target.tokenizer.decode([token])
    return html.escape(text.replace("\n", "⏎").replace(" ", "␣") or "∅")


SLOT_MARKS = {"acc": "✓", "rej": "✗", "unr": "·"}
ADAPTIVE_LABEL = "Adaptive K: cut low-confidence draft tails (uses this machine's measured verify cost)"
TREE_LABEL = "FlashMap drafts per round (T = 0: verified together as a tree of at most K tokens)"
TREE_CHOICES = [1, 2, 4, 8]


def slot_kinds(ev: RoundEvent) -> list[str]:
    """Per drafted slot: accepted, the first rejected, or not reached (after the rejection)."""
    return ["acc" if slot < ev.n_accepted else "rej" if slot == ev.n_accepted else "unr"
            for slot in range(len(ev.drafted))]


def render_round(service: ChatService, index: int, ev: RoundEvent) -> str:
    """One row: each drafted slot marked accepted / rejected / not reached, then the target's token."""
    cells = [f"<span class='fm-round'>#{index}</span>"]
    if ev.branches > 1:  # the row shows the draft the target followed furthest
        cells.append(f"<span class='fm-slot fm-unr' title='best of {ev.branches} drafts, verified as a tree'>"
                     f"⑂{ev.branches}</span>")
    for slot, (token, kind) in enumerate(zip(ev.drafted, slot_kinds(ev))):
        mark = SLOT_MARKS[kind]
        cells.append(f"<span class='fm-slot fm-{kind}' title='slot {slot + 1}'>{mark}{token_text(service, token)}</span>")
    cells.append(f"<span class='fm-slot fm-bonus' title='target'>★{token_text(service, ev.target_token)}</span>")
    return "<div class='fm-row'>" + "".join(cells) + "</div>"


def render_panel(service: ChatService, events: list[RoundEvent]) -> str:
    rounds = [ev for ev in events if ev.kind == "round" and ev.finish_reason != "cancelled"]
    start = max(0, len(rounds) - PANEL_ROUNDS)
    rows = [render_round(service, start + i + 1, ev) for i, ev in enumerate(rounds[start:])]
    body = "".join(reversed(rows)) or "<div class='fm-row'>No rounds yet.</div>"
    return f"<div class='fm-panel'>{LEGEND}{body}</div>"


def render_stats(service: ChatService, stats: AcceptanceStats, tokens_per_s: float | None, drafter: str) -> str:
    plain = service.plain_tokens_per_s
    lines = [f"**Drafter:** {DRAFTER_LABELS.get(drafter, drafter)}"]
    lines.append(f"**This reply:** {tokens_per_s:.1f} tokens/s" if tokens_per_s else "**This reply:** –")
    if stats.acceptance_length:
        lines.append(f"**Mean acceptance length (conversation):** {stats.acceptance_length:.2f} tokens / target forward")
    if plain:
        ratio = f" (× {tokens_per_s / plain:.2f})" if tokens_per_s else ""
        source = f" ({service.plain_measured})" if service.plain_measured else ""
        lines.append(f"**Plain decoding on this machine{source}:** {plain:.1f} tokens/s{ratio}")
    return "  \n".join(lines)


def slot_chart(stats: AcceptanceStats):
    """A matplotlib bar chart of conditional acceptance per slot (slots no round reached are left empty)."""
    from matplotlib.figure import Figure

    rates = stats.per_slot()
    fig = Figure(figsize=(5, 2.6), layout="constrained")
    ax = fig.add_subplot()
    slots = list(range(1, len(rates) + 1))
    ax.bar(slots, [r or 0.0 for r in rates], color="#2e9e48")
    ax.set_xticks(slots or [1])
    ax.set_ylim(0, 1)
    ax.set_xlabel("slot")
    ax.set_ylabel("acceptance")
    ax.set_title("Acceptance per slot (given earlier slots accepted)", fontsize=10)
    return fig


def settings_from(drafter, block_size, steps, temperature, top_p, max_new_tokens, thinking, system_prompt,
                  adaptive=True, tree=1):
    return ChatSettings(drafter, int(block_size), int(steps), float(temperature), float(top_p), int(max_new_tokens),
                        bool(thinking), system_prompt or "", adaptive=bool(adaptive), tree=int(tree))


def resolve_drafter(service: ChatService, settings: ChatSettings):
    """(drafter or None, warning or None): an unusable drafter falls back to plain decoding, saying why."""
    try:
        return service.drafter(settings.drafter, settings.steps, settings.tree), None
    except DrafterUnavailable as err:
        return None, f"{DRAFTER_LABELS.get(settings.drafter, settings.drafter)} unavailable, using plain decoding: {err}"


def prepare(service: ChatService, text: str, *settings_args) -> tuple[ChatSettings, object]:
    """Validate a request: (settings, drafter or None). Bad input raises a gr.Error with the reason;
    an unusable drafter falls back to plain decoding with a warning."""
    if not (text or "").strip():
        raise gr.Error("Type a message first: the prompt is empty.")
    try:
        settings = settings_from(*settings_args)
    except ValueError as err:
        raise gr.Error(str(err)) from err
    drafter, warning = resolve_drafter(service, settings)
    if warning:
        gr.Warning(warning)
    return settings, drafter


@contextmanager
def user_errors():
    """Turn the failures a user can cause into a clear message instead of a stack trace."""
    try:
        yield
    except PromptError as err:
        raise gr.Error(str(err)) from err
    except (MemoryError, torch.OutOfMemoryError) as err:
        raise gr.Error("Out of memory: lower max new tokens, shorten the chat, or start a new one.") from err


def chat(service: ChatService, message: str, history: list[dict], stats: AcceptanceStats | None, *settings_args):
    """Streams (history, panel html, stats markdown, slot chart, stats) while the reply is written."""
    stats = stats or AcceptanceStats()
    history = list(history or [])
    settings, drafter = prepare(service, message, *settings_args)
    shown = settings.drafter if drafter is not None else "none"
    with user_errors():
        prompt_ids = service.prompt_ids(history, message, settings)
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
        last_update, last_chart = float("-inf"), 0
        for ev, tps in service.stream(prompt_ids, settings, drafter):
            stats.add(ev)
            history[-1]["content"] = ev.text
            if not ev.finished and time.perf_counter() - last_update < UPDATE_EVERY_S:
                continue  # every event is counted; the screen catches up at the next update
            # drawing a figure costs more than a round here: the chart is redrawn every CHART_EVERY rounds and at the end
            redraw = ev.finished or stats.rounds - last_chart >= CHART_EVERY or not last_chart
            last_chart = stats.rounds if redraw else last_chart
            last_update = time.perf_counter()
            yield (history, render_panel(service, service.last_events), render_stats(service, stats, tps, shown),
                   slot_chart(stats) if redraw else gr.skip(), stats)


def compare(service: ChatService, prompt: str, drafter_name: str, block_size, steps, temperature, max_new_tokens,
            adaptive=True, tree=1):
    """Plain decoding and the drafter on one prompt, same settings: outputs, speeds, identity check."""
    settings, drafter = prepare(service, prompt, drafter_name, block_size, steps, temperature, 1.0, max_new_tokens,
                                False, "", adaptive, tree)
    with user_errors():
        ids = service.prompt_ids([], prompt, settings)
        plain_text, plain_tokens, plain_tps = service.run_once(ids, settings, None)
        spec_text, spec_tokens, spec_tps = service.run_once(ids, settings, drafter)
    label = DRAFTER_LABELS.get(drafter_name, drafter_name) if drafter is not None else "none"
    if settings.temperature == 0:
        same = plain_tokens == spec_tokens
        check = "✓ identical to plain decoding, token for token" if same else "✗ outputs differ"
    else:
        check = "T > 0: outputs are samples; both follow the target's distribution exactly"
    summary = (f"**Plain:** {plain_tps:.1f} tokens/s ({len(plain_tokens)} tokens)  \n"
               f"**{label}:** {spec_tps:.1f} tokens/s ({len(spec_tokens)} tokens)  \n"
               f"**Speedup:** × {spec_tps / plain_tps:.2f}  \n**Check:** {check}")
    return plain_text, spec_text, summary, speed_chart(["plain", label], [plain_tps, spec_tps])


def speed_chart(labels: list[str], tokens_per_s: list[float]):
    """A matplotlib bar chart of tokens/s, one bar per decoding mode."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2.6), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh(labels, tokens_per_s, color=["#9e9e9e", "#2e9e48"][: len(labels)])
    ax.bar_label(bars, fmt="%.1f tok/s", padding=3)
    ax.set_xlabel("tokens / s")
    ax.set_xlim(0, max(tokens_per_s) * 1.3)
    ax.invert_yaxis()
    return fig


def example_prompts(shared_data: str = "../shared/data/prompts") -> list[str]:
    """A few eval prompts per domain when the shared data is present, else built-in ones."""
    prompts = []
    for domain in ("math", "code", "chat"):
        try:
            prompts += [row["prompt"] for row in read_jsonl(f"{shared_data}/eval_{domain}.jsonl")[:2]]
        except OSError:
            pass
    return prompts or [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "Write a Python function that checks whether a string is a palindrome.",
        "Give me three tips for staying focused while working from home.",
    ]


def build_ui(service: ChatService, default_drafter: str = "flashmap") -> gr.Blocks:
    available = service.available()
    default = default_drafter if default_drafter in available else available[0]
    choices = [(DRAFTER_LABELS[name], name) for name in available]
    with gr.Blocks(title="FlashMap Chat") as demo:
        gr.Markdown(f"# FlashMap Chat\nTarget: `{service.target.name}` on `{service.target.device}` — "
                    "speculative decoding that never changes the target's output.")
        if service.unavailable:
            gr.Markdown("  \n".join(f"⚠️ {DRAFTER_LABELS[n]} unavailable: {why}" for n, why in service.unavailable.items()))
        with gr.Tab("Chat"):
            with gr.Row():
                with gr.Column(scale=3):
                    chatbot = gr.Chatbot(label="Chat", height=460)
                    message = gr.Textbox(label="Message", placeholder="Ask something…", lines=2)
                    with gr.Row():
                        send = gr.Button("Send", variant="primary")
                        stop = gr.Button("Stop")
                        clear = gr.Button("New chat")
                    with gr.Accordion("Settings", open=True):
                        system = gr.Textbox(label="System prompt", lines=1)
                        drafter = gr.Dropdown(choices, value=default, label="Drafter")
                        block = gr.Slider(1, 16, value=8, step=1, label="Block size K")
                        steps = gr.Radio([1, 2], value=1, label="Drafting steps (FlashMap)")
                        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature")
                        top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
                        max_new = gr.Slider(16, 2048, value=256, step=16, label="Max new tokens")
                        adaptive = gr.Checkbox(True, label=ADAPTIVE_LABEL)
                        tree = gr.Radio(TREE_CHOICES, value=1, label=TREE_LABEL)
                        thinking = gr.Checkbox(False, label="Thinking (Qwen3)", visible=service.target.supports_thinking())
                with gr.Column(scale=2):
                    panel = gr.HTML(render_panel(service, []), label="Draft panel", elem_id="draft-panel")
                    stats_md = gr.Markdown(render_stats(service, AcceptanceStats(), None, default), elem_id="stats")
                    chart = gr.Plot(slot_chart(AcceptanceStats()), label="Acceptance per slot", show_label=False,
                                    elem_id="slot-chart")
            stats = gr.State(None)
            settings = [drafter, block, steps, temperature, top_p, max_new, thinking, system, adaptive, tree]
            outputs = [chatbot, panel, stats_md, chart, stats]
            run = lambda msg, hist, st, *s: (yield from chat(service, msg, hist, st, *s))
            events = [trigger(run, [message, chatbot, stats, *settings], outputs, api_visibility="private")
                      for trigger in (send.click, message.submit)]
            for ev in events:
                ev.then(lambda: "", None, message, api_visibility="private")
            stop.click(None, None, None, cancels=events, api_visibility="private")
            clear.click(lambda: ([], render_panel(service, []), None), None, [chatbot, panel, stats],
                        api_visibility="private")
        with gr.Tab("Compare"):
            c_prompt = gr.Textbox(label="Prompt", lines=3, elem_id="compare-prompt")
            gr.Examples(example_prompts(), inputs=c_prompt, label="Examples (math, code, chat)")
            with gr.Row():
                c_drafter = gr.Dropdown([c for c in choices if c[1] != "none"] or choices, value=default, label="Drafter")
                c_block = gr.Slider(1, 16, value=8, step=1, label="Block size K")
                c_steps = gr.Radio([1, 2], value=1, label="Steps")
                c_temp = gr.Slider(0, 2, value=0, step=0.05, label="Temperature")
                c_max = gr.Slider(16, 1024, value=128, step=16, label="Max new tokens")
                c_adaptive = gr.Checkbox(True, label=ADAPTIVE_LABEL)
                c_tree = gr.Radio(TREE_CHOICES, value=1, label=TREE_LABEL)
            c_run = gr.Button("Run both", variant="primary")
            with gr.Row():
                c_plain = gr.Textbox(label="Plain decoding", lines=12)
                c_spec = gr.Textbox(label="Speculative decoding", lines=12)
            c_summary = gr.Markdown(elem_id="compare-summary")
            c_chart = gr.Plot(label="Tokens per second", elem_id="compare-chart")
            c_run.click(lambda *a: compare(service, *a),
                        [c_prompt, c_drafter, c_block, c_steps, c_temp, c_max, c_adaptive, c_tree],
                        [c_plain, c_spec, c_summary, c_chart], api_name="compare")

        def api_chat(message: str) -> str:
            """Reply to one user message with the default drafter and settings (streamed)."""
            defaults = ChatSettings(drafter=default)
            settings, drafter_obj = prepare(service, message, default, defaults.block_size, defaults.steps,
                                            defaults.temperature, defaults.top_p, defaults.max_new_tokens, False, "",
                                            defaults.adaptive)
            with user_errors():
                for ev, _tps in service.stream(service.prompt_ids([], message, settings), settings, drafter_obj):
                    yield ev.text

        def api_draft_panel() -> str:
            """The draft panel of the most recent reply, as plain text rows (for scripts and tests)."""
            rows = []
            for ev in service.last_events:
                if ev.kind == "round":
                    decode = service.target.tokenizer.decode
                    slots = [SLOT_MARKS[kind] + decode([t]) for t, kind in zip(ev.drafted, slot_kinds(ev))]
                    rows.append(" ".join(slots + ["★" + decode([ev.target_token])]))
            return "\n".join(rows)

        gr.api(api_chat, api_name="chat")
        gr.api(api_draft_panel, api_name="draft_panel")
    demo.queue(default_concurrency_limit=1)  # one model: requests wait in line, the queue shows their place
    return demo
