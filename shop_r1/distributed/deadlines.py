"""How long the driver waits on each kind of actor call: derived from the work (bytes, tokens), never forever.

Each timeout is a fixed part (minutes: one-off costs, a busy node) plus the work at a floor pace (far below what the
hardware does, so a call that is slow but alive is not cut off). A config field set > 0 replaces the derived value.

    call                                    derived timeout                         config (> 0 replaces it)
    weight sync: one push to every engine   300 s + bytes / 50 MB/s                 rollout.weight_sync_timeout_s
      each broadcast (bucket) inside it     half the push's                         (the same)
    learner call that runs the model        600 s + tokens per rank / 100 per s     learner.step_timeout_s
      (GRPO / SFT step, self-certainty, probe, eval loss)
    checkpoint save / load, HF save         600 s + 8 x model bytes / 50 MB/s       learner.checkpoint_timeout_s
    an actor's start (its first call)       600 s + copies x model bytes / 50 MB/s  -
    generation, reward scoring              rollout.generate_timeout_s, reward_pool.timeout_s / ready_timeout_s

"Model bytes" are the weight files in the model's folder (`model_bytes`); a folder the driver cannot see counts 0.

What a timeout is, and what happens then (the failure it stands for):
- Weight sync past its deadline: every engine still receiving is hung. It is killed and replaced like a dead engine
  (`EngineGroup.replace`, at most rollout.max_engine_restarts times, then EngineFailure, which `shop-r1 train`
  checkpoints before stopping) and the weights are pushed again, a new sync with a deadline of its own. See
  shop_r1/distributed/sync_group.py for which parties count as hung.
- Any other actor call past its timeout: `ActorTimeout`, naming the call, its timeout and the config key. The actor
  no longer answers, so `is_actor_death` counts it as dead: a learner past its deadline takes the learner-restart
  path (rl.max_restarts / sft.max_restarts: actors torn down, the run resumes from its last complete checkpoint).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MB = 1_000_000

SYNC_FIXED_S = 300.0
"""A push's one-off costs: the first ZeRO-3 gather, vLLM's reload bookkeeping, a busy node; a small model's whole
sync."""
SYNC_FLOOR_BYTES_PER_S = 50 * MB
"""gloo through host memory and TCP. Measured on a 2-core dev machine under load: 200 MB broadcast to 4
receivers over loopback gloo in at most 0.8 s (250 MB/s and up); a 10 GbE link carries ~1.2 GB/s and NCCL more.
50 MB/s leaves 5x and more."""

STEP_FIXED_S = 600.0
"""A learner call's one-off costs: DeepSpeed's first-step allocations, a CPU-offloaded optimizer's first step, a
busy node. A small model's whole step."""
STEP_FLOOR_TOKENS_PER_S = 100.0
"""Tokens of the batch (padding included) per rank per second, across everything one GRPO update does with them
(policy forward + backward, the reference's forward). Assumed, not measured here: a 3B policy on one H100 goes
through thousands per second, so 100 is a pace only a hung or badly overloaded rank falls below."""

DISK_FLOOR_BYTES_PER_S = 50 * MB
"""Reading or writing model and checkpoint files on shared storage (NFS, an object store's mount) under load; local
NVMe does GB/s."""
CHECKPOINT_FIXED_S = 600.0
"""A checkpoint's one-off costs: gathering ZeRO shards, fsync, directory listing on a network filesystem."""
CHECKPOINT_BYTES_PER_MODEL_BYTE = 8
"""A DeepSpeed checkpoint of a bf16 model holds the bf16 weights, fp32 master weights and two fp32 Adam moments: 14
bytes per parameter, 7x the 2 bytes per parameter of the model's files (an fp32 model: 12 / 4 = 3x). Rounded up."""

START_FIXED_S = 600.0
"""An actor's start beside loading its weights: vLLM's profiling, compilation and CUDA graphs; DeepSpeed's start (its
CPU communication op is no longer built: init_deepspeed_comm); imports on a busy node. The bound the sync
group's rendezvous had before it was derived."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class SyncTimeouts:
    push_s: float
    """One push, every party done (learner ranks and every engine): the one deadline of the whole sync."""
    collective_s: float
    """Each broadcast inside it (and the group's rendezvous): half the push's, so that the parties a stalled engine
    holds up fail with gloo's timeout before the push's deadline, and only the stalled engine is still busy then."""


def _derived(fixed_s: float, work: float, floor_rate: float, override_s: float) -> float:
    if work < 0:
        raise ValueError(f"negative work: {work}")
    return override_s if override_s > 0 else fixed_s + work / floor_rate


def weight_sync_timeouts(num_bytes: int, override_s: float = 0.0) -> SyncTimeouts:
    """The push's deadline for `num_bytes` of weights (rollout.weight_sync_timeout_s when > 0), and each
    collective's."""
    push_s = _derived(SYNC_FIXED_S, num_bytes, SYNC_FLOOR_BYTES_PER_S, override_s)
    return SyncTimeouts(push_s, push_s / 2)


def learner_step_timeout_s(tokens_per_rank: int, override_s: float = 0.0) -> float:
    """A learner call that runs the model over `tokens_per_rank` tokens on each rank (learner.step_timeout_s)."""
    return _derived(STEP_FIXED_S, tokens_per_rank, STEP_FLOOR_TOKENS_PER_S, override_s)


def checkpoint_timeout_s(model_bytes: int, override_s: float = 0.0) -> float:
    """Saving or loading a checkpoint (or the HF model) of a model whose files hold `model_bytes`
    (learner.checkpoint_timeout_s)."""
    return _derived(CHECKPOINT_FIXED_S, CHECKPOINT_BYTES_PER_MODEL_BYTE * model_bytes, DISK_FLOOR_BYTES_PER_S,
                    override_s)


def start_timeout_s(model_bytes: int, copies: int = 1) -> float:
    """An actor's start: loading `copies` models of `model_bytes` (a learner: the policy and the reference)."""
    return _derived(START_FIXED_S, copies * model_bytes, DISK_FLOOR_BYTES_PER_S, 0.0)


def model_bytes(path: str | os.PathLike | None) -> int:
    """The bytes of the weight files directly in a model folder (0 when there is no such folder, e.g. a model the
    driver's node cannot see: the fixed parts above still apply)."""
    if not path or not os.path.isdir(path):
        return 0
    with os.scandir(path) as entries:
        return sum(e.stat().st_size for e in entries if e.is_file() and e.name.endswith(WEIGHT_SUFFIXES))


def explain(key: str, override_s: float) -> str:
    """How a timeout was set, for an error message: the config key and whether it was derived."""
    if override_s > 0:
        return f"{key}={override_s:g}"
    return f"{key}=0: derived from the work (shop_r1/distributed/deadlines.py); set it > 0 to wait longer"
