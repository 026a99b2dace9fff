"""learner: the training ranks (DeepSpeed or FSDP2), how their forwards are laid out, their deadlines; the rules
that tie the attention and the optimizer's offload to the backend and the ranks' devices (`problems`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from shop_r1.config.fields import bounded


@dataclass
class LearnerConfig:
    num_ranks: int = bounded(1, ge=1)
    """DeepSpeed data-parallel ranks, one Ray actor each (gloo on CPU, NCCL on GPU)."""
    backend: Literal["deepspeed", "fsdp2"] = "deepspeed"
    """What trains on each rank: `deepspeed` (ZeRO, `zero_stage`) or `fsdp2`, torch's own `fully_shard` (each decoder
    layer sharded over the ranks, as in TRL's async trainer and prime-rl; `zero_stage` does not apply, and
    `offload_optimizer` is refused). Both run the same GRPO step (shop_r1/learner/grpo_step.py) to the same update; a
    checkpoint is in its backend's format, so a resume may not change it."""
    zero_stage: int = bounded(2, ge=0, le=3)
    """DeepSpeed ZeRO stage."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: float32 on CPU, bfloat16 on CUDA."""
    max_tokens_per_micro_batch: int = bounded(8192, ge=1)
    """Micro-batches are filled with consecutive responses up to this many tokens as the forward runs them (padding
    included, each micro-batch trimmed to its own longest row or pack); one longer sequence is its own."""
    shared_prompt: bool = True
    """GRPO forwards (policy, reference, exact self-certainty) encode each group's prompt once: the completions that
    share it are packed after it with a block attention mask (shop_r1/algo/shared_prompt.py), exactly equal to the
    separate rows. Needs an attention that takes a 4D mask (eager or sdpa, not flash-attention 2)."""
    pack_sequences: bool = False
    """GRPO micro-batches pack uneven rows (or shared-prompt packs) end to end instead of padding them to the longest
    (shop_r1/algo/packing.py): the same loss and gradients. Needs a 4D-mask attention (eager or sdpa)."""
    attention: Literal["dense", "split", "flex"] = "split"
    """How packed lines (`shared_prompt`, `pack_sequences`) attend: `dense` passes the [n, 1, W, W] mask to the
    model's attention (SDPA), which computes every pair and masks it; `split` (the default) runs each pack as two
    SDPA calls, its prompt causally and its completions against prompt + completions with a small mask, so no
    masked pair is computed (shop_r1/learner/split_attention.py; CPU and CUDA, both backends; a model with
    sliding-window layers, or one that cannot be switched, gets the dense mask instead); `flex` passes the same mask
    as a block-sparse
    FlexAttention BlockMask and switches the model to attn_implementation=flex_attention, so the blocks a
    completion cannot see (the other completions) are skipped. Same outputs and gradients. CUDA only (a forward on
    another device is an error naming this key): torch's FlexAttention has no CPU backward, and its compiled CPU
    forward fails once shapes vary."""
    last_layer_at_targets: bool = True
    """Forwards run the last decoder layer's query, attention output, MLP and final norm only at the positions the
    loss reads (shop_r1/learner/target_states.py): SFT rows, GRPO rows, and GRPO's packed lines (shared prompts,
    sequence packing; learner.attention dense or split, not flex), where the completions and each prompt's last
    token are read. The same outputs and gradients; an SFT forward + backward 1.77x faster on the main job's 2-layer
    model (benchmarks/bench_last_layer.py), at most 1/L of the work saved on an L-layer one. Qwen2 and Llama layouts
    without sliding windows; other models and FSDP2 run the full forward."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them from the forward: less memory
    for about one more forward's compute."""
    grad_clip: float = bounded(1.0, gt=0)
    """Clip the global gradient norm to this."""
    weight_decay: float = bounded(0.0, ge=0)
    """AdamW weight decay."""
    offload_optimizer: bool = False
    """ZeRO CPU offload of optimizer states (GPU memory saver)."""
    num_cpus_per_rank: float = bounded(1.0, ge=0)
    """Ray CPUs reserved per rank."""
    cpu_cores: str = ""
    """Pin every rank's process to these CPU cores (as rollout.cpu_cores; OMP_NUM_THREADS = their count, passive
    OpenMP waits); empty: no pinning."""
    num_gpus_per_rank: float = bounded(0.0, ge=0)
    """Ray GPUs reserved per rank (1 on GPU configs, 0 on CPU)."""
    step_timeout_s: float = bounded(0.0, ge=0)
    """A learner call that runs the model (a GRPO or SFT step, the self-certainty, probe and eval-loss forwards) not
    done within this many seconds counts as a hung learner: the run restarts from its last checkpoint
    (rl.max_restarts, sft.max_restarts). 0: derived, 600 s + the batch's tokens per rank / 100 per s
    (shop_r1/distributed/deadlines.py)."""
    checkpoint_timeout_s: float = bounded(0.0, ge=0)
    """The same for saving or loading a checkpoint or the HF model. 0: derived, 600 s + 8 x the bytes of the model
    folder's weight files / 50 MB/s (checkpoints live on shared storage)."""
    resources: str = ""
    """Ray custom resources each rank's placement bundle takes, so the ranks land only on nodes that offer them (as
    rollout.resources). Format: name=amount pairs joined by commas; each amount > 0, whole above 1."""


class _Sections(Protocol):
    """What the learner rules read of the root Config (which imports this module)."""

    learner: LearnerConfig


def problems(cfg: _Sections, bad: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The learner section's cross-field rules, one line each."""
    learner, out = cfg.learner, []
    if learner.attention == "flex" and learner.num_gpus_per_rank == 0:
        out.append("learner.attention=flex needs GPU ranks (learner.num_gpus_per_rank > 0): torch's FlexAttention "
                   "has no CPU backward; use learner.attention=split on CPU")
    if learner.attention == "flex" and learner.backend == "fsdp2":
        out.append("learner.attention=flex runs with learner.backend=deepspeed only (the FSDP2 wrapper cannot "
                   "switch the model's attention implementation); use learner.attention=split")
    if learner.offload_optimizer and learner.backend == "fsdp2":  # was refused only when an FSDP2 rank started
        out.append("learner.offload_optimizer is DeepSpeed ZeRO's CPU offload; learner.backend=fsdp2 has none: set "
                   "learner.offload_optimizer=false or learner.backend=deepspeed")
    return out
