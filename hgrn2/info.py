"""`hgrn2 info`: what is installed and which backends the dispatch will pick."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .ops import available_backends, triton_available

    print(f"hgrn2        {__version__}")
    print(f"python       {platform.python_version()}")
    for pkg in ("torch", "triton", "transformers", "safetensors", "flash-linear-attention"):
        print(f"{pkg:<12} {_version(pkg)}")
    cuda = torch.cuda.is_available()
    print(f"cuda         {torch.version.cuda if cuda else 'unavailable'}")
    for d in range(torch.cuda.device_count()):
        print(f"  cuda:{d}     {torch.cuda.get_device_name(d)}")
    for op, names in available_backends().items():
        default = "triton" if "triton" in names else ("chunk" if op == "hgrn2" else "scan")
        print(f"{op} backends {', '.join(names)} (default on {'cuda' if cuda else 'cpu'}: {default})")
    glue = "Triton kernels on CUDA tensors" if triton_available() else "PyTorch composites"
    print(f"RMSNorm, SwiGLU, cross entropy: {glue}")
    return 0
