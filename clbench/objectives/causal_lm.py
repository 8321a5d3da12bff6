"""Continual instruction tuning of causal language models (TRACE and its look-alikes).

Training: each record ``{"prompt", "answer"}`` is tokenised as prompt and answer separately
(no special tokens inside either), joined as ``prompt + answer + EOS``, and the next-token loss
is taken on the answer and EOS tokens only: prompt and padding positions carry the label
``-100``. Sequences longer than ``max_length`` lose tokens from the *left of the prompt*, so
the answer and the instruction's end (nearest the answer) are kept; the answer itself is cut
only when it alone exceeds ``max_length``.

Chat template (``chat_template: true``, for instruct models): each prompt becomes the user turn
of a one-turn conversation rendered by the tokenizer's chat template with the generation prompt
(``<|im_start|>user ... <|im_end|> <|im_start|>assistant``, plus whatever default system turn
the template adds); the answer is what the template renders after it for the assistant's turn,
cut after the first EOS (SmolLM2's and Qwen's end-of-turn ``<|im_end|>``), or followed by EOS
when the template's turn end is not the EOS. The loss stays on the answer's tokens only,
end-of-turn included, as instruction tuning is done; the template's tokens carry ``-100``.
Evaluation decodes from the same rendered prompt. TRACE feeds plain prompts (the default,
``chat_template: false``); truncation still cuts from the left, i.e. the template's opening
(the system turn) goes first.

Evaluation: greedy decoding, batched, with the KV cache, from left-padded prompts (every prompt
then ends where decoding starts), stopping at EOS or after ``max_new_tokens``. A pass's prompts
are kept until it ends and decoded together (:mod:`~clbench.objectives.generation_pool`:
``generation_batch`` rows ordered by column and length, a column's shared instruction
prefilled once, one greedy loop a batch that drops each row at its own EOS or cap); under
sharded parameters each batch is decoded as it comes, every rank in step. The generation
is decoded without special tokens, then scored by the column's task metric
(:mod:`clbench.metrics.text`; TRACE's per-task choice arrives from the stream as
``task_metrics``). A metric of TRACE's own scoring (``scoring = "trace"``) gets the text as
TRACE's inference decodes it (``clean_up_tokenization_spaces=False``, nothing stripped); the
lenient metrics get it stripped. ``summary()["scoring"]`` records which scoring the task
metrics use (``trace``, ``normalized``, or ``mixed``). Greedy decoding has no randomness, so
evaluation is deterministic up to the hardware's arithmetic. The final stage's generations are written per task to
``predictions/<task>.jsonl`` with their prompt, reference and score.

The loss is the mean over the batch's answer tokens (as transformers computes it), so a
batch's long answers weigh more than short ones; TRACE's training code does the same.

``answer_logits_only`` computes the training logits over the answer window only, by default
where that changes no number, i.e. the LM head is frozen (:mod:`~clbench.objectives.answer_logits`).

Routing records (models with MoE layers): padding tokens are never counted. In evaluation the
counted units are the tokens of each test sample's prompt + reference answer in one
teacher-forced forward pass (the "old-task tokens" of MH-MoE's N_eff; test batches carry those
sequences only when the model has routing layers as its loaders are built), not the generation,
whose decoding steps are left unrecorded: what a generation routes depends on what the model
generates. A token's composition is (task, relative-position bucket, token-frequency bucket)
(:mod:`~clbench.objectives.token_compositions`). The paper's fourth feature, a stance label,
exists for one of its datasets only and is left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from clbench.errors import UserError
from clbench.models import routing_channel as routing
from clbench.models import auxiliary
from clbench.models.protocol import has_routing_layers
from clbench.models.sharded import is_sharded
from clbench.objectives.answer_logits import carrying, model_inputs
from clbench.objectives.base import Objective
from clbench.objectives.greedy_loop import keeps_logits, loop_decodes
from clbench.objectives.kv_cache import KVCache, forward_hooked, static_cache
from clbench.objectives.text_batches import IGNORE, TextCollator, answer_window
from clbench.objectives.token_compositions import frequency_buckets, token_labels
from clbench.config.validation import ArgumentError

Tokens = Annotated[int, Field(ge=1)]  # a number of generated tokens


class CausalLanguageModeling(Objective):
    """Prompt-masked next-token loss; scored by generation with a metric per task.

    ``task_metrics``: metric name per experience name (``exact_match``, ``answer_letter``,
    ``rouge_l``, ``edit_similarity``, ``sari``); experiences not named use ``default_metric``.
    ``max_new_tokens``: one number, or one per experience name. ``max_length``: tokens of
    prompt + answer in training, of prompt + generation in evaluation. ``chat_template``: wrap
    each prompt in the tokenizer's chat template (instruct models); off by default, as in TRACE.
    ``answer_logits_only``: training logits only where the loss reads them; by default where
    that changes no number, i.e. the LM head is frozen (:mod:`~clbench.objectives.answer_logits`).
    ``generation_batch``: rows decoded together once a pass's prompts are pooled and bucketed
    (:mod:`~clbench.objectives.generation_pool`); 64, our choice: on a 2-core CPU a SmolLM2
    decoding step over 64 rows costs about twice one over 8, for eight times the tokens.
    ``pool_generation: false`` decodes each loader batch as it comes instead, as sharded
    parameters always do: greedy tokens then do not depend on how a pass was pooled (under
    bf16 the rounding of other rows can flip a near tie), e.g. to compare a DDP run with a
    sharded one. A pooled pass decodes with the dynamic cache in the objective's own greedy
    loop (:mod:`~clbench.objectives.greedy_loop`). ``kv_cache: static`` decodes with
    transformers' static cache through ``generate``, whose decoding step transformers compiles
    on a GPU (:mod:`~clbench.objectives.kv_cache`); off by default: its tokens may differ from
    the dynamic cache's at a near tie. Sharded parameters, and a model whose forward hooks
    change what its forward sees (MoSEs), decode with the dynamic cache through ``generate``,
    as does a model whose generation config is more than a plain argmax (a repetition penalty)
    or whose cache keeps a sliding window.
    """

    model_args: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[frozenset[str]] = frozenset({"language_model"})

    def __init__(self, task_metrics: dict[str, str] | None = None, default_metric: str = "exact_match",
                 max_length: Annotated[int, Field(ge=2)] = 512,
                 max_new_tokens: Tokens | dict[str, Tokens] = 32, chat_template: bool = False,
                 answer_logits_only: bool | None = None, generation_batch: Annotated[int, Field(ge=1)] = 64,
                 pool_generation: bool = True, kv_cache: KVCache = "dynamic"):
        self.kv_cache = kv_cache
        self.chat_template = chat_template
        self.generation_batch = generation_batch
        self.pool_generation = pool_generation
        self.answer_logits_only = answer_logits_only
        self.task_metrics = dict(task_metrics or {})
        self.default_metric = default_metric
        self.max_length = max_length
        self.max_new_tokens = max_new_tokens
        self.tokenizer = None
        self.model = None
        self._keeps_logits = False  # whether the attached model takes logits_to_keep
        self._truncated: dict[str, Any] = {"train": 0, "test": 0}  # samples whose prompt lost tokens, as seen
        self._generations: dict[str, list[dict]] = {}
        self._pending: list = []  # this pass's batches waiting for their generations (generation_pool)
        self._generation_rows: list[int] = []  # the batch sizes the last pass decoded with
        self._buckets: Tensor | None = None  # token id -> frequency bucket, built when first needed

    def setup(self, spec, experiences) -> None:
        from clbench.metrics.text import make_text_metric

        super().setup(spec, experiences)
        for exp in experiences:  # an unknown metric name fails before any model is built
            make_text_metric(self.metric_name(exp))

    def attach(self, model) -> None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise UserError(f"the causal-LM objective needs a model with a tokenizer, got {type(model).__name__}",
                            where="model", fix="use model: {class_path: hf_causal_lm, ...}")
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ArgumentError("objective", "chat_template", "chat_template is true but the model's tokenizer has no "
                                "chat template",
                                fix="set chat_template: false (plain prompts), or use an instruct model's tokenizer")
        self._keeps_logits = keeps_logits(model)
        if self.answer_logits_only and not self._keeps_logits:
            raise ArgumentError("objective", "answer_logits_only", f"{type(getattr(model, 'hf', model)).__name__} "
                                "has no logits_to_keep argument",
                                fix="set answer_logits_only: false for this model")
        self.tokenizer = tokenizer
        self.model = model  # whether it has routing layers (perhaps injected later) decides the test batches

    def metric_name(self, experience) -> str:
        return self.task_metrics.get(experience.name, self.default_metric) if experience else self.default_metric

    def new_tokens(self, experience) -> int:
        if isinstance(self.max_new_tokens, dict):
            return int(self.max_new_tokens.get(experience.name if experience else "", 32))
        return int(self.max_new_tokens)

    def collate(self, train: bool):
        longest = max([self.new_tokens(e) for e in self.experiences] or [self.new_tokens(None)])
        routed = self.model is not None and has_routing_layers(self.model)
        return TextCollator(self.tokenizer, self.max_length, train, max_new_tokens=longest, forced=routed and not train,
                            chat_template=self.chat_template)

    def lengths(self, dataset) -> list[int]:
        """Each training row's tokens as the training collator builds it (prompt cut to fit, answer, EOS)."""
        collate, n = self.collate(train=True), len(dataset)
        return [length for start in range(0, n, 256)
                for length in collate([dataset[i] for i in range(start, min(start + 256, n))])["attention_mask"]
                .sum(1).tolist()]

    # -- training -------------------------------------------------------------------------
    def _count(self, split: str, batch: dict) -> None:
        """Add a batch's truncation count without reading it back from the device (no sync)."""
        if "truncated" in batch:
            self._truncated[split] = self._truncated[split] + batch["truncated"].detach()

    def split(self, batch: dict) -> tuple[dict, Tensor]:
        self._count("train", batch)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        return carrying(inputs, batch["labels"], self.answer_logits_only, self._keeps_logits), batch["labels"]

    def join(self, parts: list[tuple[dict, Tensor]]) -> tuple[dict, Tensor]:
        """Right-pad every part to the longest and stack (a replay batch with the current one)."""
        width = max(labels.shape[1] for _, labels in parts)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

        def widen(t: Tensor, value: int) -> Tensor:
            return F.pad(t, (0, width - t.shape[1]), value=value)

        inputs = {"input_ids": torch.cat([widen(i["input_ids"], pad_id) for i, _ in parts]),
                  "attention_mask": torch.cat([widen(i["attention_mask"], 0) for i, _ in parts])}
        labels = torch.cat([widen(labels, IGNORE) for _, labels in parts])
        return carrying(inputs, labels, self.answer_logits_only, self._keeps_logits), labels

    def forward(self, model, inputs: dict) -> Tensor:
        inputs = model_inputs(inputs, self.answer_logits_only, model)
        # padding tokens are not routing units, nor tokens of a layer's auxiliary loss
        if routing.is_recording() or auxiliary.is_collecting():
            with routing.units(token_mask=inputs["attention_mask"]):
                return model(**inputs).logits
        return model(**inputs).logits

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Mean next-token cross-entropy over the answer tokens (labels != -100); ``logits``
        of every position, or of the answer window only (``answer_logits_only``)."""
        if logits.shape[1] != labels.shape[1]:
            start, end = answer_window(labels)
            return F.cross_entropy(logits.flatten(0, 1).float(), labels[:, start + 1: end + 1].flatten(),
                                   ignore_index=IGNORE)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE)

    # -- evaluation -----------------------------------------------------------------------
    def metrics(self, experience):
        from clbench.metrics.text import make_text_metric

        name = self.metric_name(experience)
        return {name: make_text_metric(name)}

    def begin_evaluation(self) -> None:
        self._generations = {}
        self._pending = []

    @torch.no_grad()
    def generate(self, model, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int,
                 raw: bool = False, cache: Any = None) -> list[str]:
        """Greedy continuations of left-padded prompts, decoded without special tokens and
        stripped; ``raw``: decoded as TRACE's inference does (no clean-up of tokenization
        spaces, nothing stripped); ``cache``: a KV cache holding the first positions'
        keys and values (a shared prefix). With sharded parameters every rank keeps decoding
        (``synced_gpus``) until all are done, with the dynamic cache."""
        tok = self.tokenizer
        sharded = is_sharded(model)
        if self.kv_cache == "static" and not sharded and not forward_hooked(model):
            cache = static_cache(model, input_ids.shape[1] + max_new_tokens, filled=cache)
        cached = {} if cache is None else {"cache": cache}
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             do_sample=False, use_cache=True, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id, synced_gpus=sharded, **cached)
        return self._texts(out[:, input_ids.shape[1]:], raw)

    def _texts(self, tokens: Any, raw: bool) -> list[str]:
        """Generated token rows as text: without special tokens, stripped; ``raw`` as TRACE's
        inference decodes them (no clean-up of tokenization spaces, nothing stripped)."""
        if raw:
            return self.tokenizer.batch_decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return [text.strip() for text in self.tokenizer.batch_decode(tokens, skip_special_tokens=True)]

    @torch.no_grad()
    def decode_loop(self, model, rows: list[Tensor], caps: list[int], columns: list[Any], raws: list[bool]
                    ) -> list[str]:
        """Greedy continuations of a pooled batch of any caps, each row stopped at its own EOS or
        cap (:func:`~clbench.objectives.greedy_loop.greedy`), as text."""
        from clbench.objectives.greedy_loop import greedy

        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        tokens = greedy(model, rows, caps, columns, pad_id, tok.eos_token_id)
        return [self._texts([t], raw)[0] for t, raw in zip(tokens, raws)]

    def _record_routing(self, model, batch: dict) -> None:
        """One teacher-forced forward of prompt + answer, its tokens labelled for N_eff."""
        ids, mask = batch["forced_ids"], batch["forced_mask"]
        if self._buckets is None:  # built when first needed, from the stream's training records
            self._buckets = frequency_buckets(self.tokenizer, self.experiences)
        labels = token_labels(ids, mask, self._buckets)
        # the records come from the layers; of the logits one position is enough (no LM head over all)
        keep = {"logits_to_keep": 1} if keeps_logits(model) else {}
        with routing.units(token_mask=mask.bool(), token_labels=labels):
            model(input_ids=ids, attention_mask=mask, **keep)

    @torch.no_grad()
    def evaluate(self, model, batch: dict, metrics, column=None) -> None:
        """Record the batch's routing (teacher-forced, now) and keep its prompts for the pass's
        pooled generation (:meth:`finish_evaluation`). Under sharded parameters every forward is
        a collective that all ranks must run in step, so the batch is decoded at once instead."""
        self._evaluate(model, batch, metrics, column, keep=True)

    def evaluate_padding(self, model, batch: dict, metrics, column=None) -> None:
        self._evaluate(model, batch, metrics, column, keep=False)

    def _evaluate(self, model, batch: dict, metrics, column, keep: bool) -> None:
        from clbench.objectives.generation_pool import PendingBatch

        if keep:  # a padding batch repeats a real one
            self._count("test", batch)
        if routing.is_recording() and "forced_ids" in batch:
            self._record_routing(model, batch)
        (metric,) = metrics.values()
        mask = batch["attention_mask"].bool()
        pending = PendingBatch(rows=[ids[m] for ids, m in zip(batch["input_ids"], mask)], cap=self.new_tokens(column),
                               raw=getattr(metric, "scoring", None) == "trace", metrics=metrics, column=column,
                               prompts=list(batch["prompts"]), answers=list(batch["answers"]))
        if is_sharded(model) or not self.pool_generation:
            with routing.paused():
                pending.predictions = self.generate(model, batch["input_ids"], batch["attention_mask"], pending.cap,
                                                    raw=pending.raw)
            if keep:
                self._score(pending)
        elif keep:
            self._pending.append(pending)

    @torch.no_grad()
    def finish_evaluation(self, model, evaluating=None) -> None:
        """Decode every prompt the pass kept, pooled across its batches (and across its columns
        unless ``evaluating(column)``, the strategy's per-column context, is given: then per
        column inside it), then score each batch in the order it came."""
        from clbench.objectives.generation_pool import decode

        pending, self._pending = self._pending, []
        if not pending:
            return
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        looped = self.kv_cache == "dynamic" and loop_decodes(model)
        with routing.paused():
            self._generation_rows = decode(model, pending, self.generate, pad_id, self.generation_batch, evaluating,
                                           loop=self.decode_loop if looped else None)
        for batch in pending:
            self._score(batch)

    def _score(self, batch) -> None:
        """Update the column's metric with a decoded batch and keep its rows for save_outputs."""
        (metric,) = batch.metrics.values()
        scores = metric.sample_scores(batch.predictions, batch.answers, batch.prompts)  # kept for save_outputs
        batch.metrics.update(batch.predictions, batch.answers, sources=batch.prompts, scores=scores)
        rows = self._generations.setdefault(batch.column.name if batch.column else "all", [])
        rows += [{"prompt": p, "answer": a, "prediction": g, "score": s}
                 for p, a, g, s in zip(batch.prompts, batch.answers, batch.predictions, scores)]

    def end_evaluation(self) -> None:
        """Under data parallelism, every process gets every process's generations, in dataset
        order: the evaluation shards are interleaved (sample ``i`` of rank ``r`` is the test
        set's ``r + i * world_size``; :func:`clbench.data.datasets.run_loader`), so they are merged the same way."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        shards: list[dict[str, list[dict]]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(shards, self._generations)
        merged: dict[str, list[dict]] = {}
        for task in dict.fromkeys(task for shard in shards for task in shard):
            rows = [shard.get(task, []) for shard in shards]
            merged[task] = [part[i] for i in range(max(map(len, rows))) for part in rows if i < len(part)]
        self._generations = merged

    def save_outputs(self, directory: Path) -> None:
        """``predictions/<task>.jsonl``: what the model generated at the last evaluation."""
        from clbench.io import atomic_write

        folder = Path(directory) / "predictions"
        folder.mkdir(parents=True, exist_ok=True)
        for task, rows in self._generations.items():
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            atomic_write(folder / f"{task}.jsonl", lambda handle, t=text: handle.write(t), "w")

    def scoring(self) -> str | None:
        """``trace`` or ``normalized`` when every task metric is of that scoring, ``mixed``
        otherwise (None before :meth:`setup`)."""
        from clbench.metrics.text import TEXT_METRICS

        kinds = {TEXT_METRICS[self.metric_name(e)].scoring for e in getattr(self, "experiences", None) or []}
        return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"

    def summary(self) -> dict[str, Any]:
        out = {"max_length": self.max_length, "chat_template": self.chat_template,
               "truncated_samples": {k: int(v) for k, v in self._truncated.items()}, "scoring": self.scoring()}
        if self._generation_rows:  # the largest batch the last pass decoded (below generation_batch: memory)
            out["generation_rows"] = max(self._generation_rows)
        if self._generations:  # where the final stage's generations are, beside result.json
            out["predictions"] = {task: f"predictions/{task}.jsonl" for task in self._generations}
        return out
