"""An OpenAI-compatible API on the app's own server, so editors and other clients can point at FlashMap Chat:
GET /v1/models and POST /v1/chat/completions (streamed as server-sent events, or whole).

Standard fields: model (the loaded target's name, as /v1/models lists it), messages, temperature (default 1, as
OpenAI's), top_p, max_tokens / max_completion_tokens, stream, seed, stop. Optional extra fields choose the
drafter the app would use (drafter, block_size, steps, tree, adaptive; the openai client sends them through
`extra_body`). Every response carries `speculative`: the drafter, its acceptance length, tokens/s and the ratio to
plain decoding measured inside the same reply. Bad requests get a 4xx with an OpenAI-style error body; requests
are served one at a time in arrival order, sharing the model lock with the UI.
"""
from __future__ import annotations

import itertools
import json
import logging
import time
import uuid
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app import __version__
from app.remote import RemoteUnavailable
from app.service import ChatService, ChatSettings
from core.decoding.engine import PromptError
from core.decoding.stats import AcceptanceStats
from drafter.registry import DrafterUnavailable
from drafter.spec import SpecError

log = logging.getLogger("flashmap")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


def part_text(part) -> str:
    """The text of one part of a message's content in OpenAI's list form; this server's models read text only."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind != "text":
        raise ValueError(f"content parts of type {kind!r} are not supported: the model reads text only")
    if not isinstance(part.get("text"), str):
        raise ValueError("a text part needs its `text`, a string")
    return part["text"]


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str  # a string, or a list of text parts (joined), as OpenAI accepts

    @field_validator("content", mode="before")
    @classmethod
    def joined(cls, content):
        return "".join(part_text(part) for part in content) if isinstance(content, list) else content


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send many optional fields this server does not use

    model: str
    messages: list[Message] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    seed: int = 0
    stop: str | list[str] | None = None
    n: int = 1
    # fields clients send that this server does not serve: refused with a 400 naming them when they ask for something
    # (unsupported_fields), never silently ignored
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    functions: list | None = None
    response_format: dict | None = None
    drafter: str | None = None  # extensions: the app's drafter settings
    block_size: int | None = Field(None, ge=1)
    steps: int = Field(1, ge=1)
    tree: int = Field(1, ge=1)
    adaptive: bool = True


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def error_response(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    log.warning("api error %d: %s", status, message)  # one line: the client's mistake, not a fault
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def unsupported_fields(req: ChatRequest) -> list[str]:
    """The fields of this request that ask for what the server does not do: token log-probabilities, logit biases,
    repetition penalties, tool calls and structured output (each left at its default passes)."""
    asked = {
        "logprobs": bool(req.logprobs),
        "top_logprobs": bool(req.top_logprobs),
        "logit_bias": bool(req.logit_bias),
        "presence_penalty": bool(req.presence_penalty),
        "frequency_penalty": bool(req.frequency_penalty),
        "tools": bool(req.tools),
        "tool_choice": req.tool_choice not in (None, "none"),
        "functions": bool(req.functions),
        "response_format": (req.response_format or {"type": "text"}).get("type") != "text",
    }
    return [name for name, wanted in asked.items() if wanted]


def fault_body(err: Exception) -> dict:
    """An OpenAI-style error body for a fault of the server's (not the request's)."""
    return {"error": {"message": f"the reply failed: {type(err).__name__}: {err} (the server log has the details)",
                      "type": "server_error", "param": None, "code": "internal_error"}}


def settings_for(req: ChatRequest, default_drafter: str) -> ChatSettings:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return ChatSettings(drafter=req.drafter or default_drafter, block_size=req.block_size, steps=req.steps,
                            temperature=req.temperature, top_p=req.top_p,
                            max_new_tokens=req.max_completion_tokens or req.max_tokens or 256,
                            system_prompt="\n".join(m.content for m in req.messages if m.role == "system"),
                            seed=req.seed, adaptive=req.adaptive, tree=req.tree, stop_strings=tuple(stops))
    except (SpecError, ValueError) as err:
        raise ApiError(400, str(err)) from err


def conversation(req: ChatRequest) -> tuple[list[dict], str]:
    """(history, last user message) from the request's messages (system messages become the system prompt)."""
    turns = [{"role": m.role, "content": m.content} for m in req.messages if m.role != "system"]
    if not turns or turns[-1]["role"] != "user":
        raise ApiError(400, "the last message must come from the user", param="messages")
    if not turns[-1]["content"].strip():
        raise ApiError(400, "the last user message is empty", param="messages")
    return turns[:-1], turns[-1]["content"]


def speculative(name: str, stats: AcceptanceStats, speed, precision: str) -> dict:
    return {"drafter": name, "precision": precision, "acceptance_length": stats.acceptance_length,
            "rounds": stats.rounds, "rounds_by_source": dict(stats.sources),  # rounds by RoundEvent.source
            "tokens_per_s": speed.tokens_per_s, "plain_tokens_per_s": speed.plain_tokens_per_s,
            "speedup_vs_plain": speed.ratio if name != "none" else 1.0}


