"""Run logs: one JSON object per line in `<out_dir>/log.jsonl` and, if installed, TensorBoard scalars.

Records: {"kind": "train", "step", "loss", "lr", "grad_norm", "tokens", "tok_per_s", "time"} and
{"kind": "val", "step", "val_loss", "val_ppl", "sequences"}. On resume from step s, records after s (written by
the interrupted run after its last checkpoint) are dropped so the log reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import os
import time
import warnings

from ..data.files import strict_dumps


def read_log(path: str) -> list[dict]:
    """The records of a run log. A line that is not a JSON object (garbled, or half-written by a killed process)
    is skipped with a warning naming it; the records after it are kept."""
    out, bad = [], []
    with open(path, "rb") as f:  # bytes: a line that is not UTF-8 is garbled like any other
        lines = f.readlines()
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            out.append(record)
        elif k < len(lines) - 1 or line.endswith(b"\n"):  # a last line without its newline is a cut write
            bad.append(k + 1)
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} unreadable line(s) (line {', '.join(map(str, bad[:5]))}"
                      f"{', ...' if len(bad) > 5 else ''})", stacklevel=2)
    return out


class RunLogger:
    def __init__(self, out_dir: str, *, enabled: bool, start_step: int, tensorboard: bool):
        self.enabled = enabled
        self.path = os.path.join(out_dir, "log.jsonl")
        self.t0 = time.time()
        self.tb = None
        if not enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        self.seen = set()  # (kind, step) of the records in the log: a resumed run may reach a step twice
        if os.path.exists(self.path):
            keep = [r for r in read_log(self.path) if r.get("step", 0) <= start_step] if start_step else []
            self.seen = {(r.get("kind"), r.get("step")) for r in keep}
            self._write(self.path + ".tmp", "w", keep)
            os.replace(self.path + ".tmp", self.path)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tb = SummaryWriter(os.path.join(out_dir, "tb"), purge_step=start_step + 1 if start_step else None)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        key = (record.get("kind"), record.get("step"))
        if key in self.seen:
            return
        self.seen.add(key)
        record = {**record, "time": round(time.time() - self.t0, 3)}
        self._write(self.path, "a", [record])
        if self.tb is not None:
            for key, value in record.items():
                if key not in ("kind", "step", "time") and isinstance(value, int | float):
                    self.tb.add_scalar(f"{record['kind']}/{key}", value, record["step"])

    @staticmethod
    def _write(path: str, mode: str, records: list[dict]) -> None:
        try:
            with open(path, mode) as f:
                f.writelines(strict_dumps(r) + "\n" for r in records)
        except OSError as e:
            if mode == "w" and os.path.exists(path):
                os.remove(path)
            raise OSError(e.errno, f"could not write the run log {path} ({e.strerror}); free space and rerun with "
                                   f"resume=true") from e

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

