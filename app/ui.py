"""The Gradio app: chat with live draft panels and stats, saved conversations, a streaming side-by-side compare
tab, and named API endpoints.

Every callback is a plain function of (service, inputs) so tests can call it without a browser. A user's mistake
(an empty message, settings that do not fit together, a prompt too long for the context) is a toast that leaves
the conversation as it was, never an error laid over the outputs; Stop ends a reply after the current round and
keeps what was written.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

import gradio as gr
import torch

from app import __version__
from app.remote import RemoteUnavailable
from app.render import (
    CSS,
    DRAFTER_LABELS,
    SLOT_MARKS,
    render_panel,
    render_stats,
    slot_chart,
    slot_kinds,
    speed_chart,
    speed_lines,
)
from app.service import REMOTE, ChatService, ChatSettings
from core.decoding.engine import PromptError, RoundEvent
from core.decoding.stats import AcceptanceStats
from core.prompts import read_prompt_file
from drafter.registry import DrafterUnavailable
from drafter.spec import ADAPTIVE_CHOICES, FLASHMAP_CHOICES

__all__ = ["CSS", "build_ui"]
UPDATE_EVERY_S = 0.1  # at most ~10 screen updates a second: the browser shares the CPU with the model
CHART_EVERY_S = 1.5  # the per-slot chart is redrawn this often while a reply streams (a figure costs ~ a round)


class Every:
    """Whether a streamed reply's screen (or chart) is due: at most once every `seconds`, and at the reply's end."""

    def __init__(self, seconds: float):
        self.seconds, self.last = seconds, float("-inf")

    def due(self, ev: RoundEvent) -> bool:
        now = time.perf_counter()
        if not ev.finished and now - self.last < self.seconds:
            return False
        self.last = now
        return True
ADAPTIVE_LABEL = ("Adaptive K: cut low-confidence draft tails and skip the drafter while its drafts do not pay for it "
                  "(uses this machine's measured verify cost)")
TREE_LABEL = "FlashMap drafts per round (T = 0: verified together as a tree of at most K tokens)"
TREE_CHOICES = [1, 2, 4, 8]
# every ChatSettings field, by name: components map onto these keys
CASTS: dict[str, Callable] = {
    "drafter": str, "block_size": lambda v: int(v) or None, "steps": int, "temperature": float, "top_p": float,
    "max_new_tokens": int, "enable_thinking": bool, "system_prompt": lambda v: v or "", "adaptive": bool,
    "tree": int, "seed": int, "stop_strings": tuple}
COMPARE_FIXED = ("top_p", "enable_thinking", "system_prompt", "seed", "stop_strings")  # Compare keeps their defaults
log = logging.getLogger("flashmap")


class UserError(ValueError):
    """Something the user can fix; shown as a toast, logged as one line."""


def settings_from(**values) -> ChatSettings:
    """ChatSettings from component values by field name (fields not given keep their defaults); K = 0 means the
    drafter's own. Raises UserError saying what does not fit."""
    unknown = set(values) - set(CASTS)
    if unknown:
        raise UserError(f"unknown settings {sorted(unknown)}")
    try:
        return ChatSettings(**{name: CASTS[name](value) for name, value in values.items()})
    except (TypeError, ValueError) as err:
        raise UserError(str(err)) from err


def check_controls(controls: dict, fixed) -> None:
    """Every ChatSettings field has a component or is declared fixed: a new setting cannot be dropped silently."""
    missing = set(CASTS) - set(controls) - set(fixed)
    if missing:
        raise RuntimeError(f"settings without a control: {sorted(missing)}")


def prepare(service: ChatService, text: str, values: dict) -> tuple[ChatSettings, object]:
    """Validate a request: (settings, drafter or None). An unusable drafter falls back to plain decoding (to the
    vLLM server where this app holds no weights) with a warning toast; anything the user must fix raises
    UserError."""
    if not (text or "").strip():
        raise UserError("Type a message first: the prompt is empty.")
    settings = settings_from(**values)
    try:
        return settings, service.drafter_for(settings)
    except DrafterUnavailable as err:
        label = DRAFTER_LABELS.get(settings.drafter, settings.drafter)
        fallback = service.fallback()
        instead = "plain decoding" if fallback is None else DRAFTER_LABELS[REMOTE]
        gr.Warning(f"{label} unavailable, using {instead}: {err}")
        log.warning("drafter %s unavailable: %s", settings.drafter, err)
        return (settings if fallback is None else replace(settings, drafter=REMOTE)), fallback


