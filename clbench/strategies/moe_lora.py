"""LoRAMoE and MH-MoE: mixtures of LoRA experts on a frozen causal LM, trained on every task in turn.

Both replace the targeted linear modules of the frozen model by
:class:`clbench.models.layers.moe_lora.MoELoRALinear` (see there for the layer, its gating and the
top-1 router-gradient choice) in :meth:`adapt_model`, and train only the experts and routers over the
whole stream: no task ids, boundaries or replay (MH-MoE, Sec. 5.1 and App. A.3.4).

* ``loramoe`` (Dou et al. 2024): one router over the module's input, K LoRA experts. Default
  K = 4, top-1: MH-MoE's Table 1 baseline. ``top_k=None`` gives LoRAMoE's published dense
  softmax gating; ``balance_weight`` its localized balancing constraint (δ = 0 by default;
  ``balance_delta`` = δ with ``knowledge_tasks`` naming the tasks of LoRAMoE's "world knowledge"
  type, whose samples favour the first half of the experts).
* ``mh_moe`` (MH-MoE, Algorithm 1): the input split into ``heads`` contiguous slices, each
  with its own router and K = 4 private LoRA experts, top-1 per head, head outputs summed and
  added to the frozen base (the additive reading of "LoRA-style" experts, App. A.3.3).

Targets: the MLP's linear modules (the paper attaches experts "to the linear modules in the MLP
layers"; which ones is not given): ``gate_proj``, ``up_proj`` and ``down_proj``, the modules of
LoRAMoE's released code. The down projection's input is the MLP's intermediate activation;
MH-MoE splits it like any input (App. A.3.3, item 2). Every transformer layer is adapted unless
``layers`` is given.

Budget: the paper tunes ranks "so that the number of activated parameters is comparable across
methods". ``r`` sets the rank directly; ``match_lora_rank=r0`` instead picks, at setup, the rank
whose active parameters per token (experts used + routers,
:func:`~clbench.models.layers.moe_lora.param_counts`) over the adapted modules come closest to those
of one plain LoRA of rank r0 on the same modules. ``active_params`` and ``total_params`` are
then set on the strategy (and recorded through :meth:`hparams`). Matching changes the rank, so
a fixed α would change the scale α/r with it (α = 16: 8 at r = 2, 2 at r = 8) and, under Adam,
the size of the steps in function space; ``scale`` fixes α/r instead (α = scale · r, recorded
as ``alpha``), as the suites do to compare adapters on equal footing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clbench import ArgumentError, Strategy
from clbench.models.layers import moe_lora as moe_layers
from clbench.models.layers.adapted import matching_linears
from clbench.strategies.lora import lora_target, refuse_other_adapters

MLP = ["gate_proj", "up_proj", "down_proj"]

# The arguments' types and ranges, shared by both methods' signatures and checked from the config.
Count = Annotated[int, Field(ge=1)]
Scale = Annotated[float, Field(gt=0)]
Weight = Annotated[float, Field(ge=0)]
Rate = Annotated[float, Field(ge=0, lt=1)]
ModuleNames = Annotated[list[str], Field(min_length=1)]
LayerIndices = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Top1Gate = Literal["probability", "renormalized"]  # moe_layers.TOP1_GATES (a test keeps them equal)


class _MoELoRA(Strategy):
    kind = "loramoe"
    supports_distributed = True  # experts and routers are created from the same seeded RNG on every rank
    supports_sharded = True  # layers are injected before anything runs, so before sharding

    def __init__(self, num_experts: Count = 4, top_k: Count | None = 1, r: Count = 4, alpha: Scale = 16.0,
                 heads: Count = 1, match_lora_rank: Count | None = None, top1_gate: Top1Gate = "probability",
                 dropout: Rate = 0.0, balance_weight: Weight = 0.0, target_modules: ModuleNames | None = None,
                 layers: LayerIndices | None = None, balance_delta: Rate = 0.0,
                 knowledge_tasks: list[str] | None = None, scale: Scale | None = None):
        super().__init__()
        # Each argument's type and range is declared above and checked from the config
        # (clbench.config.validation); what depends on two arguments or on the method is checked here.
        checks = [
            ("top_k", top_k is None or top_k <= num_experts,
             f"an integer in [1, num_experts = {num_experts}]" + (", or null for dense gating"
                                                                  if self.kind == "loramoe" else "")),
            ("heads", self.kind == "mh_moe" or heads == 1,
             "1 for loramoe; for mh_moe a divisor of the adapted modules' input widths"),
        ]
        if self.kind == "mh_moe" and top_k is None:
            checks.append(("top_k", False, "an integer: MH-MoE routes top-k within each head"))
        if balance_delta:
            checks += [("balance_delta", num_experts % 2 == 0,
                        "0, or an even num_experts: the type-wise term splits the experts in halves"),
                       ("knowledge_tasks", knowledge_tasks is not None,
                        "the names of the world-knowledge tasks (type 1) when balance_delta > 0")]
        for name, ok, fix in checks:
            if not ok:
                value = {"top_k": top_k, "heads": heads, "balance_delta": balance_delta,
                         "knowledge_tasks": knowledge_tasks}[name]
                raise ArgumentError("strategy", name, f"{name} = {value!r} is not valid for {self.kind}",
                                    fix=f"give {fix}")
        self.num_experts, self.top_k, self.r, self.alpha, self.heads = num_experts, top_k, r, alpha, heads
        self.match_lora_rank, self.top1_gate, self.dropout = match_lora_rank, top1_gate, dropout
        self.balance_weight, self.target_modules, self.layers = balance_weight, target_modules, layers
        self.balance_delta, self.knowledge_tasks = balance_delta, knowledge_tasks
        self.scale = scale
        self.active_params: int | None = None
        self.total_params: int | None = None

    def layer_args(self) -> dict:
        return {"kind": self.kind, "num_experts": self.num_experts, "top_k": self.top_k, "heads": self.heads}

    def diagnostics(self):
        return {"active_params": self.active_params, "total_params": self.total_params}

    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        refuse_other_adapters(ctx.model, self.kind)
        unknown = sorted(set(self.knowledge_tasks or ()) - {e.name for e in experiences})
        if unknown:
            raise ArgumentError("strategy", "knowledge_tasks", f"{unknown} are not tasks of this stream",
                                fix=f"name tasks among {sorted(e.name for e in experiences)}")
        target = lora_target(ctx.model)
        found = matching_linears(target, self.target_modules or MLP, self.layers)
        if not found:
            raise ArgumentError("strategy", "target_modules", f"{self.kind}: no linear module named "
                                f"{self.target_modules or MLP} to adapt",
                                fix="name the model's linear layers, e.g. [gate_proj, up_proj, down_proj]")
        shapes = [(m.in_features, m.out_features) for _, m in found]
        bad = sorted({i for i, _ in shapes if i % self.heads})
        if bad:
            raise ArgumentError("strategy", "heads", f"heads = {self.heads} does not divide the input widths {bad}",
                                fix="give a common divisor of the input widths")
        if self.match_lora_rank is not None:
            budget = sum(moe_layers.param_counts(i, o, kind="lora", num_experts=1, top_k=1,
                                                   r=self.match_lora_rank)["active"] for i, o in shapes)
            self.r = moe_layers.rank_for_budget(budget, shapes, **self.layer_args())
        if self.scale is not None:  # α follows the rank, so the adapter scale α/r is the one given
            self.alpha = self.scale * self.r
        counts = [moe_layers.param_counts(i, o, r=self.r, **self.layer_args()) for i, o in shapes]
        self.active_params = sum(c["active"] for c in counts)
        self.total_params = sum(c["total"] for c in counts)

    def adapt_model(self, ctx, upto):
        """The mixture layers, injected once (before the first evaluation)."""
        model = ctx.model
        target = lora_target(model)
        if moe_layers.moe_layers(target):
            return
        moe_layers.inject(target, self.target_modules or MLP, self.layers, r=self.r, alpha=self.alpha,
                            top1_gate=self.top1_gate, dropout=self.dropout, balance_weight=self.balance_weight,
                            balance_delta=self.balance_delta, **self.layer_args())
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)

    def before_experience(self, ctx, experience):
        """The experience's LoRAMoE task type (1 for a world-knowledge task) on every layer, for
        the type-wise balancing term: each experience is one task, so one type for its batches."""
        kind = int(experience.name in (self.knowledge_tasks or ()))
        for layer in moe_layers.moe_layers(lora_target(ctx.model)):
            layer.sample_type = kind

    def state_dict(self):
        return {"r": self.r}

    def load_state_dict(self, state):
        self.r = int(state["r"])
        if self.scale is not None:
            self.alpha = self.scale * self.r


class LoRAMoE(_MoELoRA):
    """LoRAMoE: frozen base + K LoRA experts under one router per adapted module.

    Args:
        num_experts: K (4, MH-MoE's Table 1 baseline; LoRAMoE's code uses 8).
        top_k: experts per token, renormalised softmax over them; ``None`` for dense softmax gating.
        r, alpha: each expert's rank and α (scale α/r); ``match_lora_rank`` overrides ``r``.
        scale: the adapter scale α/r itself; α = scale · r once the rank is known, so a matched
            rank keeps the scale of the LoRA it is matched to (suites compare adapters at one
            α/r: :func:`clbench.leaderboard.adapter_scales.check_adapter_scales`).
        top1_gate: with top-1, ``"probability"`` (Switch-style p_j, the router learns) or
            ``"renormalized"`` (weight ≡ 1, router frozen in effect).
        dropout: on the experts' input. balance_weight: weight of the localized balancing term
            (LoRAMoE's ``blc_weight``). balance_delta: its δ (``blc_alpha``); knowledge_tasks: the
            tasks whose samples are of the world-knowledge type (needed when δ > 0).
        target_modules, layers: which linear modules, in which transformer layers.
    """

    kind = "loramoe"


class MHMoE(_MoELoRA):
    """MH-MoE: ``heads`` input slices, each with its own router and K private LoRA experts.

    Args as :class:`LoRAMoE`, plus ``heads`` (H; must divide every adapted input width); the
    defaults are the paper's K = 4 private experts per head, top-1.
    """

    kind = "mh_moe"

    def __init__(self, num_experts: Count = 4, top_k: Count | None = 1, r: Count = 4, alpha: Scale = 16.0,
                 heads: Count = 4, match_lora_rank: Count | None = None, top1_gate: Top1Gate = "probability",
                 dropout: Rate = 0.0, balance_weight: Weight = 0.0, target_modules: ModuleNames | None = None,
                 layers: LayerIndices | None = None, balance_delta: Rate = 0.0,
                 knowledge_tasks: list[str] | None = None, scale: Scale | None = None):
        super().__init__(num_experts, top_k, r, alpha, heads, match_lora_rank, top1_gate, dropout,
                         balance_weight, target_modules, layers, balance_delta, knowledge_tasks, scale)
