"""What the UI draws: the draft panel (per-slot accept / reject colouring), the stats text and the charts.
Pure functions of events and statistics, so tests check them without a browser."""
from __future__ import annotations

import html
import re
from collections import Counter

from transformers.convert_slow_tokenizer import bytes_to_unicode

from app.service import REMOTE
from core.decoding.engine import RoundEvent
from core.decoding.stats import AcceptanceStats, ReplySpeed
from drafter.spec import CHOICE_LABELS
from drafter.spec import LABELS as ENGINE_LABELS

DRAFTER_LABELS = {**ENGINE_LABELS, **CHOICE_LABELS, REMOTE: "vLLM server (its own drafter)"}
REMOTE_PANEL = ("<div class='fm-row'>The vLLM server does not expose its drafted blocks or which of their slots it "
                "accepted; the stats give the acceptance its own counters measured during the reply.</div>")

PANEL_ROUNDS = 12
SLOT_MARKS = {"acc": "✓", "rej": "✗", "unr": "·"}
CSS = """
.fm-panel {font-family: ui-monospace, monospace; font-size: 12px; line-height: 1.9}
.fm-row {display: flex; flex-wrap: wrap; gap: 3px; align-items: center; margin-bottom: 4px}
.fm-round {color: #666; width: 3.2em}
.fm-slot {padding: 1px 5px; border-radius: 4px; border: 1px solid transparent; white-space: pre}
.fm-acc {background: #c9f2d0; border-color: #2e9e48; color: #0b4d1c}
.fm-rej {background: #ffd0d0; border-color: #c62828; color: #6b0d0d; text-decoration: line-through}
.fm-unr {background: #eeeeee; border-color: #bbbbbb; color: #888888}
.fm-bonus {background: #cfe3ff; border-color: #1f5fbf; color: #0b2e66; font-weight: bold}
.fm-settings .wrap {min-width: 0}
.fm-settings input[type=number] {min-width: 4.5em}
"""
LEGEND = (
    "<div class='fm-row'><span class='fm-slot fm-acc'>✓ accepted</span><span class='fm-slot fm-rej'>✗ rejected</span>"
    "<span class='fm-slot fm-unr'>· not reached</span><span class='fm-slot fm-bonus'>★ target token</span></div>"
)
_BYTE_OF_CHAR = {char: byte for byte, char in bytes_to_unicode().items()}  # byte-level BPE alphabet -> byte


def byte_label(tokenizer, token: int) -> str:
    """A token holding part of a multi-byte character, readably: its text where it is valid UTF-8 and <0xF0>-style
    hex for the bytes that are not (a byte-level BPE piece, or a SentencePiece byte-fallback token)."""
    piece = tokenizer.convert_ids_to_tokens(token)
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
        return piece
    if not all(char in _BYTE_OF_CHAR for char in piece):
        return piece
    raw = bytes(_BYTE_OF_CHAR[char] for char in piece).decode("utf-8", errors="backslashreplace")
    return re.sub(r"\\x([0-9a-f]{2})", lambda m: f"<0x{m.group(1).upper()}>", raw)


def token_text(tokenizer, token: int) -> str:
    """One token as the panel shows it: spaces ␣, newlines ⏎, byte pieces as hex, HTML-escaped."""
    text = tokenizer.decode([token])
    if "\ufffd" in text:
        text = byte_label(tokenizer, token)
    return html.escape(text.replace("\n", "⏎").replace(" ", "␣") or "∅")


def slot_kinds(ev: RoundEvent) -> list[str]:
    """Per drafted slot: accepted, the first rejected, or not reached (after the rejection)."""
    return ["acc" if slot < ev.n_accepted else "rej" if slot == ev.n_accepted else "unr"
            for slot in range(len(ev.drafted))]


COPY_MARKS = {  # round source -> (its mark in the panel, what the mark's title says)
    "lookup": ("⧉ copied", "prompt lookup: copied from earlier in the conversation, no drafter call"),
    "phrasebook": ("⧉ phrasebook", "phrasebook: what the target&#39;s own replies most often continue these tokens "
                                   "with, no drafter call"),
    "tail": ("⧉ block tail", "the rest of the network&#39;s last block, which foresaw the tokens kept since, "
                             "no drafter call"),
}


