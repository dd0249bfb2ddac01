"""FlashMap Chat: `python app.py`, then open the printed local URL.

Loads the target (the embedded SmolLM2-135M-Instruct by default, offline) and its drafters, and serves the UI
and an OpenAI-compatible API (/v1) on 127.0.0.1 (no share links) as soon as the target is loaded; the verify-cost
curve for adaptive K is read from this machine's cache and re-measured in the background.
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path

from core.runtime.threads import start_policy

DEFAULT_DATA_DIR = Path.home() / ".flashmap-chat"


def early_thread_policy(argv: list[str]):
    """This machine's thread policy (core.runtime.threads), its wait policy set before torch starts OpenMP."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    known, _ = early.parse_known_args(argv)
    return start_policy(Path(known.data_dir) / "cache")


THREAD_POLICY = early_thread_policy(sys.argv[1:])

from core.runtime.target import (  # noqa: E402
    TargetLoadError,
    add_target_args,
    load_served_target,
    load_target,
    target_config_from_args,
)
from core.runtime.threads import apply_thread_policy, wait_policy  # noqa: E402
from drafter.spec import CHOICES  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    add_target_args(parser)
    parser.add_argument("--drafter", default="auto", choices=list(CHOICES),
                        help="the drafter choice selected when the page opens (auto: prompt lookup, the phrasebook "
                             "and the FlashMap network where it pays; flashmap / dflash: that network every round; "
                             "copies: auto without the network; none: plain decoding)")
    parser.add_argument("--weights", default=None,
                        help="checkpoint folder or hub id of --drafter's network (auto's: FlashMap's)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    parser.add_argument("--port", type=int, default=7860, help="port of the UI and the /v1 API")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR),
                        help="saved conversations and cached measurements (default ~/.flashmap-chat)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: this machine's measured policy, core.runtime.threads; "
                             "0: one per core; shown in the UI)")
    parser.add_argument("--no-measure", action="store_true",
                        help="do not re-measure the verify-cost curve in the background (use the cached one)")
    parser.add_argument("--backend", default="engine", choices=["engine", "vllm"],
                        help="vllm: a vLLM server (--vllm-url) writes every reply with the drafter it was started "
                             "with, and this app loads the target's tokenizer and chat template alone (docs/serving.md;"
                             " --keep-engine: the target too, keeping this engine's choices beside the server)")
    parser.add_argument("--vllm-url", default="http://127.0.0.1:8000", help="the vLLM server for --backend vllm")
    parser.add_argument("--keep-engine", action="store_true",
                        help="with --backend vllm: load the target here too (a second copy of its weights), so that "
                             "this engine's drafters and Compare's plain decoding beside the server stay offered")
    return parser.parse_args(argv)


def connect_backend(args, cfg):
    """For --backend vllm: (the vLLM server, the target's text side alone: tokenizer, chat template and config, no
    weights, core.runtime.target.ServedTarget) where the server answers and splits text as the target does, so that
    one GPU holds the model once. Else (None, None), with one line saying why: the app then loads the target and
    serves every reply with its own engine."""
    if args.backend != "vllm":
        return None, None
    from app.remote import RemoteUnavailable, VllmServer

    server = VllmServer(args.vllm_url)
    try:
        model = server.check()
        text_side = load_served_target(cfg, args.vllm_url)
        server.check_tokenizer(text_side)
    except RemoteUnavailable as err:
        print(f"note: {err}; loading the target to serve with this app's own engine", flush=True)
        return None, None
    if args.keep_engine:
        print(f"vLLM backend: {model} at {args.vllm_url}, beside this app's own engine", flush=True)
    else:
        print(f"vLLM backend: {model} at {args.vllm_url} writes every reply; this app loaded {cfg.target}'s "
              "tokenizer and chat template alone (--keep-engine: the target too)", flush=True)
    return server, text_side


def serve(app, host: str, port: int) -> None:
    """Run uvicorn; print the URL once it is accepting connections."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.05)
    if server.started:
        print(f"Running on local URL: http://{host}:{port}", flush=True)
    thread.join()


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    policy, source = THREAD_POLICY
    threads = apply_thread_policy(policy.threads if args.threads is None else args.threads)
    chosen = policy.describe() if args.threads is None else f"{threads} thread(s)"
    print(f"CPU threads: {chosen}, OpenMP wait: {wait_policy()} ({source})", flush=True)
    cfg = target_config_from_args(args, cache_dir=str(Path(args.data_dir) / "cache"))
    try:
        remote, target = connect_backend(args, cfg)
        if target is None or args.keep_engine:
            print(f"Loading target {args.target} …", flush=True)
            target = load_target(cfg)
    except TargetLoadError as err:
        raise SystemExit(f"error: {err}") from err

    import gradio as gr
    from fastapi import FastAPI

    from app.openai_api import add_openai_routes
    from app.service import REMOTE, ChatService
    from app.ui import CSS, build_ui

    network = {"auto": "flashmap"}.get(args.drafter, args.drafter)
    service = ChatService(target, {network: args.weights} if args.weights else None, args.allow_download,
                          data_dir=Path(args.data_dir), thread_policy=policy if args.threads is None else None,
                          remote=remote)
    for name, why in service.unavailable.items() if service.local else ():  # served: connect_backend said why
        print(f"note: {name} drafter unavailable ({why})", flush=True)
    print(f"Forward: {target.precision}", flush=True)
    print(f"Verify-cost curve: {service.curve_status}", flush=True)  # before the re-measurement changes it
    default = REMOTE if service.remote is not None else args.drafter
    if not args.no_measure and service.local:
        service.measure_in_background(default)
    api = FastAPI(title="FlashMap Chat")
    add_openai_routes(api, service, default)
    app = gr.mount_gradio_app(api, build_ui(service, default), path="/", css=CSS)
    serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
