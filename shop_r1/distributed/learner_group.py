"""K learner ranks (shop_r1/learner/rank.py, on the `learner.backend` each builds: DeepSpeed or FSDP2) as Ray actors
in one placement group (PACK: ranks share nodes where they fit).

A rendezvous actor in bundle 0 (rank 0's node) opens the group's TCPStore on a port the OS picks while binding and
holds it for the group's lifetime; every rank starts with MASTER_ADDR / MASTER_PORT naming it and joins as a client
(gloo on CPU, NCCL on GPU). Every call fans out to all ranks: ZeRO's and FSDP2's collectives need every rank to
enter.

Every wait is bounded (shop_r1/distributed/deadlines.py): the group's start (placement, then every rank's start), a
call that runs the model by the batch's tokens per rank (learner.step_timeout_s), a checkpoint by the model's bytes
(learner.checkpoint_timeout_s). A call past its timeout raises ActorTimeout naming it, its timeout and the key; the
drivers treat that as a dead learner (restart from the last checkpoint: rl.max_restarts, sft.max_restarts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from shop_r1.config import AdvantageConfig, LearnerConfig, LossConfig, parse_cpu_cores, parse_resources
from shop_r1.distributed import deadlines
from shop_r1.distributed.actors import Ref, Resources, get, kill, spawn

if TYPE_CHECKING:
    from shop_r1.algo.batch import GRPOBatch
    from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
    from shop_r1.learner.sft_data import MicroBatch
    from shop_r1.types import GRPOStepStats, SFTStepStats
    from shop_r1.weight_sync.broadcast import Manifest, SyncGroupSpec

PLACEMENT_TIMEOUT_S = 300.0


class RendezvousStore:
    """Holds the learners' rendezvous TCPStore on rank 0's node for the group's lifetime: opened on a port the OS
    picks while binding (a port picked in advance can be lost to another process before anyone listens on it)."""

    def __init__(self) -> None:
        import ray

        from shop_r1.weight_sync.broadcast import open_master_store

        self.address = ray.util.get_node_ip_address()
        self.store = open_master_store(self.address)

    def endpoint(self) -> tuple[str, int]:
        return self.address, self.store.port


class LearnerGroup:
    def __init__(self, model_path: str, cfg: LearnerConfig, lr: float, total_steps: int, seed: int, local: bool,
                 warmup_steps: int = 0, reference_path: str | None = None, learner_cls: type | None = None,
                 lr_schedule: str = "constant") -> None:
        """`learner_cls`: the rank actor's class (LearnerRank, which builds learner.backend's TrainingBackend on
        each rank; a test's stand-in or subclass), built on every rank with the same arguments."""
        if learner_cls is None:
            from shop_r1.learner.rank import LearnerRank as learner_cls  # noqa: N813
        self.world_size = cfg.num_ranks
        self._pg = self._rendezvous = None
        size = deadlines.model_bytes(model_path)
        self._step_override = cfg.step_timeout_s
        self._checkpoint_s = deadlines.checkpoint_timeout_s(size, cfg.checkpoint_timeout_s)
        self._checkpoint_key = deadlines.explain("learner.checkpoint_timeout_s", cfg.checkpoint_timeout_s)
        self.start_timeout_s = deadlines.start_timeout_s(size, copies=1 if reference_path is None else 2)
        """A rank's start: the backend's init (DeepSpeed engine or FSDP2 sharding) with the policy (and the
        reference) loaded."""
        if local:
            if cfg.num_ranks != 1:
                raise ValueError(f"learner.num_ranks={cfg.num_ranks}: local mode runs one rank in-process")
            self.ranks = [spawn(learner_cls, model_path, cfg, lr, total_steps, rank=0, world_size=1, seed=seed,
                                warmup_steps=warmup_steps, reference_path=reference_path, lr_schedule=lr_schedule,
                                local=True)]
            return
        import ray
        from ray.util.placement_group import placement_group

        bundle = {"CPU": cfg.num_cpus_per_rank, **parse_resources(cfg.resources, "learner.resources")}
        if cfg.num_gpus_per_rank:
            bundle["GPU"] = cfg.num_gpus_per_rank
        self._pg = placement_group([dict(bundle) for _ in range(cfg.num_ranks)], strategy="PACK")
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the learner group needs {cfg.num_ranks} x {bundle} but the cluster cannot place it "
                               f"within {PLACEMENT_TIMEOUT_S:.0f}s (available: {ray.available_resources()}); lower "
                               "learner.num_cpus_per_rank / num_gpus_per_rank or add nodes") from None
        self._rendezvous = spawn(RendezvousStore, local=False, resources=Resources(
            num_cpus=0, placement_group=self._pg, bundle_index=0))
        master_addr, master_port = get(self._rendezvous.endpoint.remote(), timeout_s=PLACEMENT_TIMEOUT_S,
                                       what="the learners' rendezvous store")
        self.ranks = []
        for rank in range(cfg.num_ranks):
            env = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(rank),
                   "WORLD_SIZE": str(cfg.num_ranks), "LOCAL_RANK": "0"}
            res = Resources(num_cpus=cfg.num_cpus_per_rank, num_gpus=cfg.num_gpus_per_rank, env=env,
                            placement_group=self._pg, bundle_index=rank,
                            cpu_cores=parse_cpu_cores(cfg.cpu_cores, "learner.cpu_cores"))
            self.ranks.append(spawn(learner_cls, model_path, cfg, lr, total_steps, rank=rank,
                                    world_size=cfg.num_ranks, seed=seed, warmup_steps=warmup_steps,
                                    reference_path=reference_path, lr_schedule=lr_schedule, local=False,
                                    resources=res))
        try:  # bounded here, so that no later call's timeout has to allow for the start
            self.num_threads()
        except Exception:
            self.shutdown()
            raise

    def sft_step(self, per_rank_micro_batches: Sequence[Sequence[MicroBatch]],
                 num_loss_tokens_global: int) -> list[SFTStepStats]:
        """One optimizer step over the global batch; per_rank_micro_batches[r] is rank r's share. Stats per rank."""
        if len(per_rank_micro_batches) != self.world_size:
            raise ValueError(f"got {len(per_rank_micro_batches)} shares for {self.world_size} ranks")
        refs = [r.sft_step.remote(list(mbs), num_loss_tokens_global)
                for r, mbs in zip(self.ranks, per_rank_micro_batches)]
        return self._run(refs, "sft_step", max(sum(map(_tokens, mbs)) for mbs in per_rank_micro_batches))

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> list[GRPOStepStats]:
        """Every rank trains on its contiguous share of the responses (K = 1: all of them)."""
        shares = self._shares(batch)
        refs = [r.grpo_step.remote(share, loss_cfg) for r, share in zip(self.ranks, shares)]
        return self._run(refs, "grpo_step", max(map(_tokens, shares)))

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig) -> list[UpdateWithSelfCertainty]:
        """Every rank trains on its contiguous share of the whole batch, told where it starts (to place its s(r)
        among every response's) and given every response's rewards (to compute the advantages)."""
        shares, firsts = self._shares(batch), self._bounds(batch.num_responses)[:-1]
        refs = [r.grpo_step_with_self_certainty.remote(share, loss_cfg, rewards, adv_cfg, first)
                for r, share, first in zip(self.ranks, shares, firsts)]
        return self._run(refs, "grpo_step_with_self_certainty", max(map(_tokens, shares)))

    def grpo_step_after_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                       adv_cfg: AdvantageConfig, action_only: bool
                                       ) -> list[UpdateWithSelfCertainty]:
        """Every rank gets the whole batch (it takes s(r) of its contiguous share, then trains its contiguous share of
        the rows kept: the same shares as `rationale_self_certainty` then `grpo_step` of the kept batch); the
        timeout allows for both passes."""
        refs = [r.grpo_step_after_self_certainty.remote(batch, loss_cfg, rewards, adv_cfg, action_only)
                for r in self.ranks]
        return self._run(refs, "grpo_step_after_self_certainty", 2 * _tokens(batch) // self.world_size + 1)

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        """Each rank computes its own share's values (s(r) of a response depends on its row alone) and every rank
        runs as many forwards (under ZeRO-3 a forward on one rank alone would hang); in the batch's order."""
        shares = self._shares(batch)
        refs = [r.rationale_self_certainty.remote(share, direction, normalize_by_vocab)
                for r, share in zip(self.ranks, shares)]
        return [v for values in self._run(refs, "rationale_self_certainty", max(map(_tokens, shares)))
                for v in values]

    def _bounds(self, n: int) -> list[int]:
        """Rank r's rows of n are [bounds[r], bounds[r + 1]) = [r n / K, (r + 1) n / K): contiguous, even."""
        return [r * n // self.world_size for r in range(self.world_size + 1)]

    def _shares(self, batch: GRPOBatch) -> list[GRPOBatch]:
        """Rank r's contiguous share of the responses: rows [r n / K, (r + 1) n / K) (K = 1: the batch itself)."""
        if self.world_size == 1:
            return [batch]
        bounds = self._bounds(batch.num_responses)
        return [batch.select(range(bounds[r], bounds[r + 1])) for r in range(self.world_size)]

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]:
        """Every rank runs the forward (ZeRO-3, as above); rank 0's values."""
        return self._run([r.probe_logprobs.remote(batch) for r in self.ranks], "probe_logprobs", _tokens(batch))[0]

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float:
        """Every rank evaluates the same batches (ZeRO-3 forwards need all ranks); rank 0's value is returned."""
        return self._run([r.eval_loss.remote(list(micro_batches)) for r in self.ranks], "eval_loss",
                         sum(map(_tokens, micro_batches)))[0]

    def _run(self, refs: list[Ref], call: str, tokens_per_rank: int) -> list[Any]:
        """A call that runs the model over `tokens_per_rank` tokens on each rank, within its step timeout."""
        return get(refs, timeout_s=deadlines.learner_step_timeout_s(tokens_per_rank, self._step_override),
                   what=f"learner {call} on {self.world_size} rank(s), {tokens_per_rank} tokens per rank "
                        f"({deadlines.explain('learner.step_timeout_s', self._step_override)})")

    def _io(self, refs: list[Ref], call: str) -> list[Any]:
        """A call that reads or writes the model's weights (checkpoints), within the checkpoint timeout."""
        return get(refs, timeout_s=self._checkpoint_s, what=f"learner {call} ({self._checkpoint_key})")

    def save_hf(self, out_dir: str) -> None:
        self._io([r.save_hf.remote(out_dir) for r in self.ranks], "save_hf")

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        self._io([r.save_checkpoint.remote(ckpt_dir, client_state) for r in self.ranks], "save_checkpoint")

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        return self._io([r.load_checkpoint.remote(ckpt_dir) for r in self.ranks], "load_checkpoint")[0]

    def num_threads(self) -> list[int]:
        return get([r.num_threads.remote() for r in self.ranks], timeout_s=self.start_timeout_s,
                   what=f"{self.world_size} learner rank(s) starting (an actor's start timeout, "
                        "shop_r1/distributed/deadlines.py)")

    def nonfinite_weights(self) -> list[str]:
        """Every rank checks (under ZeRO-3 reading the weights is a collective); the names any rank found."""
        found = self._io([r.nonfinite_weights.remote() for r in self.ranks], "nonfinite_weights")
        return sorted({name for names in found for name in names})

    # -------------------------------------- the weight sync's calls (LearnerWeights, shop_r1/distributed/protocols.py)

    def weight_manifest(self, bucket_bytes: int) -> Ref:
        """Rank 0's manifest (every rank's is the same), in flight."""
        return self.ranks[0].weight_manifest.remote(bucket_bytes)

    def open_weight_sync_store(self, timeout_s: float) -> Ref:
        """Rank 0, the sender, opens the sync group's store: (address, port), in flight."""
        return self.ranks[0].open_weight_sync_store.remote(timeout_s)

    def init_weight_sender(self, spec: SyncGroupSpec) -> Ref:
        """Rank 0 joins the sync group as its sender; in flight, since it returns only once every engine joined."""
        return self.ranks[0].init_weight_sender.remote(spec)

    def broadcast_weights(self, manifest: Manifest) -> list[Ref]:
        """Every rank's part of one push (the gathers are collectives), in rank order; rank 0's returns the bytes."""
        return [r.broadcast_weights.remote(manifest) for r in self.ranks]

    def named_weights(self) -> Ref:
        """Rank 0's full weights (local mode only: one process holds the rank), in flight."""
        return self.ranks[0].named_weights.remote()

    def shutdown(self) -> None:
        for r in self.ranks:
            kill(r)
        if self._rendezvous is not None:
            kill(self._rendezvous)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)


def _tokens(batch: GRPOBatch | MicroBatch) -> int:
    """The tokens of a batch or micro-batch, padding included (its `input_ids` [b, T]): what a forward costs."""
    return int(batch.input_ids.numel())
