"""The FSDP2 backend (`learner.backend=fsdp2`): a `TrainingBackend` (shop_r1/learner/backend.py) with torch's own
`fully_shard`, held by the learner rank (shop_r1/learner/rank.py), which owns everything the backends share. This
module holds the FSDP2 concerns: sharding, backward, the optimizer step, gathers, save/load.

Sharding: each decoder layer is one FSDP unit; the embeddings, final norm and LM head are the root's (tied embeddings
need the LM head and the embeddings in one unit). The forward math calls `policy.model(...)`, then `policy.lm_head`
on the target positions only, never the whole model, so `policy` is a view (`_Policy`) whose `model` runs through the
root's FSDP hooks (`register_fsdp_forward_method`): the root's parameters are gathered there and, as FSDP2 does for
a root, stay gathered until the backward's end, where their gradient is reduced, so the LM head call in between uses
them. After a no-grad forward they stay gathered until `release_gathered`, which the learner rank calls after such
forwards and before every weight read and load.

Gradient sum: FSDP2 averages over ranks by default. Here the divide factor is 1 with sum-only collectives
(`set_gradient_divide_factor(1.0)`, `set_force_sum_reduction_for_comms(True)`; gloo has neither AVG nor PREMUL_SUM),
so each backward's reduce-scatter sums over ranks as the protocol says; its result accumulates in the sharded grads.

Optimizer step: `clip_grad_norm_` over the sharded grads returns the global norm (a DTensor, made whole) before
clipping, as DeepSpeed's `gradient_clipping` does (coefficient max_norm / (norm + 1e-6), at most 1); a non-finite loss
on any rank or norm skips the step on every rank (LearnerRank.optimizer_step). Then AdamW and the same LR
schedule (shop_r1/algo/lr_schedule.py). bfloat16 (`learner.dtype`) computes in bf16 over fp32 sharded weights (the
optimizer's), reducing gradients in fp32.

Checkpoints: torch.distributed.checkpoint (DCP) writes the sharded weights and AdamW state (any world size can load
them); rank 0 adds the schedule, the step and the caller's state as JSON (STATE_FILE). DCP's own `.metadata` is a
pickle, as DeepSpeed's state files are: load only checkpoints you trust.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from shop_r1.learner import process_group
from shop_r1.learner.backend import BackendSetup, Policy, adamw, load_policy

if TYPE_CHECKING:
    from transformers import PretrainedConfig

STATE_FILE = "fsdp2_learner_state.json"
"""Beside DCP's files: the LR schedule, the learner step and the caller's client_state."""


@dataclass(frozen=True)
class _Policy:
    """What the forward math (shop_r1/learner/forward.py) uses of the trained model (backend.Policy): the transformer
    called through the FSDP root (`model`), the LM head, and the dtype the forward computes in (the attention
    mask's)."""

    model: Callable[..., Any]
    lm_head: torch.nn.Module
    dtype: torch.dtype
    config: PretrainedConfig  # its attention implementation (learner.attention=split switches it at load)


def _run_transformer(self: torch.nn.Module, **inputs: torch.Tensor) -> Any:
    """Becomes the root module's `shop_r1_transformer` method, registered as an FSDP forward."""
    return self.model(**inputs)


class FSDP2Backend:
    def __init__(self, setup: BackendSetup) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        cfg = setup.cfg
        self._device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if setup.on_gpu \
            else torch.device("cpu")
        if setup.on_gpu:
            torch.cuda.set_device(self._device)
        self._rendezvous_store = process_group.init_process_group(setup.rank, setup.world_size,
                                                                  "nccl" if setup.on_gpu else "gloo")
        self.cfg, self.rank, self.bf16 = cfg, setup.rank, setup.bf16
        model = load_policy(setup)
        if cfg.attention == "split" and (cfg.shared_prompt or cfg.pack_sequences):
            from shop_r1.learner import split_attention

            if split_attention.applies(model):  # switched before the wrapper hides the model; else the dense mask
                split_attention.ready(model)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        mesh = init_device_mesh(self._device.type, (setup.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 \
            else MixedPrecisionPolicy()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self._units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in self._units:  # sum, not mean, over ranks (module docstring)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        model.shop_r1_transformer = types.MethodType(_run_transformer, model)
        register_fsdp_forward_method(model, "shop_r1_transformer")
        self.module = model
        self.optimizer, self.scheduler = adamw(model.parameters(), setup)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def policy(self) -> Policy:
        return _Policy(self.module.shop_r1_transformer, self.module.lm_head,
                       torch.bfloat16 if self.bf16 else torch.float32, self.module.config)

    def release_gathered(self) -> None:
        """Every unit back to its shards (the root stays gathered after a forward until its backward ends)."""
        for unit in self._units:
            unit.reshard()

    def begin_micro_batch(self) -> None:
        """Nothing to do: every backward reduce-scatters and accumulates into the sharded gradients itself."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # summed over ranks by the reduce-scatter (divide factor 1, module docstring)

    def grad_norm(self) -> float | None:
        """`clip_grad_norm_` to learner.grad_clip over the sharded grads: the global norm before clipping."""
        from torch.distributed.tensor import DTensor

        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip) if params else None
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm) if norm is not None else None

    def apply_step(self) -> float | None:
        """AdamW and the schedule (already clipped by `grad_norm`); the norm is `grad_norm`'s (None here)."""
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return None

    def drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def weight_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        for name, param in self.module.named_parameters():  # a DTensor's shape is the whole tensor's
            yield name, tuple(param.shape)

    def gathered_buckets(self, buckets: Sequence[Sequence[str]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """One all-gather per sharded parameter, whole on every rank."""
        from torch.distributed.tensor import DTensor

        params = dict(self.module.named_parameters())
        for names in buckets:
            yield [(name, params[name].full_tensor() if isinstance(params[name], DTensor) else params[name])
                   for name in names]

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The gather is a collective; only rank 0 receives the weights, the others yield nothing."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if state:
            for name, _ in self.module.named_parameters():
                # A copy: on one CPU rank the gathered tensor is the parameter itself. Popped, so at most one
                # tensor is held twice.
                yield name, state.pop(name).detach().to(torch.float32, copy=True)

    # ------------------------------------------------------------------------------------------- checkpoints

    def _state_dicts(self) -> tuple[dict, dict, bool]:
        """(model, optimizer) sharded state dicts and whether AdamW has taken no step yet. DCP fills an empty AdamW
        state with a zero step; that is undone, so a checkpoint never changes the live optimizer."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        fresh = not self.optimizer.state
        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        if fresh:
            self.optimizer.state.clear()
        return model_state, optim_state, fresh

    def save_checkpoint(self, ckpt_dir: str, tag: str, client_state: dict) -> None:
        """One checkpoint a folder (`tag` unused)."""
        import torch.distributed.checkpoint as dcp

        model_state, optim_state, fresh = self._state_dicts()
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=ckpt_dir)
        if self.rank == 0:
            from shop_r1.atomic import write_atomic

            write_atomic(Path(ckpt_dir) / STATE_FILE, json.dumps({
                "client_state": client_state, "optimizer_fresh": fresh,
                "scheduler": self.scheduler.state_dict()}))

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        folder = Path(ckpt_dir)
        if not (folder / ".metadata").is_file() or not (folder / STATE_FILE).is_file():
            raise FileNotFoundError(f"{ckpt_dir}: no FSDP2 checkpoint to resume from (learner.backend=fsdp2 reads "
                                    f"only its own: DCP's .metadata and {STATE_FILE})")
        model_state, optim_state, _ = self._state_dicts()
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=ckpt_dir)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        extra = json.loads((folder / STATE_FILE).read_text())
        if extra["optimizer_fresh"]:
            self.optimizer.state.clear()
        self.scheduler.load_state_dict(extra["scheduler"])
        return extra["client_state"]