class Completion:
    """One request's reply, run through the service: events in, OpenAI objects out."""

    def __init__(self, service: ChatService, req: ChatRequest, default_drafter: str):
        if req.model != service.target.name:
            raise ApiError(404, f"model {req.model!r} is not served here; GET /v1/models lists {service.target.name!r}",
                           code="model_not_found", param="model")
        if req.n != 1:
            raise ApiError(400, "only n = 1 is supported", param="n")
        unsupported = unsupported_fields(req)
        if unsupported:
            raise ApiError(400, f"{', '.join(unsupported)}: not supported by this server (it writes plain text "
                                "replies, exact to the target's own decoding)", param=unsupported[0])
        self.service, self.settings = service, settings_for(req, default_drafter)
        history, message = conversation(req)
        try:
            self.drafter = service.drafter_for(self.settings)
        except DrafterUnavailable as err:
            raise ApiError(400, f"drafter {self.settings.drafter!r} unavailable: {err}", param="drafter") from err
        self.prompt_ids = service.prompt_ids(history, message, self.settings)
        self.name = self.settings.drafter if self.drafter is not None else "none"
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.stats, self.tokens, self.text, self.finish, self.speed = AcceptanceStats(), 0, "", "stop", None

    def events(self):
        """The reply's events; PromptError (too long for the context) becomes a 400 before anything is sent."""
        stream = self.service.stream(self.prompt_ids, self.settings, self.drafter)
        try:
            first = next(stream)
        except PromptError as err:
            raise ApiError(400, str(err), code="context_length_exceeded", param="messages") from err
        except RemoteUnavailable as err:
            raise ApiError(502, str(err), code="backend_unavailable") from err
        for ev, speed in [first, *stream]:
            self.stats.add(ev)
            self.tokens += len(ev.committed)
            self.text, self.speed = ev.text, speed
            if ev.finish_reason:
                self.finish = FINISH[ev.finish_reason]
            yield ev

    def base(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.service.target.name}

    def usage(self) -> dict:
        prompt = len(self.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": self.tokens, "total_tokens": prompt + self.tokens}

    def whole(self) -> dict:
        for _ in self.events():
            pass
        return {**self.base("chat.completion"), "usage": self.usage(),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text},
                             "finish_reason": self.finish}],
                "speculative": speculative(self.name, self.stats, self.speed, self.service.target.precision)}

    def chunks(self, events):
        """Server-sent events: a role chunk, a content delta per round, a last chunk with the finish reason, usage
        and speculative stats, then [DONE]."""
        chunk = lambda delta, finish=None, **extra: {**self.base("chat.completion.chunk"), **extra,  # noqa: E731
                                                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        yield sse(chunk({"role": "assistant", "content": ""}))
        sent = ""
        try:
            for ev in events:
                ready = settled(self.text, self.settings.stop_strings, ev.finished)
                if ready != sent and ready.startswith(sent):
                    yield sse(chunk({"content": ready[len(sent):]}))
                    sent = ready
        except Exception as err:  # the status went out with the first chunk: the fault goes as an error event
            log.exception("streamed reply failed")
            yield sse(fault_body(err))
            yield "data: [DONE]\n\n"
            return
        spec = speculative(self.name, self.stats, self.speed, self.service.target.precision)
        yield sse(chunk({}, self.finish, usage=self.usage(), speculative=spec))
        yield "data: [DONE]\n\n"


def settled(text: str, stops: tuple[str, ...], finished: bool) -> str:
    """What a stream may send of the reply so far: all of it once it has finished; before that, all but a tail that
    could still grow into a stop string (the engine cuts the reply before a stop string only once the string is
    whole, and a delta sent cannot be taken back)."""
    if finished:
        return text
    hold = 0
    for stop in stops:
        hold = max(hold, next((n for n in range(min(len(stop) - 1, len(text)), 0, -1) if text.endswith(stop[:n])), 0))
    return text[: len(text) - hold]


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def add_openai_routes(app: FastAPI, service: ChatService, default_drafter: str) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(400, f"{where}: {first.get('msg', 'invalid request')}", param=where or None)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError):
        return error_response(err.status, err.message, err.code, err.param)

    @app.exception_handler(Exception)
    async def fault(request: Request, err: Exception):  # anything else: answered as OpenAI does
        # one line here; Starlette raises the error on after this answer, and the server logs its traceback
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(err).__name__, err)
        return JSONResponse(fault_body(err), 500)

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": service.target.name, "object": "model", "created": 0,
                                            "owned_by": "local", "version": __version__}]}

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatRequest):
        completion = Completion(service, req, default_drafter)
        if not req.stream:
            return completion.whole()
        events = completion.events()
        first = next(events, None)  # a prompt too long fails here, as a 400, before the stream starts
        return StreamingResponse(completion.chunks(itertools.chain([first] if first else [], events)),
                                 media_type="text/event-stream")
