"""Start-up breakdown of one ``clbench run``: library imports versus the harness's own set-up.

A run's start-up is everything before its first training or evaluation loop. Each round starts
two fresh processes, in alternating order:

* *warm*: first imports every library module that such a run imports, grouped by library in
  dependency order (each figure is what that library adds to the ones above it), then runs
  the command; its phases are then the harness's own cost;
* *cold*: runs the command with nothing imported, so each library import falls inside the
  phase that first needs it (what a profile of a plain ``clbench run`` shows).

The command is ``clbench.cli.main.main(["run", ...])`` stopped at the first ``Trainer.fit`` or
``Trainer.validate``. Phases are exclusive (a phase nested in another is not counted twice);
"other set-up" is the rest (argument parsing, output checks, Trainer arguments, loaders, the
strategy's set-up). A first, untimed process lists the modules a run imports.

    python perf/startup.py [--config configs/examples/digits-domains-replay.yaml] [--rounds 5]
                           [--threads 1] [override ...]      (default override: train.epochs=1)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
BASELINE = set(sys.modules)  # the interpreter's own modules and this script's

HARNESS = ("clbench", "benchmarks", "strategies")
# Dependency order: a library's figure excludes what the libraries above it already imported.
LIBRARIES = ("numpy", "torch", "torchvision", "torchmetrics", "lightning", "tensorboard", "sklearn", "avalanche")
OTHERS = "others (stdlib, smaller packages)"


class _Done(BaseException):
    """Raised at the first training/evaluation loop: start-up is over."""


class Phases:
    """Exclusive wall-clock time per label; time outside every wrapped call is 'other set-up'."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack = ["other set-up"]
        self.last = time.perf_counter()

    def _switch(self) -> None:
        now = time.perf_counter()
        self.seconds[self.stack[-1]] = self.seconds.get(self.stack[-1], 0.0) + now - self.last
        self.last = now

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._switch()
            self.stack.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self._switch()
                self.stack.pop()

        return timed


