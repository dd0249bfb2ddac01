import threading
import time
from dataclasses import replace

import gradio as gr
import pytest

from app import render, ui
from app.service import ChatService, ChatSettings
from core.decoding.stats import AcceptanceStats
from core.runtime.verify_cost import CostCurves
from lab.testing import event, make_target, tiny_llama

SETTINGS = dict(drafter="copies", block_size=4, steps=1, temperature=0.0, top_p=1.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return ChatService(make_target(tiny_llama(vocab_size=64), name="tiny-ui"),
                       data_dir=tmp_path_factory.mktemp("fm-data"))


@pytest.fixture
def toasts(monkeypatch):
    seen = []
    monkeypatch.setattr(gr, "Warning", lambda message, *a, **k: seen.append(message))
    return seen


def test_only_working_drafters_are_offered(service):
    assert service.available() == ["auto", "copies", "none"]  # auto without a network: the free sources
    auto = service.drafter_for(ChatSettings(drafter="auto", steps=2))  # FlashMap's options left aside with it
    assert auto.main.name == "none" and auto is service.drafter_for(ChatSettings(drafter="copies"))
    assert "no drafter checkpoint" in service.unavailable["flashmap"]


def test_chat_streams_reply_panel_and_stats_and_saves_it(service, monkeypatch):
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 0.0)  # a screen update per round (the tiny model is too fast to throttle)
    monkeypatch.setattr(ui, "CHART_EVERY_S", 0.0)
    outputs = list(ui.chat(service, "w10 w11 w12 w10 w11", [], None, None, **SETTINGS))
    assert len(outputs) > 2
    history, panel, stats_md, chart, stats, _ = outputs[-2]  # the last streamed frame; the final one saves
    assert [m["role"] for m in history] == ["user", "assistant"] and history[-1]["content"]
    assert "fm-bonus" in panel and "✓ accepted" in panel  # the legend names each mark
    assert "tokens/s" in stats_md and "Context:" in stats_md and stats.rounds > 0
    bars = chart.axes[0].patches  # one bar per slot reached
    assert [round(b.get_height(), 6) for b in bars] == [round(r or 0.0, 6) for r in stats.per_slot()]
    conv_id = outputs[-1][5]
    assert service.conversations.load(conv_id)["messages"] == history
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 60.0)  # throttled: the first event, the final state, the save
    assert len(list(ui.chat(service, "w10 w11 w12 w10 w11", [], None, None, **SETTINGS))) == 3
    # the conversation goes on under the same id: history is passed back in, stats accumulate
    more = list(ui.chat(service, "w20", history, stats, conv_id, **SETTINGS))[-1]
    assert len(more[0]) == 4 and more[5] == conv_id and len(service.conversations.load(conv_id)["messages"]) == 4


def test_the_chat_api_streams_at_most_every_update_interval_and_ends_with_the_whole_reply(service, monkeypatch):
    api_chat = ui.api_functions(service, "copies")["chat"]
    message = "w10 w11 w12 w10 w11"
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 0.0)
    every_round = list(api_chat(message, drafter="copies", block_size=4, max_new_tokens=24))
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 60.0)
    throttled = list(api_chat(message, drafter="copies", block_size=4, max_new_tokens=24))
    assert len(every_round) > 2 and len(throttled) == 2  # the first round's text, then the finished reply
    assert throttled[-1] == every_round[-1] == service.last_events[-1].text


def test_panel_marks_accepted_rejected_unreached_and_target():
    tokenizer = make_target(tiny_llama(vocab_size=64)).tokenizer
    ev = event(drafted=(10, 11, 12, 13), n_accepted=1, target_token=20, committed=(10, 20))
    row = render.render_round(tokenizer, 1, ev)
    assert row.count("fm-acc") == 1 and row.count("fm-rej") == 1 and row.count("fm-unr") == 2
    assert "✓w10" in row and "✗w11" in row and "·w12" in row and "★w20" in row
    tree = render.render_round(tokenizer, 3, event(drafted=(10, 11), n_accepted=2, target_token=20, branches=4))
    assert "⑂4" in tree and tree.count("fm-acc") == 2
    copied = render.render_round(tokenizer, 4, event(drafted=(10, 11), n_accepted=2, target_token=20, source="lookup"))
    assert "⧉ copied" in copied and "⧉" not in row  # a prompt-lookup round reads as such
    phrase = render.render_round(tokenizer, 5, event(drafted=(10,), n_accepted=1, target_token=20,
                                                     source="phrasebook"))
    assert "⧉ phrasebook" in phrase and "⧉ copied" not in phrase  # so does a phrasebook round
    stats = AcceptanceStats().add_all([event(drafted=(10,), n_accepted=1, source="lookup"), event(), event(),
                                       event(drafted=(10,), n_accepted=0, source="phrasebook")])
    assert "1 copied by prompt lookup · 1 copied from the phrasebook · 2 plain steps" in render.render_stats(
        stats, None, "flashmap", (1, 9), "", 1)


