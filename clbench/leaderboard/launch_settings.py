"""A suite file's ``launcher`` section: the defaults of ``--launcher local`` and ``--launcher slurm``.

They say where a suite's runs go, not what they compute, so they are in no run config and no
hash (docs/cluster.md).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from clbench.config.schema import Count, NonNegative, Section
from clbench.config.validation import refuse


def _partition(name: str) -> str:
    if not name.strip():
        raise refuse(f"expected a partition name, got {name!r}", "e.g. partition: gpu")
    return name


class LocalLauncher(Section):
    jobs: Count = None  # type: ignore[assignment]


class SlurmLauncher(Section):
    """``--launcher slurm``'s defaults (docs/cluster.md)."""

    partition: Annotated[str, AfterValidator(_partition)] = None  # type: ignore[assignment]
    gpus_per_node: NonNegative = None  # type: ignore[assignment]
    cpus_per_task: Count = None  # type: ignore[assignment]
    timeout_min: Count = None  # type: ignore[assignment]
    mem_gb: Annotated[float, Field(gt=0)] = None  # type: ignore[assignment]
    jobs: Count = None  # type: ignore[assignment]
    additional: dict[str, str | int | float | bool] = None  # type: ignore[assignment]  # more #SBATCH options
    setup: list[str] = None  # type: ignore[assignment]  # shell lines before each task


class Launchers(Section):
    local: LocalLauncher | None = None
    slurm: SlurmLauncher | None = None
