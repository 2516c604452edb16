"""NVIDIA MPS for processes sharing one GPU: under its daemon their kernels run side by side instead of taking turns
(no setting of the card changes; the daemon lives for one block of code)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

CONTROL = "nvidia-cuda-mps-control"


@contextlib.contextmanager
def mps_daemon(what: str = "--mps"):
    """Start an MPS control daemon for the processes started inside the block (they find it through
    CUDA_MPS_PIPE_DIRECTORY, set in os.environ with its pipe and log folders in a temporary folder), then stop it
    and restore the environment. A daemon that cannot start is a RuntimeError naming `what` and the reason."""
    exe = shutil.which(CONTROL)
    if exe is None:
        raise RuntimeError(f"`{what}`: {CONTROL} is not on the PATH (it comes with the NVIDIA driver)")
    with tempfile.TemporaryDirectory(prefix="hgrn2-mps-", ignore_cleanup_errors=True) as tmp:
        env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(tmp, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(tmp, "log")}
        for folder in env.values():
            os.makedirs(folder)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            # clients number devices within the daemon's view: a daemon that sees every device leaves their
            # CUDA_VISIBLE_DEVICES meaning what it means without MPS
            daemon_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            started = subprocess.run([exe, "-d"], env=daemon_env, capture_output=True, text=True, check=False)
            if started.returncode:
                why = (started.stderr or started.stdout).strip().splitlines() or [f"exit {started.returncode}"]
                raise RuntimeError(f"`{what}`: {CONTROL} -d failed: {why[-1]}")
            try:
                yield
            finally:
                subprocess.run([exe], input="quit\n", capture_output=True, text=True, check=False)
                _wait_gone(os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control"))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _wait_gone(path: str, seconds: float = 5.0) -> None:
    """Until the daemon has removed its control pipe (it has exited), or `seconds` have passed."""
    end = time.monotonic() + seconds
    while os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
