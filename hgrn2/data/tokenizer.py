"""Tokenizers for corpus preparation: load a local `tokenizer.json` / HF tokenizer directory, or train a byte-level
BPE on the corpus with the `tokenizers` library. Everything returns a `tokenizers.Tokenizer` (fast, batched)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>")


def load_tokenizer(path: str):
    """A `tokenizers.Tokenizer` from a `tokenizer.json` file or a directory holding one (a saved HF tokenizer)."""
    from tokenizers import Tokenizer

    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer: {path!r} does not exist (expected a tokenizer.json or an HF directory)")
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isfile(file):
        return Tokenizer.from_file(file)
    # A slow-only HF directory (e.g. sentencepiece): let transformers convert it to a fast tokenizer, offline.
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, use_fast=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the path that failed
        raise ValueError(f"tokenizer: cannot load a tokenizer from directory {path!r}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer: {path!r} has no fast tokenizer (tokenizer.json); convert it first")
    return tok.backend_tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int, eos: str = "<|endoftext|>"):
    """Train a byte-level BPE (GPT-2 style) of `vocab_size` tokens on an iterator of texts; `eos` gets id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 258:
        raise ValueError(f"tokenizer vocab_size >= 258 (256 bytes + eos), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(_batched(texts), trainer=trainer)
    return tok


def eos_id(tok, eos: str | None = None) -> int | None:
    """Id of the end-of-document token: `eos` if given (must exist), else the first known name present, else None."""
    if eos is not None:
        i = tok.token_to_id(eos)
        if i is None:
            raise ValueError(f"eos token {eos!r} is not in the tokenizer's vocabulary")
        return i
    for name in EOS_CANDIDATES:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


def pretrained_tokenizer(source: str, eos_id: int | None = None):
    """transformers' fast tokenizer for `source` (a tokenizer.json file or a directory holding one), with its
    special tokens set and padding on the left (a decoder's batch: the recurrent state must start at each prompt's
    first token): a directory's own `tokenizer_config.json` wins for the special tokens; otherwise the token
    `eos_id` is the end-of-text, beginning-of-text and padding token (GPT-2's convention, as `train_bpe` has one
    special token).
    `save_pretrained(dir)` on the result writes what `AutoTokenizer.from_pretrained(dir)` loads."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.path.isdir(source) and os.path.isfile(os.path.join(source, "tokenizer_config.json")):
        hf = AutoTokenizer.from_pretrained(source, local_files_only=True, padding_side="left")
    else:
        tok = load_tokenizer(source)
        eos = tok.id_to_token(eos_id) if eos_id is not None else None
        if eos_id is not None and eos is None:
            raise ValueError(f"tokenizer: eos id {eos_id} is outside the vocabulary of {source!r}")
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos, padding_side="left")
    if hf.pad_token is None and hf.eos_token is not None:
        hf.pad_token = hf.eos_token  # batched generation pads on the left; the mask hides the padding
    return hf


def special_token_ids(hf) -> dict:
    """{bos,eos,pad}_token_id of a transformers tokenizer, for a model config."""
    return {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id, "pad_token_id": hf.pad_token_id}


def _batched(texts: Iterable[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