def test_byte_pieces_are_shown_as_hex_not_replacement_characters():
    class ByteLevel:  # a GPT-2-style byte-level BPE piece: " \xf0\x9f\x98", the start of an emoji
        def decode(self, ids):
            return " \ufffd"

        def convert_ids_to_tokens(self, token):
            return "ĠðŁĺ"

    assert render.token_text(ByteLevel(), 0) == "␣&lt;0xF0&gt;&lt;0x9F&gt;&lt;0x98&gt;"


def test_unavailable_drafter_falls_back_with_a_warning(service, toasts):
    settings, drafter = ui.prepare(service, "hi", {"drafter": "flashmap"})
    assert drafter is None and "using plain decoding" in toasts[0]


def test_bad_input_is_a_toast_and_the_conversation_stays(service, toasts):
    history = [{"role": "user", "content": "w9"}, {"role": "assistant", "content": "w10"}]
    for message, settings in (("   ", SETTINGS), (" ".join(["w9"] * 600), SETTINGS),
                              ("w9", {**SETTINGS, "block_size": 40}),
                              ("w9", {**SETTINGS, "drafter": "flashmap", "temperature": 0.7, "tree": 4}),
                              ("w9", {**SETTINGS, "drafter": "dflash", "tree": 4})):
        outputs = list(ui.chat(service, message, history, None, "some-id", **settings))
        assert len(outputs) == 1 and outputs[0][0] == history and outputs[0][5] == "some-id"
    assert [t.split(":")[0].split(" ")[0] for t in toasts][:2] == ["Type", "The"]
    assert any("block size" in t for t in toasts) and any("temperature 0 only" in t for t in toasts)
    assert any("flow drafters" in t for t in toasts)  # the rule lives in the drafter spec


def test_stop_ends_the_reply_and_keeps_it(service):
    replies = ui.chat(service, "w10 w11 w12", [], None, None, **{**SETTINGS, "max_new_tokens": 400,
                                                                  "drafter": "none"})
    first = next(replies)
    service.cancel()  # what the Stop button does (outside the queue)
    rest = list(replies)
    history = rest[-1][0]
    assert history[-1]["role"] == "assistant" and len(history[-1]["content"]) >= len(first[0][-1]["content"])
    assert service.last_events[-1].finish_reason == "cancelled"


def test_regenerate_and_edit_last(service, toasts):
    outputs = list(ui.chat(service, "w10 w11 w12", [], None, None, **SETTINGS))
    history, conv_id = outputs[-1][0], outputs[-1][5]
    again = list(ui.regenerate(service, history, None, conv_id, **SETTINGS))[-1][0]
    assert again == history  # T = 0: the same reply again, in place of the old one
    shorter, text = ui.edit_last(history)
    assert shorter == [] and text == "w10 w11 w12"
    assert list(ui.regenerate(service, [], None, None, **SETTINGS))[0][0] == [] and "Nothing" in toasts[-1]


def test_conversations_reopen_rename_and_delete(service):
    conv_id = list(ui.chat(service, "w30 w31", [], None, None, **SETTINGS))[-1][5]
    history, _panel, _stats, opened, title = ui.open_conversation(service, conv_id)
    assert opened == conv_id and history[0]["content"] == "w30 w31" and title == "w30 w31"
    ui.rename_conversation(service, conv_id, "numbers")
    assert ("numbers", conv_id) in [(label.split(" · ")[0], cid) for label, cid in ui.conversation_choices(service)]
    ui.delete_conversation(service, conv_id)
    assert conv_id not in [cid for _, cid in ui.conversation_choices(service)]
    reopened = ChatService(service.target, data_dir=service.data_dir)  # a restart finds the rest again
    assert ui.conversation_choices(reopened) == ui.conversation_choices(service)


