"""Token shards on disk: writing one whole or not at all, the records that mark it finished, and the index.

A prepared directory in the sharded format (`hgrn2-tokens-v2`):
    shards/TTTTTT-PPPP.{train,val}.bin   piece P of task T: its documents' tokens back to back, each followed by eos
    shards/TTTTTT-PPPP.json              that piece's record: per split file, tokens, documents, sha256, per source
    shards/TTTTTT.json                   task T finished: its number of pieces
    prepare.json                         the settings and the task plan (what a resumed or partial run must match)
    part-I-of-N.json                     with `--part I/N`: the records of that part's tasks, for `hgrn2 data merge`
    meta.json                            the index: dtype, vocabulary, eos, tokenizer, and per split its token and
                                         document counts, counts per source and the shard list in stream order
A piece's .bin files are written as .tmp, flushed and renamed, then its record is written; a piece without a
record is unfinished and is written again, a finished one is checked against its sha256 and never rewritten.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os

import numpy as np

from .files import write_json

FORMAT = "hgrn2-tokens-v2"
SPLITS = ("train", "val")


class ShardError(ValueError):
    """A finished shard does not match its record (changed or damaged after it was written)."""


def piece_name(task: int, piece: int) -> str:
    return f"{task:06d}-{piece:04d}"


class _SplitFile:
    """One split's tokens of a piece, appended to `<path>.tmp` with a running sha256."""

    def __init__(self, path: str, dtype: np.dtype):
        self.path, self.dtype = path, dtype
        self.f = None
        self.sha = hashlib.sha256()
        self.tokens = self.documents = 0
        self.by_source: dict[str, list[int]] = {}

    def append(self, ids: list[int], source: str) -> None:
        if self.f is None:
            self.f = open(self.path + ".tmp", "wb")  # noqa: SIM115 - closed in finish/abort
        data = np.asarray(ids, dtype=self.dtype).tobytes()
        try:
            self.f.write(data)
        except OSError as e:
            raise named_error(e, self.path) from None
        self.sha.update(data)
        self.tokens += len(ids)
        self.documents += 1
        counts = self.by_source.setdefault(source, [0, 0])
        counts[0] += len(ids)
        counts[1] += 1

    def finish(self) -> dict | None:
        """Flush, rename into place; the record of this file (None if it holds nothing)."""
        if self.f is None:
            return None
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
        except OSError as e:
            raise named_error(e, self.path) from None
        self.f.close()
        self.f = None
        os.replace(self.path + ".tmp", self.path)
        return {"file": os.path.basename(self.path), "tokens": self.tokens, "documents": self.documents,
                "sha256": self.sha.hexdigest(),
                "sources": {k: {"tokens": t, "documents": d} for k, (t, d) in sorted(self.by_source.items())}}

    def abort(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        for p in (self.path + ".tmp", self.path):
            if os.path.exists(p):
                os.remove(p)


def named_error(e: OSError, path: str) -> OSError:
    """The write error as one line naming the file (a full disk above all)."""
    if e.errno == errno.ENOSPC:
        return OSError(errno.ENOSPC, f"no space left on device while writing {path} (nothing partial is left; free "
                                     f"space and run the same command again to continue)")
    return OSError(e.errno, f"could not write {path}: {e.strerror or e}")


def write_record(path: str, obj) -> None:
    """write_json, its errors naming the file."""
    try:
        write_json(path, obj)
    except OSError as e:
        raise named_error(e, path) from None


class PieceWriter:
    """The train and val files of one piece; `finish` writes them and then the record that marks them done."""

    def __init__(self, shard_dir: str, task: int, piece: int, dtype):
        self.dir, self.name = shard_dir, piece_name(task, piece)
        self.files = {s: _SplitFile(os.path.join(shard_dir, f"{self.name}.{s}.bin"), np.dtype(dtype)) for s in SPLITS}

    def append(self, split: str, ids: list[int], source: str) -> None:
        self.files[split].append(ids, source)

    def finish(self) -> dict:
        try:
            record = {s: f.finish() for s, f in self.files.items()}
        except BaseException:
            self.abort()
            raise
        path = os.path.join(self.dir, self.name + ".json")
        try:
            write_record(path, record)
        except OSError:
            self.abort()
            raise
        return record

    def abort(self) -> None:
        for f in self.files.values():
            f.abort()


def finished_piece(shard_dir: str, task: int, piece: int) -> dict | None:
    """The record of a finished piece, its files checked against their sha256; None if the piece is unfinished."""
    name = piece_name(task, piece)
    path = os.path.join(shard_dir, name + ".json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        record = json.load(f)
    for r in record.values():
        if r is not None:
            verify(os.path.join(shard_dir, r["file"]), r)
    return record


def verify(path: str, r: dict) -> None:
    """A finished shard's file against its record's sha256."""
    stem = path.rsplit(".", 2)[0]
    if not os.path.isfile(path):
        raise ShardError(f"{path} is missing but {stem}.json records it as finished; remove {stem}.* to write that "
                         f"piece again")
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            sha.update(block)
    if sha.hexdigest() != r["sha256"]:
        raise ShardError(f"{path} does not match the sha256 in {stem}.json (changed after it was written?); remove "
                         f"{stem}.* to write that piece again")


def task_done(shard_dir: str, task: int) -> int | None:
    """Number of pieces of a finished task, None if unfinished."""
    path = os.path.join(shard_dir, f"{task:06d}.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)["pieces"]


def mark_task_done(shard_dir: str, task: int, pieces: int) -> None:
    write_record(os.path.join(shard_dir, f"{task:06d}.json"), {"pieces": pieces})


def remove_partial(shard_dir: str, tasks: set[int] | None = None) -> None:
    """What an interrupted run had in flight: temporary files, and shard files whose piece has no record (of
    `tasks` only, when other machines write their parts into the same folder)."""
    if not os.path.isdir(shard_dir):
        return
    names = set(os.listdir(shard_dir))
    for name in names:
        stem = name.split(".")[0]
        mine = tasks is None or (stem[:6].isdigit() and int(stem[:6]) in tasks)
        if mine and (name.endswith(".tmp") or (name.endswith(".bin") and stem + ".json" not in names)):
            os.remove(os.path.join(shard_dir, name))


def task_records(shard_dir: str, task: int, pieces: int) -> list[dict]:
    out = []
    for p in range(pieces):
        with open(os.path.join(shard_dir, piece_name(task, p) + ".json")) as f:
            out.append(json.load(f))
    return out


# ----------------------------------------------------------------------------------------------------------------
# the index


def build_index(head: dict, records: list[list[dict]], prefix: str = "shards") -> dict:
    """meta.json from the tasks' piece records (task order, then piece order). `prefix` is each task's shard folder
    relative to the index (a list: one per task, for a merge of parts in several folders)."""
    splits = {}
    for s in SPLITS:
        shards, sources = [], {}
        for t, task in enumerate(records):
            folder = prefix[t] if isinstance(prefix, list) else prefix
            for rec in task:
                r = rec.get(s)
                if r is None:
                    continue
                shards.append({"file": f"{folder}/{r['file']}", "tokens": r["tokens"], "documents": r["documents"],
                               "sha256": r["sha256"]})
                for k, c in r["sources"].items():
                    acc = sources.setdefault(k, {"tokens": 0, "documents": 0})
                    acc["tokens"] += c["tokens"]
                    acc["documents"] += c["documents"]
        splits[s] = {"tokens": sum(x["tokens"] for x in shards), "documents": sum(x["documents"] for x in shards),
                     "by_source": dict(sorted(sources.items())), "shards": shards}
    return {"format": FORMAT, **head, "splits": splits}


def check_index(meta: dict, val_expected: bool) -> None:
    if meta["splits"]["train"]["tokens"] == 0:
        raise ValueError("the training corpus is empty (no non-blank documents / no tokens)")
    if val_expected and meta["splits"]["val"]["tokens"] == 0:
        raise ValueError("the validation split is empty: raise --val-fraction or give --val-inputs")
