"""torchrun integration: process group from the environment, DDP / FSDP2 wrapping, full state dicts, reductions.

Single-node and multi-node runs differ only in torchrun's arguments (rendezvous); nothing here changes.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(want: str = "auto") -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPU.
    `want`: "auto" (CUDA when available), "cuda" or "cpu"."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but CUDA is not available")
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return Dist(rank, world, local, device)


def shutdown() -> None:
    """Leave the process group. Callers drop their wrapped models first: DDP and FSDP2 keep the group in reference
    cycles, and if the interpreter's teardown frees it, gloo's destructors abort the process or hang."""
    if dist.is_initialized():
        # every rank reaches the teardown before any tears down: gloo aborts a rank whose peer has already gone
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer/RNN blocks (HF convention: `model.model.layers`)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find its blocks (expected .model.layers)")
    return list(layers)


def wrap(model: torch.nn.Module, how: str, d: Dist, *, reshard: str = "auto", param_dtype: str = "fp32",
         prefetch: int = 1, unit: int = 1) -> torch.nn.Module:
    """DDP, or FSDP2 (`fully_shard` on every unit of `unit` consecutive blocks, then the root), or the model itself
    when alone.

    FSDP2 only: `reshard` after each unit's forward: "auto" (every unit but the last, whose parameters the
    backward needs again at once), "always" or "never" (parameters stay gathered from the forward to the backward:
    more memory, one all-gather per step fewer); `param_dtype` "bf16" gathers and computes with bf16 copies of the
    parameters (`MixedPrecisionPolicy`, gradients reduced in fp32; half the all-gather bytes), "fp32" gathers the
    fp32 parameters that autocast then casts; `prefetch`: how many next units' all-gathers are issued ahead, in
    the forward and the backward; `unit`: blocks per unit, each unit one all-gather and one reduce-scatter (the
    host's work per step falls with the number of units, the memory held at once rises)."""
    if unit < 1:
        raise ValueError(f"`unit`: expected at least 1 block per FSDP2 unit, got {unit}")
    if d.world == 1:
        return model
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if param_dtype == "bf16" else MixedPrecisionPolicy()
    layers = blocks(model)
    groups = [layers[i:i + unit] for i in range(0, len(layers), unit)]
    for i, group in enumerate(groups):
        after = {"auto": i < len(groups) - 1, "always": True, "never": False}[reshard]
        fully_shard(group if len(group) > 1 else group[0], reshard_after_forward=after, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if prefetch:
        heads = [group[0] for group in groups]  # a unit's modules share one FSDP state: its first stands for it
        for i, head in enumerate(heads):
            # issue the next units' all-gathers while this one computes (FSDP2 prefetches one unit in the
            # backward by itself, none in the forward), so that a fast GPU does not wait on the host to launch them
            if heads[i + 1:i + 1 + prefetch]:
                head.set_modules_to_forward_prefetch(heads[i + 1:i + 1 + prefetch])
            if prefetch > 1 and i:
                head.set_modules_to_backward_prefetch(heads[max(0, i - prefetch):i][::-1])
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def no_sync(model: torch.nn.Module, sync: bool):
    """Context for one micro step: skip the gradient all-reduce except on the last one (DDP and FSDP2)."""
    import contextlib

    if hasattr(model, "no_sync") and not sync:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        # FSDP2: between the micro steps of one optimiser step, keep the parameters gathered after the backward
        # (the next micro step's forward needs them), sharding them again after the last one
        model.set_reshard_after_backward(sync)
    return contextlib.nullcontext()


def full_model_state(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(unwrap(model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model, optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load full state dicts, which every rank holds; each keeps its shard (FSDP2) or replica (DDP).

    (StateDictOptions.broadcast_from_rank0, which would let only rank 0 read the file, hung on gloo in torch 2.13
    for both DDP and FSDP2.)
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(unwrap(model), optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(full_state_dict=True))


def sync_buffers(model: torch.nn.Module, d: Dist) -> None:
    """Rank 0's buffers on every rank (those DDP broadcasts before each training forward; BatchNorm's statistics
    differ between ranks until then)."""
    if d.world > 1:
        for buffer in unwrap(model).buffers():
            dist.broadcast(buffer, 0)


def mean(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """Average over ranks (sum then divide: gloo has no AVG)."""
    return total(x, d) / d.world


def total(x: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        x = x.clone()
        dist.all_reduce(x)
    return x


def gather_objects(obj, d: Dist) -> list:
    if d.world == 1:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def main_process() -> bool:
    """False on torchrun's ranks other than 0, which leave tables and records to rank 0."""
    return int(os.environ.get("RANK", "0")) == 0
