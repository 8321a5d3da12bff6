"""Layers a strategy puts into a model: LoRA mixtures (LoRAMoE, MH-MoE), MoSEs' masked sub-experts
and Grow's expanded layers. Each wraps or replaces a module of a built model."""
