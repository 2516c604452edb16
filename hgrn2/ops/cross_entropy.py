"""Cross entropy of a linear head without materialising the [N, V] logits.

The forward walks over row chunks, keeping only the fp32 log-sum-exp per row; the backward recomputes each
chunk's logits and turns them into gradients right away. Peak extra memory is one [chunk, V] fp32 block instead
of the full logits (and their gradient), which dominates memory at large vocabularies. On CUDA the element-wise
work on each chunk's logits (log-sum-exp; softmax − onehot, scaled) runs as Triton kernels
(`hgrn2.ops.triton.cross_entropy`): one pass each instead of the composite's five or six over a float32 copy.
"""

from __future__ import annotations

import torch

from . import use_glue_kernels as _use_triton  # a module global, so that tests can force either path
from .checks import check_values

# default chunk: 256 MB of bf16 logits (Triton path) or 512 MB of fp32 ones. Larger chunks than the memory needs,
# because each chunk costs a dozen kernel launches, and an eager training step is bound by the CPU that launches
# them: `hgrn2 bench train`'s 16K tokens at V = 32000 make 4 chunks (16 at 2**25 elements)
CHUNK_ELEMENTS = 1 << 27
# the logits' rows are laid out ROW_ALIGN columns apart (the weight padded with zero rows): cuBLAS's fast GEMMs
# need 16-byte-aligned rows, and a vocabulary such as GPT-2's 50265 otherwise falls to fallback kernels several
# times slower
ROW_ALIGN = 64


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                         ignore_index: int = -100, chunk_size: int | None = None,
                         reduction: str = "mean") -> torch.Tensor:
    """CE(hidden @ weightᵀ, labels), equal to `F.cross_entropy(hidden @ weight.T, labels)` (fp32 softmax).

    Args:
        hidden: [N, d] float. weight: [V, d], same dtype. labels: [N] int, in [0, V) or `ignore_index`.
        chunk_size: rows per chunk (default: about 2**25 / V).
        reduction: "mean" over non-ignored rows (0 when there are none) or "sum".
    Returns a scalar float32 loss.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"`hidden`, `weight`: expected [N, d] and [V, d], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1] or labels.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"`labels`: expected an int tensor of shape {tuple(hidden.shape[:1])}, got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"`reduction`: expected 'mean' or 'sum', got {reduction!r}")
    V = weight.shape[0]
    if not torch.compiler.is_compiling():  # data-dependent: compiled graphs would break here
        check_labels(labels, V, ignore_index)
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):  # as nn.Linear would under autocast: both operands in the autocast dtype
        dt = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dt), weight.to(dt)
    if hidden.dtype != weight.dtype:
        raise ValueError(f"`hidden`, `weight`: expected one dtype, got {hidden.dtype} and {weight.dtype}")
    if chunk_size is None:
        chunk_size = max(1, CHUNK_ELEMENTS // V)
    if chunk_size < 1:
        raise ValueError(f"`chunk_size`: expected a positive int, got {chunk_size}")
    return _LinearCrossEntropy.apply(hidden, weight, labels, ignore_index, chunk_size, reduction)


def check_labels(labels: torch.Tensor, V: int, ignore_index: int) -> None:
    """A clear error for labels outside [0, V) other than ignore_index (no host sync on a GPU: `check_values`)."""
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    check_values(~bad.any(), "labels", f"values in [0, {V}) or ignore_index={ignore_index}",
                 lambda: f"{labels[bad][:4].tolist()} among them")


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def forward(ctx, hidden, weight, labels, ignore_index, chunk_size, reduction):
        valid = labels != ignore_index
        safe = torch.where(valid, labels, 0)
        ctx.triton = _use_triton(hidden)
        V, padded = weight.shape[0], _padded(weight)
        lses, targets = [], []
        for s in range(0, hidden.shape[0], chunk_size):
            logits = (hidden[s:s + chunk_size] @ padded.t())[:, :V]
            if ctx.triton:
                from .triton.cross_entropy import ce_fwd
                lse, target = ce_fwd(logits, safe[s:s + chunk_size])
            else:
                logits = logits.float()
                lse, target = logits.logsumexp(-1), logits.gather(1, safe[s:s + chunk_size, None]).squeeze(1)
            lses.append(lse)
            targets.append(target)
        # per-row results are joined once: per-chunk slicing, copies and sums cost launches on the CPU
        lse, target = torch.cat(lses), torch.cat(targets)
        total = ((lse - target) * valid).sum()
        denom = valid.sum().clamp(min=1).float() if reduction == "mean" else torch.ones((), device=hidden.device)
        ctx.save_for_backward(hidden, weight, safe, valid, lse, denom)
        ctx.chunk_size = chunk_size
        return total / denom

    @staticmethod
    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def backward(ctx, grad_out):
        hidden, weight, safe, valid, lse, denom = ctx.saved_tensors
        C = ctx.chunk_size
        need_h, need_w = ctx.needs_input_grad[:2]
        V, padded = weight.shape[0], _padded(weight)
        dh = torch.empty_like(hidden) if need_h else None
        # the padding's rows of dw are dropped at the end; its columns of p stay 0 (logits of zero rows, untouched)
        dw = torch.zeros(padded.shape, dtype=torch.float32, device=weight.device) if need_w else None
        coef = (grad_out.float() / denom) * valid.float()  # d loss / d logit-row scale, 0 for ignored rows
        for s in range(0, hidden.shape[0], C):
            h = hidden[s:s + C]
            p = h @ padded.t()
            if ctx.triton:
                from .triton.cross_entropy import ce_bwd_
                ce_bwd_(p[:, :V], safe[s:s + C], lse[s:s + C], coef[s:s + C])
            else:
                q = (p[:, :V].float() - lse[s:s + C, None]).exp_()  # softmax
                q.scatter_add_(1, safe[s:s + C, None], -torch.ones_like(q[:, :1]))  # softmax − onehot
                p[:, :V] = q.mul_(coef[s:s + C, None])  # back in the input dtype: matmuls as for the logits
            if need_h:
                torch.mm(p, padded, out=dh[s:s + C])  # p, weight and dh share hidden's dtype
            if need_w:
                dw.add_(p.t() @ h)  # fp32 accumulation of the chunk's product (promoted in the add)
        return dh, (dw[:V].to(weight.dtype) if need_w else None), None, None, None, None


def _padded(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [V, d] with zero rows appended up to a multiple of ROW_ALIGN (itself when already one)."""
    extra = -weight.shape[0] % ROW_ALIGN
    return torch.nn.functional.pad(weight, (0, 0, 0, extra)) if extra else weight
