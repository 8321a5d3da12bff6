"""Adapter scales α/r of run configs, known before any run, and the rule that a suite compares
its adapters at one scale (:func:`check_adapter_scales`, called by the suite's pre-flight check)."""

from __future__ import annotations

from clbench.errors import UserError


def adapter_scales(cfg: dict) -> dict[str, float | None]:
    """The adapter scales α/r a resolved run config trains with, by where they are set: the
    strategy's own adapter (a strategy whose signature has ``r`` and ``alpha``; ``scale`` when
    it has one and it is given) and the model's ``lora`` argument (EWC or GEM on LoRA). None: not
    known before the run (a rank picked by ``match_lora_rank`` under a fixed ``alpha``)."""
    import inspect

    from clbench.models.lm.causal_lm import LORA_DEFAULTS
    from clbench import registry

    out: dict[str, float | None] = {}
    strategy = cfg["strategy"]
    cls = registry.resolve("strategies", strategy["class_path"])
    params = inspect.signature(cls.__init__).parameters if inspect.isclass(cls) else {}
    if "r" in params and "alpha" in params:
        args = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
        args.update(strategy.get("init_args") or {})
        if args.get("scale") is not None:
            out["strategy"] = float(args["scale"])
        elif args.get("match_lora_rank") is not None:
            out["strategy"] = None
        else:
            out["strategy"] = float(args["alpha"]) / float(args["r"])
    lora = (cfg["model"].get("init_args") or {}).get("lora")
    if isinstance(lora, dict):
        settings = {**LORA_DEFAULTS, **lora}
        out["model.lora"] = float(settings["alpha"]) / float(settings["r"])
    return out


def check_adapter_scales(runs: list[tuple[str, dict]], where: str) -> None:
    """Refuse adapters of unequal scale α/r among ``runs`` ((label, resolved config) of runs
    that are compared with each other, e.g. a suite's strategies).

    Why one scale: the adapter's output is multiplied by α/r, and Adam's per-parameter steps are
    about the learning rate whatever the gradient's size, so the change of the adapted function
    per step grows with α/r. Parameter matching gives the methods different ranks (a rank-8
    LoRA, rank-6 LoRAMoE and rank-2 MH-MoE experts); with one α they would take steps up to 4x
    apart, which alone moves what they learn and forget. With α = scale · r and one scale for
    every adapter, they differ only in their structure."""
    scales = list(dict.fromkeys((f"{label}{'' if key == 'strategy' else ' ' + key}", value)
                                for label, cfg in runs for key, value in adapter_scales(cfg).items()))
    if len(scales) < 2:
        return
    unknown = [label for label, value in scales if value is None]
    if unknown:
        raise UserError(f"the adapter scale α/r of {', '.join(unknown)} is not known before the run "
                        "(match_lora_rank picks its rank under a fixed alpha)", where=where,
                        fix="give scale (α/r) instead of alpha, equal to the other adapters' α/r")
    if len({round(value, 9) for _, value in scales}) > 1:
        shown = ", ".join(f"{label} {value:g}" for label, value in scales)
        raise UserError(f"adapters are compared at unequal scales α/r: {shown}", where=where,
                        fix="give every adapter the same α/r (alpha = scale · r; scale for match_lora_rank)")
