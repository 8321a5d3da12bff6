"""``clbench run --config PATH --output DIR [key.path=value ...]``: one continual run."""

from __future__ import annotations

import argparse
from pathlib import Path

from clbench.limits import AUTO, FEW_CORES


def _threads(value: str) -> int | str:
    if value == AUTO:
        return value
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}")
    return number


def register(sub) -> None:
    p = sub.add_parser("run", help="run one config through its stream and write DIR/result.json",
                       description="Run one config; overrides like train.epochs=5 or "
                                   "strategy.init_args.mem_size=500 may go before, between or after the options.")
    p.intermixed = True
    p.add_argument("--config", "-c", required=True, help="YAML run config")
    p.add_argument("--output", "-o", required=True, help="output directory (result.json, tensorboard/, checkpoint)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run in --output")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--print-config", action="store_true",
                   help="check the config and its overrides, print the resolved config as YAML and exit "
                        "without training (a dry run)")
    p.add_argument("--threads", type=_threads, default=AUTO, metavar="N",
                   help="torch CPU threads per process (recorded as env.torch_threads; CPU results can "
                        f"depend on it). Default 'auto': 1 on fewer than {FEW_CORES} usable cores, else the "
                        "physical cores divided by trainer.devices. Resume with the same value.")
    p.add_argument("--cpu-kernels", default="native", metavar="LEVEL",
                   help="pin the CPU kernels (ATen, MKL, oneDNN) to one instruction-set level: avx2 gives the "
                        "same floats on every x86-64 CPU of one vendor with AVX2; default native (each "
                        "library picks by this CPU). Recorded as env.cpu.pin. Resume with the same value.")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from clbench.cli import check_folder
    from clbench.config.load import blame_overrides, load_config
    from clbench.errors import UserError

    check_folder(args.output, "--output")
    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        import yaml

        from clbench.plugins.build import preflight

        preflight(cfg, args.config)  # imports the components and checks their init_args: nothing is built
        print(yaml.safe_dump(cfg, sort_keys=False), end="")
        return 0
    from clbench.limits import decide_threads, torch_threads

    threads = decide_threads(args.threads, cfg["trainer"], where="--threads", field="--threads")
    from clbench.cpu_kernels import pin_for_run

    pin_for_run(args.cpu_kernels, where="--cpu-kernels")  # before the first tensor operation
    from clbench.engine.runner import run  # heavy imports only once the config is known to be valid

    try:
        with torch_threads(threads):
            result = run(cfg, Path(args.output), source=args.config, resume=args.resume, overwrite=args.overwrite,
                         progress=False if args.no_progress else None)
    except UserError as err:  # a component's check of a value the command line set: blame the command line
        raise blame_overrides(err, args.config, args.overrides) from None
    from clbench.engine.outputs import launched_as_rank_zero

    if launched_as_rank_zero():  # only the global rank 0 reports
        from clbench.results.report import print_result

        print_result(result, Path(args.output))
    return 0
