"""Running under ``torchrun``: process group, device, and the ``parallelize`` step (compile, DDP or FSDP2).

The model knows nothing of distribution: :func:`parallelize` takes a plain ``DDLForCausalLM`` and returns
the module to train (like torchtitan). FSDP2 shards every ``DDLBlock`` and then the root with
``fully_shard``; on CUDA with a mixed-precision policy of bf16 parameters and fp32 gradient reduction.

Checkpoint state goes through ``torch.distributed.checkpoint.state_dict`` with full (unsharded) state
dicts, so a checkpoint written by one mode (single process, DDP, FSDP) resumes in any other.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from deep_delta import runtime


@dataclass
class DistInfo:
    """Where this process runs: ``mode`` is "none", "ddp" or "fsdp"."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mode: str = "none"
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mode != "none"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """The device of this process: :func:`deep_delta.runtime.resolve_device` with "cuda" meaning the GPU of
    ``LOCAL_RANK``."""
    return runtime.resolve_device(device, local_rank)


def setup(distributed: str = "auto", device: str = "auto") -> DistInfo:
    """Read the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), pick the device and, for
    more than one process, initialise the process group (nccl on CUDA, gloo on CPU).

    ``distributed``: "auto" (DDP when WORLD_SIZE > 1), "none", "ddp" or "fsdp". FSDP is allowed with one
    process (it then only shards trivially), DDP too (it becomes a no-op wrapper).
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if distributed == "none" and world > 1:
        raise ValueError(
            f"TrainConfig: `distributed` got 'none' but WORLD_SIZE={world} processes were started; "
            "allowed under torchrun: auto | ddp | fsdp"
        )
    mode = ("ddp" if world > 1 else "none") if distributed == "auto" else distributed
    dev = resolve_device(device, local_rank)
    owns = False
    if mode != "none" and not dist.is_initialized():
        if world == 1:  # a single process asked for ddp/fsdp explicitly: a private one-process group
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=dev if dev.type == "cuda" else None)
        owns = True
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, mode=mode, device=dev, owns_group=owns)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def teardown(info: DistInfo) -> None:
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def check_cuda_graphs(cuda_graphs: str, info: DistInfo) -> None:
    """CUDA graphs (``TrainConfig.cuda_graphs`` other than "off") need a CUDA device and one process: the graphs of
    Inductor's mode="reduce-overhead" are not captured for CPU tensors (it would silently run without them), and
    DDP's and FSDP's communication hooks run between the compiled regions, which has not been tested with them."""
    if cuda_graphs == "off":
        return
    if info.device.type != "cuda":
        raise ValueError(f"TrainConfig: `cuda_graphs` got {cuda_graphs!r} on device {info.device}; allowed: off "
                         "(CUDA graphs need a CUDA device)")
    if info.mode != "none":
        raise ValueError(f"TrainConfig: `cuda_graphs` got {cuda_graphs!r} under {info.mode.upper()}; allowed: off "
                         "(CUDA graphs are for one process; not tested with DDP or FSDP)")


def parallelize(model: nn.Module, info: DistInfo, *, compile: bool = False, bf16: bool = False,
                cuda_graphs: str = "off") -> nn.Module:
    """The module to train: ``model`` compiled (per block, in place) and wrapped for ``info.mode``.

    ``bf16`` selects FSDP's mixed-precision policy (bf16 parameters, fp32 reduction); DDP and single-process
    runs use autocast instead. ``cuda_graphs`` (with ``compile``; :func:`check_cuda_graphs`): "blocks" compiles
    each block with mode="reduce-overhead" (its forward and backward captured and replayed as CUDA graphs by
    Inductor's CUDA graph trees), "model" the whole model in place instead of the blocks.
    """
    check_cuda_graphs(cuda_graphs, info)
    if cuda_graphs != "off" and not compile:
        raise ValueError(f"parallelize: `cuda_graphs` got {cuda_graphs!r} with compile=False; allowed: off")
    if cuda_graphs != "off" and getattr(getattr(model, "model", None), "recompute_states", False):
        raise ValueError(f"parallelize: `cuda_graphs` got {cuda_graphs!r} for a model with recompute_states; allowed: "
                         "off (the state rebuild's saved-tensor hooks cannot run inside a graph)")
    if compile and cuda_graphs == "model":
        model.compile(mode="reduce-overhead")
    elif compile:
        kwargs = {"mode": "reduce-overhead"} if cuda_graphs == "blocks" else {}
        # the blocks share DDLBlock.forward's code object, whose graphs Dynamo counts against recompile_limit (8):
        # blocks whose inputs differ (AttnRes: a longer tuple of sources at every block) need graphs of their own
        # (the design says how many: design.graphs_per_block)
        limit = torch._dynamo.config.recompile_limit
        per_block = model.config.design.graphs_per_block(model.config)
        torch._dynamo.config.recompile_limit = max(limit, per_block * len(model.model.layers))
        for block in model.model.layers:
            block.compile(**kwargs)
    if info.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if info.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # Fused channel reads let block i read block i+1's compressor weight: a parameter of another FSDP unit,
        # still sharded then (and its gradient would miss that unit's reduce-scatter). Read inside each block.
        if hasattr(model.model, "fuse_reads"):
            model.model.fuse_reads = False

        # A block hands its output, a reshaped view for d_v > 1, to the next block; nothing modifies it in place,
        # so FSDP's warning about views is moot here.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        mp = fsdp_mixed_precision(bf16)
        for block in model.model.layers:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    return model


def fsdp_mixed_precision(bf16: bool):
    """FSDP2's ``MixedPrecisionPolicy``: with ``bf16`` the blocks compute in bf16 parameters (gathered in bf16)
    and gradients are reduced in fp32 (the sharded master weights and the optimizer state stay fp32);
    without, FSDP2's default (the parameters' own dtype throughout)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def set_gradient_sync(module: nn.Module, info: DistInfo, enabled: bool) -> None:
    """Turn the gradient all-reduce of the next backward on or off (off for all but the last micro-batch)."""
    if info.mode == "ddp":
        module.require_backward_grad_sync = enabled
    elif info.mode == "fsdp":
        module.set_requires_gradient_sync(enabled)


