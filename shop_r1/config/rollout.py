"""rollout: the vLLM engines that sample GRPO's groups, their placement, deadlines and weight loading; the rule
that ties an engine's GPUs to its tensor parallelism (`problems`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from shop_r1.config.fields import bounded

MAX_TOP_K_LOGPROBS = 20
"""vLLM's default `max_logprobs`: the most logprobs per position `rollout.top_k_logprobs` may ask for. (The engine
passes `max_logprobs=max(top_k_logprobs, 1)` to vLLM, so the bound is this project's, not the engine's.)"""


@dataclass
class RolloutConfig:
    temperature: float = bounded(0.6, gt=0)
    """Sampling temperature of GRPO rollouts (GRPO samples, so never greedy)."""
    max_new_tokens: int = bounded(256, ge=1)
    """Response budget of one rollout."""
    group_size: int = bounded(8, ge=2)
    """GRPO group size: samples per prompt (advantages compare the samples of a group, so one is not a group)."""
    top_k_logprobs: int = bounded(20, ge=0, le=MAX_TOP_K_LOGPROBS)
    """Logprobs returned per position; the self-certainty estimate reads them (reward.self_certainty). At most
    vLLM's default `max_logprobs` (`MAX_TOP_K_LOGPROBS`): each returned logprob is a Python object per token, so the
    cost grows with it."""
    num_engines: int = bounded(1, ge=1)
    """vLLM engines, each in its own Ray actor; a batch of prompts is split between them."""
    tensor_parallel_size: int = bounded(1, ge=1)
    """GPUs per engine (GPU only; on CPU each engine is one process). With GPUs (num_gpus_per_engine > 0) at most
    the GPUs an engine holds: one GPU per tensor-parallel worker."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU (bf16 is ~15x slower there), bfloat16 on CUDA."""
    gpu_memory_utilization: float = bounded(0.85, gt=0, le=1)
    """Share of each GPU's memory vLLM may take (weights + KV cache)."""
    kv_cache_gib: float = bounded(2.0, gt=0)
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)."""
    enable_prefix_caching: bool = True
    """The G samples of one prompt share its long page context."""
    num_cpus_per_engine: float = bounded(1.0, ge=0)
    """Ray CPUs reserved per engine."""
    cpu_cores: str = ""
    """Pin every engine's process to these CPU cores (Linux list: "0", "0-3", "0,2"; empty: no pinning, Ray's
    OMP_NUM_THREADS from num_cpus_per_engine): its OpenMP threads number as many, vLLM binds them there
    (VLLM_CPU_OMP_THREADS_BIND) and they wait passively (OMP_WAIT_POLICY=PASSIVE). With learner.cpu_cores disjoint,
    one-step-off async overlaps generation and update without the two thread pools spinning on the same cores."""
    num_gpus_per_engine: float = bounded(0.0, ge=0)
    """Set by the GPU configs (= tensor_parallel_size); 0 on CPU."""
    resources: str = ""
    """Ray custom resources each engine takes, so the engines land only on nodes that offer them (a node started with
    `ray start --resources='{"rollout_node": 1}'`; `node:<ip>=0.01` names one node), e.g. `rollout_node=0.01`
    (fractions let many engines share such a node). Empty: any node with the CPUs and GPUs.
    Format: name=amount pairs joined by commas; each amount > 0, whole above 1 (`parse_resources`)."""
    placement_timeout_s: float = bounded(300.0, gt=0)
    """How long the engines may wait for a node with room for them (CPUs, GPUs and `resources`), at start and for
    each replacement of a dead engine; past it the start fails, or the run stops with an error after a checkpoint,
    naming the resources and the cluster's nodes (e.g. the only node offering `resources` is gone)."""
    max_engine_restarts: int = bounded(3, ge=0)
    """Engines that die (or hang past generate_timeout_s) are replaced, re-synced and their prompts requeued, at most
    this many times per run; past it the run stops with an error after a checkpoint."""
    generate_timeout_s: float = bounded(1800.0, gt=0)
    """An engine that returns none of its pending chunks within this many seconds counts as hung."""
    weight_sync_timeout_s: float = bounded(0.0, ge=0)
    """One weight sync (learner rank 0 to every engine) must end within this many seconds; an engine still receiving
    then counts as hung and is replaced like a dead one (max_engine_restarts). Each bucket's broadcast waits at most
    half of it. 0: derived from the weights' bytes, 300 s + bytes / 50 MB/s (shop_r1/distributed/deadlines.py)."""
    weight_load: Literal["auto", "in_place", "layerwise"] = "auto"
    """How an engine loads a broadcast weight update. `in_place`: each tensor straight into its parameter (vLLM's
    fused q/k/v and gate/up from the parts the learner sends adjacent, as one view; on CPU the linear layers' repack
    from it), one pass over the bytes (shop_r1/rollout/in_place_load.py); refused, naming why, where the model's
    layout does not allow it (tensor parallelism, quantisation, a fusion the sender does not lay out). `layerwise`:
    vLLM's `reload_weights`, which rebuilds every layer. `auto`: in place where allowed, else layerwise."""
    cpu_linear: Literal["onednn", "torch"] = "onednn"
    """CPU engines only: what the linear layers (and the lm_head) compute from. `onednn`: vLLM's own, a copy of each
    weight repacked into its CPU kernel's blocked layout, redone at every weight update (the sync's load and post
    phases). `torch`: the weight stays a plain parameter and torch.nn.functional.linear computes from it, so an
    in-place update is a copy and nothing is repacked (shop_r1/rollout/cpu_linear.py); generation then runs on
    torch's GEMM. Measured (SmolLM2-135M, 2-core AMD EPYC, benchmarks/README.md "Weight sync"): sync 1.82-1.94x the
    raw broadcast against 2.94-3.24x, but generation at 0.71-0.75x the tokens/s, so `onednn` stays the default.
    Ignored on GPU."""


class _Sections(Protocol):
    """What the rollout rules read of the root Config (which imports this module)."""

    rollout: RolloutConfig


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The rollout section's cross-field rules, one line each (`bad`: keys out of their range, whose rules are left
    out)."""
    gpus, tp = cfg.rollout.num_gpus_per_engine, cfg.rollout.tensor_parallel_size
    if bad & {"rollout.num_gpus_per_engine", "rollout.tensor_parallel_size"} or gpus <= 0:
        return []
    if tp > max(gpus, 1):  # a fraction below 1 is one shared card
        return [f"rollout.tensor_parallel_size={tp} is more than the GPUs an engine holds "
                f"(rollout.num_gpus_per_engine={gpus:g}): each tensor-parallel worker needs a GPU of its own; set "
                f"rollout.num_gpus_per_engine={tp}"]
    if gpus >= 1 and gpus != tp:
        return [f"rollout.num_gpus_per_engine={gpus:g} must equal rollout.tensor_parallel_size={tp}: an engine "
                "holds one GPU per tensor-parallel worker (a fraction below 1 shares one card)"]
    return []