def toast(err: Exception) -> None:
    message = str(err)
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        message = "Out of memory: lower max new tokens, shorten the chat, or start a new one."
    log.warning("user error: %s", message)  # one line, no traceback: nothing is broken
    gr.Warning(message)


def fault_message(err: Exception) -> str:
    """What the page says of an unexpected error (logged whole, with its traceback, under the same words)."""
    log.exception("reply failed: %s: %s", type(err).__name__, err)
    return f"⚠️ The reply failed: {type(err).__name__}: {err} (the server log has the details)"


def fault_in_conversation(history: list[dict], message: str, started: bool, err: Exception) -> list[dict]:
    """The conversation with the fault said as the assistant's turn: after what the reply had written where it had
    started (history then ends with the user's message and the reply), else after the user's message."""
    note = fault_message(err)
    if started:
        written = history[-1]["content"]
        return [*history[:-1], {"role": "assistant", "content": f"{written}\n\n{note}" if written else note}]
    return [*history, {"role": "user", "content": message}, {"role": "assistant", "content": note}]


def context_usage(service: ChatService, history: list[dict], settings: ChatSettings) -> tuple[int, int]:
    """(tokens the conversation takes with the next turn's prompt, the model's context)."""
    messages = service.messages(history, None, settings)
    used = len(service.target.chat_ids(messages, settings.enable_thinking)) if messages else 0
    return used, service.target.max_positions