def test_compare_streams_both_sides_then_checks_identity(service, monkeypatch):
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 0.0)
    outputs = list(ui.compare(service, "w10 w11 w12 w10 w11", drafter="copies", block_size=4, max_new_tokens=24))
    plain_only = [o for o in outputs[:-1] if o[0]["value"] and not o[1]["value"]]
    assert plain_only and "Plain decoding" in plain_only[0][2]  # text on screen before the run ends
    assert plain_only[0][0]["label"] == "Plain decoding" and plain_only[0][1]["label"] == "Copies"
    plain, spec, summary, figure = outputs[-1]
    assert plain == spec and "identical" in summary and "Copies / Plain decoding" in summary
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["Plain decoding", "Copies"]


def test_compare_runs_any_two_choices():
    """Compare's first side is any choice too (default: plain decoding); the same choice twice is told apart."""
    from app.service import ChatService
    from lab.testing import make_target, tiny_llama

    service = ChatService(make_target(tiny_llama()))
    *_, last = ui.compare(service, "w10 w11 w12 w10 w11", "copies", drafter="auto", block_size=4, max_new_tokens=16)
    assert "**Copies:**" in last[2] and "**Auto:**" in last[2] and "identical" in last[2]
    *_, last = ui.compare(service, "w10 w11 w12", "copies", drafter="copies", max_new_tokens=8)
    assert "**Copies (2) / Copies:**" in last[2]
    *_, last = ui.compare(service, "w10 w11 w12", "none", drafter="auto", steps=2, max_new_tokens=8)
    assert "**Auto / Plain decoding:**" in last[2]  # FlashMap's two steps stay with Auto's side


def test_ui_builds_with_named_api_endpoints(service):
    demo = ui.build_ui(service, "flashmap")
    names = {dep.api_name for dep in demo.fns.values() if getattr(dep, "api_name", None)}
    assert {"chat", "draft_panel", "compare", "speed"} <= names
    info = demo.get_api_info()["named_endpoints"]
    assert [p["parameter_name"] for p in info["/chat"]["parameters"]][:4] == ["message", "drafter", "block_size",
                                                                            "steps"]


def test_drafter_change_sets_k_range_and_disables_what_does_not_apply(service):
    block, steps, tree, adaptive = ui.drafter_options(service, "copies", 16)
    assert block["maximum"] == 16 and steps["interactive"] is False and steps["value"] == 1
    assert tree["interactive"] is False and adaptive["interactive"] is True
    block, *_ = ui.drafter_options(service, "none", 8)
    assert block["interactive"] is False


def test_verify_cost_curve_is_measured_cached_and_reused(service):
    curves = service.measure_verify_cost(repeats=2)
    curve = curves.at(curves.contexts[0])
    assert len(curve) == 17 and curve[0] == 1.0 and all(1.0 <= c <= n for n, c in enumerate(curve, start=1))
    assert "measured" in service.curve_status
    again = ChatService(service.target, data_dir=service.data_dir)  # a second start: no measurement needed
    assert again.cost_curves == curves and "cached" in again.curve_status
    assert again.verify_cost(40, 24) == curves.for_reply(40, 24)  # a reply's curve: after its prompt and budget
    assert ChatSettings().generation(curve).verify_cost == curve
    assert ChatSettings(adaptive=False).generation(curve).verify_cost == ()


def test_background_measurement_lets_replies_through(service):
    thread = service.measure_in_background()
    outputs = list(ui.chat(service, "w10 w11", [], None, None, **SETTINGS))
    thread.join(timeout=120)
    assert outputs[-1][0][-1]["content"] and not thread.is_alive()


def test_background_measurement_then_prepares_the_default_drafter(service, tmp_path):
    """After the curves, the default choice's drafter is built and its call cost measured: no reply pays for it."""
    fresh = ChatService(service.target, data_dir=tmp_path)
    fresh.measure_in_background("copies").join(timeout=120)
    copies = fresh.drafter_for(ChatSettings(drafter="copies"))
    assert fresh.cost_curves is not None and id(copies) in fresh._draft_costs
    assert fresh.prepare_drafter("none") == 0.0 and fresh.prepare_drafter("flashmap") == 0.0  # plain; unavailable


