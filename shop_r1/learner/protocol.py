"""The learner seam, per rank: what the learner group calls on each rank's actor. Backends (`learner.backend`):
`DeepSpeedLearner` (ZeRO 0-3) and `FSDP2Learner` (torch `fully_shard`); gloo on CPU, NCCL on CUDA.

Another backend is one new class that implements `shop_r1.learner.backend.TrainingBackend` (its framework's concerns)
and these methods, the step ones by delegating to shop_r1/learner/grpo_step.py and sft_step.py; LearnerGroup picks
it from `learner.backend` (or takes it as `learner_cls`). The driver never sees it directly, only through
`shop_r1.distributed.protocols.Learners`. A test checks that every backend class matches its protocols, parameter
names included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
from shop_r1.config import AdvantageConfig, LossConfig
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.types import GRPOStepStats, SFTStepStats


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

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        """HF-named full tensors (gathered under ZeRO-3 and FSDP2), for the engines."""
