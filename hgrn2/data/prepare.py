"""`hgrn2 data prepare`: tokenise a corpus into token shards that `hgrn2 train` reads as one stream.

Output directory (the sharded format; `shards.py` describes the files):
    shards/       each piece's tokens per split (every document followed by eos), uint16 if the vocabulary fits in
                  16 bits, else uint32; raw little-endian arrays readable with np.memmap; a record per piece
    meta.json     the index: format, dtype, vocab_size, eos_id, per split the token/document counts, the counts per
                  source and the shards in stream order with their sha256
    tokenizer.json, tokenizer_config.json   the tokenizer used (copied or trained), loadable by `AutoTokenizer`

Inputs are local files (`sources.py`: text, JSON lines, parquet, the Pile's and SlimPajama's .jsonl.zst) or a hub
dataset (`--dataset`, online, only when asked). `sources.plan` cuts them into tasks by file names and sizes alone;
worker processes (`--workers`, default all cores) tokenise the tasks, each into pieces of about `--shard-size`
characters of text, so the output is the same byte for byte whatever the number of workers. `--part I/N` prepares
only part I of N (one per machine, all with the same command line) and `hgrn2 data merge` joins the parts' indexes.
A rerun of the same command resumes: finished pieces are checked against their sha256 and kept, the pieces that
were in flight are written again. Validation is either separate files (`--val-inputs`) or every k-th document of
each task (k = 1/val_fraction).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import sys

import numpy as np

from . import shards as S
from .corpus import parse_size
from .files import out_folder
from .sources import Reader, expand, hub_task, plan

FORMAT_V1 = "hgrn2-tokens-v1"
DEFAULT_SHARD_SIZE = 32_000_000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("corpus")
    src.add_argument("inputs", nargs="*", help="local .txt/.jsonl/.json/.parquet/.jsonl.zst files, globs or "
                                               "directories")
    src.add_argument("--val-inputs", nargs="*", default=None, help="validation files (else --val-fraction)")
    src.add_argument("--dataset", default=None, help="hub dataset name (needs internet; used only when given)")
    src.add_argument("--dataset-config", default=None, help="hub dataset configuration name")
    src.add_argument("--split", default="train", help="hub dataset split for training text")
    src.add_argument("--val-split", default=None, help="hub dataset split for validation (else --val-fraction)")
    src.add_argument("--text-field", default="text", help="field holding the text (json/parquet/zst/hub)")
    src.add_argument("--where", action="append", default=[], metavar="FIELD=VALUE[,VALUE...]",
                     help="keep only records whose FIELD (dotted, e.g. meta.pile_set_name) is one of the values; "
                          "repeat to require several")
    src.add_argument("--source-field", default=None,
                     help="field naming a record's source for the per-source counts (default: meta.pile_set_name "
                          "or meta.redpajama_set_name, else the input argument)")
    src.add_argument("--sample-by", default="line", choices=["line", "paragraph", "document"],
                     help="what one document is in .txt files")
    tok = parser.add_argument_group("tokenizer")
    tok.add_argument("--tokenizer", default=None, help="tokenizer.json file or HF tokenizer directory")
    tok.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                     help="train a byte-level BPE of this vocabulary size on the training corpus")
    tok.add_argument("--eos", default=None, help="end-of-document token (default: first of </s>, <|endoftext|>, ...)")
    tok.add_argument("--no-eos", action="store_true", help="do not append an end-of-document token")
    out = parser.add_argument_group("output")
    out.add_argument("--out", required=True, type=out_folder, help="output directory")
    out.add_argument("--val-fraction", type=float, default=0.005, help="fraction of documents held out (every k-th)")
    out.add_argument("--batch-docs", type=int, default=1000, help="documents tokenised per batch")
    out.add_argument("--shard-size", type=parse_size, default=DEFAULT_SHARD_SIZE, metavar="SIZE",
                     help="characters of text per shard, e.g. 32M (default); sets how the input is cut")
    out.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    out.add_argument("--part", default=None, metavar="I/N",
                     help="prepare only part I of N (one per machine); join the parts with `hgrn2 data merge`")
    out.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")


def run(args: argparse.Namespace) -> int:
    try:
        meta = _run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"hgrn2 data prepare: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk: one line naming the file
        print(f"hgrn2 data prepare: error: {e}", file=sys.stderr)
        return 1
    if "part" in meta:
        i, n = meta["part"]
        print(f"wrote part {i}/{n} of {args.out}: {len(meta['tasks'])} task(s); when every part is done: "
              f"hgrn2 data merge OUT PART_DIR [PART_DIR ...]")
        return 0
    _print_summary(args.out, meta)
    return 0


def _print_summary(out: str, meta: dict) -> None:
    s = meta["splits"]
    print(f"wrote {out}: train {s['train']['tokens']:,} tokens ({s['train']['documents']:,} docs), "
          f"val {s['val']['tokens']:,} tokens ({s['val']['documents']:,} docs), vocab {meta['vocab_size']}, "
          f"{meta['dtype']}, {len(s['train']['shards']) + len(s['val']['shards'])} shards")


def _run(args) -> dict:
    return prepare(
        inputs=args.inputs, out=args.out, tokenizer=args.tokenizer, train_tokenizer=args.train_tokenizer,
        val_inputs=args.val_inputs, dataset=args.dataset, dataset_config=args.dataset_config, split=args.split,
        val_split=args.val_split, text_field=args.text_field, sample_by=args.sample_by, eos=args.eos,
        add_eos=not args.no_eos, val_fraction=args.val_fraction, batch_docs=args.batch_docs,
        overwrite=args.overwrite, workers=args.workers, part=args.part, shard_size=args.shard_size,
        where=args.where, source_field=args.source_field,
    )


def prepare(inputs=(), out="", *, tokenizer=None, train_tokenizer=None, val_inputs=None, dataset=None,
            dataset_config=None, split="train", val_split=None, text_field="text", sample_by="line", eos=None,
            add_eos=True, val_fraction=0.005, batch_docs=1000, overwrite=False, workers=None, part=None,
            shard_size=DEFAULT_SHARD_SIZE, where=(), source_field=None, progress=True) -> dict:
    """Tokenise the corpus into `out` (see the module docstring); returns meta.json's content, or with `part` the
    part's index."""
    _check_arguments(tokenizer, train_tokenizer, val_fraction, batch_docs, shard_size)
    workers = worker_count(workers)
    part_i, part_n = parse_part(part)
    if part_n > 1 and train_tokenizer is not None:
        raise ValueError("--part needs --tokenizer: every part must use the same one (train it first, e.g. with "
                         "--train-tokenizer on one machine and no --part)")
    reader = Reader(text_field, sample_by, where, source_field)
    tasks, sources, every = _plan(inputs, val_inputs, dataset, dataset_config, split, val_split, sample_by,
                                  val_fraction, shard_size)
    if part_n > 1 and any("hub" in t for t in tasks):
        raise ValueError("--part works on local files, not --dataset")
    if overwrite:
        _clear(out)
    settings = {"text_field": text_field, "sample_by": sample_by, "where": sorted(where or ()),
                "source_field": source_field, "shard_size": shard_size, "eos": eos, "add_eos": add_eos,
                "val": "inputs" if every == 0 and any(t["split"] == "val" for t in tasks) else f"every {every}",
                "tokenizer": f"train {train_tokenizer}" if tokenizer is None else None}
    src_tok = None
    if tokenizer is not None:
        from .tokenizer import load_tokenizer

        src_tok = load_tokenizer(tokenizer)
        settings["tokenizer"] = hashlib.sha256(src_tok.to_str().encode()).hexdigest()
    state = os.path.join(out, "prepare.json")
    finished = os.path.join(out, "meta.json")
    if os.path.exists(finished):
        if not _same_run(state, settings, tasks):
            raise FileExistsError(f"{out!r} already holds a prepared corpus; pass --overwrite to replace it")
        print(f"{out}: already prepared by the same command; nothing to do", flush=True)
        with open(finished) as f:  # the same command again after it finished (a kill that came too late)
            return json.load(f)
    resumed = _check_state(state, settings, tasks)
    eos_name = eos if tokenizer is not None else eos or "<|endoftext|>"
    tok, eos_i = _tokenizer(out, src_tok, tokenizer, train_tokenizer, eos_name, add_eos, reader, tasks, resumed)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    digest = hashlib.sha256(json.dumps([settings, tasks], sort_keys=True).encode()).hexdigest()
    head = {"dtype": np.dtype(np.uint16 if vocab <= 2**16 else np.uint32).name, "vocab_size": vocab,
            "eos_id": eos_i, "tokenizer": "tokenizer.json", "sources": sources, "settings": settings, "plan": digest}
    if not os.path.isfile(state):  # parts on other machines may be reading it in a shared folder
        S.write_record(state, {"settings": settings, "tasks": tasks, "head": head})

    mine = [t for t, owner in zip(tasks, assign_parts(tasks, part_n)) if owner == part_i]
    job = {"shard_dir": os.path.join(out, "shards"), "tokenizer": os.path.join(out, "tokenizer.json"),
           "eos": eos_i, "dtype": head["dtype"], "every": every, "shard_size": shard_size, "batch_docs": batch_docs,
           "reader": reader}
    os.makedirs(job["shard_dir"], exist_ok=True)
    S.remove_partial(job["shard_dir"], {t["id"] for t in mine})
    records = run_tasks(mine, job, workers, progress)
    return _write_index(out, head, tasks, records, part_i, part_n)


