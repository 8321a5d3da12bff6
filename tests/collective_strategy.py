"""Naive fine-tuning with a collective in ``before_experience``, as grow's broadcast of which
layers to widen: under several processes the process group must exist before a stage's first
fit, a resumed run's first stage included. Named by import path in the DDP resume test."""

from clbench.strategies.naive import Naive


class CollectiveNaive(Naive):
    def __init__(self, world: int = 1):
        super().__init__()
        self.world = world

    def before_experience(self, ctx, experience):
        import torch.distributed as dist

        if self.world > 1:
            if not (dist.is_initialized() and dist.get_world_size() == self.world):
                raise RuntimeError("before_experience ran without the run's process group")
            box = [experience.name if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(box, src=0)
            if box[0] != experience.name:
                raise RuntimeError(f"rank {dist.get_rank()} is at {experience.name}, rank 0 at {box[0]}")
        super().before_experience(ctx, experience)
