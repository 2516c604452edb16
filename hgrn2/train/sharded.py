"""The training engine's checkpoints: sharded through `torch.distributed.checkpoint` (DCP), committed atomically.

A checkpoint is the folder `<dir>/step_00001000/`: every rank writes its own shards of the model and optimiser
(FSDP2: its shards; DDP and one process: DCP writes each replicated tensor once), rank 0 adds `train_state.pt`
(step, loss sums, the optimiser's parameter groups, every rank's RNG state, the config) and `manifest.json` (size and
sha256 of every file), and the folder, written as `step_00001000.tmp/`, becomes a checkpoint by its final rename. A
folder counts only when its manifest matches, so a crash at any point leaves the previous checkpoint in use; loading
reshards to the current world size (a run saved on 2 ranks resumes on 1 and the reverse). Nothing in a checkpoint
is unpickled as code: the tensors through DCP, DCP's metadata through an allow-list (an entry that DCP would
unpickle refused), `train_state.pt` with `weights_only=True`. Single-file `step_*.pt` checkpoints of earlier versions
(`checkpoint.py`) still resume: the language model's (full state dicts keyed by name) and the other tasks'
(`optimizer.state_dict()`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from . import checkpoint as ckpt
from . import distributed as D
from .guard import RunError

STEP_DIR = re.compile(r"step_(\d{8})$")
MANIFEST, TRAIN_STATE = "manifest.json", "train_state.pt"
# how this process's optimiser steps, not its state: a checkpoint's parameter groups do not override them
IMPLEMENTATION = ("foreach", "fused")


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of the committed checkpoint folders and the old single files, oldest first, valid or not."""
    found = [(int(m.group(1)), os.path.join(directory, name)) for name in _names(directory)
             if (m := STEP_DIR.match(name)) and os.path.isdir(os.path.join(directory, name))]
    found += [(int(ckpt.NAME.search(p).group(1)), p) for p in ckpt.list_checkpoints(directory)]
    return sorted(found)


def _names(directory: str) -> list[str]:
    return os.listdir(directory) if os.path.isdir(directory) else []


def save(directory: str, step: int, model, optimizer, train_state: dict, d: D.Dist, keep_last: int) -> str:
    """Write the checkpoint of `step` from every rank and commit it; keep the newest `keep_last`. Returns its path.
    A failed write (SaveError) leaves nothing of it behind."""
    path = os.path.join(directory, f"step_{step:08d}")
    tmp = path + ".tmp"
    if d.main:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    D.barrier(d)
    D.sync_buffers(model, d)  # DCP writes each replicated tensor from any one rank: rank 0's, as DDP uses them
    model_sd, optim_sd = _state(model, optimizer)
    failed = None
    try:
        with _one_process_quietly():
            dcp.save({"model": model_sd, "optim": optim_sd["state"]}, storage_writer=dcp.FileSystemWriter(tmp),
                     no_dist=d.world == 1)  # alone, though other processes may share a process group (sweeps)
        if d.main:
            _write(os.path.join(tmp, TRAIN_STATE), lambda f: torch.save(
                {**train_state, "param_groups": optim_sd["param_groups"]}, f))
            manifest = {name: _file_info(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
            _write(os.path.join(tmp, MANIFEST), lambda f: f.write(json.dumps(manifest).encode()))
            _fsync_dir(tmp)
            shutil.rmtree(path, ignore_errors=True)  # a checkpoint of this step from a run cut before it
            os.replace(tmp, path)
            _fsync_dir(directory)
    except (Exception, CheckpointException) as e:  # DCP's (a BaseException) holds each rank's error: a full disk
        failed = e
    if D.gather_objects(failed is not None, d) != [False] * d.world:
        if d.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise ckpt.SaveError(f"could not write {path} ({_why(failed) if failed else 'failed on another rank'})"
                             "; the previous checkpoint is intact: free space and rerun with resume=true to continue "
                             "from it") from failed
    if d.main:
        for _, old in list_checkpoints(directory)[:-keep_last]:
            _remove(old)
    D.barrier(d)
    return path


def read_model(path: str, key: str = "model") -> dict:
    """The whole model state dict (`key` "optim": the optimiser's state by parameter name), on the CPU, of a
    checkpoint folder, without a model to load it into."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with _one_process_quietly():
        return _load_state_dict_from_keys({key}, storage_reader=SafeReader(path))[key]


def read_latest(directory: str) -> dict | None:
    """The newest intact checkpoint's state with its `model`, on the CPU, without a model to load it into (None
    when there is none); unusable ones are skipped as by `load_latest`."""
    return _newest(directory, D.Dist(0, 1, 0, torch.device("cpu")), lambda path: ckpt.load(path) if not
                   os.path.isdir(path) else {**ckpt.load(os.path.join(path, TRAIN_STATE)), "model": read_model(path)})


def _one_process_quietly():
    """DCP warns on every call that it runs in one process when no process group exists, which is expected here."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process")
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed.checkpoint")
    return stack


