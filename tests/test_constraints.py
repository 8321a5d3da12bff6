"""constraints.txt, the tested versions: it pins every dependency within what pyproject.toml
allows, and the README's install command and CI use it."""

from __future__ import annotations

import re

import pytest

from helpers import REPO

tomllib = pytest.importorskip("tomllib")
packaging_requirements = pytest.importorskip("packaging.requirements")


def _pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"not a plain pin: {line!r}"
            name, version = line.split("==")
            assert canonicalize_name(name) not in pins, f"{name} pinned twice"
            pins[canonicalize_name(name)] = version
    return pins


def test_every_dependency_is_pinned_within_what_pyproject_allows():
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = packaging_requirements.Requirement(text)
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, (f"{req.name} is a dependency but constraints.txt does not pin it (install it, "
                                    "then 'python .ci/constraints.py write' in the environment the tests pass in)")
        assert req.specifier.contains(pinned, prereleases=True), \
            f"constraints.txt pins {req.name}=={pinned}, outside pyproject.toml's {req}"
    assert "clbench" not in pins


def test_readme_and_ci_install_with_the_pins():
    readme = (REPO / "README.md").read_text()
    installs = [line for line in readme.splitlines() if line.startswith("pip install -e \".[dev]\"")]
    assert installs and all("-c constraints.txt" in line for line in installs)
    ci = (REPO / ".ci" / "run").read_text()
    assert "-c constraints.txt" in ci and "cat constraints.txt" in ci  # installed with, and in the cache key
