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

MixerState = torch.Tensor | tuple[torch.Tensor, ...]  # whatever a token mixer returns as its state


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

    def lazy_initialization(self, key_states: torch.Tensor | None = None,
                            value_states: torch.Tensor | None = None) -> None:
        pass

    def update(self, state: MixerState | None, num_tokens: int) -> MixerState | None:
        self.state, self.seen, self.is_initialized = state, self.seen + num_tokens, True
        return state

    def get_seq_length(self, *args: object, **kwargs: object) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int, *args: object) -> tuple[int, int]:
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

    def offload(self) -> None:
        self.state = _map(self.state, lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        pass


class HGRN2Cache(Cache):
    """Per-layer mixer states. `cache[i]` is layer i's state (None before its first update)."""

    def __init__(self, num_layers: int):
        super().__init__(layers=[RecurrentLayer() for _ in range(num_layers)])

    def __getitem__(self, layer_idx: int) -> MixerState | None:
        return self.layers[layer_idx].state

    def update_state(self, layer_idx: int, state: MixerState | None, num_tokens: int) -> MixerState | None:
        """Store layer `layer_idx`'s new state after it consumed `num_tokens` positions."""
        return self.layers[layer_idx].update(state, num_tokens)

    def get_seq_length(self, layer_idx: int | None = 0, *args: object, **kwargs: object) -> int:
        return self.layers[layer_idx or 0].seen if self.layers else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0, *args: object) -> tuple[int, int]:
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


class StaticRecurrentLayer(RecurrentLayer):
    """A layer whose state lives in buffers allocated by the first update (the prefill) and written in place by
    every later one, so a decode step reads and writes the same addresses (what a CUDA graph replays)."""

    def __init__(self):
        super().__init__()
        self.buffers = None

    @property
    def state(self) -> MixerState | None:
        return self.buffers if self.seen else None  # a reset cache hands the mixer no state, its buffers kept

    @state.setter
    def state(self, value: MixerState | None) -> None:
        if value is not None:
            raise AttributeError("a static layer's state is written through `update`")

    def update(self, state: MixerState, num_tokens: int) -> MixerState:
        if self.buffers is not None and _shapes(self.buffers) == _shapes(state):
            _copy_into(self.buffers, state)
        elif self.seen == 0:
            self.buffers = _map(state, torch.clone)
        else:
            raise ValueError(f"static cache: a layer's state changed from {_shapes(self.buffers)} to {_shapes(state)} "
                             "between calls; only token mixers with fixed-size states (not attention) can use it")
        self.seen, self.is_initialized = self.seen + num_tokens, True
        return self.buffers

    def reset(self) -> None:
        self.seen, self.is_initialized = 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.buffers is not None:
            _copy_into(self.buffers, _map(self.buffers, lambda t: t.index_select(0, beam_idx.to(t.device))))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.seen:
            raise NotImplementedError("static cache: the batch size is fixed once the prompt has been fed")

    def offload(self) -> None:
        raise NotImplementedError("static cache: its buffers stay on their device")


def _shapes(state):
    if isinstance(state, torch.Tensor):
        return tuple(state.shape), state.dtype, state.device
    return tuple(_shapes(s) for s in state) if isinstance(state, (tuple, list)) else None


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src):
            _copy_into(d, s)


class HGRN2StaticCache(HGRN2Cache):
    """An HGRN2Cache whose states stay at fixed addresses (allocated on the prompt, written in place after), so the
    one-token decode step can be captured once in a CUDA graph and replayed (`decode`). `reset()` keeps the buffers
    and the graph for the next prompt of the same batch size. Token mixers whose state grows (attention) are refused.

    cuda_graph: replay the decode step from a CUDA graph when it runs on a GPU (eager elsewhere).
    """

    graph_devices = ("cuda",)  # where `decode` captures and replays (tests emulate the graph on the CPU)

    def __init__(self, num_layers: int, cuda_graph: bool = True):
        Cache.__init__(self, layers=[StaticRecurrentLayer() for _ in range(num_layers)])
        self.cuda_graph = cuda_graph
        self.graph = None  # (key, CUDAGraph, static input ids, static logits) once captured

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()

    def graphable(self, input_ids: torch.Tensor | None) -> bool:
        """Whether `decode` may replay a graph for this step: a one-token CUDA step after the prompt, no autograd."""
        return (self.cuda_graph and input_ids is not None and input_ids.device.type in self.graph_devices
                and input_ids.ndim == 2 and input_ids.shape[1] == 1 and self.get_seq_length() > 0
                and not torch.is_grad_enabled() and all(layer.buffers is not None for layer in self.layers))

    def decode(self, step: Callable[[torch.Tensor], torch.Tensor], input_ids: torch.Tensor,
               weights: tuple = ()) -> torch.Tensor:
        """Logits of `step(input_ids)` (one decode step that updates this cache), replayed from a CUDA graph captured
        on first use. `weights`: what identifies the model's weights (a graph reads them at fixed addresses; a new
        value recaptures). Returns a copy, so a caller may keep it past the next step."""
        key = (tuple(input_ids.shape), input_ids.device, weights, tuple(_ptrs(layer.buffers) for layer in self.layers))
        if self.graph is None or self.graph[0] != key:
            self.graph = (key, *self._capture(step, input_ids))
        _, graph, ids, logits = self.graph
        ids.copy_(input_ids)
        graph.replay()
        for layer in self.layers:
            layer.seen += input_ids.shape[1]
        return logits.clone()

    def _capture(self, step, input_ids: torch.Tensor):
        """Warm up `step` on a side stream (Triton autotuning, lazy allocations), put the states back as they were,
        then capture one step; the Python side of the cache (positions seen) is restored too."""
        self.graph = None  # a failed capture leaves none behind
        seen = [layer.seen for layer in self.layers]
        saved = [_map(layer.buffers, torch.clone) for layer in self.layers]
        ids = input_ids.clone()
        try:
            side = torch.cuda.Stream(input_ids.device)
            side.wait_stream(torch.cuda.current_stream(input_ids.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    step(ids)
            torch.cuda.current_stream(input_ids.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = step(ids)
        finally:
            for layer, s, n in zip(self.layers, saved, seen):
                _copy_into(layer.buffers, s)
                layer.seen = n
        return graph, ids, logits


def _ptrs(state) -> tuple:
    out = []
    _map(state, lambda t: out.append(t.data_ptr()) or t)
    return tuple(out)
