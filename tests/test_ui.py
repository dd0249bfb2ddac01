import gradio as gr
import pytest

from app import ui
from app.service import ChatService, ChatSettings
from app.stats import AcceptanceStats
from tests.tiny import make_target, tiny_llama

SETTINGS = ["ngram", 4, 1, 0.0, 1.0, 24, False, ""]  # drafter, K, steps, T, top-p, max new, thinking, system


@pytest.fixture(scope="module")
def service():
    return ChatService(make_target(tiny_llama(vocab_size=64), name="tiny-ui"))


def test_only_working_drafters_are_offered(service):
    assert service.available() == ["ngram", "none"]
    assert "no drafter checkpoint" in service.unavailable["flashmap"]


def test_chat_streams_reply_panel_and_stats(service, monkeypatch):
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 0.0)  # a screen update per round (the tiny model is too fast to throttle)
    outputs = list(ui.chat(service, "w10 w11 w12 w10 w11", [], None, *SETTINGS))
    assert len(outputs) > 2
    history, panel, stats_md, chart, stats = outputs[-1]
    assert [m["role"] for m in history] == ["user", "assistant"] and history[-1]["content"]
    assert "fm-bonus" in panel and "✓ accepted" in panel  # the legend names each mark
    assert "tokens/s" in stats_md and stats.rounds > 0
    bars = chart.axes[0].patches  # the final event always redraws the chart: one bar per slot reached
    assert [round(b.get_height(), 6) for b in bars] == [round(r or 0.0, 6) for r in stats.per_slot()]
    redrawn = [not isinstance(out[3], dict) for out in outputs]  # gr.skip() is an empty update dict
    assert redrawn[-1] and sum(redrawn) < len(outputs)  # not a figure per round: drawing costs more than one
    monkeypatch.setattr(ui, "UPDATE_EVERY_S", 60.0)  # throttled: the first event, then only the final state
    assert len(list(ui.chat(service, "w10 w11 w12 w10 w11", [], None, *SETTINGS))) == 2
    # the conversation goes on: history is passed back in, stats accumulate
    more = list(ui.chat(service, "w20", history, stats, *SETTINGS))[-1]
    assert len(more[0]) == 4 and more[4].rounds > stats.rounds - 1


def test_panel_marks_accepted_rejected_unreached_and_target():
    from app.engine import RoundEvent

    class Svc:
        class target:
            tokenizer = make_target(tiny_llama(vocab_size=64)).tokenizer

    ev = RoundEvent("round", (10, 11, 12, 13), 1, 20, (10, 20), "", 0.0, 0.0)
    row = ui.render_round(Svc, 1, ev)
    assert row.count("fm-acc") == 1 and row.count("fm-rej") == 1 and row.count("fm-unr") == 2
    assert "✓w10" in row and "✗w11" in row and "·w12" in row and "★w20" in row


def test_unavailable_drafter_falls_back_with_a_warning(service):
    settings = ChatSettings(drafter="flashmap")
    drafter, warning = ui.resolve_drafter(service, settings)
    assert drafter is None and "using plain decoding" in warning


def test_bad_input_is_a_clear_error_not_a_trace(service):
    with pytest.raises(gr.Error, match="empty"):
        list(ui.chat(service, "   ", [], None, *SETTINGS))
    with pytest.raises(gr.Error, match="context"):
        list(ui.chat(service, " ".join(["w9"] * 600), [], None, *SETTINGS))
    with pytest.raises(gr.Error, match="block size"):
        list(ui.chat(service, "w9", [], None, "ngram", 40, 1, 0.0, 1.0, 24, False, ""))


def test_compare_runs_both_and_checks_identity(service):
    plain, spec, summary, figure = ui.compare(service, "w10 w11 w12 w10 w11", "ngram", 4, 1, 0.0, 24)
    assert plain == spec and "identical" in summary and "Speedup" in summary
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["plain", "n-gram"]


def test_ui_builds_with_api_endpoints(service):
    demo = ui.build_ui(service, "flashmap")
    names = {dep.api_name for dep in demo.fns.values() if getattr(dep, "api_name", None)}
    assert {"chat", "draft_panel", "compare"} <= names


def test_adaptive_setting_uses_the_measured_verify_cost(service):
    curve = service.calibrate_verify_cost()
    assert len(curve) == 17 and curve[0] == 1.0 and all(c > 0 for c in curve)
    assert ChatSettings().generation(curve).verify_cost == curve
    assert ChatSettings(adaptive=False).generation(curve).verify_cost == ()
    assert ui.settings_from("ngram", 8, 1, 0, 1, 32, False, "", False).adaptive is False


def test_tree_setting_is_checked_and_shown():
    from app.engine import RoundEvent

    with pytest.raises(gr.Error, match="temperature 0 only"):
        list(ui.chat(None, "w9", [], None, "flashmap", 8, 1, 0.7, 1.0, 24, False, "", True, 4))
    assert ui.settings_from("flashmap", 8, 1, 0, 1, 32, False, "", True, 4).tree == 4

    class Svc:
        class target:
            tokenizer = make_target(tiny_llama(vocab_size=64)).tokenizer

    row = ui.render_round(Svc, 3, RoundEvent("round", (10, 11), 2, 20, (10, 11, 20), "", 0.0, 0.0, branches=4))
    assert "⑂4" in row and row.count("fm-acc") == 2


def test_plain_speed_says_where_it_was_measured(service):
    service.calibrate_plain()
    assert "at start-up" in ui.render_stats(service, AcceptanceStats(), 10.0, "ngram")
    list(ui.chat(service, "w10 w11 w12", [], None, "none", 4, 1, 0.0, 1.0, 24, False, ""))
    assert "your last plain reply" in ui.render_stats(service, AcceptanceStats(), 10.0, "ngram")
