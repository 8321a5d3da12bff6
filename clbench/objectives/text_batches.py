"""Batches of ``{"prompt", "answer"}`` records for a causal LM: tokenised, truncated from the
left of the prompt, padded (right for training, with the loss's labels; left for generation),
and the window of positions whose next token is an answer token.

What each batch holds and why is :mod:`clbench.objectives.causal_lm`'s to say (its module notes):
this module is the mechanics, shared by the objective and the perf scripts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

IGNORE = -100  # the label of a position no loss reads (prompt, padding)


def answer_window(labels: Tensor) -> tuple[int, int]:
    """``(start, end)``: the positions ``start <= t < end`` whose next token is an answer token
    (label != -100) in some row; at least one position. Read back from the device once (a
    training step asks for it), not once per bound."""
    answered = (labels[:, 1:] != IGNORE).any(0).int()
    if answered.numel() == 0:
        return 0, 1
    first, last_from_end, found = torch.stack([answered.argmax(), answered.flip(0).argmax(), answered.max()]).tolist()
    return (first, answered.numel() - last_from_end) if found else (0, 1)


def prompt_and_answer(item: Any) -> tuple[str, str]:
    """(prompt, answer) of a dataset item: a ``{"prompt", "answer"}`` dict (Avalanche may wrap
    it in a tuple with its task label)."""
    if isinstance(item, (tuple, list)):
        item = item[0]
    return item["prompt"], item["answer"]


class TextCollator:
    """Tokenises and pads a list of records; a plain class, so loader workers can pickle it."""

    def __init__(self, tokenizer: Any, max_length: int, train: bool, max_new_tokens: int = 0,
                 forced: bool = False, chat_template: bool = False):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.forced = forced  # test batches also carry teacher-forced prompt + answer (routing records)
        self.max_length = max_length
        self.train = train
        self.max_new_tokens = max_new_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_id = tokenizer.eos_token_id

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _chat(self, prompts: list[str], answers: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """Prompt ids up to the assistant's turn, and the answer's ids through its end-of-turn."""
        tok = self.tokenizer
        prompt_ids, answer_ids = [], []
        for prompt, answer in zip(prompts, answers):
            user = [{"role": "user", "content": prompt}]
            head = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
            whole = tok.apply_chat_template(user + [{"role": "assistant", "content": answer}], tokenize=False)
            tail = whole[len(head):] if whole.startswith(head) else answer
            ids = self._ids([tail])[0]
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id) + 1]
            elif self.eos_id is not None:
                ids = ids + [self.eos_id]
            prompt_ids.append(self._ids([head])[0])
            answer_ids.append(ids)
        return prompt_ids, answer_ids

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        prompts, answers = zip(*(prompt_and_answer(item) for item in items))
        if self.chat_template:
            prompt_ids, answer_ids = self._chat(list(prompts), list(answers))
        else:
            prompt_ids, answer_ids = self._ids(list(prompts)), None
        if self.train:
            return self._train(prompt_ids, answer_ids if answer_ids is not None else self._ids(list(answers)))
        batch = self._test(prompt_ids, list(prompts), list(answers))
        if self.forced:
            forced = self._train(prompt_ids, answer_ids if answer_ids is not None else self._ids(list(answers)))
            batch.update(forced_ids=forced["input_ids"], forced_mask=forced["attention_mask"])
        return batch

    def _train(self, prompt_ids: list[list[int]], answer_ids: list[list[int]]) -> dict[str, Any]:
        rows, labels, truncated = [], [], 0
        for p, a in zip(prompt_ids, answer_ids):
            if not self.chat_template:  # the chat answer already ends with its end-of-turn
                a = a + ([self.eos_id] if self.eos_id is not None else [])
            a = a[: self.max_length]
            keep = self.max_length - len(a)
            if len(p) > keep:
                truncated += 1
                p = p[len(p) - keep:] if keep > 0 else []
            rows.append(p + a)
            labels.append([IGNORE] * len(p) + a)
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        label_t = torch.full((len(rows), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (r, lab) in enumerate(zip(rows, labels)):  # right padding
            input_ids[i, : len(r)] = torch.tensor(r)
            label_t[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(r)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": label_t,
                "truncated": torch.tensor(truncated)}

    def _test(self, prompt_ids: list[list[int]], prompts: list[str], answers: list[str]) -> dict[str, Any]:
        room = max(1, self.max_length - self.max_new_tokens)
        truncated = sum(len(p) > room for p in prompt_ids)
        rows = [torch.tensor(p[-room:], dtype=torch.long) for p in prompt_ids]
        input_ids, mask = left_padded(rows, self.pad_id, max(len(r) for r in rows))
        return {"input_ids": input_ids, "attention_mask": mask, "prompts": prompts, "answers": answers,
                "truncated": torch.tensor(truncated)}


def left_padded(rows: list[Tensor], pad_id: int, width: int | None = None) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)`` with every row ending at the last position (``width``
    columns; the longest row's by default)."""
    width = max(1, max(len(r) for r in rows)) if width is None else width
    device = rows[0].device
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row):] = row
            mask[i, width - len(row):] = 1
    return ids, mask