def test_requests_are_served_in_arrival_order():
    from app.service import FairLock

    lock, order = FairLock(), []
    with lock:
        threads = [threading.Thread(target=lambda i=i: (lock.__enter__(), order.append(i), lock.__exit__()))
                   for i in range(5)]
        for t in threads:
            t.start()
            time.sleep(0.02)  # each waits before the next arrives
    for t in threads:
        t.join()
    assert order == [0, 1, 2, 3, 4]


def test_stats_show_the_ratio_measured_inside_the_reply(service):
    """A plain reply reads x 1.00; a drafting reply's ratio comes from its own plain steps."""
    list(ui.chat(service, "w10 w11 w12", [], None, None, **{**SETTINGS, "drafter": "none", "max_new_tokens": 60}))
    text = render.render_stats(AcceptanceStats(), service.last_speed, "none", (10, 100), "cached", 2)
    assert "itself plain decoding" in text and "10 / 100 tokens" in text and "CPU threads:** 2" in text
    assert abs(service.last_speed.ratio - 1.0) < 0.15
    list(ui.chat(service, "w10 w11 w12 w10 w11", [], None, None, **{**SETTINGS, "max_new_tokens": 200}))
    speed = service.last_speed
    assert len(speed.plain_steps) >= 3  # the engine made plain steps inside the drafting reply
    line = render.speed_lines(speed, drafting=True)[1]
    assert "measured inside this reply" in line or "not enough" in line


def test_plain_steps_fold_into_one_row_so_drafted_rounds_stay_in_view():
    tokenizer = make_target(tiny_llama(vocab_size=64)).tokenizer
    events = [event(drafted=(10, 11), n_accepted=1, target_token=20)] + [event(target_token=21)] * 30
    panel = render.render_panel(tokenizer, events)
    assert panel.count("fm-row fm-plain") == 1 and "#2–31" in panel and panel.count("fm-acc") == 2  # + legend


def test_each_row_says_why_the_round_verified_what_it_did():
    from core.drafting.policy.policy import Decision

    tokenizer = make_target(tiny_llama(vocab_size=64)).tokenizer
    called = Decision("drafter", "none found", "called: 16 drafted, 2 verified")
    waiting = Decision("plain", "none pays under the cut", "waiting: measured slower than plain steps in this reply")
    probe = Decision("plain", "not asked: a plain step is due (plain probe)", "not asked: a plain step is due")
    events = [event(drafted=(10, 11), n_accepted=1, target_token=20, source="drafter", decision=called),
              *[event(target_token=21, decision=waiting)] * 2, event(target_token=22, decision=probe)]
    panel = render.render_panel(tokenizer, events)
    assert "title='drafter: copies none found; network called: 16 drafted, 2 verified'" in panel
    assert "2× copies none pays under the cut; network waiting: measured slower than plain steps" in panel
    assert "1× copies not asked: a plain step is due (plain probe)" in panel


def test_history_sent_back_by_the_browser_keeps_every_turn(service):
    """Gradio's Chatbot returns content as typed parts: earlier turns must still reach the prompt."""
    browser = [{"role": "user", "content": [{"type": "text", "text": "w10 w11"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "w12"}]}]
    history = list(ui.chat(service, "w13", browser, None, None, **SETTINGS))[-1][0]
    assert [m["content"] for m in history[:3]] == ["w10 w11", "w12", "w13"]
    settings = ChatSettings(**{k: v for k, v in SETTINGS.items()})
    assert len(service.prompt_ids(history[:2], "w13", settings)) > len(service.prompt_ids([], "w13", settings))


def test_flashmap_drafts_from_zero_noise_at_every_temperature():
    """The path chosen by measurement: FlashMap's jumps from x0 = 0, one or two, at T = 0 and T > 0; trees need
    noise. Prompt lookup and the phrasebook join a network drafter at every temperature."""
    assert ChatSettings().spec().drafter.noise_scale == 0.0
    assert ChatSettings().spec().text().startswith("flashmap,scale=0")
    for zero in (dict(steps=2), dict(temperature=1.0), dict(steps=2, temperature=0.7)):
        assert ChatSettings(**zero).spec().drafter.noise_scale == 0.0
    for other in (dict(tree=4), dict(drafter="dflash")):
        assert ChatSettings(**other).spec().drafter.noise_scale == 1.0
    assert ChatSettings().spec().drafter.lookup and ChatSettings(temperature=1.0).spec().drafter.lookup  # auto
    for network in ("flashmap", "dflash"):  # the network every round: no free sources, no adaptive cut or skip
        spec = ChatSettings(drafter=network, adaptive=True).spec()
        assert spec.drafter.name == network and not spec.drafter.lookup and not spec.adaptive
    assert ChatSettings(drafter="flashmap").spec().drafter.noise_scale == 0.0
    assert ChatSettings(drafter="copies").spec().drafter.name == "copies"
    assert ChatSettings(drafter="none").spec().drafter.name == "none"


