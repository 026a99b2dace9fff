"""One DeepSpeed rank (`learner.backend=deepspeed`): the training backend (shop_r1/learner/backend.py) for the policy
under ZeRO 0-3, and the learner actor the group calls. The steps and their forwards are algorithm code shared with
the FSDP2 backend (shop_r1/learner/grpo_step.py, sft_step.py, forward.py), as are the process group and all-reduce
(process_group.py) and the weight-sync sender (weight_sender.py); this module holds the DeepSpeed concerns: the
engine, backward, optimizer step, ZeRO-3 gathers, save/load.

The optimizer is `torch.optim.AdamW` (with `zero_allow_untested_optimizer`), and DeepSpeed's shm communication op is
switched off (`init_deepspeed_comm`), so nothing is JIT-compiled.

DeepSpeed averages gradients over data-parallel ranks; `backward` multiplies each rank's loss by world_size to undo
that, so the steps' losses (shares of the global batch's loss) sum over ranks as the protocol says.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
from shop_r1.config import AdvantageConfig, LearnerConfig, LossConfig
from shop_r1.learner import process_group
from shop_r1.learner.backend import OptimizerStep, computes_in_bf16, lr_scheduler, reference_policy, save_hf_folder
from shop_r1.learner.grpo_step import (
    grpo_update,
    grpo_update_with_self_certainty,
    probe_logprobs,
    rationale_self_certainty,
)
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.learner.sft_step import eval_loss, sft_update
from shop_r1.learner.weight_sender import LearnerSender
from shop_r1.types import GRPOStepStats, SFTStepStats


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
        # DeepSpeedLearner.begin_micro_batch.
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


class DeepSpeedLearner:
    def __init__(self, model_path: str, cfg: LearnerConfig, lr: float, total_steps: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, warmup_steps: int = 0, reference_path: str | None = None,
                 lr_schedule: str = "constant") -> None:
        self.on_gpu = torch.cuda.is_available()
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if self.on_gpu else "cpu")
        self._rendezvous_store = process_group.init_process_group(rank, world_size, "nccl" if self.on_gpu else "gloo")
        import deepspeed
        from transformers import AutoModelForCausalLM

        init_deepspeed_comm(self.on_gpu)
        torch.manual_seed(seed)
        self.rank, self.world_size, self.model_path, self.cfg = rank, world_size, str(model_path), cfg
        bf16 = computes_in_bf16(cfg, self.on_gpu)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
        schedule = lr_scheduler(optimizer, total_steps, warmup_steps, lr_schedule)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=schedule, config=deepspeed_config(cfg, bf16))
        self.total_steps = total_steps
        self.step = 0
        self.reference = reference_policy(reference_path, bf16, self.device)
        self._weights_out = LearnerSender(rank)

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def policy(self) -> Any:
        return self.engine.module

    # ---------------------------------------------------- the steps (shop_r1/learner/grpo_step.py, sft_step.py)

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> GRPOStepStats:
        """One GRPO update on this rank's share of the batch (any size, even empty); figures over the global batch."""
        stats = grpo_update(self, batch, loss_cfg, step=self.step + 1, pack=self.cfg.pack_sequences)
        self.step += 1
        return stats

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig, first_row: int) -> UpdateWithSelfCertainty:
        """One GRPO update whose own forward gives s(r) and the advantages (shop_r1/learner/grpo_step.py). Cost: with
        rl.self_certainty_breaks_ties=false a no-grad forward of the dropped groups' rows and forward + backward of
        the kept ones (below learner_logits); with it true a forward with gradient of every row and a backward through
        every micro-batch holding a kept row (can exceed learner_logits when many groups are dropped)."""
        out = grpo_update_with_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, first_row, step=self.step + 1,
                                              pack=self.cfg.pack_sequences)
        self.step += int(out.updated)
        return out

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        return rationale_self_certainty(self, batch, direction, normalize_by_vocab, pack=self.cfg.pack_sequences)

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]:
        return probe_logprobs(self, batch, pack=self.cfg.pack_sequences)

    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> SFTStepStats:
        """One optimizer step; the loss is the global batch's token mean (shop_r1/learner/sft_step.py)."""
        stats = sft_update(self, micro_batches, num_loss_tokens_global, step=self.step + 1)
        self.step += 1
        return stats

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float:
        return eval_loss(self, micro_batches)

    # ---------------------------------------------------------------- the backend (shop_r1/learner/backend.py)

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

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        return process_group.all_reduce(values, op, self.world_size, self.device)

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        """engine.step(), with this step's global gradient norm (before clipping) -- or, when a loss of this step (on
        any rank) or the gradient norm is NaN/inf, no step at all: the gradients are dropped, the weights, optimizer
        and schedule stay as they were, and the cause ("loss" / "grad_norm") is returned.

        Where the gradients sit on the parameters we measure them before the step; where ZeRO keeps them in its own
        partitioned buffers only the losses can be checked before it, and DeepSpeed's own norm is read after it (a
        non-finite one is then reported, and `nonfinite_weights` keeps such weights out of any checkpoint).
        """
        from shop_r1.algo.finite import CAUSES, learner_cause

        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) \
            if grads else None
        local = learner_cause(losses, norm)
        # Every rank skips or steps together (the step is a collective under ZeRO).
        flags = self.all_reduce(torch.tensor([float(local == c) for c in CAUSES], dtype=torch.float64), "max")
        cause = next((c for c, f in zip(CAUSES, flags.tolist()) if f), "")
        if cause:
            self.engine.zero_grad()
            self.engine.optimizer.zero_grad(set_to_none=True)
            return OptimizerStep(norm if norm is not None else float("nan"), cause)
        self.engine.step()
        if norm is None:
            ds_norm = self.engine.get_global_grad_norm()
            norm = float(ds_norm) if ds_norm is not None else float("nan")
            cause = learner_cause((), norm) if ds_norm is not None else ""
        return OptimizerStep(norm, cause)

    # ------------------------------------------------------------------------------------------- weight sync

    def weight_manifest(self, bucket_bytes: int) -> Any:
        from shop_r1.weight_sync.broadcast import first_bucket_bytes, make_manifest

        dtype = torch.bfloat16 if self.engine.bfloat16_enabled() else torch.float32
        return make_manifest(((n, tuple(p.ds_shape if hasattr(p, "ds_shape") else p.shape), dtype)
                              for n, p in self.engine.module.named_parameters()), bucket_bytes, fuse=True,
                             first_bytes=first_bucket_bytes(bucket_bytes))

    def open_weight_sync_store(self, timeout_s: float = 600.0) -> tuple[str, int]:
        return self._weights_out.open_store(timeout_s)

    def init_weight_sender(self, spec: Any) -> None:
        self._weights_out.connect(spec, self.device)

    def broadcast_weights(self, manifest: Any) -> int:
        """Every rank must call: under ZeRO-3 the parameters of one bucket are gathered together (one gather per
        bucket, not per parameter), and rank 0 copies them once into the bucket's buffer and broadcasts it before
        they are released. Returns bytes sent (0 on other ranks)."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        sent = 0
        last = len(manifest.buckets) - 1
        for k, bucket in enumerate(manifest.buckets):
            group = [(m.name, params[m.name]) for m in bucket]
            with deepspeed.zero.GatheredParameters([p for _, p in group], enabled=self.cfg.zero_stage == 3):
                sent += self._weights_out.send_bucket(bucket, group, last=k == last,
                                                          zero_copy=manifest.zero_copy)
        return sent

    def nonfinite_weights(self) -> list[str]:
        """The names of the policy's parameters that hold NaN or inf (checked before a checkpoint is written)."""
        from shop_r1.algo.finite import nonfinite_names

        return nonfinite_names(self.named_weights())

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in HF names; under ZeRO-3 gathered, so every rank must iterate it."""
        import deepspeed

        module = self.engine.module
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], enabled=self.cfg.zero_stage == 3):
                yield name, param.detach().to(torch.float32).cpu().clone()

    def save_hf(self, out_dir: str) -> None:
        """A normal HF folder of the trained weights (rank 0 writes; under ZeRO-3 every rank gathers)."""
        state = dict(self.named_weights())
        if self.rank == 0:
            save_hf_folder(state, self.model_path, self.step, out_dir)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        self.engine.save_checkpoint(ckpt_dir, tag=f"step{self.step}", client_state={**client_state,
                                                                                   "learner_step": self.step})

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        path, client_state = self.engine.load_checkpoint(ckpt_dir)
        if path is None:
            raise FileNotFoundError(f"{ckpt_dir}: no DeepSpeed checkpoint to resume from")
        self.step = int(client_state.get("learner_step", self.step))
        return client_state
