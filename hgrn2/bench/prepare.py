"""`hgrn2 bench prepare`: how `hgrn2 data prepare` scales with its worker processes.

Assembles a corpus of `--corpus-bytes` of JSON lines offline (CPython's `help()` topics, `hgrn2 data corpus
python-docs`, each copy with its paragraphs in another seeded order, so no two copies are the same text), trains a
byte-level BPE on one copy, then prepares the whole corpus with 1, 2, 4, ... workers and records tokens/s, the
speed-up over one worker and the efficiency (speed-up / workers). Every run must write the same meta.json (the
output does not depend on the number of workers); a run whose index differs fails the benchmark. Worker counts
above the machine's cores are skipped. The corpus and each finished measurement are kept in `--work`, so a run cut
short continues with the next worker count; the record is rewritten after each one. One worker takes minutes on
1 GB: where commands are cut after some minutes, run it in the background (nohup) or run the same command again
until every count is measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hgrn2.data.corpus import documents, parse_size
from hgrn2.data.files import write_json
from hgrn2.data.prepare import prepare, worker_count
from hgrn2.data.tokenizer import train_bpe

from .common import add_output_argument, command_of, environment, format_table, write_result
from .report import PREPARE_COLUMNS

FILE_BYTES = 64_000_000  # the corpus is files of this size (each cut into shards by `data prepare`)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus-bytes", type=parse_size, default=parse_size("1G"), metavar="SIZE",
                        help="size of the assembled corpus (default 1G)")
    parser.add_argument("--workers", default="1,2,4,8,16", help="worker counts to measure, comma-separated")
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("8M"), metavar="SIZE",
                        help="`data prepare --shard-size` (default 8M: about 125 tasks per GB, so that the last "
                             "tasks leave few of 16 workers idle)")
    parser.add_argument("--vocab", type=int, default=16384, help="BPE vocabulary size")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "hgrn2-bench-prepare"),
                        help="folder for the corpus, the outputs and the finished measurements")
    parser.add_argument("--quick", action="store_true", help="a 1 MB corpus, 1 and 2 workers (a smoke run)")
    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.corpus_bytes, args.workers, args.shard_size, args.vocab = 1_000_000, "1,2", 100_000, 1000
    try:
        counts = sorted({int(w) for w in args.workers.split(",")})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        print(f"hgrn2 bench prepare: error: --workers: expected positive integers like 1,2,4, got {args.workers!r}",
              file=sys.stderr)
        return 2
    import transformers  # noqa: F401 - imported before the first timed run, as every later run finds it

    cores = worker_count(None)
    work = Path(args.work)
    corpus, tok = _corpus(work, args.corpus_bytes, args.vocab)
    key = hashlib.sha256(json.dumps([args.corpus_bytes, args.vocab, args.shard_size]).encode()).hexdigest()[:16]
    done_file = work / f"rows-{key}.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    env = environment("cpu") | {"device": f"{_cpu_name()}, {cores} cores", "device_slug": f"cpu{cores}"}
    skipped = [w for w in counts if w > cores]
    for w in counts:
        if w > cores or str(w) in done:
            continue
        done[str(w)] = _measure(corpus, tok, work / "out", w, args.shard_size)
        write_json(done_file, done)
        _record(args, env, counts, done, skipped)
    rows = _record(args, env, counts, done, skipped)
    if skipped:
        print(f"skipped: {skipped} workers: more than the {cores} cores")
    print(format_table(rows, PREPARE_COLUMNS))
    return 0


def _record(args, env, counts, done, skipped) -> list[dict]:
    """The rows so far (checked: every run wrote the same index), written as the benchmark's record."""
    rows = [dict(workers=w, **done[str(w)]) for w in counts if str(w) in done]
    if len({r["meta_sha256"] for r in rows}) > 1:
        raise RuntimeError(f"the prepared index differs between worker counts: {[r['meta_sha256'] for r in rows]}")
    one = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
        if one is not None:
            r["speedup"] = r["tokens_per_s"] / one["tokens_per_s"]
            r["efficiency"] = r["speedup"] / r["workers"]
    note = (f"{args.corpus_bytes / 1e9:.2f} GB of JSON lines (python-docs, reordered copies), BPE vocabulary "
            f"{args.vocab}, --shard-size {args.shard_size:,}; every run wrote the same meta.json")
    if skipped:
        note += f"; {skipped} workers skipped (more than the cores)"
    write_result(args.out, "prepare_scaling", env, rows,
                 command_of(args), quick=args.quick, note=note)
    return rows


def _measure(corpus: Path, tok: Path, out: Path, workers: int, shard_size: int) -> dict:
    start = time.perf_counter()
    meta = prepare([str(corpus)], str(out), tokenizer=str(tok), shard_size=shard_size, workers=workers,
                   overwrite=True, progress=False)
    seconds = time.perf_counter() - start
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    sha = hashlib.sha256((out / "meta.json").read_bytes()).hexdigest()
    shutil.rmtree(out)
    print(f"{workers} worker(s): {tokens:,} tokens in {seconds:.1f} s", flush=True)
    return {"seconds": seconds, "tokens": tokens, "meta_sha256": sha}


def _corpus(work: Path, size: int, vocab: int) -> tuple[Path, Path]:
    """JSON lines files of at least `size` bytes in all and a BPE tokenizer trained on one copy; reused when present."""
    corpus, tok = work / f"corpus-{size}", work / f"tokenizer-{vocab}"
    base = [text for _, text in documents("python-docs")]
    if not (corpus / "done").is_file():
        shutil.rmtree(corpus, ignore_errors=True)
        corpus.mkdir(parents=True)
        written, copy, k = 0, 0, 0
        f = None
        while written < size:
            rng = random.Random(copy)
            for text in base:
                paras = text.split("\n\n")
                rng.shuffle(paras)
                line = (json.dumps({"text": "\n\n".join(paras), "meta": {"copy": copy}}) + "\n").encode()
                if f is None or f.tell() >= FILE_BYTES:
                    f = _next_file(f, corpus, k)
                    k += 1
                f.write(line)
                written += len(line)
                if written >= size:
                    break
            copy += 1
        f.close()
        (corpus / "done").write_text("")
    if not (tok / "tokenizer.json").is_file():
        tok.mkdir(parents=True, exist_ok=True)
        train_bpe(iter(base), vocab).save(str(tok / "tokenizer.json"))
    return corpus, tok


def _next_file(f, folder: Path, k: int):
    if f is not None:
        f.close()
    return open(folder / f"{k:05d}.jsonl", "wb")  # noqa: SIM115 - closed by the caller


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"