def test_prompt_lookup_wraps_the_network_drafter_without_loading_it_again(monkeypatch, tmp_path):
    from core.drafting.base import LookupHybrid, NgramDrafter

    service = ChatService(make_target(tiny_llama(vocab_size=64)), data_dir=tmp_path)
    monkeypatch.setattr("app.service.build_drafter", lambda *args: NgramDrafter())  # stands in for a network
    service.unavailable.clear()
    spec = ChatSettings().spec().drafter
    hybrid, network = service.drafter(spec), service.drafter(replace(spec, lookup=False))
    assert isinstance(hybrid, LookupHybrid) and hybrid.main is network  # one network loaded, not two
    assert service.drafter_for(ChatSettings()) is hybrid


def test_an_adaptive_reply_charges_drafts_for_the_drafter_measured_once(service, monkeypatch):
    from app import service as service_module

    service = ChatService(service.target)  # its own drafters: none measured yet

    calls, seen = [], []
    monkeypatch.setattr(service_module, "measure_draft_cost", lambda target, drafter: calls.append(drafter) or 0.4)
    real_generate = service_module.generate
    monkeypatch.setattr(service_module, "generate",
                        lambda target, ids, gen, *a, **k: seen.append(gen.draft_cost) or real_generate(target, ids, gen,
                                                                                                      *a, **k))
    monkeypatch.setattr(service, "cost_curves", CostCurves((256,), ((1.0,) * 17,)))
    settings = ChatSettings(**SETTINGS)
    drafter = service.drafter(settings.spec().drafter)
    for _ in range(2):
        service.run_once(service.prompt_ids([], "w10 w11", settings), settings, drafter)
    service.run_once(service.prompt_ids([], "w10 w11", settings), ChatSettings(**SETTINGS, adaptive=False), drafter)
    hot = ChatSettings(**dict(SETTINGS, temperature=1.0))
    service.run_once(service.prompt_ids([], "w10 w11", hot), hot, drafter)
    assert calls == [drafter] and seen == [0.4, 0.4, 0.0, 0.0]  # measured on the first adaptive reply, kept; T = 0 only


def test_the_status_line_says_why_the_native_step_is_off(service, monkeypatch):
    assert "native step off" not in ui.status_text(service)
    monkeypatch.setitem(service.target.extra, "native_step", "no C++ compiler (g++) on this machine")
    text = ui.status_text(service)
    assert "native step off: no C++ compiler (g++) on this machine" in text and "CPU threads: " in text


def test_a_fault_is_said_in_the_conversation_and_logged_not_laid_over_the_page(service, monkeypatch, caplog):
    original = service.stream

    def breaks_after_one(*args, **kwargs):
        stream = original(*args, **kwargs)
        yield next(stream)
        stream.close()
        raise RuntimeError("kernel fault")

    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 0.0)
    monkeypatch.setattr(service, "stream", breaks_after_one)
    history = [{"role": "user", "content": "w9"}, {"role": "assistant", "content": "w10"}]
    outputs = list(ui.chat(service, "w10 w11 w12", history, None, "some-id", **SETTINGS))  # nothing raised
    shown = outputs[-1][0]
    assert shown[:2] == history and shown[2] == {"role": "user", "content": "w10 w11 w12"}
    assert shown[3]["role"] == "assistant" and "The reply failed: RuntimeError: kernel fault" in shown[3]["content"]
    assert shown[3]["content"].split("\n\n")[0] == outputs[0][0][3]["content"]  # what it had written stays
    assert any(r.exc_info and "kernel fault" in r.getMessage() for r in caplog.records)  # with its traceback
    summary = list(ui.compare(service, "w10 w11", drafter="copies", block_size=4, max_new_tokens=8))[-1][2]
    assert "The reply failed: RuntimeError: kernel fault" in summary
