"""FlashMap Chat: `python app.py`, then open the printed local URL.

Loads the target (the embedded SmolLM2-135M-Instruct by default, offline), its drafters, measures
plain decoding speed on this machine, and serves the UI on 127.0.0.1 (no share links).
"""
from __future__ import annotations

import argparse

from app.target import TargetLoadError, add_target_args, load_target, target_config_from_args


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    add_target_args(parser)
    parser.add_argument("--drafter", default="flashmap", choices=["flashmap", "dflash", "ngram", "none"])
    parser.add_argument("--weights", default=None, help="drafter checkpoint folder or hub id for --drafter")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from app.service import ChatService
    from app.ui import CSS, build_ui

    print(f"Loading target {args.target} …", flush=True)
    try:
        target = load_target(target_config_from_args(args))
    except TargetLoadError as err:
        raise SystemExit(f"error: {err}") from err
    service = ChatService(target, {args.drafter: args.weights} if args.weights else None, args.allow_download)
    for name, why in service.unavailable.items():
        print(f"note: {name} drafter unavailable ({why})", flush=True)
    print(f"Measuring plain decoding on this machine: {service.calibrate_plain():.1f} tokens/s", flush=True)
    curve = service.calibrate_verify_cost()
    print(f"Verify cost of 2 / 9 / 17 positions: {curve[1]:.2f} / {curve[8]:.2f} / {curve[16]:.2f} x one", flush=True)
    demo = build_ui(service, args.drafter)
    demo.launch(server_name=args.host, server_port=args.port, share=False, css=CSS)


if __name__ == "__main__":
    main()
