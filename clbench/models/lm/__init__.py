"""Causal language models: the ``hf_causal_lm`` builder (:mod:`.causal_lm`), reading models and
tokenizers from disk (:mod:`.loading`), GGUF checkpoints and presets, and a tiny random model on
disk for tests.

Nothing here is imported by ``clbench list``; transformers is imported inside the functions
that need it, so listing plugins stays fast.
"""
