"""The learner seams, per rank. `Learner` and `WeightSource` are what the learner group calls on each rank's actor,
`shop_r1.learner.rank.LearnerRank` (the one learner actor: whatever `learner.backend` trains with, a
`shop_r1.learner.backend.TrainingBackend` inside it); `TrainingRank` is what the steps written once against it
(shop_r1/learner/grpo_step.py, sft_step.py) use of a rank. gloo on CPU, NCCL on CUDA.

The driver never sees a rank directly, only through `shop_r1.distributed.protocols.Learners` (and the weight sync
through `LearnerWeights`). tests/test_protocols_on_cpu.py checks that the rank and the backends match their
protocols, parameter names included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import torch

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
from shop_r1.config import AdvantageConfig, LearnerConfig, LossConfig
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.types import GRPOStepStats, SFTStepStats

if TYPE_CHECKING:
    from shop_r1.learner.backend import OptimizerStep, Policy
    from shop_r1.weight_sync.broadcast import Manifest, SentBytes, SyncGroupSpec


@runtime_checkable
class Learner(Protocol):
    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> SFTStepStats:
        """One optimizer step on this rank's share; the loss is the global token mean."""

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float: ...

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> GRPOStepStats:
        """One GRPO update on this rank's share of the batch (any size, even empty: every rank makes the same
        collective calls); figures over the global batch."""

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig, first_row: int) -> UpdateWithSelfCertainty:
        """reward.self_certainty.source=update_logits: one GRPO update on this rank's share of the step's whole
        batch (rows first_row.. of `rewards`, advantages not yet known), whose own forward gives every response's
        s(r); the advantages computed from them as the driver would (every rank the same). Figures over the global
        batch; the learner's step counts only an update that ran (`updated`). Where rl.self_certainty_breaks_ties=
        false the dropped groups are known first and forward without gradient (grpo_step.py states the cost)."""

    def grpo_step_after_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                       adv_cfg: AdvantageConfig, action_only: bool) -> UpdateWithSelfCertainty:
        """reward.self_certainty.source=learner_logits in one call: `batch` is the step's whole batch on every rank;
        s(r) of this rank's share, summed over ranks, the advantages, then `grpo_step` of this rank's share of the
        rows that train. The learner's step counts only an update that ran (`updated`)."""

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        """s(r) of each response of this rank's share from the full logits at temperature 1 (no gradient); every rank
        must call (ZeRO-3 and FSDP2 forwards are collectives), each with its own share."""

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]:
        """The policy's logprobs of each response's completion tokens (the weight-sync check)."""

    def save_hf(self, out_dir: str) -> None: ...

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None: ...

    def load_checkpoint(self, ckpt_dir: str) -> dict: ...

    def num_threads(self) -> int:
        """torch.get_num_threads() in this rank's process."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors (gathered under ZeRO-3 and FSDP2), for the engines."""


@runtime_checkable
class WeightSource(Protocol):
    """A rank's side of the weight sync (shop_r1/distributed/sync_group.py). Rank 0 holds the sender; every rank
    takes part in the gathers (`broadcast_weights`, `named_weights`, `nonfinite_weights` are collectives where the
    weights are partitioned)."""

    def weight_manifest(self, bucket_bytes: int) -> Manifest:
        """Every weight's name, whole shape and wire dtype, in buckets of about `bucket_bytes` (the engines' layout:
        fused parts adjacent)."""

    def open_weight_sync_store(self, timeout_s: float = 600.0) -> tuple[str, int]:
        """Rank 0: open the sync group's store on a port the OS picks; (this node's address, the port)."""

    def init_weight_sender(self, spec: SyncGroupSpec) -> None:
        """Rank 0 joins the sync group as its sender (returns once every engine has joined); others do nothing."""

    def broadcast_weights(self, manifest: Manifest) -> SentBytes:
        """Every rank must call: each bucket gathered whole and broadcast by rank 0; the bytes sent (0 elsewhere)."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 CPU weights in HF names, parameters only (every rank iterates; may be empty off rank 0)."""

    def nonfinite_weights(self) -> list[str]:
        """The names of the policy's parameters that hold NaN or inf (checked before a checkpoint is written)."""


@runtime_checkable
class TrainingRank(Protocol):
    """What the steps (grpo_step.py, sft_step.py) use of one rank: its config, frozen reference, LR schedule and
    all-reduce, and its backend's forward, backward and step."""

    cfg: LearnerConfig
    reference: Policy | None
    """The frozen reference policy (an HF causal LM, no gradient) for the KL term, or None."""

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """`get_last_lr()[0]` is the rate the next optimizer step applies."""

    @property
    def policy(self) -> Policy:
        """The trained model; partitioned under ZeRO-3 and FSDP2, so every rank must make the same forwards."""

    @property
    def device(self) -> torch.device: ...

    def begin_micro_batch(self) -> None:
        """Called before each forward whose backward follows (TrainingBackend.begin_micro_batch)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient; at the optimizer step it is the sum over ranks of every backward's loss."""

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        """Step on the accumulated gradients, or, when a loss of this step (on any rank) or the gradient norm is
        NaN/inf, skip it on every rank: the gradients dropped, weights, optimizer and schedule unchanged."""

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        """Sum (or max) a small CPU float64 vector over the ranks (a no-op on one rank); every rank must call."""
