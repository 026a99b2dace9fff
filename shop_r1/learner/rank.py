"""One learner rank, the actor the learner group calls (`Learner` and `WeightSource`, shop_r1/learner/protocol.py),
whatever trains on it: it owns what every backend shares and holds one `TrainingBackend` (shop_r1/learner/backend.py)
for the rest, chosen once by `training_backend` from `learner.backend`.

Shared here: the step count; the GRPO and SFT steps (shop_r1/learner/grpo_step.py, sft_step.py), which run against
this rank (`TrainingRank`); the process group's all-reduce (process_group.py); the non-finite guard of the optimizer
step (a NaN/inf loss on any rank or gradient norm skips the step on every rank); the frozen reference; the learner
step in the checkpoint's client state; the HF export; the weight source of the sync (the manifest, the bucketed
broadcast through rank 0's sender, weight_sender.py, the full weights and their non-finite check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import torch

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
from shop_r1.config import AdvantageConfig, LearnerConfig, LossConfig
from shop_r1.learner import process_group
from shop_r1.learner.backend import (
    BackendSetup,
    OptimizerStep,
    Policy,
    TrainingBackend,
    computes_in_bf16,
    reference_policy,
    save_hf_folder,
)
from shop_r1.learner.grpo_step import (
    grpo_update,
    grpo_update_after_self_certainty,
    grpo_update_with_self_certainty,
    probe_logprobs,
    rationale_self_certainty,
)
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.learner.sft_step import eval_loss, sft_update
from shop_r1.learner.weight_sender import LearnerSender
from shop_r1.types import GRPOStepStats, SFTStepStats
from shop_r1.weight_sync.broadcast import Manifest, SentBytes, SyncGroupSpec


def training_backend(setup: BackendSetup) -> TrainingBackend:
    """The backend `learner.backend` names, built on this rank (its framework is imported only here)."""
    if setup.cfg.backend == "fsdp2":
        from shop_r1.learner.fsdp2_learner import FSDP2Backend

        return FSDP2Backend(setup)
    from shop_r1.learner.deepspeed_learner import DeepSpeedBackend

    return DeepSpeedBackend(setup)


class LearnerRank:
    def __init__(self, model_path: str, cfg: LearnerConfig, lr: float, total_steps: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, warmup_steps: int = 0, reference_path: str | None = None,
                 lr_schedule: str = "constant",
                 backend: Callable[[BackendSetup], TrainingBackend] = training_backend) -> None:
        """`backend` builds this rank's TrainingBackend from its setup (`training_backend`: learner.backend's)."""
        on_gpu = torch.cuda.is_available()
        self.rank, self.world_size, self.model_path, self.cfg = rank, world_size, str(model_path), cfg
        self.bf16 = computes_in_bf16(cfg, on_gpu)
        self.backend = backend(BackendSetup(str(model_path), cfg, lr, total_steps, warmup_steps, lr_schedule, rank,
                                            world_size, seed, on_gpu, self.bf16))
        self.total_steps = total_steps
        self.step = 0
        self.reference: Policy | None = reference_policy(reference_path, self.bf16, self.device)
        self._weights_out = LearnerSender(rank)

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def policy(self) -> Policy:
        return self.backend.policy

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.backend.scheduler

    # ---------------------------------------------------- the steps (shop_r1/learner/grpo_step.py, sft_step.py)

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> GRPOStepStats:
        """One GRPO update on this rank's share of the batch (any size, even empty); figures over the global batch."""
        stats = grpo_update(self, batch, loss_cfg, step=self.step + 1, pack=self.cfg.pack_sequences)
        self.step += 1
        return stats

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig, first_row: int) -> UpdateWithSelfCertainty:
        """One GRPO update whose own forward gives s(r) and the advantages (shop_r1/learner/grpo_step.py); a step it
        did not train ran forwards without backward (`release_gathered`). Cost: with
        rl.self_certainty_breaks_ties=false a no-grad forward of the dropped groups' rows and forward + backward of
        the kept ones (below learner_logits); with it true a forward with gradient of every row and a backward through
        every micro-batch holding a kept row (can exceed learner_logits when many groups are dropped)."""
        out = grpo_update_with_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, first_row, step=self.step + 1,
                                              pack=self.cfg.pack_sequences)
        if not out.updated:
            self.backend.release_gathered()
        self.step += int(out.updated)
        return out

    def grpo_step_after_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                       adv_cfg: AdvantageConfig, action_only: bool) -> UpdateWithSelfCertainty:
        """reward.self_certainty.source=learner_logits in one call: s(r) of this rank's share of the whole batch
        (no-grad), every response's summed over ranks, the advantages, then the update of the kept rows' share
        (shop_r1/learner/grpo_step.py: the driver's two calls' numbers, in one)."""
        out = grpo_update_after_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, action_only, self.rank,
                                               self.world_size, step=self.step + 1, pack=self.cfg.pack_sequences,
                                               update=lambda share: self.grpo_step(share, loss_cfg))
        if not out.updated:  # (an update that ran counted its step in grpo_step)
            self.backend.release_gathered()
        return out

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        values = rationale_self_certainty(self, batch, direction, normalize_by_vocab, pack=self.cfg.pack_sequences)
        self.backend.release_gathered()
        return values

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]:
        values = probe_logprobs(self, batch, pack=self.cfg.pack_sequences)
        self.backend.release_gathered()
        return values

    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> SFTStepStats:
        """One optimizer step; the loss is the global batch's token mean (shop_r1/learner/sft_step.py)."""
        stats = sft_update(self, micro_batches, num_loss_tokens_global, step=self.step + 1)
        self.step += 1
        return stats

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float:
        loss = eval_loss(self, micro_batches)
        self.backend.release_gathered()
        return loss

    # ------------------------------------------------------- what the steps call (TrainingRank, protocol.py)

    def begin_micro_batch(self) -> None:
        self.backend.begin_micro_batch()

    def backward(self, loss: torch.Tensor) -> None:
        self.backend.backward(loss)

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        return process_group.all_reduce(values, op, self.world_size, self.device)

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        """The backend's step, with this step's global gradient norm (before clipping) -- or, when a loss of this
        step (on any rank) or the gradient norm is NaN/inf, no step at all: the gradients are dropped, the weights,
        optimizer and schedule stay as they were, and the cause ("loss" / "grad_norm") is returned.

        Where the backend can measure the norm only during its step (ZeRO's partitioned gradients) only the losses
        are checked before it; a non-finite norm it then reports is returned as the cause, and `nonfinite_weights`
        keeps such weights out of any checkpoint.
        """
        from shop_r1.algo.finite import CAUSES, learner_cause

        norm = self.backend.grad_norm()
        local = learner_cause(losses, norm)
        # Every rank skips or steps together (a step is a collective under ZeRO; FSDP2's shards must stay one model).
        flags = self.all_reduce(torch.tensor([float(local == c) for c in CAUSES], dtype=torch.float64), "max")
        cause = next((c for c, f in zip(CAUSES, flags.tolist()) if f), "")
        if cause:
            self.backend.drop_gradients()
            return OptimizerStep(norm if norm is not None else float("nan"), cause)
        measured = self.backend.apply_step()
        if norm is None and measured is not None:
            return OptimizerStep(measured, learner_cause((), measured))
        return OptimizerStep(norm if norm is not None else float("nan"))

    # ---------------------------------------------------------------------- weight sync (WeightSource, protocol.py)

    def weight_manifest(self, bucket_bytes: int) -> Manifest:
        from shop_r1.weight_sync.broadcast import first_bucket_bytes, make_manifest

        dtype = torch.bfloat16 if self.bf16 else torch.float32
        return make_manifest(((name, shape, dtype) for name, shape in self.backend.weight_shapes()), bucket_bytes,
                             fuse=True, first_bytes=first_bucket_bytes(bucket_bytes))

    def open_weight_sync_store(self, timeout_s: float = 600.0) -> tuple[str, int]:
        return self._weights_out.open_store(timeout_s)

    def init_weight_sender(self, spec: SyncGroupSpec) -> None:
        self._weights_out.connect(spec, self.device)

    @torch.no_grad()
    def broadcast_weights(self, manifest: Manifest) -> SentBytes:
        """Every rank must call: the parameters of one bucket are gathered whole together (the backend's
        `gathered_buckets`), and rank 0 copies them into the bucket's buffer and broadcasts it before they are
        released. Returns bytes sent (0 on other ranks)."""
        self.backend.release_gathered()
        names = [[m.name for m in bucket] for bucket in manifest.buckets]
        sent, last = SentBytes(0), len(manifest.buckets) - 1
        for k, group in enumerate(self.backend.gathered_buckets(names)):
            sent += self._weights_out.send_bucket(manifest.buckets[k], group, last=k == last,
                                                  zero_copy=manifest.zero_copy)
        return sent

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 CPU weights in HF names, parameters only (a tied one once); every rank must iterate (the
        gathers are collectives), and a backend may yield them on rank 0 only."""
        self.backend.release_gathered()
        return self.backend.named_weights()

    def nonfinite_weights(self) -> list[str]:
        """The names of the policy's parameters that hold NaN or inf (checked before a checkpoint is written); where
        the backend yields the weights on rank 0 only, rank 0 checks the whole model and the others join the gather."""
        from shop_r1.algo.finite import nonfinite_names

        return nonfinite_names(self.named_weights())

    # ------------------------------------------------------------------------------- export and checkpoints

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def save_hf(self, out_dir: str) -> None:
        """A normal HF folder of the trained weights (every rank gathers, rank 0 writes)."""
        state = dict(self.named_weights())
        if self.rank == 0:
            save_hf_folder(state, self.model_path, self.step, out_dir)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        """The backend's engine state, with `client_state` and this rank's step (`learner_step`) beside it."""
        self.backend.release_gathered()
        self.backend.save_checkpoint(ckpt_dir, f"step{self.step}", {**client_state, "learner_step": self.step})

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        self.backend.release_gathered()
        client_state = self.backend.load_checkpoint(ckpt_dir)
        self.step = int(client_state.get("learner_step", self.step))
        return client_state