def when_imported(name: str, patch) -> None:
    """Call ``patch(module)`` once module ``name`` has executed (now, if it already has)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return

    class Hook:
        @staticmethod
        def find_spec(fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(Hook)
            spec = importlib.util.find_spec(fullname)
            if spec is not None and spec.loader is not None:
                run_module = spec.loader.exec_module

                def exec_module(module):
                    run_module(module)
                    patch(module)

                spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook)


def instrument(phases: Phases) -> None:
    def on_attr(module, attr: str, label: str) -> None:
        if hasattr(module, attr):
            setattr(module, attr, phases.wrap(label, getattr(module, attr)))

    def on_init(cls, label: str) -> None:
        if cls is not None:
            cls.__init__ = phases.wrap(label, cls.__init__)

    def stop(*args, **kwargs):
        raise _Done

    def trainer(module) -> None:
        on_init(module.Trainer, "Trainer set-up")
        module.Trainer.fit = module.Trainer.validate = stop

    when_imported("clbench.config.load", lambda m: on_attr(m, "load_config", "config load"))
    when_imported("clbench.plugins.build", lambda m: [on_attr(m, "preflight", "preflight"),
                                              on_attr(m, "build_strategy", "strategy build"),
                                              on_attr(m, "build_benchmark", "stream build"),
                                              on_attr(m, "build_model", "model build")])
    when_imported("clbench.data.streams", lambda m: [on_attr(m, "spec_of", "stream build"),
                                                on_attr(m, "ordered_experiences", "stream build")])
    when_imported("clbench.engine.module", lambda m: on_init(getattr(m, "ContinualModule", None), "module set-up"))
    when_imported("lightning.pytorch.trainer.trainer", trainer)


def library_of(name: str) -> str:
    top = name.split(".")[0]
    return top if top in LIBRARIES else OTHERS


def import_libraries(modules: list[str]) -> dict[str, float]:
    """Import ``modules`` library by library; seconds per library."""
    seconds = {}
    for group in (*LIBRARIES, OTHERS):
        names = [m for m in modules if library_of(m) == group]
        if not names:
            continue
        t0 = time.perf_counter()
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001  (a module registered under an alias, a private shim)
                pass
        seconds[group] = time.perf_counter() - t0
    return seconds


def child(args: argparse.Namespace) -> None:
    modules = json.loads(Path(args.modules).read_text()) if args.mode == "warm" else []
    imports = import_libraries(modules)
    phases = Phases()
    instrument(phases)
    from clbench.cli.main import build_parser, main

    output = tempfile.mkdtemp(prefix="clbench-startup-")
    argv = ["run", "-c", args.config, "-o", str(Path(output) / "run"), "--no-progress"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args([*argv, "--threads", str(args.threads)])
        argv += ["--threads", str(args.threads)]
    except SystemExit:  # a clbench without --threads: OMP_NUM_THREADS (set by the parent) applies
        pass
    phases.last = time.perf_counter()
    try:
        main([*argv, *args.overrides])
        raise SystemExit("the run finished without reaching a training or evaluation loop")
    except _Done:
        phases._switch()
    record = {"imports": imports, "phases": phases.seconds, "process": time.perf_counter() - START}
    if args.mode == "discover":
        harness = tuple(f"{h}." for h in HARNESS)
        record["modules"] = [m for m in sys.modules if m not in BASELINE and m not in HARNESS
                             and not m.startswith(harness) and not m.startswith(("clbench_user_", "__"))]
    Path(args.out).write_text(json.dumps(record))


def spawn(mode: str, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / f"{mode}.json"
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--child", mode, "--out", str(out), "--modules", str(workdir / "modules.json"),
           "--config", args.config, "--threads", str(args.threads), *args.overrides]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        sys.exit(f"{mode} process failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def table(title: str, rows: dict[str, list[float]]) -> None:
    rounds = len(next(iter(rows.values())))
    print(f"\n{title}")
    print(f"  {'':<36}" + "".join(f"{'r' + str(i + 1):>8}" for i in range(rounds)) + f"{'median':>9}")
    for label, values in rows.items():
        print(f"  {label:<36}" + "".join(f"{v:8.2f}" for v in values) + f"{statistics.median(values):9.2f}")


def collect(records: list[dict], key: str, order: list[str]) -> dict[str, list[float]]:
    rows = {label: [r[key].get(label, 0.0) for r in records] for label in order}
    rows["total"] = [sum(r[key].values()) for r in records]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/examples/digits-domains-replay.yaml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every process")
    parser.add_argument("--child", choices=["discover", "warm", "cold"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--modules", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        child(args)
        return
    args.overrides = args.overrides or ["train.epochs=1"]

    with tempfile.TemporaryDirectory(prefix="clbench-startup-") as tmp:
        workdir = Path(tmp)
        modules = spawn("discover", args, workdir)["modules"]  # untimed; also warms the file cache
        (workdir / "modules.json").write_text(json.dumps(modules))
        warm, cold = [], []
        for i in range(args.rounds):
            for mode in (("warm", "cold") if i % 2 == 0 else ("cold", "warm")):
                (warm if mode == "warm" else cold).append(spawn(mode, args, workdir))

    libraries = [g for g in (*LIBRARIES, OTHERS) if any(g in r["imports"] for r in warm)]
    phase_order = ["config load", "preflight", "strategy build", "stream build", "model build", "module set-up",
                   "Trainer set-up", "other set-up"]
    print(f"start-up of `clbench run -c {args.config} {' '.join(args.overrides)}` up to its first loop; "
          f"{args.rounds} rounds, fresh processes, torch threads {args.threads}; seconds")
    print(f"{len(modules)} library modules imported by the run")
    table("libraries, imported first (warm process)", collect(warm, "imports", libraries))
    own = collect(warm, "phases", phase_order)
    table("the harness's own set-up, libraries already imported (warm process)", own)
    table("the same set-up in a cold process (library imports inside the phases)", collect(cold, "phases", phase_order))
    total = [r["process"] for r in cold]
    print(f"\ncold process, start to first loop: median {statistics.median(total):.2f} s; "
          f"harness's own part: median {statistics.median(own['total']):.2f} s (target < 1.5 s)")


if __name__ == "__main__":
    main()