def _write_index(out: str, head: dict, tasks: list[dict], records: dict, part_i: int, part_n: int) -> dict:
    """meta.json (the whole run) or part-I-of-N.json (one part's records, for `merge`); returns what it wrote."""
    if part_n > 1:
        index = {"part": [part_i, part_n], "head": head, "tasks": {str(t): r for t, r in sorted(records.items())}}
        S.write_record(os.path.join(out, f"part-{part_i}-of-{part_n}.json"), index)
        return index
    meta = S.build_index(head, [records[t["id"]] for t in tasks])
    S.check_index(meta, val_expected=head["settings"]["val"] != "every 0")
    S.write_record(os.path.join(out, "meta.json"), meta)
    return meta


def _check_arguments(tokenizer, train_tokenizer, val_fraction, batch_docs, shard_size) -> None:
    if (tokenizer is None) == (train_tokenizer is None):
        raise ValueError("give exactly one of --tokenizer PATH or --train-tokenizer VOCAB")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if batch_docs < 1:
        raise ValueError(f"--batch-docs must be >= 1, got {batch_docs}")
    if shard_size < 1:
        raise ValueError(f"--shard-size must be >= 1, got {shard_size}")


def worker_count(workers: int | None) -> int:
    if workers is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    return workers


def parse_part(part) -> tuple[int, int]:
    """'2/4' -> (2, 4); None -> (1, 1)."""
    if part is None:
        return 1, 1
    i, slash, n = str(part).partition("/")
    if not (slash and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise ValueError(f"--part: expected I/N with 1 <= I <= N (e.g. 2/4), got {part!r}")
    return int(i), int(n)


def assign_parts(tasks: list[dict], n: int) -> list[int]:
    """The part (1..n) of each task: largest tasks first, each to the part with the fewest bytes so far."""
    owner = [1] * len(tasks)
    load = [0] * n
    for t in sorted(tasks, key=lambda t: (-t["bytes"], t["id"])):
        k = min(range(n), key=lambda k: (load[k], k))
        owner[t["id"]] = k + 1
        load[k] += t["bytes"]
    return owner


def _plan(inputs, val_inputs, dataset, dataset_config, split, val_split, sample_by, val_fraction, shard_size):
    """(tasks with ids, the sources description per split, every: 0 or the k of every-k-th validation)."""
    if dataset:
        if inputs:
            raise ValueError("give either local inputs or --dataset, not both")
        tasks = [hub_task(dataset, dataset_config, split, "train")]
        sources = {"train": f"hub:{dataset}/{dataset_config or ''}:{split}"}
    else:
        files = expand(inputs, "inputs")
        tasks = plan(files, "train", shard_size, sample_by)
        sources = {"train": list(dict.fromkeys(arg for _, arg in files))}
    if val_inputs or val_split:
        if val_split and dataset:
            tasks.append(hub_task(dataset, dataset_config, val_split, "val"))
            sources["val"] = f"hub:{dataset}/{dataset_config or ''}:{val_split}"
        else:
            files = expand(val_inputs, "--val-inputs")
            tasks += plan(files, "val", shard_size, sample_by)
            sources["val"] = list(dict.fromkeys(arg for _, arg in files))
        every = 0
    else:
        every = round(1 / val_fraction) if val_fraction > 0 else 0
        sources["val"] = f"every {every}th document of each task"
    for i, t in enumerate(tasks):
        t["id"] = i
    return tasks, sources, every


def _clear(out: str) -> None:
    """Remove what `prepare` writes (and nothing else) from an existing output directory."""
    shutil.rmtree(os.path.join(out, "shards"), ignore_errors=True)
    names = ["meta.json", "prepare.json", "train.bin", "val.bin", *TOKENIZER_FILES]
    for path in [os.path.join(out, n) for n in names] + glob.glob(os.path.join(out, "part-*-of-*.json")):
        if os.path.exists(path):
            os.remove(path)


def _same_run(state: str, settings: dict, tasks: list[dict]) -> bool:
    """Whether `state` (prepare.json) records these settings and inputs."""
    if not os.path.isfile(state):
        return False
    with open(state) as f:
        old = json.load(f)
    return old["settings"] == settings and old["tasks"] == tasks


def _check_state(state: str, settings: dict, tasks: list[dict]) -> bool:
    """Whether `out` holds an unfinished run of the same settings and inputs; one of others is refused if it
    finished any piece, else cleared."""
    if not os.path.isfile(state):
        return False
    with open(state) as f:
        old = json.load(f)
    if old["settings"] != settings or old["tasks"] != tasks:
        if not glob.glob(os.path.join(os.path.dirname(state), "shards", "*-*.json")):
            _clear(os.path.dirname(state))  # nothing finished to keep: start afresh
            return False
        what = "settings" if old["settings"] != settings else "inputs"
        raise FileExistsError(f"{os.path.dirname(state)!r} holds an unfinished prepare with other {what}; run the "
                              f"same command to continue it, or pass --overwrite to start again")
    return True


def _tokenizer(out, tok, tokenizer, train_tokenizer, eos_name, add_eos, reader, tasks, resumed):
    """(tokenizer, eos id): `tok` (loaded from `tokenizer`) or a BPE trained on the training documents (the one an
    unfinished run trained, when resuming), saved in `out` with the transformers files before any worker starts."""
    from .tokenizer import load_tokenizer, train_bpe

    saved = os.path.join(out, "tokenizer.json")
    if tok is None and resumed and os.path.isfile(saved):
        tok = load_tokenizer(saved)
        return tok, _eos(tok, eos_name, add_eos)
    if tok is None:
        texts = (text for t in tasks if t["split"] == "train" for text, _ in reader.documents(t))
        tok = train_bpe(texts, train_tokenizer, eos=eos_name)
    eos_i = _eos(tok, eos_name, add_eos)
    _save_tokenizer(out, tok, tokenizer if tokenizer is not None and os.path.isdir(tokenizer) else None, eos_i)
    return tok, eos_i


def _save_tokenizer(out: str, tok, hf_dir: str | None, eos_i: int | None) -> None:
    """tokenizer.json and the transformers files (`AutoTokenizer` loads `out`), each file replaced whole: parts on
    other machines may be loading them from a shared folder."""
    import socket
    import tempfile

    from .tokenizer import pretrained_tokenizer

    os.makedirs(out, exist_ok=True)
    prefix = f".tokenizer-{socket.gethostname()}-"
    for stale in glob.glob(os.path.join(out, prefix + "*")):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=out)
    try:
        tok.save(os.path.join(tmp, "tokenizer.json"))
        pretrained_tokenizer(hf_dir or os.path.join(tmp, "tokenizer.json"), eos_i).save_pretrained(tmp)
        for name in os.listdir(tmp):
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    except OSError as e:
        raise S.named_error(e, os.path.join(out, "tokenizer.json")) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _eos(tok, eos: str | None, add_eos: bool) -> int | None:
    from .tokenizer import eos_id

    if not add_eos:
        return None
    i = eos_id(tok, eos)
    if i is None:
        raise ValueError("the tokenizer has no known end-of-document token; name one with --eos or pass --no-eos")
    return i


