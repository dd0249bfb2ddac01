"""app/remote.py and --backend vllm: a stand-in server that speaks vLLM's API (models, streamed completions with
token ids, Prometheus counters) behind the app's chat, Compare and OpenAI API; a server that is down."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app import ui
from app.remote import RemoteUnavailable, VllmServer, parse_spec_counters, reply_acceptance
from app.service import REMOTE, ChatService
from core.decoding.engine import GenerationConfig, generate_all
from drafter.registry import DrafterUnavailable
from lab.testing import make_target, tiny_llama

SETTINGS = dict(block_size=4, steps=1, temperature=0.0, top_p=1.0, max_new_tokens=20)
METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny"}} {drafts}.0
vllm:spec_decode_num_drafts_created{{engine="0",model_name="tiny"}} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="tiny"}} {draft_tokens}.0
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="tiny"}} {accepted}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="0"}} {pos0}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="1"}} {pos1}.0
"""


@pytest.fixture(scope="module")
def target():
    return make_target(tiny_llama(vocab_size=64), name="tiny")


@pytest.fixture(scope="module")
def server(target):
    """Writes the target's own greedy reply in chunks of 1 and 2 tokens (as a speculative server streams accepted
    tokens), counting one draft per chunk and one accepted token per 2-token chunk."""
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos0": 0, "pos1": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
            elif self.path == "/metrics":
                body = METRICS.format(**counters).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":  # a server on another model's folder splits the probe otherwise
                tokens = target.tokenizer(req["prompt"], add_special_tokens=False)["input_ids"]
                body = json.dumps({"tokens": tokens + [1] if counters.get("other_model") else tokens}).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)
                return
            assert req["return_token_ids"] and req["stream"] and req["model"] == "tiny"
            out, _ = generate_all(target, req["prompt"], GenerationConfig(max_new_tokens=req["max_tokens"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [out[i:i + 2] for i in range(0, len(out), 2)]
            for n, ids in enumerate(chunks):
                counters["drafts"] += 1
                counters["draft_tokens"] += 3
                counters["accepted"] += len(ids) - 1
                counters["pos0"] += len(ids) - 1
                finish = ("length" if len(out) == req["max_tokens"] else "stop") if n == len(chunks) - 1 else None
                chunk = {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    remote = VllmServer(f"http://127.0.0.1:{httpd.server_address[1]}")
    assert remote.check() == "tiny"
    remote.check_tokenizer(target)
    remote.counters = counters  # for the test that plays another model
    yield remote
    httpd.shutdown()


@pytest.fixture(scope="module")
def service(target, server, tmp_path_factory):
    return ChatService(target, data_dir=tmp_path_factory.mktemp("fm-remote"), remote=server)


def test_counters_parse_from_prometheus_text_and_a_reply_reads_their_change():
    before = parse_spec_counters(METRICS.format(drafts=10, draft_tokens=30, accepted=6, pos0=4, pos1=2))
    assert before == {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 6,
                      "num_accepted_tokens_per_pos": [4, 2]}
    after = parse_spec_counters(METRICS.format(drafts=14, draft_tokens=42, accepted=12, pos0=8, pos1=4))
    got = reply_acceptance(before, after)
    assert got["drafts"] == 4 and got["acceptance_length"] == pytest.approx(2.5)
    assert got["per_position"] == [pytest.approx(1.0), pytest.approx(0.5)]
    assert reply_acceptance(after, after)["acceptance_length"] is None


def test_a_chat_reply_comes_from_the_server_and_says_what_it_does_not_expose(service, target):
    assert REMOTE in service.available()
    ids = target.chat_ids([{"role": "user", "content": "w10 w11"}])
    want, _ = generate_all(target, ids, GenerationConfig(max_new_tokens=20))
    outputs = list(ui.chat(service, "w10 w11", [], None, None, drafter=REMOTE, **SETTINGS))
    history, panel, stats_md = outputs[-2][:3]  # the last update while streaming; the final one saves
    assert history[-1]["content"] == target.decode(target.until_eos(want))
    assert [ev.kind for ev in service.last_events][:2] == ["prefill", "remote"]
    assert sum(len(ev.committed) for ev in service.last_events) == len(want)
    assert "does not expose its drafted blocks" in panel
    assert "Server's acceptance length:** 1.9" in stats_md or "Server's acceptance length:** 2.0" in stats_md
    assert "vLLM server" in stats_md and service.last_remote["drafts"] == (len(want) + 1) // 2


def test_compare_puts_this_engines_plain_decoding_beside_the_server(service):
    *_, last = ui.compare(service, "w10 w11 w12", drafter=REMOTE, **SETTINGS)
    assert "identical, token for token" in last[2] and "vLLM server" in last[2]


def test_stop_ends_a_server_reply_and_keeps_what_was_written(service, target):
    cancel = threading.Event()
    settings = ui.settings_from(drafter=REMOTE, **SETTINGS)
    events = []
    for ev, _speed in service.stream(target.chat_ids([{"role": "user", "content": "w1"}]), settings, service.remote,
                                     cancel):
        events.append(ev)
        cancel.set()
    assert events[-1].finish_reason == "cancelled" and events[-1].text == target.decode(events[0].committed)


def test_a_server_that_is_down_is_one_clear_line_and_the_app_keeps_its_engine(capsys, tmp_path, target):
    script = app_script()
    args = script.parse_args(["--backend", "vllm", "--vllm-url", "http://127.0.0.1:9"])
    assert script.connect_backend(args, script.target_config_from_args(args)) == (None, None)
    out = capsys.readouterr().out
    assert "no vLLM server answers at http://127.0.0.1:9" in out and "this app's own engine" in out
    with pytest.raises(RemoteUnavailable, match="no vLLM server answers"):
        VllmServer("http://127.0.0.1:9").check()
    plain = ChatService(target, data_dir=tmp_path)
    assert REMOTE not in plain.available()
    with pytest.raises(DrafterUnavailable, match="--backend vllm"):
        plain.drafter_for(ui.settings_from(drafter=REMOTE, **SETTINGS))


def test_the_openai_api_serves_the_vllm_choice_and_says_when_the_server_is_gone(service, target, server):
    import openai
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from app.openai_api import add_openai_routes

    api = FastAPI()
    add_openai_routes(api, service, REMOTE)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="local", http_client=TestClient(api),
                           max_retries=0)
    reply = client.chat.completions.create(model="tiny", temperature=0, max_tokens=12,
                                           messages=[{"role": "user", "content": "w3 w4"}])
    want, _ = generate_all(target, target.chat_ids([{"role": "user", "content": "w3 w4"}]),
                           GenerationConfig(max_new_tokens=12))
    assert reply.choices[0].message.content == target.decode(target.until_eos(want))
    assert reply.model_extra["speculative"]["drafter"] == REMOTE
    gone = ChatService(target, data_dir=None, remote=VllmServer("http://127.0.0.1:9"))
    api = FastAPI()
    add_openai_routes(api, gone, REMOTE)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="local", http_client=TestClient(api),
                           max_retries=0)
    with pytest.raises(openai.APIStatusError, match="no vLLM server answers"):
        client.chat.completions.create(model="tiny", temperature=0, max_tokens=4,
                                       messages=[{"role": "user", "content": "w3"}])


def test_a_server_on_another_model_is_refused_by_its_tokenizer(server, target):
    server.counters["other_model"] = True
    try:
        with pytest.raises(RemoteUnavailable, match="another model"):
            server.check_tokenizer(target)
    finally:
        server.counters.pop("other_model")


def app_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("app_script", Path(__file__).parent.parent / "app.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def text_only_folder(target, tmp_path_factory):
    """The tiny target's folder without its weights: config, generation config, tokenizer and chat template."""
    folder = tmp_path_factory.mktemp("tiny-text-side")
    target.model.config.save_pretrained(folder)
    target.model.generation_config.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return folder


def test_backend_vllm_loads_the_tokenizer_alone_and_every_reply_is_the_servers(server, target, text_only_folder,
                                                                                tmp_path, capsys):
    """`python app.py --backend vllm` with a server that answers: the target's tokenizer, chat template and config
    are read (from a folder that holds no weights at all), so one GPU holds the model once; every choice goes to the
    server, and a choice that needs local weights says so."""
    from core.runtime.target import ServedTarget, eos_ids

    script = app_script()
    args = script.parse_args(["--backend", "vllm", "--vllm-url", server.url, "--target", str(text_only_folder)])
    remote, text_side = script.connect_backend(args, script.target_config_from_args(args))
    assert "tokenizer and chat template alone" in capsys.readouterr().out
    assert isinstance(text_side, ServedTarget) and text_side.model is None and remote.model == "tiny"
    messages = [{"role": "user", "content": "w3 w4"}]
    assert text_side.chat_ids(messages) == target.chat_ids(messages)
    # the end-of-sequence ids load_target gives a loaded target (its generation config's and the tokenizer's)
    assert text_side.eos_token_ids == eos_ids(target.model.generation_config, target.tokenizer)
    assert text_side.identity == {**target.identity, "name": str(text_only_folder)}
    service = ChatService(text_side, data_dir=tmp_path, remote=remote)
    assert not service.local and service.available() == [REMOTE]
    with pytest.raises(DrafterUnavailable, match="tokenizer alone"):
        service.drafter_for(ui.settings_from(drafter="auto", **SETTINGS))
    settings, drafter = ui.prepare(service, "w3 w4", dict(drafter="none", **SETTINGS))  # falls back to the server
    assert drafter is remote and settings.drafter == REMOTE
    text, tokens, _ = service.run_once(text_side.chat_ids(messages), settings, drafter)
    want, _ = generate_all(target, target.chat_ids(messages), GenerationConfig(max_new_tokens=20))
    assert tokens == want and text == target.decode(target.until_eos(want))
    with pytest.raises(DrafterUnavailable, match="tokenizer alone"):  # nothing here can run a forward
        list(service.stream(text_side.chat_ids(messages), settings, None))
    ui.build_ui(service, REMOTE)  # the page builds with the server as its only choice
