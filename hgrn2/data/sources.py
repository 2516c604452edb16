"""The documents of a corpus on disk, split into tasks that worker processes read independently.

Inputs are .txt/.text/.raw, .jsonl/.json, .parquet and zstandard-compressed JSON lines (.jsonl.zst/.json.zst/.zst,
the Pile's and SlimPajama's own files), given as files, globs or directories. `plan` cuts them into tasks from their
names and sizes alone, so every machine and any number of workers sees the same tasks: consecutive small files are
grouped until a task holds `shard_size` bytes, a large uncompressed line-per-document file (.jsonl, or .txt read
by line) is cut into byte ranges of `shard_size` (a line belongs to the range its first byte falls in), and a
compressed file is one task (a zstandard stream cannot be entered half-way). `documents(task)` yields the task's
(text, source) pairs in order: blank texts and records failing `--where` are skipped; the source is the record's
`meta.pile_set_name` / `meta.redpajama_set_name` (or `--source-field`), else the input argument the file came from.
"""

from __future__ import annotations

import glob
import io
import json
import os
from collections.abc import Iterator

TEXT = (".txt", ".text", ".raw")
ZST = (".jsonl.zst", ".json.zst", ".zst")
SUFFIXES = (*ZST, *TEXT, ".jsonl", ".json", ".parquet")
SOURCE_FIELDS = ("meta.pile_set_name", "meta.redpajama_set_name")


def suffix(path: str) -> str | None:
    low = path.lower()
    return next((s for s in SUFFIXES if low.endswith(s)), None)


def expand(inputs, what: str) -> list[list[str]]:
    """[[file, the input argument it came from], ...] in a fixed order (directories and globs sorted)."""
    if not inputs:
        raise ValueError(f"no {what}: give files/directories or --dataset NAME")
    files: list[list[str]] = []
    for p in inputs:
        if os.path.isdir(p):
            found = sorted(f for f in glob.glob(os.path.join(p, "**", "*"), recursive=True)
                           if os.path.isfile(f) and suffix(f))
            if not found:
                raise FileNotFoundError(f"{what}: directory {p!r} has no {list(SUFFIXES)} files")
            files += [[f, p] for f in found]
        elif os.path.isfile(p):
            files.append([p, p])
        else:
            matched = sorted(glob.glob(p, recursive=True))
            if not matched:
                raise FileNotFoundError(f"{what}: {p!r} does not exist")
            files += [[f, p] for f in matched]
    bad = [f for f, _ in files if not suffix(f)]
    if bad:
        raise ValueError(f"{what}: unsupported file type(s) {bad[:5]}; expected one of {list(SUFFIXES)}")
    text = [f for f, _ in files if suffix(f) in TEXT]
    if text and len(text) < len(files):
        other = next(f for f, _ in files if suffix(f) not in TEXT)
        raise ValueError(f"{what}: a mix of text files ({text[0]}) and records ({other}); prepare each kind "
                         f"separately, or name the files to read")
    if all(os.path.getsize(f) == 0 for f, _ in files):
        raise ValueError(f"{what}: all {len(files)} file(s) are empty")
    return files


def _splittable(path: str, sample_by: str) -> bool:
    s = suffix(path)
    return s == ".jsonl" or (s in TEXT and sample_by == "line")


def plan(files: list[list[str]], split: str, shard_size: int, sample_by: str) -> list[dict]:
    """Tasks {split, files: [[file, arg]], start, stop, bytes} for one split's files; start/stop is a byte range
    of the only file (None: whole files)."""
    tasks: list[dict] = []
    group: list[list[str]] = []
    size = 0

    def flush():
        nonlocal group, size
        if group:
            tasks.append({"split": split, "files": group, "start": None, "stop": None, "bytes": size})
        group, size = [], 0

    for f, arg in files:
        n = os.path.getsize(f)
        if n > shard_size and (_splittable(f, sample_by) or suffix(f) in ZST):
            flush()
            if suffix(f) in ZST:
                tasks.append({"split": split, "files": [[f, arg]], "start": None, "stop": None, "bytes": n})
                continue
            for a in range(0, n, shard_size):
                b = min(a + shard_size, n)
                tasks.append({"split": split, "files": [[f, arg]], "start": a, "stop": b, "bytes": b - a})
        else:
            group.append([f, arg])
            size += n
            if size >= shard_size:
                flush()
    flush()
    return tasks


def hub_task(name: str, config: str | None, split_name: str, split: str) -> dict:
    return {"split": split, "hub": [name, config, split_name], "files": [], "start": None, "stop": None, "bytes": 0}


# ----------------------------------------------------------------------------------------------------------------
# reading


