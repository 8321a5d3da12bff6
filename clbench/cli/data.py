"""``clbench data check BENCHMARK --root DIR``: verify a dataset's on-disk layout."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from clbench.cli.data_check import PROG
from clbench.errors import UserError

if TYPE_CHECKING:
    from clbench.cli.data_check import Summary


def register(sub) -> None:
    p = sub.add_parser("data", help="dataset utilities")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    check = data_sub.add_parser("check", help="verify a dataset's layout and counts, and name what is missing")
    check.add_argument("benchmark", help="benchmark name, e.g. core50, office-home, cifar10-dirichlet")
    # Everything after the name goes to the checker's own parser (argparse inside subparsers
    # cannot take key=value pairs after an option).
    check.add_argument("rest", nargs=argparse.REMAINDER, metavar="--root DIR [key=value ...] [options]")
    check.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    return main([args.benchmark, *args.rest])


def _classes_text(classes: list[int]) -> str:
    if not classes:
        return "0"
    if classes == list(range(classes[0], classes[-1] + 1)) and len(classes) > 2:
        return f"{len(classes)} ({classes[0]}-{classes[-1]})"
    shown = ",".join(map(str, classes[:12])) + (",..." if len(classes) > 12 else "")
    return f"{len(classes)} ({shown})"


def print_summary(summary: "Summary", console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    shape = "x".join(map(str, summary.input_shape))
    kind = f"{summary.num_classes} classes, input {shape}" if summary.num_classes else \
        f"prompt/answer records ({summary.objective})"
    console.print(f"[bold]{summary.benchmark}[/bold] at {summary.root}: stream {summary.stream}, "
                  f"{summary.scenario_type}, {kind}")
    table = Table(show_footer=True)
    table.add_column("#", footer="")
    table.add_column("experience", footer="total")
    table.add_column("domain", justify="right", footer="")
    labelled = bool(summary.num_classes)
    if labelled:
        table.add_column("classes", footer=str(summary.num_classes))
    table.add_column("train", justify="right", footer=str(summary.train_total))
    test_total = summary.experiences[0].test if summary.shared_test else sum(e.test for e in summary.experiences)
    table.add_column("test", justify="right", footer=str(test_total))
    for i, e in enumerate(summary.experiences):
        classes = [_classes_text(e.classes)] if labelled else []
        table.add_row(str(i), e.name, str(e.domain_id), *classes, str(e.train), str(e.test))
    console.print(table)
    if summary.shared_test:
        console.print("every experience is tested on the same test set (counted once in the total)")
    if summary.global_test is not None:
        console.print(f"balanced global test set: {summary.global_test} samples")
    console.print(f"named orders: {', '.join(summary.named_orders)} (or a list of names, or {{permutation: SEED}})")
    if not labelled:
        console.print(f"read all {summary.train_total + test_total} records: each has a prompt and an answer")
    elif summary.images_checked:
        console.print(f"decoded all {summary.images_checked} image files: OK")
    elif summary.images_checked == 0:
        console.print("no image files to decode: the images are read from arrays")
    if summary.speed:
        s = summary.speed
        console.print(f"loader speed: {s['images_per_second']:.0f} training images/s with {s['workers']} workers "
                      f"({s['images_per_second_per_worker']:.0f} per worker, batch {s['batch_size']})")


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as a UserError (one line, exit status 2)."""

    def error(self, message: str):
        raise UserError(message, where=PROG, fix=f"run '{PROG} --help'")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Verify a dataset's on-disk layout and counts; name exactly what is missing.")
    p.add_argument("benchmark", help="benchmark name or import path, e.g. core50, office-home, cifar10-dirichlet")
    p.add_argument("--root", help="the dataset folder (see docs/datasets.md); optional for a benchmark with a default "
                                  "location (fashion-mnist-*: the Debian package's folder, then the cache)")
    p.add_argument("args", nargs="*", metavar="key=value",
                   help="benchmark init_args, YAML values (protocol=ni, objects=[1,2,3], augment.flip=false)")
    p.add_argument("--no-decode", action="store_true", help="check the layout and counts only, do not decode images")
    p.add_argument("--threads", type=int, default=8, help="threads decoding images (default 8)")
    p.add_argument("--speed", type=int, default=0, metavar="N", help="also time N training batches through a loader")
    p.add_argument("--workers", type=int, default=8, help="loader worker processes for --speed (default 8)")
    p.add_argument("--batch-size", type=int, default=128, help="batch size for --speed (default 128)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def parse_init_args(items: list[str]) -> dict:
    from clbench.config.load import apply_overrides

    return apply_overrides({}, items)


def main(args: list[str]) -> int:
    """Entry point of ``clbench data check``: ``args`` are the words after ``data check``."""
    from clbench.cli.data_check import build, measure_speed, summarize, verify

    opts = build_parser().parse_intermixed_args(args)
    init_args = parse_init_args(opts.args)
    if "root" in init_args:
        raise UserError("root is given with --root", where=f"{PROG}: root=", fix="remove the root=... argument")
    spec, experiences = build(opts.benchmark, opts.root, **init_args)
    summary = summarize(opts.benchmark, opts.root, spec, experiences)
    if not opts.no_decode:
        summary.images_checked = verify(experiences, opts.threads)
    if opts.speed > 0 and spec.num_classes is not None:  # the loader-speed probe reads image batches
        summary.speed = measure_speed(experiences[0].train, batches=opts.speed, workers=opts.workers,
                                      batch_size=opts.batch_size)
    if opts.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print_summary(summary)
    return 0
