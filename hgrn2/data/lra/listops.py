"""ListOps (Nangia & Bowman 2018) as Long Range Arena generates it (google-research/long-range-arena
`lra_benchmarks/data/listops.py`): nested MIN / MAX / MED / SM (sum mod 10) expressions over digits 0-9.

A node is a digit with probability 0.75 (always at the maximum depth 10), else an operator with 2-10 arguments.
An expression is kept when its length (digits, operators and closing brackets) is strictly between 500 and 2000;
duplicates are dropped. Splits: 96,000 / 2,000 / 2,000. Files use LRA's release layout, `basic_{train,val,test}.tsv`
(header `Source\tTarget`, bracketed strings such as `( ( ( [MAX 2 ) 9 ) ] )`).

Differences from LRA's script, for reproducibility: one `random.Random(seed)` per chunk of examples (chunks run
in parallel; the result does not depend on the number of workers), and duplicates are dropped in generation order
(LRA's Python `set` gave a hash-dependent order).
"""

from __future__ import annotations

import csv
import os
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25
MAX_DEPTH, MAX_ARGS, MIN_LENGTH, MAX_LENGTH = 10, 10, 500, 2000
SPLITS = {"train": 96_000, "val": 2_000, "test": 2_000}
CHUNK = 500
# token ids: 0 padding, 1 end of sequence, then the operators, the closing bracket and the digits
DIGITS = tuple(str(v) for v in range(10))
VOCAB = ("<pad>", "<eos>", *OPERATORS, END, *DIGITS)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}


def grow(rng: random.Random, parts: list[str], depth: int = 1) -> int:
    """One expression as LRA's `generate_tree` draws it (the same draws in the same order: the node kind, a digit or
    the argument count, the arguments, then the operator), written into `parts` as the string LRA's `to_string`
    makes of its tree of pairs, e.g. "( ( ( [MAX 2 ) 9 ) ] )"; returns LRA's length (digits, operators, closing
    brackets). Most expressions fall outside the length limits: no tree and no value is built for them."""
    if depth == MAX_DEPTH or rng.random() > VALUE_P:
        parts.append(rng.choice(DIGITS))
        return 1
    n = rng.randint(2, MAX_ARGS)
    head = len(parts)
    parts.append("")  # "( " per pair and the operator, which is drawn after the arguments
    length = 2
    for k in range(n):
        if k:
            parts.append(" ")
        length += grow(rng, parts, depth + 1)
        parts.append(" )")
    parts.append(" ] )")
    parts[head] = "( " * (n + 1) + rng.choice(OPERATORS) + " "
    return length


def apply(op: str, args: list[int]) -> int:
    """LRA's operators; MED is its int(np.median(args)): the middle value, or the floor of the middle two's mean."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        s, m = sorted(args), len(args) // 2
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2
    return sum(args) % 10


def evaluate(source: str) -> int:
    """Value of a ListOps string by a token stack (independent of the tree form; brackets are ignored)."""
    stack: list[tuple[str, list[int]]] = []
    result = None
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok in OPERATORS:
            stack.append((tok, []))
        elif tok == END:
            op, args = stack.pop()
            value = apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif tok.isdigit() and len(tok) == 1:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"`source`: unexpected ListOps token {tok!r}")
    if stack or result is None:
        raise ValueError("`source`: unbalanced ListOps expression")
    return result


def _chunk(args: tuple[int, int, int, int, int]) -> list[tuple[str, int]]:
    seed, index, count, min_length, max_length = args
    rng = random.Random(f"listops-{seed}-{index}")
    out = []
    while len(out) < count:
        parts: list[str] = []
        if min_length < grow(rng, parts) < max_length:
            source = "".join(parts)
            out.append((source, evaluate(source)))
    return out


def generate(n: int, seed: int = 0, workers: int | None = None, min_length: int = MIN_LENGTH,
             max_length: int = MAX_LENGTH, progress: bool = True) -> list[tuple[str, int]]:
    """n distinct (source, label) examples, seeded; chunks of 500 run over `workers` processes."""
    out: dict[str, int] = {}
    index = 0
    workers = workers or os.cpu_count() or 1
    with tqdm(total=n, desc="ListOps", disable=not progress, leave=False) as bar, \
            ProcessPoolExecutor(workers) as pool:
        while len(out) < n:
            need = n - len(out)
            jobs = [(seed, index + k, min(CHUNK, need - k * CHUNK), min_length, max_length)
                    for k in range((need + CHUNK - 1) // CHUNK)]
            index += len(jobs)
            for chunk in pool.map(_chunk, jobs):
                for source, label in chunk:
                    if len(out) < n and source not in out:
                        out[source] = label
                        bar.update(1)
    return list(out.items())


def write_splits(directory: str | Path, seed: int = 0, sizes: dict[str, int] | None = None,
                 workers: int | None = None, **kwargs) -> Path:
    """Generate and write `basic_{train,val,test}.tsv` under `directory` (each written atomically)."""
    sizes = sizes or SPLITS
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = generate(sum(sizes.values()), seed, workers, **kwargs)
    start = 0
    for split, size in sizes.items():
        path = directory / f"basic_{split}.tsv"
        with open(str(path) + ".tmp", "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t")
            writer.writerow(["Source", "Target"])
            writer.writerows(data[start:start + size])
        os.replace(str(path) + ".tmp", path)
        start += size
    return directory


def read_split(path: str | Path) -> tuple[list[str], np.ndarray]:
    """(sources, labels) of one `basic_*.tsv` file."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows or rows[0][:2] != ["Source", "Target"]:
        raise ValueError(f"{path}: expected a TSV with the header 'Source\\tTarget' (LRA's listops-1000 layout)")
    return [r[0] for r in rows[1:]], np.array([int(r[1]) for r in rows[1:]], dtype=np.int64)


def tokenize(source: str) -> list[int]:
    """Token ids of a ListOps string, brackets dropped, with the end-of-sequence token appended."""
    return [TOKEN_ID[t] for t in source.replace("(", " ").replace(")", " ").split()] + [TOKEN_ID["<eos>"]]
