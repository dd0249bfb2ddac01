"""The OpenAI-compatible API, driven by the real `openai` client (in-process here; against a running app in
test_app_e2e.py)."""
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.openai_api import add_openai_routes
from app.service import ChatService, ChatSettings
from lab.testing import make_target, tiny_llama


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return ChatService(make_target(tiny_llama(vocab_size=64), name="tiny-api"),
                       data_dir=tmp_path_factory.mktemp("fm-api"))


@pytest.fixture(scope="module")
def client(service):
    app = FastAPI()
    add_openai_routes(app, service, "copies")
    return openai.OpenAI(base_url="http://testserver/v1", api_key="local", http_client=TestClient(app), max_retries=0)


def plain_reply(service, message: str, max_new_tokens: int) -> str:
    settings = ChatSettings(drafter="none", max_new_tokens=max_new_tokens)
    return service.run_once(service.prompt_ids([], message, settings), settings, None)[0]


def test_models_lists_the_target(client):
    from app import __version__

    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-api"] and models[0].model_extra["version"] == __version__


def test_completion_equals_plain_decoding_and_reports_speculative_stats(client, service):
    reply = client.chat.completions.create(model="tiny-api", temperature=0, max_tokens=24,
                                           messages=[{"role": "user", "content": "w10 w11 w12 w10 w11"}])
    assert reply.choices[0].message.content == plain_reply(service, "w10 w11 w12 w10 w11", 24)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
    spec = reply.model_extra["speculative"]
    assert spec["drafter"] == "copies" and spec["acceptance_length"] >= 1.0 and spec["tokens_per_s"] > 0
    assert sum(spec["rounds_by_source"].values()) == spec["rounds"]  # plain steps and drafted rounds, counted


def test_streaming_sends_deltas_that_add_up_to_the_reply(client, service):
    stream = client.chat.completions.create(model="tiny-api", temperature=0, max_tokens=24, stream=True,
                                            messages=[{"role": "user", "content": "w10 w11 w12"}],
                                            extra_body={"drafter": "none"})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain_reply(service, "w10 w11 w12", 24) and len(chunks) > 3
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["speculative"]["speedup_vs_plain"] == 1.0


def test_bad_requests_get_4xx_with_a_message(client):
    cases = [(dict(model="gpt-4", messages=[{"role": "user", "content": "hi"}]), openai.NotFoundError, "not served"),
             (dict(model="tiny-api", messages=[]), openai.BadRequestError, "messages"),
             (dict(model="tiny-api", messages=[{"role": "assistant", "content": "hi"}]), openai.BadRequestError,
              "last message"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}], temperature=5),
              openai.BadRequestError, "temperature"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}], extra_body={"block_size": 99}),
              openai.BadRequestError, "block size"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}],
                   extra_body={"drafter": "flashmap", "steps": 7}), openai.BadRequestError, "1, 2, 3, 4 jumps"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}],
                   extra_body={"drafter": "copies", "steps": 2}), openai.BadRequestError, "Copies drafts without"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}],
                   extra_body={"drafter": "none", "tree": 4}), openai.BadRequestError, "steps and drafts per round"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "hi"}],
                   extra_body={"drafter": "ngram"}), openai.BadRequestError, "auto, flashmap, dflash, copies, none"),
             (dict(model="tiny-api", messages=[{"role": "user", "content": "w9 " * 600}]), openai.BadRequestError,
              "context")]
    for kwargs, error, words in cases:
        with pytest.raises(error, match=words) as caught:
            client.chat.completions.create(**kwargs)
        assert 400 <= caught.value.status_code < 500


