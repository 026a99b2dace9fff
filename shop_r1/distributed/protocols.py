"""The seams the GRPO and SFT drivers are written against: the learner group, the engine group and the weight sync.

    Learners       LearnerGroup (learner ranks as Ray actors, or one in-process; DeepSpeed or FSDP2 inside each,
                   `learner.backend`: shop_r1/learner/backend.py)
    LearnerWeights LearnerGroup again: the learner side of the weight sync (its ranks' `WeightSource`)
    Engines        EngineGroup (vLLM engines as Ray actors, or one in-process)
    WeightSync     BroadcastSync (one process group, bucketed broadcast: gloo / NCCL), DirectSync (local mode)

Another training framework is one `TrainingBackend` file under shop_r1/learner/ (the learner group and its ranks
stay); other engines (SGLang) or another sync (CUDA IPC) are a new class with these methods, chosen where the driver
builds its groups; the loop in `train.py` does not change. The weight-sync transports reach the learners only
through `LearnerWeights`; on the engines they call `init_weight_receiver` / `receive_weights` (`DirectSync`:
`load_weights`), so a new engine backend implements those too, or brings its own sync. Per-actor seams:
`shop_r1.learner.protocol.Learner` and `WeightSource`, and `shop_r1.rollout.engine.RolloutEngine`.
tests/test_protocols_on_cpu.py checks each backend against its protocol, parameter names included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from shop_r1.config import AdvantageConfig, LossConfig
from shop_r1.types import Generation, GRPOStepStats, Prompt, SamplingSpec, SFTStepStats

if TYPE_CHECKING:
    from shop_r1.algo.batch import GRPOBatch
    from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
    from shop_r1.distributed.actors import Ref
    from shop_r1.learner.sft_data import MicroBatch
    from shop_r1.weight_sync.broadcast import Manifest, SyncGroupSpec


@dataclass(frozen=True)
class SyncStats:
    """One push (or bump), seconds throughout. The phases are summed over the buckets along the slowest engine's
    path, so they never add up to more than `seconds` (which also holds the driver's calls and waits)."""

    seconds: float
    num_bytes: int
    pack_s: float = 0.0
    """Learner rank 0 copying the gathered parameters into the bucket buffers, while the engine waited for it."""
    transfer_s: float = 0.0
    """The rest of the engine's wait for bucket bytes: the wire (and the gather) not hidden behind loading."""
    load_s: float = 0.0
    """The engine's loader taking the tensors into the model."""
    post_s: float = 0.0
    """The rest of the engine's reload: vLLM's layerwise set-up and finalisation, and there the CPU lm_head's repack
    (the in-place path repacks it during the load, as soon as its weight arrives)."""
    reset_s: float = 0.0
    """The engine's prefix-cache reset."""
    load_path: str = ""
    """How the slowest engine loaded (`in_place`, or `layerwise (why)`: rollout.weight_load); empty where unknown."""

    def phase_metrics(self) -> dict[str, float]:
        """`timing/weight_sync_{pack,transfer,load,post,reset}`, and `weight_sync/in_place` (1 or 0) where the
        load path is known."""
        out = {f"timing/weight_sync_{k}": getattr(self, f"{k}_s") for k in ("pack", "transfer", "load", "post",
                                                                           "reset")}
        if self.load_path:
            out["weight_sync/in_place"] = float(self.load_path == "in_place")
        return out


@runtime_checkable
class Learners(Protocol):
    world_size: int

    def sft_step(self, per_rank_micro_batches: Sequence[Sequence[MicroBatch]],
                 num_loss_tokens_global: int) -> list[SFTStepStats]:
        """One optimizer step over the global batch; per_rank_micro_batches[r] is rank r's share. Stats per rank."""

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float: ...

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> list[GRPOStepStats]:
        """One GRPO update on the whole batch (each rank gets its share); GRPOStepStats per rank."""

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig) -> list[UpdateWithSelfCertainty]:
        """reward.self_certainty.source=update_logits: one GRPO update on the step's whole batch (every group,
        advantages not yet known; each rank gets its share) whose own forward gives s(r); the advantages from the
        re-formed `rewards`. Per rank (every rank holds every response's s(r) and the same advantages)."""

    def grpo_step_after_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                       adv_cfg: AdvantageConfig, action_only: bool
                                       ) -> list[UpdateWithSelfCertainty]:
        """reward.self_certainty.source=learner_logits in one call: the step's whole batch to every rank, which takes
        s(r) of its share without gradient, the advantages of the re-formed `rewards`, then updates its share of the
        rows that train. Per rank (every rank holds every response's s(r) and the same advantages)."""

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        """s(r) per response, in the batch's order (each rank computes its share's)."""

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]: ...

    def save_hf(self, out_dir: str) -> None: ...

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None: ...

    def load_checkpoint(self, ckpt_dir: str) -> dict: ...

    def num_threads(self) -> list[int]:
        """torch.get_num_threads() in each rank."""

    def nonfinite_weights(self) -> list[str]:
        """The policy parameters holding NaN or inf on any rank (checked before a checkpoint); [] when finite."""

    def shutdown(self) -> None: ...


@runtime_checkable
class LearnerWeights(Protocol):
    """The learner group's side of the weight sync: its ranks' `WeightSource` (shop_r1/learner/protocol.py), each
    call returned in flight (`Ref`), so that the transport waits on it beside the engines' calls, within its own
    deadlines (shop_r1/distributed/sync_group.py). Rank 0 holds the sender; every rank takes part in a push."""

    def weight_manifest(self, bucket_bytes: int) -> Ref:
        """-> Manifest: every weight's name, whole shape and wire dtype, in buckets of about `bucket_bytes`."""

    def open_weight_sync_store(self, timeout_s: float) -> Ref:
        """-> (address, port) of the sync group's store, opened by the sender on a port the OS picks."""

    def init_weight_sender(self, spec: SyncGroupSpec) -> Ref:
        """-> None once the sender and every engine have joined the sync group."""

    def broadcast_weights(self, manifest: Manifest) -> list[Ref]:
        """One push: every rank's call (the gathers are collectives), in rank order; the first returns the bytes
        sent (`SentBytes`), the others 0."""

    def named_weights(self) -> Ref:
        """-> the full weights, (HF name, tensor) pairs, in one process with the caller (local mode)."""


@runtime_checkable
class Engines(Protocol):
    restarts: int
    on_replace: Callable[[], None] | None
    defer_resync: bool
    resync_pending: bool

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """All prompts' generations in the prompts' order."""

    def generate_scored(self, prompts: Sequence[Prompt], spec: SamplingSpec, pool: Any) -> Any:
        """Generate and score through the reward pool: a ScoredBatch in the prompts' order."""

    def load_weights(self, named_tensors: Any, version: int) -> None: ...

    def set_policy_version(self, version: int) -> None: ...

    def policy_versions(self) -> list[int]: ...

    def num_threads(self) -> list[int]:
        """torch.get_num_threads() in each engine."""

    def shutdown(self, timeout_s: float = 60.0) -> None: ...


@runtime_checkable
class WeightSync(Protocol):
    def push(self, version: int) -> SyncStats:
        """The learner's current weights to every engine; afterwards every engine reports `version`."""

    def bump(self, version: int) -> SyncStats:
        """The weights did not change (a skipped update): only the engines' version moves; no bytes sent."""
