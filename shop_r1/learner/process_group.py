"""The learner ranks' torch.distributed group, the same for every backend: joining it (`init_process_group`) and the
small all-reduce the steps use (`all_reduce`, behind the learner rank's, protocol.TrainingRank.all_reduce). gloo on
CPU, NCCL on CUDA.

MASTER_ADDR / MASTER_PORT name the rendezvous store the Ray learner group holds (its port picked by the OS at bind
time); run alone, a learner forms a one-rank group on 127.0.0.1 with its own store.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Literal

import torch

RENDEZVOUS_TIMEOUT_S = 600.0


def init_process_group(rank: int, world_size: int, backend: str) -> Any:
    """Join the learners' torch.distributed group through a TCPStore whose port the OS picked while binding; returns
    the store when this call opened or joined one (the caller keeps it alive), None when the group already existed.

    In a Ray learner group the store is held by a rendezvous actor (shop_r1/distributed/learner_group.py) whose
    address and port arrive as MASTER_ADDR / MASTER_PORT; every rank connects to it as a client. A standalone learner
    (tests, local mode) opens its own store on port 0. A port picked in advance (bind to 0, close, pass it on) can be
    taken by another process before anyone listens on it. A framework's own init (DeepSpeed's init_distributed,
    FSDP2's device mesh) then finds the group made.
    """
    import torch.distributed as dist

    if dist.is_initialized():  # by this process before (another learner, or vLLM's own one-rank group)
        os.environ.setdefault("LOCAL_RANK", "0")
        return None
    addr = os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if world_size == 1 and "MASTER_PORT" not in os.environ:
        store = dist.TCPStore(addr, 0, 1, True, timeout=timeout, wait_for_workers=False)
    else:
        store = dist.TCPStore(addr, int(os.environ["MASTER_PORT"]), world_size, False, timeout=timeout)
    os.environ.update(MASTER_PORT=str(store.port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return store


def all_reduce(values: torch.Tensor, op: Literal["sum", "max"], world_size: int,
               device: torch.device) -> torch.Tensor:
    """Sum (or max) a small CPU float64 vector over the learner ranks through `device` (NCCL reduces only CUDA
    tensors); on one rank `values` itself, untouched. Every rank must call."""
    if world_size == 1:
        return values
    import torch.distributed as dist

    buf = values.to(device)
    dist.all_reduce(buf, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return buf.cpu()