def _why(e: BaseException) -> str:
    """The reason of an error in one line; of a CheckpointException, its first rank's."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]  # (exception, traceback summary)
    return ckpt.reason(e)


def _state(model, optimizer) -> tuple[dict, dict]:
    """Model and optimiser state dicts keyed by parameter names: FSDP2's as DTensor shards, others whole."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(D.unwrap(model), optimizer)


def _write(path: str, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _file_info(path: str) -> dict:
    return {"bytes": os.path.getsize(path), "sha256": ckpt.sha256(path)}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        for p in (path, path[:-3] + ".json"):
            if os.path.exists(p):
                os.remove(p)


def remove_stale(directory: str) -> None:
    """Delete what an interrupted save left in `directory`: `.tmp` folders and (of the single files) `.tmp` files."""
    for name in _names(directory):
        path = os.path.join(directory, name)
        if name.endswith(".tmp") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif name.endswith(".tmp"):
            os.remove(path)


def check(path: str) -> str | None:
    """None if the checkpoint folder (or old file) is complete and intact, else the reason it is not."""
    if not os.path.isdir(path):
        return ckpt.check(path)
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({ckpt.reason(e)})"
    files = sorted(n for n in os.listdir(path) if n != MANIFEST)
    if files != sorted(manifest):
        return f"its files {files} are not the manifest's {sorted(manifest)}"
    for name, want in manifest.items():
        got = os.path.getsize(os.path.join(path, name))
        if got != want["bytes"]:
            return f"{name}: size {got} != recorded {want['bytes']} (truncated?)"
        if ckpt.sha256(os.path.join(path, name)) != want["sha256"]:
            return f"{name}: sha256 mismatch (corrupted)"
    return None


def load_latest(directory: str, model, optimizer, d: D.Dist) -> dict | None:
    """Load the newest intact checkpoint into `model` and `optimizer` (resharded to this world size) and return its
    train state (None when there is none). Rank 0 checks the files and every rank follows its verdict; unusable
    checkpoints are skipped with a warning; checkpoints that exist but none intact are a `RunError`."""
    return _newest(directory, d, lambda path: _load(path, model, optimizer, d))


def _newest(directory: str, d: D.Dist, read) -> dict | None:
    found = list_checkpoints(directory)
    for _, path in reversed(found):
        why = check(path) if d.main else None
        why = D.gather_objects(why, d)[0]
        if why is None:
            try:
                return read(path)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - any unreadable one is skipped the same way
                why = f"loading failed: {_why(e)}"
        if d.main:
            warnings.warn(f"checkpoint {path} is unusable ({why}); trying the previous one", stacklevel=2)
    if found:
        raise RunError(f"no intact checkpoint among {len(found)} in {directory} (each is named in a warning above); "
                       "move them away to start over")
    return None


def _load(path: str, model, optimizer, d: D.Dist) -> dict:
    kept = [{k: g[k] for k in IMPLEMENTATION if k in g} for g in optimizer.param_groups]
    state = _load_into(path, model, optimizer, d)
    for group, flags in zip(optimizer.param_groups, kept):
        group.update(flags)
        if group.get("fused"):  # a fused step reads its step counts on the parameters' device
            for p in group["params"]:
                if torch.is_tensor(step := optimizer.state.get(p, {}).get("step")):
                    optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)
    return state


def _load_into(path: str, model, optimizer, d: D.Dist) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not os.path.isdir(path):  # an old single-file checkpoint: full state dicts
        state = ckpt.load(path)
        groups = state["optimizer"]["param_groups"]
        if groups and groups[0]["params"] and isinstance(groups[0]["params"][0], int):  # `optimizer.state_dict()`
            D.unwrap(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        else:
            D.load_full_state(model, optimizer, state["model"], state["optimizer"])
        return state
    model_sd, optim_sd = _state(model, optimizer)  # the templates DCP loads into, in this run's sharding
    with _one_process_quietly():
        dcp.load({"model": model_sd, "optim": optim_sd["state"]}, storage_reader=SafeReader(path),
                 no_dist=d.world == 1)
    state = ckpt.load(os.path.join(path, TRAIN_STATE))
    set_state_dict(D.unwrap(model), optimizer, model_state_dict=model_sd,
                   optim_state_dict={"state": optim_sd["state"], "param_groups": state["param_groups"]},
                   options=StateDictOptions(strict=True))
    return state


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata (pickled by DCP) with the classes it holds only: a planted file cannot run code."""

    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
               ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "Path"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}

    def find_class(self, module: str, name: str):
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, its metadata read through `_MetadataUnpickler` (DCP's own reader uses `pickle.load`)."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, StorageMeta

        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        # DCP unpickles an entry stored as bytes without weights_only; the engine's checkpoints hold tensors only
        pickled = [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
        if pickled:
            raise pickle.UnpicklingError(f"entry {pickled[0]!r} is a pickled object, which is not allowed in a "
                                         f"checkpoint (it would be unpickled as code)")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
