"""The tested versions in constraints.txt: write them from an environment, or say what moved.

    python .ci/constraints.py write          pin what this environment has installed of
                                             clbench's dependencies, [dev] included, and
                                             of theirs (constraints.txt's header is kept)
    python .ci/constraints.py drift REPORT   compare a `pip install --report REPORT` (what
                                             an install without the pins resolved to) with
                                             the pins; prints one line per difference

Only the dependency closure is pinned, not everything that happens to be installed, so a
package installed by hand does not end up in the file. Markers are evaluated for this
machine: a dependency that only another platform needs is not pinned (pip then resolves it
freely there).
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
PINS_START = "# ---- pins"


def _top_level() -> list[Requirement]:
    """pyproject.toml's dependencies and its dev extra (the README's install command)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata says the same after `pip install -e .`
        dist = metadata.distribution("clbench")
        reqs = [Requirement(r) for r in dist.requires or []]
        return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": "dev"})]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def installed_closure() -> dict[str, str]:
    """Installed name -> version for every package the top-level requirements pull in."""
    dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
    pinned: dict[str, str] = {}
    todo = [(r, {""}) for r in _top_level()]
    seen = set()
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        dist = dists.get(name)
        if dist is None:
            sys.exit(f"constraints: {req.name} is required but not installed in {sys.prefix} "
                     "(install the project first: pip install -e \".[dev]\")")
        pinned[dist.metadata["Name"]] = dist.version
        todo += [(Requirement(r), set(req.extras) | {""}) for r in dist.requires or []]
    pinned.pop("clbench", None)
    return pinned


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def write() -> None:
    text = CONSTRAINTS.read_text() if CONSTRAINTS.exists() else ""
    header = text[:text.index(PINS_START)] if PINS_START in text else text
    pins = installed_closure()
    body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=str.lower))
    CONSTRAINTS.write_text(f"{header}{PINS_START} (python .ci/constraints.py write)\n{body}")
    print(f"constraints: wrote {len(pins)} pins to {CONSTRAINTS}")


def drift(report: Path) -> None:
    pins = read_pins()
    resolved = {canonicalize_name(item["metadata"]["name"]): (item["metadata"]["name"], item["metadata"]["version"])
                for item in json.loads(report.read_text())["install"]}
    lines = []
    for key, (name, version) in sorted(resolved.items()):
        if key == "clbench":
            continue
        if key not in pins:
            lines.append(f"  {name} {version} (not pinned)")
        elif version.split("+")[0] != pins[key].split("+")[0]:
            lines.append(f"  {name} {pins[key]} -> {version}")
    if lines:
        print(f"constraints: without the pins, a fresh install resolves {len(lines)} package(s) differently:")
        print("\n".join(lines))
        print("constraints: to move the pins, run the tests in such an environment (CLBENCH_CI_UNPINNED=1 "
              "bash .ci/run), then 'python .ci/constraints.py write' in it")
    else:
        print("constraints: a fresh install without the pins resolves to the pinned versions")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write()
    elif sys.argv[1:2] == ["drift"] and len(sys.argv) == 3:
        drift(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