def message_text(content) -> str:
    """A chat message's text: Gradio's Chatbot sends content back as a list of typed parts ({"type": "text",
    "text": ...}) or a string."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in parts)


def plain_history(history) -> list[dict]:
    """The conversation as [{"role", "content": str}], whatever shape the browser sent it back in."""
    return [{"role": m["role"], "content": message_text(m.get("content", ""))} for m in history or []]


def stats_text(service, stats, speed, drafter_name, history, settings) -> str:
    return render_stats(stats, speed, drafter_name, context_usage(service, history, settings), service.curve_status,
                        service.threads(), service.last_remote if drafter_name == REMOTE else None)


def chat(service: ChatService, message: str, history: list[dict], stats: AcceptanceStats | None,
         conv_id: str | None = None, **settings_values):
    """Streams (history, panel html, stats markdown, slot chart, stats, conversation id) while the reply is written;
    the conversation is saved when the reply ends (stopped replies included)."""
    stats, history = stats or AcceptanceStats(), plain_history(history)
    unchanged = (list(history), gr.skip(), gr.skip(), gr.skip(), stats, conv_id)
    started = False  # whether the user's message and the reply are in the history
    try:
        settings, drafter = prepare(service, message, settings_values)
        prompt_ids = service.prompt_ids(history, message, settings)
        shown = settings.drafter if drafter is not None else "none"
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
        started = True
        screen, chart = Every(UPDATE_EVERY_S), Every(CHART_EVERY_S)
        for ev, speed in service.stream(prompt_ids, settings, drafter):
            stats.add(ev)
            history[-1]["content"] = ev.text
            if not screen.due(ev):
                continue  # every event is counted; the screen catches up at the next update
            redraw = chart.due(ev)
            yield (history, render_panel(service.target.tokenizer, service.last_events),
                   stats_text(service, stats, speed, shown, history, settings), slot_chart(stats) if redraw
                   else gr.skip(), stats, conv_id)
    except (UserError, PromptError, RemoteUnavailable, MemoryError, torch.OutOfMemoryError) as err:
        toast(err)
        yield unchanged
        return
    except Exception as err:  # a fault, not the user's: logged whole, and said in the conversation, not over the page
        yield fault_in_conversation(history, message, started, err), gr.skip(), gr.skip(), gr.skip(), stats, conv_id
        return
    if service.conversations is not None:
        conv_id = service.conversations.save(history, conv_id)
    yield history, gr.skip(), gr.skip(), gr.skip(), stats, conv_id


def regenerate(service: ChatService, history: list[dict], stats, conv_id, **settings_values):
    """The last reply written again (with the current settings): the last turn is taken off and re-sent."""
    history = plain_history(history)
    if len(history) < 2 or history[-1]["role"] != "assistant":
        gr.Warning("Nothing to regenerate yet.")
        yield history, gr.skip(), gr.skip(), gr.skip(), stats, conv_id
        return
    yield from chat(service, history[-2]["content"], history[:-2], stats, conv_id, **settings_values)


def edit_last(history: list[dict]) -> tuple[list[dict], str]:
    """The last user message back in the message box and the last turn taken off, to be edited and re-sent."""
    history = plain_history(history)
    if len(history) < 2 or history[-1]["role"] != "assistant":
        gr.Warning("Nothing to edit yet.")
        return history, gr.skip()
    return history[:-2], history[-2]["content"]


def conversation_choices(service: ChatService) -> list[tuple[str, str]]:
    if service.conversations is None:
        return []
    return [(f"{row['title']} · {time.strftime('%m-%d %H:%M', time.localtime(row['updated']))}", row["id"])
            for row in service.conversations.list()]


def open_conversation(service: ChatService, conv_id: str | None):
    """(history, panel, stats, conversation id, title) of a saved conversation."""
    if not conv_id or service.conversations is None:
        return [], render_panel(None, []), None, None, ""
    try:
        data = service.conversations.load(conv_id)
    except (ValueError, OSError) as err:
        toast(err)
        return [], render_panel(None, []), None, None, ""
    return data["messages"], render_panel(None, []), None, conv_id, data["title"]


def rename_conversation(service: ChatService, conv_id: str | None, title: str):
    if conv_id and service.conversations is not None:
        try:
            service.conversations.rename(conv_id, title)
        except ValueError as err:
            toast(err)
    return gr.update(choices=conversation_choices(service), value=conv_id)


def delete_conversation(service: ChatService, conv_id: str | None):
    if conv_id and service.conversations is not None:
        try:
            service.conversations.delete(conv_id)
        except ValueError as err:
            toast(err)
    return gr.update(choices=conversation_choices(service), value=None), [], None, None, ""


def compare(service: ChatService, prompt: str, against: str = "none", **settings_values):
    """Two drafter choices on one prompt with the same settings, `against` (default: plain decoding) first, each
    streamed as it is written: yields (its text, the other's text, summary, chart); the identity check and the chart
    come at the end."""
    try:
        settings, drafter = prepare(service, prompt, settings_values)
        other, other_drafter = prepare(service, prompt, against_values(settings_values, against))
        ids = service.prompt_ids([], prompt, settings)
        labels = [side_label(other, other_drafter), side_label(settings, drafter)]
        labels[1] += " (2)" if labels[1] == labels[0] else ""
        sides: dict[str, tuple] = {}
        for side, (side_settings, side_drafter) in enumerate(((other, other_drafter), (settings, drafter))):
            text, tokens, screen = "", list[int](), Every(UPDATE_EVERY_S)
            for ev, speed in service.stream(ids, side_settings, side_drafter):
                text, tokens = ev.text, tokens + list(ev.committed)
                if screen.due(ev):
                    tps = f"{speed.tokens_per_s:.1f} tokens/s" if speed.tokens_per_s else "starting…"
                    texts = (text, "") if side == 0 else (sides[labels[0]][0], text)
                    yield (gr.update(value=texts[0], label=labels[0]), gr.update(value=texts[1], label=labels[1]),
                           f"**{labels[side]}:** {tps}", gr.skip())
            sides[labels[side]] = (text, tokens, speed)
    except (UserError, PromptError, RemoteUnavailable, MemoryError, torch.OutOfMemoryError) as err:
        toast(err)
        yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return
    except Exception as err:  # a fault: logged whole, said in the summary, not over the page
        yield gr.skip(), gr.skip(), fault_message(err), gr.skip()
        return
    yield (sides[labels[0]][0], sides[labels[1]][0], compare_summary(settings, labels, sides),
           speed_chart(labels, [sides[label][2].tokens_per_s or 0.0 for label in labels]))


def against_values(values: dict, against: str) -> dict:
    """Compare's first side: the same settings with its own choice, FlashMap's steps and drafts per round left at 1
    where that choice drafts without FlashMap."""
    return {**values, "drafter": against, **({} if against in FLASHMAP_CHOICES else {"steps": 1, "tree": 1})}


def side_label(settings: ChatSettings, drafter) -> str:
    """What a Compare side ran: its choice's label, or plain decoding where it drafts with nothing."""
    return DRAFTER_LABELS.get(settings.drafter, settings.drafter) if drafter is not None else "Plain decoding"


def compare_summary(settings: ChatSettings, labels: list[str], sides: dict) -> str:
    (_, first_tokens, first_speed), (_, second_tokens, second_speed) = (sides[label] for label in labels)
    if settings.temperature == 0:
        same = first_tokens == second_tokens
        check = "✓ identical, token for token (each equals plain decoding)" if same else "✗ outputs differ"
    else:
        check = "T > 0: outputs are samples; both follow the target's distribution exactly"
    first_tps, second_tps = first_speed.tokens_per_s or 0.0, second_speed.tokens_per_s or 0.0
    ratio = f"× {second_tps / first_tps:.2f}" if first_tps else "–"
    return (f"**{labels[0]}:** {first_tps:.1f} tokens/s ({len(first_tokens)} tokens)  \n"
            f"**{labels[1]}:** {second_tps:.1f} tokens/s ({len(second_tokens)} tokens)  \n"
            f"**{labels[1]} / {labels[0]}:** {ratio} (the two runs back to back, under the same load)  \n"
            f"**Check:** {check}")


def drafter_options(service: ChatService, name: str, block_size) -> tuple:
    """Updates for (K, steps, drafts per round, adaptive) when the drafter choice changes: K's range follows the block
    the drafter was trained for; options that do not apply to it are reset to their defaults and disabled (FlashMap
    and DFlash-style draft every round at the K set: no adaptive cut)."""
    k_max = service.max_block_size(name)
    flow, drafts = name in FLASHMAP_CHOICES, name not in ("none", REMOTE)  # the server's drafter has its own settings
    adaptive = name in ADAPTIVE_CHOICES
    return (gr.update(maximum=k_max, value=min(int(block_size or k_max), k_max), interactive=drafts),
            gr.update(interactive=True) if flow else gr.update(value=1, interactive=False),
            gr.update(interactive=True) if flow else gr.update(value=1, interactive=False),
            gr.update(value=True, interactive=True) if adaptive else gr.update(value=False, interactive=False))


def example_prompts() -> list[str]:
    """Two evaluation prompts per domain, from the sets the project ships (data/prompts)."""
    return [row["prompt"] for domain in ("math", "code", "chat") for row in read_prompt_file(f"eval_{domain}")[:2]]


def api_functions(service: ChatService, default: str):
    """The named API endpoints (/chat, /compare, /draft_panel): every setting a parameter with its default."""

    def api_chat(  # type: ignore[misc]  # (-> str: gradio reads the hint as the type of each update)
            message: str, drafter: str = default, block_size: int = 0, steps: int = 1, temperature: float = 0.0,
            top_p: float = 1.0, max_new_tokens: int = 256, adaptive: bool = True, tree: int = 1,
            system_prompt: str = "", enable_thinking: bool = False, seed: int = 0) -> str:
        """Reply to one user message (streamed text, at most every UPDATE_EVERY_S: each update costs the server
        about as much as a round). block_size 0: the drafter's own block."""
        values = dict(drafter=drafter, block_size=block_size, steps=steps, temperature=temperature, top_p=top_p,
                      max_new_tokens=max_new_tokens, adaptive=adaptive, tree=tree, system_prompt=system_prompt,
                      enable_thinking=enable_thinking, seed=seed)
        try:
            settings, drafter_obj = prepare(service, message, values)
            screen = Every(UPDATE_EVERY_S)
            for ev, _speed in service.stream(service.prompt_ids([], message, settings), settings, drafter_obj):
                if screen.due(ev):
                    yield ev.text
        except (UserError, PromptError, RemoteUnavailable) as err:
            log.warning("user error (api /chat): %s", err)
            raise gr.Error(str(err)) from err

    def api_compare(prompt: str, drafter: str = default, block_size: int = 0, steps: int = 1,
                    temperature: float = 0.0, max_new_tokens: int = 128, adaptive: bool = True, tree: int = 1,
                    against: str = "none") -> dict:
        """Two drafter choices on one prompt, `against` (default: plain decoding) and `drafter`: both texts, tokens/s,
        the speed ratio and the identity check (plain_*: the `against` side's)."""
        values = dict(drafter=drafter, block_size=block_size, steps=steps, temperature=temperature,
                      max_new_tokens=max_new_tokens, adaptive=adaptive, tree=tree)
        try:
            settings, drafter_obj = prepare(service, prompt, values)
            other, other_obj = prepare(service, prompt, against_values(values, against))
            ids = service.prompt_ids([], prompt, settings)
            plain = service.run_once(ids, other, other_obj)
            spec = service.run_once(ids, settings, drafter_obj)
        except (UserError, PromptError, RemoteUnavailable) as err:
            log.warning("user error (api /compare): %s", err)
            raise gr.Error(str(err)) from err
        return {"plain_text": plain[0], "text": spec[0], "plain_tokens_per_s": plain[2].tokens_per_s,
                "tokens_per_s": spec[2].tokens_per_s, "identical": plain[1] == spec[1],
                "speedup": (spec[2].tokens_per_s or 0) / (plain[2].tokens_per_s or 1), "against": against}

    def api_draft_panel() -> str:
        """The draft panel of the most recent reply, as plain text rows (for scripts and tests)."""
        decode = service.target.tokenizer.decode
        return "\n".join(" ".join([SLOT_MARKS[kind] + decode([t]) for t, kind in zip(ev.drafted, slot_kinds(ev))]
                                  + ["★" + decode([ev.target_token])])
                         for ev in service.last_events if ev.kind == "round")

    def api_speed() -> dict:
        """The last reply's speed and its ratio to plain decoding measured inside it."""
        speed = service.last_speed
        return {"tokens_per_s": speed.tokens_per_s, "plain_tokens_per_s": speed.plain_tokens_per_s,
                "ratio": speed.ratio, "plain_steps": len(speed.plain_steps)}

    return {"chat": api_chat, "compare": api_compare, "draft_panel": api_draft_panel, "speed": api_speed}


def status_text(service: ChatService) -> str:
    native = service.target.extra.get("native_step")
    slower = f" (native step off: {native}; op by op, slower)" if native not in (None, "native") else ""
    return (f"Forward: {service.target.precision}{slower} · Verify-cost curve: {service.curve_status} · "
            f"CPU threads: {service.threads()}")


def build_ui(service: ChatService, default_drafter: str = "flashmap") -> gr.Blocks:
    available = service.available()
    default = default_drafter if default_drafter in available else available[0]
    k_max = service.max_block_size(default)
    choices = [(DRAFTER_LABELS[name], name) for name in available]
    with gr.Blocks(title="FlashMap Chat") as demo:
        where = service.target.device if service.local else f"the vLLM server at {service.remote.url}"
        gr.Markdown(f"# FlashMap Chat {__version__}\nTarget: `{service.target.name}` on `{where}` — "
                    "speculative decoding that never changes the target's output.")
        status = gr.Markdown(status_text(service), elem_id="fm-status")
        gr.Timer(2.0).tick(lambda: status_text(service), None, status, queue=False, show_progress="hidden",
                           api_visibility="private")
        if service.unavailable and service.local:  # served by vLLM: the line above says where every reply comes from
            gr.Markdown("  \n".join(f"⚠️ {DRAFTER_LABELS[n]} unavailable: {why}"
                                    for n, why in service.unavailable.items()))
        with gr.Tab("Chat"):
            chat_tab(service, choices, default, k_max)
        with gr.Tab("Compare"):
            compare_tab(service, choices, default, k_max)
        for name, fn in api_functions(service, default).items():
            gr.api(fn, api_name=name)
    demo.queue(default_concurrency_limit=1)  # one model: requests wait in line, the queue shows their place
    return demo


def settings_controls(service: ChatService, choices, default: str, k_max: int) -> dict:
    with gr.Accordion("Settings", open=True, elem_classes="fm-settings"):
        system = gr.Textbox(label="System prompt", lines=1)
        drafter = gr.Dropdown(choices, value=default, label="Drafter", elem_id="chat-drafter")
        with gr.Row():
            block = gr.Slider(1, k_max, value=k_max, step=1, label="Block size K", elem_id="chat-block")
            steps = gr.Radio([1, 2], value=1, label="Drafting steps (FlashMap)",
                             interactive=default in FLASHMAP_CHOICES)
        with gr.Row():
            temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p")
        max_new = gr.Slider(16, 2048, value=256, step=16, label="Max new tokens")
        adaptive = gr.Checkbox(default in ADAPTIVE_CHOICES, label=ADAPTIVE_LABEL, elem_id="chat-adaptive",
                               interactive=default in ADAPTIVE_CHOICES)
        tree = gr.Radio(TREE_CHOICES, value=1, label=TREE_LABEL, interactive=default in FLASHMAP_CHOICES)
        thinking = gr.Checkbox(False, label="Thinking (Qwen3)", visible=service.target.supports_thinking())
    drafter.change(lambda n, k: drafter_options(service, n, k), [drafter, block], [block, steps, tree, adaptive],
                   api_visibility="private")
    return {"drafter": drafter, "block_size": block, "steps": steps, "temperature": temperature, "top_p": top_p,
            "max_new_tokens": max_new, "enable_thinking": thinking, "system_prompt": system, "adaptive": adaptive,
            "tree": tree}


def chat_tab(service: ChatService, choices, default: str, k_max: int) -> None:
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="Chat", height=460, elem_id="chatbot")
            # one line that grows: Enter sends, Shift+Enter starts a new line (gradio's rule for lines=1); the page
            # opens with the cursor here, the first field in keyboard order
            message = gr.Textbox(label="Message", placeholder="Ask something… (Enter sends, Shift+Enter: new line)",
                                 lines=1, max_lines=12, autofocus=True, elem_id="message")
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="send")
                stop = gr.Button("Stop", elem_id="stop")
                regen = gr.Button("Regenerate", elem_id="regenerate")
                edit = gr.Button("Edit last", elem_id="edit-last")
                new = gr.Button("New chat", elem_id="new-chat")
            with gr.Accordion("Conversations", open=True, visible=service.conversations is not None):
                with gr.Row():
                    saved = gr.Dropdown(conversation_choices(service), value=None, label="Saved conversations",
                                        elem_id="saved-conversations")
                    title = gr.Textbox(label="Title", elem_id="conversation-title")
                with gr.Row():
                    rename = gr.Button("Rename", size="sm")
                    delete = gr.Button("Delete", size="sm", variant="stop")
            controls = settings_controls(service, choices, default, k_max)
        with gr.Column(scale=2):
            panel = gr.HTML(render_panel(None, []), label="Draft panel", elem_id="draft-panel")
            stats_md = gr.Markdown("  \n".join(speed_lines(None, True)), elem_id="stats")
            chart = gr.Plot(slot_chart(AcceptanceStats()), label="Acceptance per slot", show_label=False,
                            elem_id="slot-chart")
    check_controls(controls, fixed=("seed", "stop_strings"))
    stats, conv_id, pending = gr.State(None), gr.State(None), gr.State("")
    outputs = [chatbot, panel, stats_md, chart, stats, conv_id]
    settings_inputs = list(controls.values())

    def run(msg, hist, st, cid, *values):
        yield from chat(service, msg, hist, st, cid, **dict(zip(controls, values)))

    def run_regenerate(hist, st, cid, *values):
        yield from regenerate(service, hist, st, cid, **dict(zip(controls, values)))

    refresh = dict(fn=lambda cid: gr.update(choices=conversation_choices(service), value=cid), inputs=conv_id,
                   outputs=saved, api_visibility="private")
    for trigger in (send.click, message.submit):  # the box clears at once; the message waits in `pending`
        taken = trigger(lambda m: ("", m), message, [message, pending], queue=False, api_visibility="private")
        taken.then(run, [pending, chatbot, stats, conv_id, *settings_inputs], outputs,
                   api_visibility="private").then(**refresh)
    regen.click(run_regenerate, [chatbot, stats, conv_id, *settings_inputs], outputs,
                api_visibility="private").then(**refresh)
    edit.click(edit_last, chatbot, [chatbot, message], api_visibility="private")
    stop.click(service.cancel, None, None, queue=False, api_visibility="private")  # ends the reply, keeps it
    new.click(lambda: ([], render_panel(None, []), None, None, gr.update(value=None), ""), None,
              [chatbot, panel, stats, conv_id, saved, title], api_visibility="private")
    saved.input(lambda cid: open_conversation(service, cid), saved, [chatbot, panel, stats, conv_id, title],
                api_visibility="private")
    rename.click(lambda cid, t: rename_conversation(service, cid, t), [conv_id, title], saved,
                 api_visibility="private")
    delete.click(lambda cid: delete_conversation(service, cid), conv_id, [saved, chatbot, stats, conv_id, title],
                 api_visibility="private")