class Reader:
    """What to take from each record: the text field, `--where` conditions, the source field, .txt's sample_by."""

    def __init__(self, text_field: str = "text", sample_by: str = "line", where=(), source_field: str | None = None):
        self.text_field, self.sample_by, self.source_field = text_field, sample_by, source_field
        self.where = parse_where(where)

    def documents(self, task: dict) -> Iterator[tuple[str, str]]:
        """(text, source) of every non-blank document of the task that passes `where`, in order."""
        if task.get("hub"):
            yield from self._records(_hub_rows(*task["hub"]), "hub:" + task["hub"][0], task["hub"][0])
            return
        for f, arg in task["files"]:
            s = suffix(f)
            if s in TEXT:
                if self.where:
                    raise ValueError(f"--where needs records with fields (.jsonl, .json, .parquet, .zst), not {f}")
                for text in _text_docs(f, self.sample_by, task["start"], task["stop"]):
                    if text.strip():
                        yield text, arg
            elif s == ".parquet":
                yield from self._records(_parquet_rows(f, self._columns()), f, arg)
            elif s == ".json":
                yield from self._records(_json_rows(f), f, arg)
            else:
                lines = _zst_lines(f) if s in ZST else _lines(f, task["start"], task["stop"])
                yield from self._records(_json_lines(f, lines), f, arg)

    def _columns(self) -> list[str]:
        fields = [self.text_field, *(k for k, _ in self.where), self.source_field or ""]
        return sorted({f.split(".")[0] for f in fields if f})

    def _records(self, rows, file: str, arg: str) -> Iterator[tuple[str, str]]:
        for n, row in enumerate(rows, 1):
            text = field(row, self.text_field)
            if text is _MISSING:
                raise ValueError(f"--text-field {self.text_field!r} is not a column; columns: {sorted(row)} "
                                 f"({file}, record {n})")
            if not isinstance(text, str) or not text.strip():
                continue
            if self.where and not all(field(row, k) in values for k, values in self.where):
                continue
            yield text, self._source(row, arg)

    def _source(self, row: dict, arg: str) -> str:
        for name in (self.source_field,) if self.source_field else SOURCE_FIELDS:
            value = field(row, name)
            if value is not _MISSING and value is not None:
                return str(value)
        return arg


_MISSING = object()


def field(row, path: str):
    """row['a']['b'] for path 'a.b' (a key holding the dot itself is tried first); _MISSING if absent."""
    if isinstance(row, dict) and path in row:
        return row[path]
    for key in path.split("."):
        if not isinstance(row, dict) or key not in row:
            return _MISSING
        row = row[key]
    return row


def parse_where(where) -> list[tuple[str, frozenset]]:
    """['meta.pile_set_name=ArXiv,Github', ...] -> [(field, {values})]; a record must match every condition."""
    out = []
    for w in where or ():
        key, eq, values = w.partition("=")
        if not eq or not key.strip() or not values:
            raise ValueError(f"--where: expected FIELD=VALUE[,VALUE...] (e.g. meta.pile_set_name=ArXiv), got {w!r}")
        out.append((key.strip(), frozenset(values.split(","))))
    return out


def _decode(raw: bytes, file: str, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not UTF-8 (byte {raw[e.start]:#04x} at offset {offset + e.start}); convert it "
                         f"first, e.g. iconv -f latin1 -t utf-8") from None


def _lines(file: str, start: int | None, stop: int | None) -> Iterator[tuple[bytes, int]]:
    """(line, offset) of the lines of a file whose first byte is in [start, stop) (the whole file if None)."""
    with open(file, "rb") as f:
        pos = 0
        if start:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())  # finish the line that started before `start`
        for line in f:
            if stop is not None and pos >= stop:
                break
            yield line, pos
            pos += len(line)


def _zst_lines(file: str) -> Iterator[tuple[bytes, int]]:
    import zstandard

    with open(file, "rb") as raw:
        # the Pile's files were written with a long window; the default limit refuses them
        stream = zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(raw, read_size=1 << 20)
        pos = 0
        try:
            for line in io.BufferedReader(stream, buffer_size=1 << 20):
                yield line, pos
                pos += len(line)
        except zstandard.ZstdError as e:
            raise ValueError(f"{file}: not a readable zstandard stream ({e}) after {pos} bytes") from None


def _json_lines(file: str, lines) -> Iterator[dict]:
    for n, (line, pos) in enumerate(lines, 1):
        if line.strip():
            try:
                yield json.loads(_decode(line, file, pos))
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}: line {n} (byte {pos}) is not JSON: {e.msg}") from None


def _json_rows(file: str) -> Iterator[dict]:
    with open(file, "rb") as f:
        raw = f.read()
    text = _decode(raw, file, 0)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:  # JSON lines under a .json name, as `datasets` accepts
        yield from _json_lines(file, ((line, 0) for line in io.BytesIO(raw)))
        return
    if not isinstance(rows, list):
        raise ValueError(f"{file}: expected a JSON list of records or JSON lines, got a {type(rows).__name__}")
    yield from rows


def _parquet_rows(file: str, columns: list[str]) -> Iterator[dict]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(file)
    have = set(pf.schema_arrow.names)
    for batch in pf.iter_batches(batch_size=1024, columns=[c for c in columns if c in have] or None):
        yield from batch.to_pylist()


def _text_docs(file: str, sample_by: str, start, stop) -> Iterator[str]:
    """Documents of a text file as `datasets`' text builder cuts them (universal newlines): each line, each
    paragraph (split at blank lines) or the whole file."""
    if sample_by == "line":
        for line, pos in _lines(file, start, stop):
            yield from _newlines(_decode(line, file, pos)).rstrip("\n").split("\n")
        return
    with open(file, "rb") as f:
        text = _newlines(_decode(f.read(), file, 0))
    yield from (text.split("\n\n") if sample_by == "paragraph" else [text])


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _hub_rows(name: str, config: str | None, split: str) -> Iterator[dict]:
    from datasets import load_dataset

    yield from load_dataset(name, config, split=split, streaming=True)
