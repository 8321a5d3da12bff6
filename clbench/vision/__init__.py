"""Vision models of the thesis: the MoE MLP layer, its routers and the ``vit_moe`` factory."""

from clbench.vision.moe import MoEMLP
from clbench.vision.routers import EMACentroidRouter, SwitchRouter, balance_loss
from clbench.vision.vit_moe import vit_moe

__all__ = ["MoEMLP", "SwitchRouter", "EMACentroidRouter", "balance_loss", "vit_moe"]
