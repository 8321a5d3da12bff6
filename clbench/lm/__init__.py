"""Language-model pieces: the causal-LM model builder and an offline tokenizer.

Nothing here is imported by ``clbench list``; transformers is imported inside the functions
that need it, so listing plugins stays fast.
"""
