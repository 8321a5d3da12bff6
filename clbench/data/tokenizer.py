"""A small byte-level BPE tokenizer trained offline, saved like a real one.

The embedded text streams and the tests need a tokenizer without a download. This one is
trained on their own texts with the ``tokenizers`` library and written with
``save_pretrained``, so it loads through ``AutoTokenizer.from_pretrained(folder)`` exactly as a
downloaded tokenizer does, and the code under test takes the user's path.

Byte-level means every string round-trips (no unknown token). Like Qwen's tokenizers it adds
no special tokens on its own and has no chat template: prompts are fed as they are, and the
causal-LM collator appends ``eos`` after each answer itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

from clbench.errors import UserError

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def train_tiny_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 512, *,
                         min_frequency: int = 2, added_tokens: Sequence[str] = ()) -> Path:
    """Train on ``texts``, save to ``out_dir`` and return it.

    ``vocab_size`` counts the 256 byte symbols and the three special tokens (pad, bos, eos,
    ids 0-2); BPE merges fill the rest, fewer if the texts run out of pairs seen
    ``min_frequency`` times. ``added_tokens`` (e.g. ``<NUM_LIT>``) are kept whole and are not
    special, so decoding with ``skip_special_tokens`` keeps them. Training is deterministic.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for t in texts if t]
    if not texts:
        raise UserError("no texts to train a tokenizer on", where="train_tiny_tokenizer")
    if vocab_size < 256 + 3:
        raise UserError(f"vocab_size {vocab_size} is below the 259 byte and special symbols",
                        where="train_tiny_tokenizer", fix="use vocab_size >= 259")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[PAD, BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    if added_tokens:
        tok.add_tokens(list(added_tokens))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    # transformers 5 records its own class name (TokenizersBackend), which 4.x cannot load; the
    # name every supported version resolves to the same fast tokenizer keeps the folder portable.
    config = out / "tokenizer_config.json"
    config.write_text(re.sub(r'"tokenizer_class": "[^"]*"', '"tokenizer_class": "PreTrainedTokenizerFast"',
                             config.read_text()))
    return out
