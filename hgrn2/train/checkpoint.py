"""Single-file checkpoints (the layout of earlier versions, which runs still resume from through `sharded.py`):
atomic writes, a checksum sidecar, keep-last-N; and the RNG states every checkpoint holds.

`<dir>/step_00001000.pt` is written as `.tmp`, fsynced and renamed into place; then `step_00001000.json` records its
size and sha256. A checkpoint counts only when its sidecar exists and matches, so a crash at any point (or a file
truncated or corrupted later) leaves the previous good checkpoint in use, with a warning naming the bad one.
States hold tensors and plain Python values only and are read with `torch.load(..., weights_only=True)`, so a
planted file cannot run code when a run resumes.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re

import numpy as np
import torch

NAME = re.compile(r"step_(\d{8})\.pt$")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


class SaveError(OSError):
    """A checkpoint or export could not be written (typically a full disk); what was there before is intact."""


def _atomic_write(path: str, write) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError ("unexpected pos")
        _remove(tmp)
        raise SaveError(f"could not write {path} ({reason(e)}); the previous checkpoint is intact: free space and "
                        f"rerun with resume=true to continue from it") from e


def reason(e: BaseException) -> str:
    """The OS's reason (torch.save wraps a failed write into an "unexpected pos" RuntimeError), in one line."""
    for x in (e, e.__cause__, e.__context__):
        if isinstance(x, OSError) and x.strerror:
            return x.strerror
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    # a heading that ends in a colon ("Error(s) in loading state_dict for X:") says nothing without its first item
    return (lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else ""))[:200]


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def save(directory: str, step: int, state: dict, keep_last: int) -> str:
    """Write `state` as the checkpoint of `step` and delete all but the newest `keep_last`. Returns the path.

    A failed write (SaveError) leaves neither a partial file nor a checkpoint without its sidecar behind."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step:08d}.pt")
    _atomic_write(path, lambda f: torch.save(state, f))
    side = {"step": step, "bytes": os.path.getsize(path), "sha256": sha256(path)}
    try:
        _atomic_write(path[:-3] + ".json", lambda f: f.write(json.dumps(side).encode()))
    except SaveError:
        _remove(path)
        raise
    for old in list_checkpoints(directory)[:-keep_last]:
        for p in (old, old[:-3] + ".json"):
            if os.path.exists(p):
                os.remove(p)
    return path


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint files in step order (oldest first), valid or not."""
    return sorted(p for p in glob.glob(os.path.join(directory, "step_*.pt")) if NAME.search(p))


def check(path: str) -> str | None:
    """None if the checkpoint is complete and intact, else the reason it is not."""
    side = path[:-3] + ".json"
    if not os.path.isfile(side):
        return "no checksum sidecar (the run stopped while writing it)"
    try:
        with open(side) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return f"unreadable sidecar: {e}"
    if os.path.getsize(path) != meta.get("bytes"):
        return f"size {os.path.getsize(path)} != recorded {meta.get('bytes')} (truncated?)"
    if sha256(path) != meta.get("sha256"):
        return "sha256 mismatch (corrupted)"
    return None


# what checkpoints written before the RNG state was kept in plain types hold: numpy's generator state
_OLD_NUMPY = [np.ndarray, np.dtype, np.dtypes.UInt32DType,
              getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct]


def load(path: str) -> dict:
    """A checkpoint's state on the CPU, unpickled with tensors, containers and numbers only."""
    with torch.serialization.safe_globals(_OLD_NUMPY):
        return torch.load(path, map_location="cpu", weights_only=True)


def rng_state(device: torch.device | None = None) -> dict:
    """Every RNG of this process; CUDA's of `device` (None: the current one), which need not be the current one."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    numpy = (kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, gauss)  # tensors: weights_only loads them
    state = {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device or "cuda")
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore `rng_state`'s result (a state without Python's and numpy's sets torch's alone)."""
    if "python" in state:
        random.setstate(state["python"])
        kind, key, *rest = state["numpy"]
        np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.set_rng_state(state["cuda"], device or "cuda")
