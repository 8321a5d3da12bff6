"""A tiny random causal LM, two text tasks and the steps to train a strategy on them by hand:
shared by the language-model strategy, layer, objective and distributed tests."""

from __future__ import annotations

import random

import torch
from helpers import tiny_config

from clbench.data.datasets import make_loader
from clbench.data.streams import Experience, StreamSpec

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256}


def lm(seed: int = 0):
    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.manual_seed(seed)
    return hf_causal_lm(architecture="qwen3", tokenizer="trace-mini", config=TINY)


def records(task: int, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed + 10 * task)
    out = []
    for _ in range(n):
        a, b = rng.randrange(20), rng.randrange(20)
        out.append({"prompt": f"Add {a} and {b}. Answer:", "answer": str(a + b)} if task == 0 else
                   {"prompt": f"Say {a} twice. Answer:", "answer": f"{a} {a}"})
    return out


def stream(n: int = 16) -> list[Experience]:
    return [Experience(position=t, name=f"task{t}", domain_id=t, classes=[], train=records(t, n), test=records(t, 4, 99))
            for t in range(2)]


def build(strategy, experiences, model=None, lr: float = 0.01):
    from clbench.engine.module import ContinualModule  # Lightning: imported when a test needs it, not at collection
    from clbench.objectives.causal_lm import CausalLanguageModeling

    model = model if model is not None else lm()
    objective = CausalLanguageModeling(max_length=48, max_new_tokens=3)
    objective.setup(StreamSpec(name="t", objective="causal_lm"), experiences)
    objective.attach(model)
    module = ContinualModule(model, strategy, objective, optimizer=lambda p: torch.optim.AdamW(p, lr=lr),
                             columns=[None])
    strategy.setup(module.context, experiences, 0)
    strategy.adapt_model(module.context, 0)
    return module


def factory(module):
    def make(ds, **kw):
        return make_loader(ds, kw.pop("batch_size", 4), shuffle=True, seed=0,
                           collate_fn=module.objective.collate(train=True), **kw)
    return make


def train(module, experience, steps: int = 3) -> None:
    strategy = module.strategy
    strategy.adapt_model(module.context, experience.position + 1)
    strategy.before_experience(module.context, experience)
    loader = strategy.train_loader(module.context, strategy.train_dataset(experience), factory(module))
    import lightning.pytorch as pl

    pl.Trainer(max_epochs=1, limit_train_batches=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False).fit(module, train_dataloaders=loader)
    strategy.after_experience(module.context, experience)


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def logits(module, experience) -> torch.Tensor:
    """The model's logits at every position of the experience's test samples (the training
    batch's inputs without the labels they carry for the answer window)."""
    from clbench.objectives.answer_logits import WINDOW

    batch = module.objective.collate(train=True)(experience.test)
    inputs, _ = module.objective.split(batch)
    inputs = {key: value for key, value in inputs.items() if key != WINDOW}
    module.model.eval()
    with torch.no_grad():
        return module.objective.forward(module.model, inputs)


def lm_config(strategy: dict) -> dict:
    from clbench.config.load import resolve_config

    raw = tiny_config(benchmark={"class_path": "trace-mini",
                                 "init_args": {"tasks": ["FOMC", "NumGLUE-cm"], "n_train": 24, "n_test": 6}},
                      model={"class_path": "hf_causal_lm",
                             "init_args": {"architecture": "qwen3", "tokenizer": "trace-mini", "config": TINY}},
                      objective={"class_path": "causal_lm", "init_args": {"max_length": 96, "max_new_tokens": 4}},
                      strategy=strategy,
                      train={"epochs": 1, "batch_size": 8,
                             "optimizer": {"class_path": "adamw", "init_args": {"lr": 0.01}}})
    raw["model"]["init_args"].pop("hidden", None)
    return resolve_config(raw)