def reshard(module: nn.Module, info: DistInfo) -> None:
    """Free FSDP's gathered parameters after forward-only work (evaluation): without a backward the root
    keeps them gathered, and the state-dict helpers would then see the unsharded tensors."""
    if info.mode == "fsdp":
        for m in module.modules():
            if hasattr(m, "reshard") and hasattr(m, "set_requires_gradient_sync"):
                m.reshard()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.distributed and info.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def agreed_signal(requested: int | None, info: DistInfo) -> int | None:
    """The stop signal any rank received (``requested``: this rank's, or None), so that every rank stops after the
    same step; one process: its own."""
    if not (info.distributed and info.world_size > 1):
        return requested
    flag = torch.tensor([0.0 if requested is None else float(requested)], device=info.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return requested if requested is not None or not flag.item() else int(flag.item())


def barrier(info: DistInfo) -> None:
    if info.distributed and info.world_size > 1:
        dist.barrier()


def broadcast_object(obj, info: DistInfo):
    """``obj`` of rank 0 on every rank."""
    if not (info.distributed and info.world_size > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model state on CPU (a collective under FSDP: call it on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    """The unsharded optimizer state keyed by parameter names (a collective under FSDP); of
    ``optim.MuonWithAdamW``, both optimizers' in one (their groups in order, their tensors' states by name)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, _torch_optimizers(optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """Load a state from :func:`full_optimizer_state` (every rank passes the full state)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, _torch_optimizers(optimizer), optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True))


def _torch_optimizers(optimizer):
    """The torch optimizer, or the list of those ``optim.MuonWithAdamW`` combines (the state-dict helpers take
    either)."""
    from deep_delta.train.optim import MuonWithAdamW

    return optimizer.optimizers if isinstance(optimizer, MuonWithAdamW) else optimizer
