"""MoSEs: Mixtures of SubExperts with per-task masks, prompts and keys on a frozen causal LM.

:class:`~clbench.models.layers.moses.MoSELinear` replaces the targeted attention projections (the
layer, its masks and the straight-through estimator are described there). Per task t the
strategy keeps a binary mask set m^t in every layer, a prompt e_t (L_e × D) and a key k_t (D),
all stored by the experience's **name** in a slot table (``slots``), so any task order works.

Training task t (Algorithm 1): the task id is the experience being trained. At its start the
score tensors s and the router entries no earlier task's mask uses are re-initialised ("we
reinitialize the gating and expert score parameters s at the beginning of each new task"; the
entries earlier masks use are kept, or those tasks would lose their routing). Each step trains
the masked experts, router, scores, e_t and k_t on

    L = L_task + λ_pull · L_pull,   L_pull = −(1/B) Σ_i cos(q(x_i), k_t)   (λ_pull = 0.1)

the single-key reading of Eq. 7 (the prose: "one selected prompt key per sample"; the printed
average over all tasks would pull every key toward every task's inputs and defeat matching).
After every optimizer step the live top-c masks are stored in slot t.

Choices where the paper is silent or self-contradictory (see also the layer's module):

* **Protection** (``protect``). The paper says masks are chosen "without freezing previously
  learned parameters" yet claims to "isolate and protect knowledge". With ``protect=True`` (the
  default) the weights an earlier task's mask selected are restored after every optimizer step
  (WSN, which the masks follow, freezes them), so earlier tasks' sub-networks stay bit-identical
  while new masks may still reuse them; ``protect=False`` is the literal reading (shared
  weights drift).
* **Prompt placement** (``deep_prompts``). Eq. 6 prepends a task prompt e_t^l to the input of
  every prompted layer: x̃ = [e_t^l; x^l]. With ``deep_prompts=True`` (the default) that is what
  happens: a forward hook on the decoder prepends L_e positions to the input embeddings (e_t^0,
  extending the attention mask and position ids, and stripping them from the output), and a
  pre-hook on every prompted decoder layer above the first overwrites those positions' hidden
  states with that layer's own e_t^l, so each layer's attention (and its MoSE projections) sees
  [e_t^l; x^l]. The prompted layers are the adapted ones (``layers``; the paper's start_e..end_e
  are not given, B.3.5). In KV-cached generation the prefix exists only in the first forward; its
  keys and values, computed from each layer's own prompt, stay in the cache. With
  ``deep_prompts=False`` only the embedding-level prefix is learned (prompt tuning).
* **Query feature** q(x): the mean of the frozen base's input embeddings over the prompt tokens
  (attention mask, and labels = −100 in training). It needs no extra forward pass and is fixed,
  so keys chase a stationary target.
* **Task inference** (``task_inference``): ``"keys"`` (TaIL, the paper's main setting) picks per
  sample the trained task whose key has the highest cosine with q(x) (Algorithm 2; γ read as a
  cosine distance). ``"oracle"`` (TiL) uses the evaluated column's task, named by the strategy's
  ``evaluating`` context around each test batch. A column with no trained task yet (the R
  matrix's upper triangle) falls back to key matching. The task is chosen once per input, in
  the forward that sees its prompt, and kept for every generated token: Algorithm 2 matches
  q(x) once per input x and answers with that task's prompt and masks. (Re-matching at each
  decoding step from the newest token alone, what happened when the cache went unrecognised,
  lets an answer drift to another task's sub-network mid-sequence: it turned the trace-mini-moe
  rows' BWT from 0.0 into -5.5.) After every stage :meth:`MoSEs.identification` measures the
  keys' task-identification accuracy on the test prompts of the tasks trained so far, recorded
  as ``strategy.diagnostics.task_identification``: with ``protect`` it is what decides BWT (a
  prompt routed to its own key meets its task's unchanged sub-network and prompt).
* Keys are initialised N(0, 0.02²) like the embeddings, prompts likewise.
* Targets: ``q_proj`` and ``v_proj`` of every layer by default (the paper adapts "the
  Self-Attention layer" without naming projections; its LoRA baseline count fits two 4096×4096
  projections); the paper's W/O[0-1] is ``layers: [2, …, 31]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from clbench import ArgumentError, Strategy
from clbench.models.layers import moses as moses_layers
from clbench.models.layers.moses import TaskState
from clbench.strategies.lora import lora_target, refuse_other_adapters

IGNORE = -100
IDENTIFY_BATCH = 64  # test prompts embedded at once when measuring task identification
INFERENCE = ("keys", "oracle")
_COLUMN: contextvars.ContextVar[str | None] = contextvars.ContextVar("moses_column", default=None)


class TaskPrompts(nn.Module):
    """Per task slot: a prompt of ``depth`` × L_e × D (entry 0 at the input embeddings, entry i
    at the input of the i-th deeper prompted layer) and a key (D)."""

    def __init__(self, num_tasks: int, length: int, dim: int, depth: int = 1, device=None):
        super().__init__()
        self.prompt = nn.ParameterList([nn.Parameter(torch.randn(depth, length, dim, device=device) * 0.02)
                                        for _ in range(num_tasks)])
        self.key = nn.ParameterList([nn.Parameter(torch.randn(dim, device=device) * 0.02)
                                     for _ in range(num_tasks)])


def query(embed: nn.Module, input_ids: Tensor, mask: Tensor | None) -> Tensor:
    """q(x): the mean of the frozen input embeddings over the tokens where ``mask`` is set."""
    with torch.no_grad():
        emb = embed(input_ids).float()
        mask = torch.ones_like(input_ids) if mask is None else mask
        weights = mask.to(emb.dtype).unsqueeze(-1)
        return (emb * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def pull_loss(queries: Tensor, key: Tensor) -> Tensor:
    """Eq. 7, single-key reading: −mean_i cos(q_i, k)."""
    return -(F.normalize(queries, dim=-1) @ F.normalize(key.float(), dim=-1)).mean()


def match(queries: Tensor, keys: Tensor) -> Tensor:
    """Index of the key with the highest cosine for every query (Algorithm 2, step 2)."""
    return (F.normalize(queries, dim=-1) @ F.normalize(keys.float(), dim=-1).T).argmax(-1)


def _prefill(kwargs: dict) -> bool:
    """Whether this decoder forward starts a sequence (no cached positions yet): only then is the
    prompt prefix prepended. The KV cache arrives as ``cache`` (transformers >= 5) or
    ``past_key_values`` (4.x); a later decoding step must not prepend the prefix again, its keys
    and values are already in the cache."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    return cache is None or cache.get_seq_length() == 0


