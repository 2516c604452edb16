"""`hgrn2 plot`: training and validation loss curves from one or more runs' `log.jsonl`, as a PNG.

    hgrn2 plot runs/hgrn2-0.385b runs/llama-0.385b --out loss.png --x tokens
"""

from __future__ import annotations

import argparse
import math
import os

from .logger import read_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (holding log.jsonl) or log.jsonl files")
    parser.add_argument("--out", default="loss.png", help="image file to write (.png, .pdf, .svg, .jpg)")
    parser.add_argument("--x", default="step", choices=["step", "tokens"], help="horizontal axis")
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window for training loss (points)")
    parser.add_argument("--logy", action="store_true", help="logarithmic loss axis")


IMAGE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


def run(args: argparse.Namespace) -> int:
    suffix = os.path.splitext(args.out)[1].lower().lstrip(".")
    if suffix not in IMAGE_FORMATS:
        raise ValueError(f"--out: {args.out!r}: expected an image file name ending in one of "
                         f"{', '.join('.' + f for f in IMAGE_FORMATS)}")
    try:
        curves = {_label(p): read_log(_log_path(p)) for p in args.runs}
    except FileNotFoundError as e:
        import sys

        print(f"hgrn2 plot: error: {e}", file=sys.stderr)
        return 2
    plot(curves, args.out, x=args.x, smooth=args.smooth, logy=args.logy)
    print(f"wrote {args.out}")
    return 0


def _log_path(p: str) -> str:
    path = os.path.join(p, "log.jsonl") if os.path.isdir(p) else p
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{p!r} has no log.jsonl")
    return path


def _label(p: str) -> str:
    return os.path.basename(os.path.normpath(p if os.path.isdir(p) else os.path.dirname(p) or p))


def pyplot(required: bool = False):
    """matplotlib's pyplot on the file backend; None (with a note) without matplotlib, unless `required`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if required:
            raise
        print("matplotlib is not installed (pip install 'hgrn2[plot]'): no plot")
        return None
    return plt


def plot(curves: dict[str, list[dict]], out: str, *, x: str = "step", smooth: int = 1, logy: bool = False) -> None:
    """One panel for training loss, one for validation loss; a line per run."""
    plt = pyplot(required=True)
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in curves.items():
        train = [r for r in rows if r.get("kind") == "train"]
        val = [r for r in rows if r.get("kind") == "val"]
        if train:
            tokens_per_step = train[-1]["tokens"] / train[-1]["step"]
            xs = [r[x] for r in train]
            # a non-finite loss is logged as null (strict JSON): NaN again here, a gap in the line
            ys = _moving_average([math.nan if r["loss"] is None else r["loss"] for r in train], smooth)
            ax_t.plot(xs, ys, label=name)
        if val:
            scale = tokens_per_step if (x == "tokens" and train) else 1
            ax_v.plot([r["step"] * scale for r in val], [math.nan if r["val_loss"] is None else r["val_loss"]
                                                         for r in val], marker="o", label=name)
    for ax, title in ((ax_t, "training loss"), (ax_v, "validation loss")):
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.grid(alpha=0.3)
        if logy:
            ax.set_yscale("log")
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _moving_average(ys: list[float], k: int) -> list[float]:
    if k <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y - (ys[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out
