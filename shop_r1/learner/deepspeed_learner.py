"""The DeepSpeed backend (`learner.backend=deepspeed`): a `TrainingBackend` (shop_r1/learner/backend.py) for the
policy under ZeRO 0-3, held by the learner rank (shop_r1/learner/rank.py), which owns everything the backends share.
This module holds the DeepSpeed concerns: the engine, backward, the optimizer step, ZeRO-3 gathers, save/load.

The optimizer is `torch.optim.AdamW` (with `zero_allow_untested_optimizer`), and DeepSpeed's shm communication op is
switched off (`init_deepspeed_comm`), so nothing is JIT-compiled.

DeepSpeed averages gradients over data-parallel ranks; `backward` multiplies each rank's loss by world_size to undo
that, so the steps' losses (shares of the global batch's loss) sum over ranks as the protocol says.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from shop_r1.config import LearnerConfig
from shop_r1.learner import process_group
from shop_r1.learner.backend import BackendSetup, Policy, adamw, load_policy


def deepspeed_config(cfg: LearnerConfig, bf16: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer and cfg.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # We accumulate ourselves over a varying number of token-budget micro-batches and call step() once.
        # Unmanaged accumulation says so: backward() only accumulates, step() is the boundary that reduces over ranks
        # and updates (managed, every backward at gradient_accumulation_steps=1 would be a boundary). See also
        # DeepSpeedBackend.begin_micro_batch.
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


# DeepSpeed's shared-memory all-reduce op on CPU. It serves only DeepSpeed's inference all-reduce, which no step here
# calls, yet `init_distributed` loads it: a JIT build (~35 s of gcc the first time) and, on every later load, torch's
# file lock `TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/lock`. A process killed while it holds that lock (a learner
# replaced mid-start, a run stopped by a time limit) leaves the file behind, and every later DeepSpeed start that
# loads the op then waits on it forever, idle. So the learners never load it. (With oneccl_bindings_for_pytorch
# installed DeepSpeed's CPU backend would be `ccl`, whose op loads the same way unguarded; it is not in the stack.)
SHM_COMM_OP = "deepspeed_shm_comm"


def init_deepspeed_comm(on_gpu: bool) -> None:
    """DeepSpeed's communication backend over the process group already joined (process_group.init_process_group),
    with the CPU shm op marked incompatible so that it is neither built nor loaded (see SHM_COMM_OP)."""
    import deepspeed

    if not on_gpu:  # on CUDA the op has no builder; the probe behind __compatible_ops__ would only cost time
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")


class DeepSpeedBackend:
    def __init__(self, setup: BackendSetup) -> None:
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if setup.on_gpu else "cpu")
        self._rendezvous_store = process_group.init_process_group(setup.rank, setup.world_size,
                                                                  "nccl" if setup.on_gpu else "gloo")
        import deepspeed

        init_deepspeed_comm(setup.on_gpu)
        self.cfg, self.world_size = setup.cfg, setup.world_size
        model = load_policy(setup)
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        optimizer, schedule = adamw(model.parameters(), setup)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=schedule, config=deepspeed_config(self.cfg, setup.bf16))

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def policy(self) -> Policy:
        return self.engine.module

    def begin_micro_batch(self) -> None:
        """What DeepSpeedEngine.forward does first, before a forward whose backward follows.

        We run the module's parts directly (the vocabulary projection only at target positions), not the engine's
        forward, so we make its bookkeeping call ourselves: ZeRO counts micro-batches there, and without it every
        backward of a step overwrote the gradients of the ones before (only part of the batch trained; the test in
        tests/learner/test_deepspeed_learner_on_cpu.py splits one batch into 1 and into 5 micro-batches).
        """
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over data-parallel ranks; scaled back, the sum over ranks is what arrives.
        self.engine.backward(loss * self.world_size)

    def grad_norm(self) -> float | None:
        """Measured where the gradients sit on the parameters; where ZeRO keeps them in its own partitioned buffers
        there are none to measure before the step (None), and `apply_step` returns DeepSpeed's own norm."""
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) \
            if grads else None

    def apply_step(self) -> float | None:
        """engine.step(): clips (`gradient_clipping`), steps AdamW and the schedule, clears the gradients."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else None

    def drop_gradients(self) -> None:
        self.engine.zero_grad()
        self.engine.optimizer.zero_grad(set_to_none=True)

    def release_gathered(self) -> None:
        """Nothing stays gathered: ZeRO-3 releases each module's parameters after its forward."""

    def weight_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        for name, param in self.engine.module.named_parameters():  # ZeRO-3 keeps the whole shape in ds_shape
            yield name, tuple(param.ds_shape if hasattr(param, "ds_shape") else param.shape)

    def gathered_buckets(self, buckets: Sequence[Sequence[str]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Under ZeRO-3 one gather per bucket, not per parameter."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        for names in buckets:
            group = [(name, params[name]) for name in names]
            with deepspeed.zero.GatheredParameters([p for _, p in group], enabled=self.cfg.zero_stage == 3):
                yield group

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """On every rank; under ZeRO-3 one gather per parameter."""
        import deepspeed

        for name, param in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], enabled=self.cfg.zero_stage == 3):
                yield name, param.detach().to(torch.float32).cpu().clone()

    def save_checkpoint(self, ckpt_dir: str, tag: str, client_state: dict) -> None:
        self.engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client_state)

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        path, client_state = self.engine.load_checkpoint(ckpt_dir)
        if path is None:
            raise FileNotFoundError(f"{ckpt_dir}: no DeepSpeed checkpoint to resume from")
        return client_state