def compare_tab(service: ChatService, choices, default: str, k_max: int) -> None:
    c_prompt = gr.Textbox(label="Prompt", lines=3, elem_id="compare-prompt")
    gr.Examples(example_prompts(), inputs=c_prompt, label="Examples (math, code, chat)")
    with gr.Row(elem_classes="fm-settings"):  # two rows: seven controls in one cut the sliders' labels short
        c_against = gr.Dropdown(choices, value="none" if any(c[1] == "none" for c in choices) else choices[0][1],
                                label="Run", elem_id="compare-against")
        c_drafter = gr.Dropdown(choices, value=default, label="against", elem_id="compare-drafter")
        c_block = gr.Slider(1, k_max, value=k_max, step=1, label="Block size K", min_width=220)
        c_steps = gr.Radio([1, 2], value=1, label="Steps", interactive=default in FLASHMAP_CHOICES)
        c_temp = gr.Slider(0, 2, value=0, step=0.05, label="Temperature", min_width=220)
    with gr.Row(elem_classes="fm-settings"):
        c_max = gr.Slider(16, 1024, value=128, step=16, label="Max new tokens", min_width=260)
        c_adaptive = gr.Checkbox(default in ADAPTIVE_CHOICES, label=ADAPTIVE_LABEL,
                                 interactive=default in ADAPTIVE_CHOICES)
        c_tree = gr.Radio(TREE_CHOICES, value=1, label=TREE_LABEL, interactive=default in FLASHMAP_CHOICES)
    c_run = gr.Button("Run both", variant="primary", elem_id="compare-run")
    with gr.Row():
        c_plain = gr.Textbox(label="Plain decoding", lines=12, elem_id="compare-plain")
        c_spec = gr.Textbox(label=DRAFTER_LABELS.get(default, default), lines=12, elem_id="compare-spec")
    c_summary = gr.Markdown(elem_id="compare-summary")
    c_chart = gr.Plot(label="Tokens per second", elem_id="compare-chart")
    c_controls = {"drafter": c_drafter, "block_size": c_block, "steps": c_steps, "temperature": c_temp,
                  "max_new_tokens": c_max, "adaptive": c_adaptive, "tree": c_tree}
    check_controls(c_controls, fixed=COMPARE_FIXED)
    c_drafter.change(lambda n, k: drafter_options(service, n, k), [c_drafter, c_block],
                     [c_block, c_steps, c_tree, c_adaptive], api_visibility="private")

    def run(prompt, against, *values):
        yield from compare(service, prompt, against, **dict(zip(c_controls, values)))

    c_run.click(run, [c_prompt, c_against, *c_controls.values()], [c_plain, c_spec, c_summary, c_chart],
                api_visibility="private")
