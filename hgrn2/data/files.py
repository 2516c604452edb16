"""Files written whole or not at all: into a temporary file beside the target, flushed to disk, then renamed over
it, so that a crash or a full disk leaves the previous version (or none), never half a file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def write_json(path: str | Path, obj, default: Callable | None = None) -> Path:
    """`obj` as JSON (indent 1, a final newline) at `path`, atomically, making its folder; `default` as json's (for
    values JSON has no type for). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=1, default=default) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