# ----------------------------------------------------------------------------------------------------------------
# the tasks, in worker processes


def run_tasks(tasks: list[dict], job: dict, workers: int, progress: bool = True) -> dict[int, list[dict]]:
    """Run the tasks (largest first) in `workers` processes; {task id: its piece records}. The progress bar counts
    the tokens written so far (the workers add to a shared counter) and the tasks done."""
    from tqdm.auto import tqdm

    global _TOKENS
    order = sorted(tasks, key=lambda t: (-t["bytes"], t["id"]))
    bar = tqdm(unit="tok", unit_scale=True, desc=f"tokenising (0/{len(order)} tasks)", dynamic_ncols=True,
               disable=not progress)
    records = {}
    ctx = mp.get_context("fork")
    _TOKENS = ctx.Value("q", 0)  # inherited by the forked workers
    # one thread per worker: `workers` is the number of cores used (tokenizers would otherwise start a thread pool)
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with ctx.Pool(min(workers, max(1, len(order))), initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
            results = pool.imap_unordered(run_task, [(t, job) for t in order])
            while len(records) < len(order):
                try:
                    t, recs = results.next(timeout=1.0)
                    records[t] = recs
                    bar.set_description(f"tokenising ({len(records)}/{len(order)} tasks)", refresh=False)
                except mp.TimeoutError:
                    pass
                bar.update(_TOKENS.value - bar.n)
    except BaseException:
        S.remove_partial(job["shard_dir"], {t["id"] for t in tasks})  # the pieces other workers had in flight
        raise
    finally:
        _TOKENS = None
        bar.close()
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    return records


_TOKENS = None  # the tokens written by every worker of the running `run_tasks`


def _die_with_parent(parent: int) -> None:
    """A worker ends when the prepare that started it is killed (else it would go on writing beside the rerun)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # killed before the call above
        os._exit(1)


_TOKENIZERS: dict[str, object] = {}


def run_task(arg) -> tuple[int, list[dict]]:
    """Tokenise one task into its pieces, keeping finished ones; (task id, piece records)."""
    task, job = arg
    tid, shard_dir = task["id"], job["shard_dir"]
    done = S.task_done(shard_dir, tid)
    if done is not None:
        return tid, [S.finished_piece(shard_dir, tid, p) for p in range(done)]
    if job["tokenizer"] not in _TOKENIZERS:
        from .tokenizer import load_tokenizer

        _TOKENIZERS[job["tokenizer"]] = load_tokenizer(job["tokenizer"])
    piece = _Piece(shard_dir, tid, job, _TOKENIZERS[job["tokenizer"]])
    every, size, records = job["every"], 0, []
    try:
        for j, (text, source) in enumerate(job["reader"].documents(task)):
            split = task["split"] if task["split"] == "val" else ("val" if every and j % every == 0 else "train")
            piece.add(text, split, source)
            size += len(text)
            if size >= job["shard_size"]:
                records.append(piece.finish())
                piece, size = _Piece(shard_dir, tid, job, piece.tok, len(records)), 0
        if piece.documents:
            records.append(piece.finish())
    except BaseException:
        piece.abort()
        raise
    S.mark_task_done(shard_dir, tid, len(records))
    return tid, records


class _Piece:
    """The documents of one piece, tokenised in batches; a piece finished by an earlier run is only checked."""

    def __init__(self, shard_dir: str, task: int, job: dict, tok, piece: int = 0):
        self.tok, self.job, self.documents = tok, job, 0
        self.record = S.finished_piece(shard_dir, task, piece)
        self.writer = None if self.record else S.PieceWriter(shard_dir, task, piece, job["dtype"])
        self.batch: list[tuple[str, str, str]] = []

    def add(self, text: str, split: str, source: str) -> None:
        self.documents += 1
        if self.writer is not None:
            self.batch.append((text, split, source))
            if len(self.batch) >= self.job["batch_docs"]:
                self._flush()

    def _flush(self) -> None:
        eos = [] if self.job["eos"] is None else [self.job["eos"]]
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # without offsets, where it exists
        encoded = encode([t for t, _, _ in self.batch], add_special_tokens=False)
        n = 0
        for (_, split, source), enc in zip(self.batch, encoded, strict=True):
            self.writer.append(split, enc.ids + eos, source)
            n += len(enc.ids) + len(eos)
        self.batch = []
        if _TOKENS is not None:
            with _TOKENS.get_lock():
                _TOKENS.value += n

    def finish(self) -> dict:
        if self.writer is None:
            return self.record
        self._flush()
        self.record, self.writer = self.writer.finish(), None  # finished: `abort` must not remove it any more
        return self.record

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


# ----------------------------------------------------------------------------------------------------------------
# merging parts


def merge(out: str, parts) -> dict:
    """Join the parts' indexes (`part-I-of-N.json` in each of `parts`, folders or the files) into `out/meta.json`,
    pointing at the parts' shards where they lie (nothing is copied but the tokenizer files)."""
    files = []
    for p in parts:
        found = sorted(glob.glob(os.path.join(p, "part-*-of-*.json"))) if os.path.isdir(p) else [p]
        if not found or not all(os.path.isfile(f) for f in found):
            raise FileNotFoundError(f"{p!r} holds no part-I-of-N.json (written by `hgrn2 data prepare --part`)")
        files += found
    indexes: dict[int, tuple[dict, str]] = {}
    first = None
    for f in files:
        with open(f) as fh:
            idx = json.load(fh)
        first = first or idx
        i, n = idx["part"]
        if idx["head"] != first["head"] or n != first["part"][1]:
            raise ValueError(f"{f} was prepared with other inputs or settings than {files[0]}")
        if i in indexes:
            raise ValueError(f"part {i}/{n} is given twice ({indexes[i][1]} and {f})")
        indexes[i] = (idx, f)
    n = first["part"][1]
    missing = sorted(set(range(1, n + 1)) - set(indexes))
    if missing:
        raise ValueError(f"part(s) {missing} of {n} are missing")
    head = first["head"]
    records, folder = {}, {}
    for idx, f in indexes.values():
        rel = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(f)), "shards"), os.path.abspath(out))
        for t, recs in idx["tasks"].items():
            records[int(t)], folder[int(t)] = recs, rel.replace(os.sep, "/")
    meta = S.build_index(head, [records[t] for t in range(len(records))], [folder[t] for t in range(len(records))])
    S.check_index(meta, val_expected=head["settings"]["val"] != "every 0")
    os.makedirs(out, exist_ok=True)
    src = os.path.dirname(os.path.abspath(indexes[1][1]))
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(src, name)) and not os.path.samefile(src, out):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name + ".tmp"))
            os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    S.write_record(os.path.join(out, "meta.json"), meta)
    return meta


# ----------------------------------------------------------------------------------------------------------------
# already-tokenised corpora (the single-file format)


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
    meta = {"format": FORMAT_V1, "dtype": np.dtype(dtype).name, "vocab_size": vocab_size, "eos_id": eos_id,
            "tokenizer": None, "splits": counts, "sources": "write_corpus"}
    S.write_record(os.path.join(out, "meta.json"), meta)
    return meta


def _atomic_write_array(path: str, arr: np.ndarray) -> None:
    with open(path + ".tmp", "wb") as f:
        arr.tofile(f)
    os.replace(path + ".tmp", path)
