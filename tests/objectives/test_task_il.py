"""Task-incremental classification: logits restricted to the sample's task, in the loss and at test."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from clbench.data.streams import Experience, StreamSpec
from clbench.objectives.classification import Classification, task_mask


def experiences(groups):
    empty = TensorDataset(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))
    return [Experience(position=i, name=f"t{i}", domain_id=i, classes=list(g), train=empty, test=empty)
            for i, g in enumerate(groups)]


def objective(scenario_type: str, groups=((0, 1), (2, 3))) -> Classification:
    obj = Classification()
    obj.setup(StreamSpec(name="s", num_classes=4, input_shape=(1,), scenario_type=scenario_type),
              experiences(groups))
    return obj


def test_the_mask_holds_each_class_to_its_task():
    mask = task_mask(StreamSpec(name="s", num_classes=4, scenario_type="task-il"), experiences([(0, 1), (2, 3)]))
    assert mask.tolist() == [[True, True, False, False], [True, True, False, False],
                             [False, False, True, True], [False, False, True, True]]
    assert task_mask(StreamSpec(name="s", num_classes=4, scenario_type="class-il"), experiences([(0, 1), (2, 3)])) \
        is None
    # tasks that reuse labels (each task's classes numbered from 0) are not masked
    assert task_mask(StreamSpec(name="s", num_classes=2, scenario_type="task-il"), experiences([(0, 1), (0, 1)])) \
        is None


def test_the_loss_ignores_the_other_tasks_logits():
    outputs = torch.tensor([[2.0, 0.0, 50.0, 0.0]])  # a confident wrong answer from the other task
    targets = torch.tensor([0])
    masked = objective("task-il").loss(outputs, targets)
    plain = objective("class-il").loss(outputs, targets)
    expected = torch.nn.functional.cross_entropy(outputs[:, :2], targets)
    assert torch.allclose(masked, expected) and plain > 40


def test_accuracy_is_scored_within_the_task():
    outputs = torch.tensor([[2.0, 0.0, 50.0, 0.0], [0.0, 0.0, 1.0, 9.0]])
    targets = torch.tensor([0, 3])
    scores = {}
    for kind in ("task-il", "class-il"):
        obj = objective(kind)
        metrics = obj.metrics(None)
        obj.evaluate(lambda x: x, (outputs, targets), metrics)
        scores[kind] = float(metrics.compute()["acc"])
    assert scores == {"task-il": 1.0, "class-il": 0.5}
