"""``clbench run --config PATH --output DIR [key.path=value ...]``: one continual run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("run", help="run one config through its stream and write DIR/result.json",
                       description="Run one config; overrides like train.epochs=5 or "
                                   "strategy.init_args.mem_size=500 follow the options.")
    p.add_argument("--config", "-c", required=True, help="YAML run config")
    p.add_argument("--output", "-o", required=True, help="output directory (result.json, tensorboard/, checkpoint)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from clbench.config import load_config

    cfg = load_config(args.config, args.overrides)
    from clbench.runner import run  # heavy imports only once the config is known to be valid

    result = run(cfg, Path(args.output), source=args.config, resume=args.resume, overwrite=args.overwrite,
                 progress=False if args.no_progress else None)
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
        from clbench.report import print_result

        print_result(result, Path(args.output))
    return 0
