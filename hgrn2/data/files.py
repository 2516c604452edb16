"""Files written whole or not at all: into a temporary file beside the target, flushed to disk, then renamed over
it, so that a crash or a full disk leaves the previous version (or none), never half a file."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from pathlib import Path


def finite(obj):
    """`obj` with every non-finite float (in its dicts, lists and tuples) made None, which strict JSON can hold."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def strict_dumps(obj, **kwargs) -> str:
    """`json.dumps` of `obj` as strict JSON: NaN and infinities written as null (`finite`), not as `NaN`."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def write_json(path: str | Path, obj, default: Callable | None = None) -> Path:
    """`obj` as strict JSON (indent 1, a final newline; NaN and infinities as null) at `path`, atomically, making its
    folder; `default` as json's (for values JSON has no type for). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(strict_dumps(obj, indent=1, default=default) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def folder_problem(path: str | Path) -> str | None:
    """Why `path` cannot be an output folder (it, or a folder above it, is a file), or None."""
    p = Path(os.path.abspath(path))
    for q in (p, *p.parents):
        if q.exists():
            return None if q.is_dir() else (f"{str(path)!r} is a file, not a folder" if q == p
                                            else f"{str(path)!r} cannot be a folder: {q} is a file")
    return None


def out_folder(text: str) -> str:
    """argparse type of an output folder: refused when it or a folder above it is a file."""
    problem = folder_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text
