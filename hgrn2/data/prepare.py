"""`hgrn2 data prepare`: tokenise a corpus into flat token memmaps that `hgrn2 train` reads.

Output directory:
    train.bin, val.bin   all documents' tokens back to back (each followed by eos), uint16 if the vocabulary
                         fits in 16 bits, else uint32; raw little-endian arrays readable with np.memmap
    meta.json            format, dtype, vocab_size, eos_id, token/document counts per split, sources
    tokenizer.json       the tokenizer used (copied or trained), so training and evaluation can decode
    tokenizer_config.json  its special tokens (end-of-text, padding), so `AutoTokenizer.from_pretrained` loads it

Inputs are local .txt / .jsonl / .json / .parquet files (or directories of them) read through HF `datasets` in
streaming mode, so corpora larger than memory pass through in batches; or a hub dataset (`--dataset`, online,
only when asked). Validation is either separate files (`--val-inputs`) or every k-th document (k = 1/val_fraction).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Iterator

import numpy as np

from .files import write_json

FORMAT = "hgrn2-tokens-v1"
BUILDERS = {".txt": "text", ".text": "text", ".raw": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("corpus")
    src.add_argument("inputs", nargs="*", help="local .txt/.jsonl/.json/.parquet files, globs or directories")
    src.add_argument("--val-inputs", nargs="*", default=None, help="validation files (else --val-fraction)")
    src.add_argument("--dataset", default=None, help="hub dataset name (needs internet; used only when given)")
    src.add_argument("--dataset-config", default=None, help="hub dataset configuration name")
    src.add_argument("--split", default="train", help="hub dataset split for training text")
    src.add_argument("--val-split", default=None, help="hub dataset split for validation (else --val-fraction)")
    src.add_argument("--text-field", default="text", help="column holding the text (json/parquet/hub)")
    src.add_argument("--sample-by", default="line", choices=["line", "paragraph", "document"],
                     help="what one document is in .txt files")
    tok = parser.add_argument_group("tokenizer")
    tok.add_argument("--tokenizer", default=None, help="tokenizer.json file or HF tokenizer directory")
    tok.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                     help="train a byte-level BPE of this vocabulary size on the training corpus")
    tok.add_argument("--eos", default=None, help="end-of-document token (default: first of </s>, <|endoftext|>, ...)")
    tok.add_argument("--no-eos", action="store_true", help="do not append an end-of-document token")
    out = parser.add_argument_group("output")
    out.add_argument("--out", required=True, help="output directory")
    out.add_argument("--val-fraction", type=float, default=0.005, help="fraction of documents held out (every k-th)")
    out.add_argument("--batch-docs", type=int, default=1000, help="documents tokenised per batch")
    out.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")


def run(args: argparse.Namespace) -> int:
    try:
        meta = _run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"hgrn2 data prepare: error: {e}", file=sys.stderr)
        return 2
    s = meta["splits"]
    print(f"wrote {args.out}: train {s['train']['tokens']:,} tokens ({s['train']['documents']:,} docs), "
          f"val {s['val']['tokens']:,} tokens ({s['val']['documents']:,} docs), vocab {meta['vocab_size']}, "
          f"{meta['dtype']}")
    return 0


def _run(args) -> dict:
    return prepare(
        inputs=args.inputs, out=args.out, tokenizer=args.tokenizer, train_tokenizer=args.train_tokenizer,
        val_inputs=args.val_inputs, dataset=args.dataset, dataset_config=args.dataset_config, split=args.split,
        val_split=args.val_split, text_field=args.text_field, sample_by=args.sample_by, eos=args.eos,
        add_eos=not args.no_eos, val_fraction=args.val_fraction, batch_docs=args.batch_docs,
        overwrite=args.overwrite,
    )


def prepare(inputs=(), out="", *, tokenizer=None, train_tokenizer=None, val_inputs=None, dataset=None,
            dataset_config=None, split="train", val_split=None, text_field="text", sample_by="line", eos=None,
            add_eos=True, val_fraction=0.005, batch_docs=1000, overwrite=False) -> dict:
    """Tokenise the corpus and write `out/{train,val}.bin`, `meta.json`, `tokenizer.json`; returns the metadata."""
    from .tokenizer import eos_id, load_tokenizer, pretrained_tokenizer, train_bpe

    if (tokenizer is None) == (train_tokenizer is None):
        raise ValueError("give exactly one of --tokenizer PATH or --train-tokenizer VOCAB")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if batch_docs < 1:
        raise ValueError(f"--batch-docs must be >= 1, got {batch_docs}")
    if os.path.exists(os.path.join(out, "meta.json")) and not overwrite:
        raise FileExistsError(f"{out!r} already holds a prepared corpus; pass --overwrite to replace it")
    train_src = _source(inputs, dataset, dataset_config, split, text_field, sample_by, what="inputs")
    if val_inputs or val_split:
        val_src = _source(val_inputs or (), dataset if val_split else None, dataset_config, val_split,
                          text_field, sample_by, what="--val-inputs")
        every = 0
    else:
        val_src, every = None, (round(1 / val_fraction) if val_fraction > 0 else 0)

    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        eos_token = eos
    else:
        eos_token = eos or "<|endoftext|>"
        tok = train_bpe(_texts(train_src), train_tokenizer, eos=eos_token)
    eos_i = eos_id(tok, eos_token) if add_eos else None
    if add_eos and eos_i is None:
        raise ValueError("the tokenizer has no known end-of-document token; name one with --eos or pass --no-eos")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab <= 2**16 else np.uint32

    os.makedirs(out, exist_ok=True)
    writers = {name: _Writer(os.path.join(out, f"{name}.bin"), dtype) for name in ("train", "val")}
    try:
        for docs, which in _routed(train_src, val_src, every, batch_docs):
            _write_batch(tok, docs, which, writers, eos_i)
        counts = {name: w.counts() for name, w in writers.items()}
        if counts["train"]["tokens"] == 0:
            raise ValueError("the training corpus is empty (no non-blank documents / no tokens)")
        if counts["val"]["tokens"] == 0 and (every or val_src is not None):
            raise ValueError("the validation split is empty: raise --val-fraction or give --val-inputs")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.commit()
    tok.save(os.path.join(out, "tokenizer.json"))
    if tokenizer is not None and os.path.isdir(tokenizer):
        hf = pretrained_tokenizer(tokenizer, eos_i)
    else:
        hf = pretrained_tokenizer(os.path.join(out, "tokenizer.json"), eos_i)
    hf.save_pretrained(out)  # tokenizer_config.json with the special tokens: `AutoTokenizer` loads `out`
    meta = {
        "format": FORMAT, "dtype": np.dtype(dtype).name, "vocab_size": vocab, "eos_id": eos_i,
        "tokenizer": "tokenizer.json",
        "splits": {name: {"file": f"{name}.bin", **c} for name, c in counts.items()},
        "sources": {"train": train_src["desc"], "val": val_src["desc"] if val_src else f"every {every}th document"},
    }
    write_json(os.path.join(out, "meta.json"), meta)
    return meta


# ----------------------------------------------------------------------------------------------------------------
# sources


def _source(inputs, dataset, config, split, text_field, sample_by, what) -> dict:
    """Describe where texts come from: {'kind': 'files'|'hub', 'builder', 'files', ...}, checked up front."""
    if dataset:
        if inputs:
            raise ValueError(f"give either local {what} or --dataset, not both")
        return {"kind": "hub", "name": dataset, "config": config, "split": split, "field": text_field,
                "desc": f"hub:{dataset}/{config or ''}:{split}"}
    files = _expand(inputs, what)
    builders = {BUILDERS[os.path.splitext(f)[1].lower()] for f in files}
    if len(builders) > 1:
        raise ValueError(f"{what}: mix of file types {sorted(builders)}; prepare each type separately")
    if all(os.path.getsize(f) == 0 for f in files):
        raise ValueError(f"{what}: all {len(files)} file(s) are empty")
    return {"kind": "files", "builder": builders.pop(), "files": files, "field": text_field,
            "sample_by": sample_by, "desc": files}


def _expand(inputs, what) -> list[str]:
    if not inputs:
        raise ValueError(f"no {what}: give files/directories or --dataset NAME")
    files: list[str] = []
    for p in inputs:
        if os.path.isdir(p):
            found = sorted(f for f in glob.glob(os.path.join(p, "**", "*"), recursive=True)
                           if os.path.splitext(f)[1].lower() in BUILDERS)
            if not found:
                raise FileNotFoundError(f"{what}: directory {p!r} has no {sorted(BUILDERS)} files")
            files += found
        elif os.path.isfile(p):
            files.append(p)
        else:
            matched = sorted(glob.glob(p))
            if not matched:
                raise FileNotFoundError(f"{what}: {p!r} does not exist")
            files += matched
    bad = [f for f in files if os.path.splitext(f)[1].lower() not in BUILDERS]
    if bad:
        raise ValueError(f"{what}: unsupported file type(s) {bad}; expected one of {sorted(BUILDERS)}")
    return files


def _texts(src: dict) -> Iterator[str]:
    """Stream the non-blank texts of a source, in a fixed order."""
    from datasets import load_dataset

    if src["kind"] == "hub":
        ds = load_dataset(src["name"], src["config"], split=src["split"], streaming=True)
    elif src["builder"] == "text":
        ds = load_dataset("text", data_files=src["files"], split="train", streaming=True, sample_by=src["sample_by"])
    else:
        ds = load_dataset(src["builder"], data_files=src["files"], split="train", streaming=True)
    field = "text" if src.get("builder") == "text" else src["field"]
    for row in ds:
        if field not in row:
            raise ValueError(f"--text-field {field!r} is not a column; columns: {sorted(row)}")
        text = row[field]
        if text and text.strip():
            yield text


def _routed(train_src, val_src, every, batch_docs) -> Iterator[tuple[list[str], list[str]]]:
    """Batches of (documents, their split names). With `every` = k, document i goes to val when i % k == 0."""
    from tqdm.auto import tqdm

    streams = [(train_src, None)] + ([(val_src, "val")] if val_src is not None else [])
    bar = tqdm(unit="doc", desc="tokenising", dynamic_ncols=True)
    i = 0
    for src, fixed in streams:
        docs: list[str] = []
        which: list[str] = []
        for text in _texts(src):
            docs.append(text)
            which.append(fixed or ("val" if every and i % every == 0 else "train"))
            i += 1
            if len(docs) == batch_docs:
                bar.update(len(docs))
                yield docs, which
                docs, which = [], []
        if docs:
            bar.update(len(docs))
            yield docs, which
    bar.close()


# ----------------------------------------------------------------------------------------------------------------
# writing


def _write_batch(tok, docs, which, writers, eos_i) -> None:
    for name, enc in zip(which, tok.encode_batch(docs, add_special_tokens=False), strict=True):
        writers[name].append(enc.ids + ([eos_i] if eos_i is not None else []))


class _Writer:
    """Append token ids to `<path>.tmp`; `commit` renames it into place (so a crash never leaves a half file)."""

    def __init__(self, path: str, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.f = open(path + ".tmp", "wb")  # noqa: SIM115 - closed in commit/abort
        self.tokens = self.documents = 0

    def append(self, ids: list[int]) -> None:
        if ids:
            np.asarray(ids, dtype=self.dtype).tofile(self.f)
            self.tokens += len(ids)
            self.documents += 1

    def counts(self) -> dict:
        return {"tokens": self.tokens, "documents": self.documents}

    def commit(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.path + ".tmp", self.path)

    def abort(self) -> None:
        self.f.close()
        if os.path.exists(self.path + ".tmp"):
            os.remove(self.path + ".tmp")


def write_corpus(out: str, splits: dict, vocab_size: int, eos_id: int | None = None) -> dict:
    """Write already-tokenised splits ({"train": ids, "val": ids}, 1-D integer arrays) in the prepared format
    (synthetic data, tests, or corpora tokenised elsewhere). Returns the metadata."""
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    os.makedirs(out, exist_ok=True)
    counts = {}
    for name, ids in splits.items():
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= vocab_size)):
            raise ValueError(f"split {name!r}: expected 1-D ids in [0, {vocab_size}), got shape {ids.shape}")
        _atomic_write_array(os.path.join(out, f"{name}.bin"), ids.astype(dtype))
        counts[name] = {"file": f"{name}.bin", "tokens": int(ids.size), "documents": None}
    meta = {"format": FORMAT, "dtype": np.dtype(dtype).name, "vocab_size": vocab_size, "eos_id": eos_id,
            "tokenizer": None, "splits": counts, "sources": "write_corpus"}
    write_json(os.path.join(out, "meta.json"), meta)
    return meta


def _atomic_write_array(path: str, arr: np.ndarray) -> None:
    with open(path + ".tmp", "wb") as f:
        arr.tofile(f)
    os.replace(path + ".tmp", path)
