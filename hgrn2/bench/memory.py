"""What autograd keeps for the backward of one training step: bytes of saved tensors, by dtype and shape.

Peak training memory is weights and optimiser state plus these saved activations; counting tensors (not
allocator blocks) works on any device, a CPU included, so regressions show in CPU tests.
"""

from __future__ import annotations

import collections

import torch


def saved_tensor_bytes(step, device_type: str,
                       autocast_dtype: torch.dtype | None = torch.bfloat16) -> collections.Counter:
    """Run `step()` (forward and backward) and return {"dtype (shape)": bytes} of every tensor autograd saved,
    each storage counted once (views of one storage share it), parameters left out (they exist anyway); under
    autocast unless `autocast_dtype` is None."""
    seen, by_kind = set(), collections.Counter()

    def pack(t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and t.numel() > 0 and not isinstance(t, torch.nn.Parameter):
            seen.add(key)
            by_kind[f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"] += storage.nbytes()
        return t

    enabled = autocast_dtype is not None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(device_type=device_type, dtype=autocast_dtype or torch.bfloat16, enabled=enabled):
        step()
    return by_kind


def activation_bytes(by_kind: collections.Counter, batch: int, seq: int) -> dict[str, int]:
    """The entries of `saved_tensor_bytes` shaped [batch, seq, ...] or [batch·seq, ...] (pick batch·seq unlike
    any weight's dimension, so that weights and their autocast copies do not match)."""
    prefixes = (f"({batch}, {seq},", f"({batch * seq},")
    return {k: n for k, n in by_kind.items() if k.split(" ", 1)[1].startswith(prefixes)}
