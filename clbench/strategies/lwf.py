"""Learning without Forgetting (LwF).

Li & Hoiem 2017, "Learning without Forgetting" (TPAMI). Before each experience after the first
the current network is frozen as a teacher; training on the new experience then minimises
``loss + α · KD(student, teacher)``, where KD compares the temperature-softened output
distributions (paper: T = 2, loss balance λ_o = α = 1).

Choices where the harness differs from the paper's setting:

* Shared head. The paper keeps one head per old task and distils only those. Here every
  stream has one head over all classes (domain-IL, class-IL), so all output units are
  distilled; in class-IL this also pulls new-class logits towards the teacher's, the known
  weakness that LwF.MC-style variants address. The paper's warm-up step (training the new head
  alone first) does not apply: there is no new head.
* KD as KL divergence. The paper writes the cross-entropy between the softened teacher and
  student distributions; the KL divergence differs from it by the teacher's entropy, a
  constant for the student, so gradients are identical and the term is 0 when the student
  matches the teacher. It is averaged over the batch and, as in the paper, not scaled by T².
* Teacher outputs on the fly. The paper records the old network's responses once, before
  training. They are computed per batch instead, on exactly the inputs the student sees: with
  augmentation, stored responses would belong to other views of the images. The teacher runs
  in eval mode (no dropout, batch norm on running statistics), like responses recorded once.
"""

from __future__ import annotations

import copy
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from clbench import Strategy


def distillation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Batch mean of KL(softmax(teacher / T) ‖ softmax(student / T))."""
    return F.kl_div(F.log_softmax(student_logits / temperature, dim=1),
                    F.log_softmax(teacher_logits / temperature, dim=1),
                    reduction="batchmean", log_target=True)


class LwF(Strategy):
    """Learning without Forgetting.

    Args:
        alpha: weight of the distillation term (the paper's λ_o, default 1).
        temperature: softmax temperature T of the distillation (paper: 2).
    """

    requires = frozenset({"classification"})  # distils class logits from the model called on x
    supports_distributed = True  # DDP: each rank distils its own batch from an identical teacher

    def __init__(self, alpha: Annotated[float, Field(ge=0)] = 1.0, temperature: Annotated[float, Field(gt=0)] = 2.0):
        super().__init__()
        self.alpha = alpha
        self.temperature = temperature
        self.teacher: torch.nn.Module | None = None
        self.teacher_position: int | None = None  # the experience the teacher serves
        self._pending: tuple[int, dict] | None = None
        self._teacher_device: torch.device | None = None

    def before_experience(self, ctx, experience):
        if experience.position == 0:
            return
        teacher = copy.deepcopy(ctx.model)
        if self._pending is not None and self._pending[0] == experience.position:
            teacher.load_state_dict(self._pending[1])  # resumed inside this experience
        self._pending = None
        teacher.eval()
        teacher.requires_grad_(False)
        self.teacher, self.teacher_position = teacher, experience.position
        self._teacher_device = next(teacher.parameters()).device

    def training_loss(self, ctx, x, y, logits, loss):
        if self.teacher is None:
            return loss
        if self._teacher_device != logits.device:
            self.teacher.to(logits.device)
            self._teacher_device = logits.device
        with torch.no_grad():
            teacher_logits = self.teacher(x)
        return loss + self.alpha * distillation(logits, teacher_logits, self.temperature)

    def state_dict(self):
        if self.teacher is None:
            return {"teacher": None, "teacher_position": None}
        return {"teacher": {k: v.detach().cpu() for k, v in self.teacher.state_dict().items()},
                "teacher_position": self.teacher_position}

    def load_state_dict(self, state):
        self.teacher = None
        self.teacher_position = None
        if state.get("teacher") is not None:
            self._pending = (int(state["teacher_position"]), state["teacher"])
