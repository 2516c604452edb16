"""A transformers `Cache` holding each token mixer's own recurrent state, for `generate` and manual decoding.

Each layer stores whatever its mixer returned (a tensor or a tuple of tensors: HGRU2's [B, H, V, K] state, conv
tails, an attention mixer's keys/values). The cache counts the positions it has consumed (padding included), so
`get_seq_length()` is the length of the prefix already folded into the state. Memory is constant in context
length for recurrent mixers. A recurrent state cannot be rolled back, so `crop` refuses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def _map(state, fn: Callable[[torch.Tensor], torch.Tensor]):
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (tuple, list)):
        return type(state)(_map(s, fn) for s in state)
    if state is None:
        return None
    raise TypeError(f"mixer states must be tensors or tuples of tensors, got {type(state).__name__}")


class RecurrentLayer(CacheLayerMixin):
    """One layer's mixer state (`state`) and the number of positions folded into it."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self):
        super().__init__()
        self.state = None
        self.seen = 0

    def lazy_initialization(self, key_states=None, value_states=None) -> None:
        pass

    def update(self, state, num_tokens: int):
        self.state, self.seen, self.is_initialized = state, self.seen + num_tokens, True
        return state

    def get_seq_length(self, *args, **kwargs) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:
        return -1

    def reset(self) -> None:
        self.state, self.seen, self.is_initialized = None, 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.state = _map(self.state, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.state = _map(self.state, lambda t: t.repeat_interleave(repeats, dim=0))

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.seen + max_length
        if max_length < self.seen:
            raise NotImplementedError("a recurrent state cannot be rolled back to an earlier position")

    def offload(self):
        self.state = _map(self.state, lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        pass


class HGRN2Cache(Cache):
    """Per-layer mixer states. `cache[i]` is layer i's state (None before its first update)."""

    def __init__(self, num_layers: int):
        super().__init__(layers=[RecurrentLayer() for _ in range(num_layers)])

    def __getitem__(self, layer_idx: int):
        return self.layers[layer_idx].state

    def update_state(self, layer_idx: int, state, num_tokens: int):
        """Store layer `layer_idx`'s new state after it consumed `num_tokens` positions."""
        return self.layers[layer_idx].update(state, num_tokens)

    def get_seq_length(self, layer_idx: int | None = 0, *args, **kwargs) -> int:
        return self.layers[layer_idx or 0].seen if self.layers else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args) -> tuple[int, int]:
        return self.layers[layer_idx].get_mask_sizes(query_length)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1

    @property
    def is_compileable(self) -> bool:
        return False

    def memory_bytes(self) -> int:
        """Bytes held by all layer states (for checking that decoding memory does not grow)."""
        total = []
        for layer in self.layers:
            _map(layer.state, lambda t: total.append(t.numel() * t.element_size()) or t)
        return sum(total)
