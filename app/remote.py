"""A vLLM server as a backend of the app (`python app.py --backend vllm --vllm-url URL`, docs/serving.md).

The server runs the target with whatever drafter it was started with (`vllm serve ... --speculative-config
'{"method": "dflash", ...}'`); the app sends it the prompt as token ids (formatted by the target's own chat
template, so it reads what this engine reads) through the OpenAI completions API with `return_token_ids`, and turns
each streamed chunk into an engine event of kind "remote": the tokens the server committed since the last chunk.
What vLLM does not expose per request — the drafted blocks, which of their slots were accepted — the panel says it
does not have; the acceptance the server's own counters (/metrics, `vllm:spec_decode_*`) moved by during the reply
stands in for it, which is this reply's alone while nobody else uses the server.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from core.decoding.engine import GenerationConfig, RoundEvent

FINISH = {"stop": "eos", "length": "length", "abort": "cancelled"}  # vLLM's finish_reason -> the engine's
PROBE = "Speculative decoding: 12 × 7 = 84, naïve café déjà-vu — 東京 🙂"  # words, digits, accents, CJK, emoji


class RemoteUnavailable(RuntimeError):
    """The server cannot be used; the message says why and what to do."""


@dataclass
class VllmServer:
    url: str = "http://127.0.0.1:8000"
    timeout_s: float = 5.0
    model: str = ""  # the served model's id, read by check()

    def _url(self, path: str) -> str:
        return self.url.rstrip("/") + path

    def _post(self, path: str, body: dict) -> urllib.request.Request:
        return urllib.request.Request(self._url(path), json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _get(self, path: str) -> bytes:
        try:
            with urllib.request.urlopen(self._url(path), timeout=self.timeout_s) as reply:
                return reply.read()
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise RemoteUnavailable(f"no vLLM server answers at {self.url} ({err}); start one as docs/serving.md "
                                    "shows, or run the app without --backend vllm") from err

    def check(self) -> str:
        """The served model's id (kept in self.model), or RemoteUnavailable."""
        try:
            models = json.loads(self._get("/v1/models"))["data"]
            self.model = models[0]["id"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise RemoteUnavailable(f"{self.url}/v1/models did not list a model as vLLM does ({err})") from err
        return self.model

    def check_tokenizer(self, target) -> None:
        """Refuse a server whose model splits text unlike the target: the app sends token ids, which would then mean
        other words (a server started on another model's folder)."""
        want = target.tokenizer(PROBE, add_special_tokens=False)["input_ids"]
        request = self._post("/tokenize", {"model": self.model, "prompt": PROBE, "add_special_tokens": False})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                got = json.loads(reply.read())["tokens"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            raise RemoteUnavailable(f"the server at {self.url} does not tokenize as vLLM does ({err})") from err
        if got != want:
            raise RemoteUnavailable(f"the vLLM server at {self.url} serves {self.model!r}, whose tokenizer splits text "
                                    f"unlike {target.name}'s: another model; start it on the target's folder "
                                    "(python -m drafter.formats.export --target-out DIR)")

    def spec_counters(self) -> dict:
        """vLLM's spec-decode counters from /metrics: drafts, draft_tokens, accepted_tokens, accepted_per_position."""
        return parse_spec_counters(self._get("/metrics").decode("utf-8", "replace"))

    def events(self, target, prompt_ids: list[int], gen: GenerationConfig, cancel=None):
        """Engine events for one reply written by the server: a "prefill" event with its first chunk, then one
        "remote" event per chunk; the last one carries the finish reason. Stop (cancel) closes the stream."""
        body = {"model": self.model, "prompt": prompt_ids, "max_tokens": gen.max_new_tokens, "stream": True,
                "temperature": gen.sampling.temperature, "top_p": gen.sampling.top_p, "seed": gen.seed,
                "stop": list(gen.stop_strings) or None, "return_token_ids": True}
        request = self._post("/v1/completions", body)
        tokens: list[int] = []
        last = time.perf_counter()
        try:
            reply = urllib.request.urlopen(request, timeout=max(self.timeout_s, 60.0))
        except (urllib.error.URLError, OSError) as err:
            raise RemoteUnavailable(f"the vLLM server at {self.url} refused the request ({err})") from err
        with reply:
            for chunk in sse_chunks(reply):
                if cancel is not None and cancel.is_set():
                    yield remote_event("round", (), target.decode(tokens), "cancelled", 0.0)
                    return
                choice = chunk["choices"][0]
                ids = tuple(choice.get("token_ids") or ())
                tokens += ids
                now = time.perf_counter()
                finish = FINISH.get(choice.get("finish_reason"), choice.get("finish_reason"))
                kind = "prefill" if len(tokens) == len(ids) else "remote"
                yield remote_event(kind, ids, target.decode(tokens), finish, now - last)
                last = now


def remote_event(kind: str, committed: tuple[int, ...], text: str, finish: str | None, seconds: float) -> RoundEvent:
    return RoundEvent(kind=kind, drafted=(), n_accepted=0, target_token=committed[-1] if committed else -1,
                      committed=committed, text=text, draft_s=0.0, verify_s=seconds, finish_reason=finish)


def sse_chunks(stream):
    """The JSON objects of a server-sent-events stream (`data: {...}` lines) up to `data: [DONE]`."""
    for raw in stream:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


COUNTER = re.compile(r'^vllm:spec_decode_(\w+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$')


def parse_spec_counters(text: str) -> dict:
    """Prometheus text -> {"num_drafts": n, "num_draft_tokens": n, "num_accepted_tokens": n,
    "num_accepted_tokens_per_pos": [n, ...]}, summed over the other labels (engines, models)."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        match = COUNTER.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name.endswith("_created"):
            continue
        position = re.search(r'position="(\d+)"', labels)
        if position:
            per_pos[int(position.group(1))] = per_pos.get(int(position.group(1)), 0.0) + value
        else:
            out[name] = out.get(name, 0) + int(value)
    if per_pos:
        out["num_accepted_tokens_per_pos"] = [int(per_pos[i]) for i in sorted(per_pos)]
    return out


def reply_acceptance(before: dict, after: dict) -> dict:
    """What the server's counters moved by during one reply: drafts, tokens per verify round (the target's own token
    included, vLLM's "acceptance length") and the acceptance rate of each draft position."""
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    pos_after, pos_before = after.get("num_accepted_tokens_per_pos", []), before.get("num_accepted_tokens_per_pos", [])
    per_pos = [a - (pos_before[i] if i < len(pos_before) else 0) for i, a in enumerate(pos_after)]
    return {"drafts": drafts, "acceptance_length": 1 + accepted / drafts if drafts else None,
            "per_position": [n / drafts for n in per_pos] if drafts else []}
