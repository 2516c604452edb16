"""`--device` values checked against the machine, for the commands that take one."""

from __future__ import annotations

import argparse

import torch


def device_name(text: str) -> str:
    """A `--device` value that names a device present here (argparse type): "cpu", "cuda[:N]" or "mps"; anything
    else, or a device this machine lacks, is an argparse error naming the argument."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA GPU that torch can use")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: MPS is not available on this machine")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N or mps)")
    return text