def render_round(tokenizer, index: int, ev: RoundEvent) -> str:
    """One row: each drafted slot marked accepted / rejected / not reached, then the target's token."""
    decision = "" if ev.decision is None else f"{ev.decision.source}: {ev.decision.why()}"
    why = f" title='{html.escape(decision, quote=True)}'" if decision else ""
    cells = [f"<span class='fm-round'{why}>#{index}</span>"]
    if ev.source in COPY_MARKS:  # a copied draft: no network call
        mark, title = COPY_MARKS[ev.source]
        cells.append(f"<span class='fm-slot fm-unr' title='{title}'>{mark}</span>")
    if ev.branches > 1:  # the row shows the draft the target followed furthest
        cells.append(f"<span class='fm-slot fm-unr' title='best of {ev.branches} drafts, verified as a tree'>"
                     f"⑂{ev.branches}</span>")
    for slot, (token, kind) in enumerate(zip(ev.drafted, slot_kinds(ev))):
        text = token_text(tokenizer, token)
        cells.append(f"<span class='fm-slot fm-{kind}' title='slot {slot + 1}'>{SLOT_MARKS[kind]}{text}</span>")
    cells.append(f"<span class='fm-slot fm-bonus' title='target'>★{token_text(tokenizer, ev.target_token)}</span>")
    return "<div class='fm-row'>" + "".join(cells) + "</div>"


def render_plain_run(tokenizer, first: int, events: list[RoundEvent]) -> str:
    """Consecutive rounds without a draft (plain steps: the adaptive cut kept nothing, the drafter was skipped, or
    a plain-step probe) in one row of target tokens, so the rounds that drafted stay in view."""
    label = f"#{first}" if len(events) == 1 else f"#{first}–{first + len(events) - 1}"
    title = html.escape(plain_title(events), quote=True)
    cells = [f"<span class='fm-round' title='{title}'>{label}</span>"]
    cells += [f"<span class='fm-slot fm-bonus' title='target'>★{token_text(tokenizer, ev.target_token)}</span>"
              for ev in events]
    return "<div class='fm-row fm-plain'>" + "".join(cells) + "</div>"


def plain_title(events: list[RoundEvent]) -> str:
    """Why a run of plain steps drafted nothing, from their decisions, the commonest reason first."""
    reasons = Counter(ev.decision.why() for ev in events if ev.decision is not None)
    return "\n".join(["plain steps: no draft", *(f"{n}× {why}" for why, n in reasons.most_common())])


def render_panel(tokenizer, events: list[RoundEvent]) -> str:
    """The latest PANEL_ROUNDS rows, newest first: one per drafted round, one per run of plain steps."""
    if any(ev.kind == "remote" for ev in events):
        return f"<div class='fm-panel'>{REMOTE_PANEL}</div>"
    rounds = [ev for ev in events if ev.kind == "round" and ev.finish_reason != "cancelled"]
    rows, run_start = [], None
    for i, ev in enumerate(rounds, start=1):
        if not ev.drafted:
            run_start = run_start or i
            if i == len(rounds) or rounds[i].drafted:
                rows.append(render_plain_run(tokenizer, run_start, rounds[run_start - 1:i]))
                run_start = None
        else:
            rows.append(render_round(tokenizer, i, ev))
    body = "".join(reversed(rows[-PANEL_ROUNDS:])) or "<div class='fm-row'>No rounds yet.</div>"
    return f"<div class='fm-panel'>{LEGEND}{body}</div>"