def _shift(positions: Tensor, length: int, first: bool) -> Tensor:
    """Positions (..., S) moved past the L_e prefix positions; in the first forward the prefix's own
    positions 0..L_e-1 are prepended."""
    shifted = positions + length
    if not first:
        return shifted
    prefix = torch.arange(length, device=positions.device, dtype=positions.dtype)
    return torch.cat([prefix.expand(*positions.shape[:-1], length), shifted], dim=-1)


class MoSEs(Strategy):
    """MoSEs on the attention projections of a frozen causal LM.

    Args:
        num_experts, top_k: N sub-experts per layer and how many each token uses (E2T2: 2, 2).
        r, alpha: each sub-expert's rank and α (β = α/r; the paper's r = 2, α = 8).
        density: c, the kept fraction of each weight tensor per task (0.29–0.30 in the paper).
        prompt_length: L_e. pull_weight: λ_pull.
        deep_prompts: a prompt at the input of every prompted layer (Eq. 6), not only at the
            input embeddings (see the module docstring).
        task_inference: ``"keys"`` (task-agnostic, key matching) or ``"oracle"`` (task id given).
        protect: keep earlier tasks' masked weights fixed (see the module docstring).
        target_modules, layers: which linear modules, in which transformer layers (null: all).
    """

    supports_distributed = True  # layers, prompts, keys and per-task resets use the same seeded RNG on every rank
    supports_sharded = False  # its per-task resets and masks address whole weight tensors
    requires = frozenset({"language_model"})  # task prompts on a decoder's input embeddings

    def __init__(self, num_experts: Annotated[int, Field(ge=1)] = 2, top_k: Annotated[int, Field(ge=1)] = 2,
                 r: Annotated[int, Field(ge=1)] = 2, alpha: Annotated[float, Field(gt=0)] = 8.0,
                 density: Annotated[float, Field(gt=0, le=1)] = 0.3, prompt_length: Annotated[int, Field(ge=0)] = 1,
                 pull_weight: Annotated[float, Field(ge=0)] = 0.1, task_inference: Literal["keys", "oracle"] = "keys",
                 protect: bool = True, target_modules: Annotated[list[str], Field(min_length=1)] | None = None,
                 layers: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None,
                 deep_prompts: bool = True):
        super().__init__()
        # Types and ranges are declared above and checked from the config (clbench.config.validation).
        if top_k > num_experts:
            raise ArgumentError("strategy", "top_k", f"top_k = {top_k} is more than num_experts = {num_experts}",
                                fix=f"give an integer in [1, {num_experts}]")
        self.num_experts, self.top_k, self.r, self.alpha, self.density = num_experts, top_k, r, alpha, density
        self.prompt_length, self.pull_weight, self.task_inference = prompt_length, pull_weight, task_inference
        self.protect, self.target_modules, self.layers = protect, target_modules, layers
        self.deep_prompts = deep_prompts
        self._slots: Tensor | None = None  # the current forward's task slot per sample
        self.slots: dict[str, int] = {}   # experience name -> task slot, in training order
        self.state = TaskState()
        self.prompts: TaskPrompts | None = None
        self.total_params: int | None = None
        self._strip = False
        self._frozen: list[tuple[Any, dict, dict]] = []
        self.task_identification: list[dict[str, Any]] = []  # per stage, after its evaluation

    # -- set-up and injection ---------------------------------------------------------------
    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        refuse_other_adapters(ctx.model, "moses")

    def adapt_model(self, ctx, upto):
        """The MoSE layers and task prompts, injected once (before the first evaluation)."""
        model = ctx.model
        target = lora_target(model)
        decoder = target.get_decoder() if hasattr(target, "get_decoder") else target
        if moses_layers.mose_layers(target):
            self.prompts = decoder.moses_prompts
            return
        names = moses_layers.inject(target, self.target_modules or ["q_proj", "v_proj"], self.layers, self.state,
                                    num_tasks=len(self.experiences), num_experts=self.num_experts, top_k=self.top_k,
                                    r=self.r, alpha=self.alpha, density=self.density)
        if not names:
            raise ArgumentError("strategy", "target_modules", f"moses: no linear module named "
                                f"{self.target_modules or ['q_proj', 'v_proj']} to adapt",
                                fix="name attention projections, e.g. [q_proj, v_proj]")
        embed = decoder.get_input_embeddings()
        deeper = self._deeper_layers(decoder)
        self.prompts = TaskPrompts(len(self.experiences), self.prompt_length, embed.embedding_dim,
                                   depth=1 + len(deeper), device=embed.weight.device)
        decoder.moses_prompts = self.prompts
        decoder.register_forward_pre_hook(self._prefix, with_kwargs=True)
        decoder.register_forward_hook(self._unprefix)
        for depth, layer in enumerate(deeper, start=1):
            layer.register_forward_pre_hook(functools.partial(self._layer_prompt, depth), with_kwargs=True)
        self.total_params = sum(m.param_counts()["total"] for m in moses_layers.mose_layers(target))
        for p in model.parameters():
            p.requires_grad_(False)

    @contextlib.contextmanager
    def evaluating(self, ctx, column):
        """Make the evaluated column's name visible to the prompt hook (``task_inference: oracle``)."""
        token = _COLUMN.set(getattr(column, "name", None))
        try:
            yield
        finally:
            _COLUMN.reset(token)

    def _deeper_layers(self, decoder) -> list[nn.Module]:
        """The prompted decoder layers above the first (their inputs get their own prompt)."""
        if not self.deep_prompts or not self.prompt_length:
            return []
        blocks = getattr(decoder, "layers", None)
        if not isinstance(blocks, nn.ModuleList):
            raise ArgumentError("strategy", "deep_prompts", f"moses: {type(decoder).__name__} has no 'layers' list "
                                "to prompt layer by layer", fix="set deep_prompts: false")
        chosen = range(len(blocks)) if self.layers is None else sorted(set(self.layers))
        return [blocks[i] for i in chosen if 0 < i < len(blocks)]

    # -- task selection and the prompt ------------------------------------------------------
    def choose_slots(self, decoder, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """Evaluation: each sample's task slot (oracle column, else key matching); None before any task."""
        if not self.slots:
            return None
        column = _COLUMN.get()
        if self.task_inference == "oracle" and column in self.slots:
            return torch.full((input_ids.shape[0],), self.slots[column], device=input_ids.device)
        return self.match_slots(decoder, input_ids, attention_mask)

    def match_slots(self, decoder, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Algorithm 2's task inference: the slot of the trained task whose key is nearest to q(x)."""
        seen = sorted(self.slots.values())
        keys = torch.stack([self.prompts.key[s] for s in seen])
        q = query(decoder.get_input_embeddings(), input_ids, attention_mask)
        return torch.tensor(seen, device=input_ids.device)[match(q, keys)]

    @torch.no_grad()
    def identification(self, ctx) -> dict[str, Any]:
        """Task-identification accuracy of the keys now: per trained task, the share of its test
        prompts (as the evaluation tokenises them) that key matching routes to its own slot, and
        the share over all of them. A sample routed to another task's key is answered with that
        task's prompt and masks; this is what makes BWT negative under ``task_inference: keys``."""
        decoder = self._decoder(ctx.model)
        device = decoder.get_input_embeddings().weight.device
        collate = ctx.objective.collate(train=False)
        per_task, hits, total = {}, 0, 0
        for exp in self.experiences:
            if exp.name not in self.slots or not len(exp.test):
                continue
            own = 0
            for start in range(0, len(exp.test), IDENTIFY_BATCH):
                batch = collate([exp.test[i] for i in range(start, min(start + IDENTIFY_BATCH, len(exp.test)))])
                slots = self.match_slots(decoder, batch["input_ids"].to(device), batch["attention_mask"].to(device))
                own += int((slots == self.slots[exp.name]).sum())
            per_task[exp.name] = own / len(exp.test)
            hits, total = hits + own, total + len(exp.test)
        return {"accuracy": hits / total if total else None, "per_task": per_task}

    def diagnostics(self) -> dict[str, Any]:
        return {"total_params": self.total_params, "task_identification": list(self.task_identification)}

    def _prefix(self, decoder, args, kwargs):
        ids = kwargs.get("input_ids")
        if args or ids is None:
            return None
        first = _prefill(kwargs)
        state, n, length = self.state, ids.shape[0], self.prompt_length
        training = decoder.training and state.training_slot is not None
        if training:
            slots = torch.full((n,), state.training_slot, device=ids.device)
        else:
            if first:
                state.slots = self.choose_slots(decoder, ids, kwargs.get("attention_mask"))
            slots = state.slots
        self._strip = False
        if slots is None or length == 0:
            return None
        mask, pos = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if mask is not None:
            kwargs["attention_mask"] = torch.cat([mask.new_ones(n, length), mask], dim=1)
        if pos is not None:
            kwargs["position_ids"] = _shift(pos, length, first)
        if kwargs.get("cache_position") is not None:  # transformers < 5 indexes the cache with it
            kwargs["cache_position"] = _shift(kwargs["cache_position"], length, first)
        if first:
            embeds = decoder.get_input_embeddings()(ids)
            prefix = torch.stack([self.prompts.prompt[s][0] for s in slots.tolist()]).to(embeds.dtype)
            self._slots = slots
            kwargs["input_ids"], kwargs["inputs_embeds"] = None, torch.cat([prefix, embeds], dim=1)
            self._strip = True
        return args, kwargs

    def _layer_prompt(self, depth: int, layer, args, kwargs):
        """Overwrite the prefix positions of a deeper layer's input with its own prompt e_t^l."""
        if not self._strip:  # no prefix in this forward (decoding from the cache, or no task yet)
            return None
        hidden = args[0] if args else kwargs["hidden_states"]
        prompt = torch.stack([self.prompts.prompt[s][depth] for s in self._slots.tolist()]).to(hidden.dtype)
        hidden = torch.cat([prompt, hidden[:, self.prompt_length:]], dim=1)
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    def _unprefix(self, decoder, args, output):
        if self._strip:
            output.last_hidden_state = output.last_hidden_state[:, self.prompt_length:]
            self._strip = False
        return output

    # -- training ---------------------------------------------------------------------------
    def before_experience(self, ctx, experience):
        slot = self.slots.setdefault(experience.name, len(self.slots))
        earlier = [s for name, s in self.slots.items() if name != experience.name]
        self.state.training_slot = slot
        self._frozen = []
        for layer in moses_layers.mose_layers(ctx.model):
            used = layer.used(earlier)
            layer.reset_scores()
            layer.reset_router(keep=used["router"] if earlier else None)
            layer.store_mask(slot)
            if self.protect and earlier:
                snapshot = {name: getattr(layer, f"lora_{name}").detach().clone() for name in used}
                self._frozen.append((layer, used, snapshot))
        for name, p in ctx.model.named_parameters():
            p.requires_grad_("lora_" in name or "score_" in name)
        self.prompts.prompt[slot].requires_grad_(True)
        self.prompts.key[slot].requires_grad_(True)

    @staticmethod
    def _decoder(model):
        target = lora_target(model)
        return target.get_decoder() if hasattr(target, "get_decoder") else target

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.pull_weight or self.state.training_slot is None:
            return loss
        decoder = self._decoder(ctx.model)
        prompt_tokens = x["attention_mask"].bool() & (y == IGNORE)
        q = query(decoder.get_input_embeddings(), x["input_ids"], prompt_tokens)
        return loss + self.pull_weight * pull_loss(q, self.prompts.key[self.state.training_slot])

    @torch.no_grad()
    def after_optimizer_step(self, ctx):
        for layer, used, snapshot in self._frozen:
            for name, keep in used.items():
                weight = getattr(layer, f"lora_{name}")
                weight.copy_(torch.where(keep, snapshot[name], weight))
        for layer in moses_layers.mose_layers(ctx.model):
            layer.store_mask(self.state.training_slot)

    def after_experience(self, ctx, experience):
        self.state.training_slot = None
        self._frozen = []
        self.task_identification.append(self.identification(ctx))

    # -- resume -----------------------------------------------------------------------------
    def state_dict(self):
        return {"slots": dict(self.slots), "task_identification": list(self.task_identification)}

    def load_state_dict(self, state):
        self.slots = {str(k): int(v) for k, v in state["slots"].items()}
        self.task_identification = list(state.get("task_identification", []))