def test_content_as_a_list_of_text_parts_is_read_as_their_text(client, service):
    parts = [{"type": "text", "text": "w10 w11 "}, {"type": "text", "text": "w12"}]
    reply = client.chat.completions.create(model="tiny-api", temperature=0, max_tokens=16,
                                           messages=[{"role": "system", "content": [{"type": "text", "text": ""}]},
                                                     {"role": "user", "content": parts}])
    assert reply.choices[0].message.content == plain_reply(service, "w10 w11 w12", 16)
    assert reply.model_extra["speculative"]["precision"] == service.target.precision
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError, match="image_url.*text only") as caught:
        client.chat.completions.create(model="tiny-api", messages=[{"role": "user", "content": image}])
    assert caught.value.status_code == 400


@pytest.mark.parametrize("field, value", [("logprobs", True), ("top_logprobs", 3), ("logit_bias", {"5": 10}),
                                          ("presence_penalty", 0.5), ("frequency_penalty", 1.0),
                                          ("tools", [{"type": "function", "function": {"name": "f"}}]),
                                          ("response_format", {"type": "json_object"})])
def test_a_field_the_server_does_not_serve_is_refused_with_a_400_that_names_it(client, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as caught:
        client.chat.completions.create(model="tiny-api", max_tokens=4, messages=[{"role": "user", "content": "w10"}],
                                       extra_body={field: value})
    assert caught.value.body["param"] == field
    reply = client.chat.completions.create(model="tiny-api", max_tokens=4, logprobs=False, presence_penalty=0,
                                           response_format={"type": "text"}, temperature=0,
                                           messages=[{"role": "user", "content": "w10"}])
    assert reply.choices[0].message.content is not None  # the defaults pass


def failing_client(service, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("kernel fault")
        yield  # (a generator, as ChatService.stream is)

    monkeypatch.setattr(service, "stream", broken)
    app = FastAPI()
    add_openai_routes(app, service, "copies")
    http = TestClient(app, raise_server_exceptions=False)  # as a server answers: the error is not raised to the client
    return openai.OpenAI(base_url="http://testserver/v1", api_key="local", http_client=http, max_retries=0)


def test_an_unexpected_error_answers_an_openai_error_body_and_is_logged(service, monkeypatch, caplog):
    client = failing_client(service, monkeypatch)
    messages = [{"role": "user", "content": "w10 w11"}]
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="tiny-api", max_tokens=4, messages=messages)
    assert caught.value.status_code == 500 and "kernel fault" in caught.value.body["message"]
    assert caught.value.body["type"] == "server_error"
    assert any("kernel fault" in r.getMessage() for r in caplog.records)


def test_an_error_during_a_stream_ends_it_with_an_error_event(service, monkeypatch):
    def breaks_after_one(*args, **kwargs):
        stream = original(*args, **kwargs)
        yield next(stream)
        stream.close()
        raise RuntimeError("fault mid-reply")

    original = service.stream
    monkeypatch.setattr(service, "stream", breaks_after_one)
    app = FastAPI()
    add_openai_routes(app, service, "copies")
    http = TestClient(app, raise_server_exceptions=False)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="local", http_client=http, max_retries=0)
    with pytest.raises(openai.APIError, match="fault mid-reply"):
        for _ in client.chat.completions.create(model="tiny-api", max_tokens=16, stream=True, temperature=0,
                                                messages=[{"role": "user", "content": "w10 w11"}]):
            pass


def test_a_stream_never_sends_text_a_stop_string_later_cuts(client):
    """A stop string can arrive across rounds: its first characters with one token, the rest with the next. The
    stream holds back a tail that could still begin one, so the deltas add up to the whole reply's text."""
    messages = [{"role": "user", "content": "w10 w11 w12"}]
    args = dict(model="tiny-api", temperature=0, max_tokens=24, messages=messages, extra_body={"drafter": "none"})
    whole = client.chat.completions.create(**args).choices[0].message.content
    for start in range(2, min(len(whole) - 3, 14)):
        stop = whole[start: start + 3]
        cut = client.chat.completions.create(stop=[stop], **args).choices[0]
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stop=[stop], stream=True, **args))
        assert cut.message.content == whole[: whole.index(stop)] == streamed and cut.finish_reason == "stop"