def remote_lines(speed: ReplySpeed | None, remote: dict | None) -> list[str]:
    """A reply the vLLM server wrote: its speed, and the acceptance its spec-decode counters moved by (no ratio to
    plain decoding: the server makes no plain steps inside a drafting reply; the Compare tab measures one)."""
    lines = [f"**This reply:** {speed.tokens_per_s:.1f} tokens/s (streamed by the server)"
             if speed is not None and speed.tokens_per_s else "**This reply:** –"]
    if remote and remote.get("acceptance_length"):
        rates = " ".join(f"{r:.2f}" for r in remote["per_position"][:8])
        lines.append(f"**Server's acceptance length:** {remote['acceptance_length']:.2f} tokens / verify round over "
                     f"{remote['drafts']} drafts (its counters during this reply; per position: {rates} …)")
    else:
        lines.append("**Server's acceptance length:** – (no drafts counted: started without a drafter?)")
    return lines


def speed_lines(speed: ReplySpeed | None, drafting: bool) -> list[str]:
    """This reply's speed and its ratio to plain decoding measured inside the same reply
    (core.decoding.stats.ReplySpeed), or what is missing for one: never a figure measured at another time, under another
    load. A plain reply is measured the same way (its ratio comes out near 1: the check that the measurement is
    fair)."""
    if speed is None or not speed.tokens_per_s:
        return ["**This reply:** –"]
    lines = [f"**This reply:** {speed.tokens_per_s:.1f} tokens/s (decoding, after reading the prompt)"]
    if speed.ratio:
        what = "this reply is itself plain decoding" if not drafting else "measured inside this reply"
        lines.append(f"**× {speed.ratio:.2f} plain decoding** ({what}: {speed.plain_tokens_per_s:.1f} tokens/s "
                     f"over its {len(speed.plain_steps)} plain steps)")
    else:
        lines.append("**× – plain decoding**: not enough plain steps in this reply yet to compare")
    return lines


def render_stats(stats: AcceptanceStats, speed: ReplySpeed | None, drafter: str, context: tuple[int, int],
                 curve_status: str, threads: str, remote: dict | None = None) -> str:
    lines = [f"**Drafter:** {DRAFTER_LABELS.get(drafter, drafter)}"]
    lines += speed_lines(speed, drafter != "none") if drafter != REMOTE else remote_lines(speed, remote)
    if stats.acceptance_length:
        lines.append(f"**Mean acceptance length (conversation):** {stats.acceptance_length:.2f} tokens / "
                     "target forward")
        lines.append("**Rounds:** " + source_counts(stats.sources))
    if stats.tokens:
        lines.append("**Tokens:** " + token_shares(stats))
    used, limit = context
    lines.append(f"**Context:** {used:,} / {limit:,} tokens ({100 * used / max(limit, 1):.1f}%)")
    lines.append(f"**Verify-cost curve (adaptive K):** {curve_status} · **CPU threads:** {threads}")
    return "  \n".join(lines)


SOURCE_WORDS = {"drafter": "drafted by the network", "lookup": "copied by prompt lookup",
                "phrasebook": "copied from the phrasebook", "tail": "from the network's last block",
                "plain": "plain steps"}


TOKEN_WORDS = {"drafter": "the network's drafts", "lookup": "prompt lookup", "phrasebook": "the phrasebook",
               "tail": "the network's last block", "target": "the target's own steps"}


def token_shares(stats: AcceptanceStats) -> str:
    """'41% the network's drafts · 22% prompt lookup · 37% the target's own steps': where the tokens came from."""
    shares = stats.token_shares()
    return " · ".join(f"{100 * shares[key]:.0f}% {words}" for key, words in TOKEN_WORDS.items() if key in shares)


def source_counts(sources: dict[str, int]) -> str:
    """'12 drafted by the network · 30 copied by prompt lookup · 40 plain steps' (the policy's choices)."""
    return " · ".join(f"{sources[key]} {words}" for key, words in SOURCE_WORDS.items() if sources.get(key))


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


def speed_chart(labels: list[str], tokens_per_s: list[float]):
    """A matplotlib bar chart of tokens/s, one bar per decoding mode."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2.6), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh(labels, tokens_per_s, color=["#9e9e9e", "#2e9e48"][: len(labels)])
    ax.bar_label(bars, fmt="%.1f tok/s", padding=3)
    ax.set_xlabel("tokens / s")
    ax.set_xlim(0, max(tokens_per_s + [1e-9]) * 1.3)
    ax.invert_yaxis()
    return fig
