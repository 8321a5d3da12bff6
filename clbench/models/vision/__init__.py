"""Vision models of the thesis: the MoE MLP layer, its routers, the prototype-routed ViT and
the ``vit_moe`` factory."""

from clbench.models.vision.moe import MoEMLP
from clbench.models.vision.prototype import PrototypeRouter, PrototypeViT
from clbench.models.vision.routers import EMACentroidRouter, SwitchRouter, balance_loss
from clbench.models.vision.vit_moe import vit_moe

__all__ = ["MoEMLP", "SwitchRouter", "EMACentroidRouter", "PrototypeRouter", "PrototypeViT", "balance_loss",
           "vit_moe"]
