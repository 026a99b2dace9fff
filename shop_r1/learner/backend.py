"""The training-backend seam, per rank: what a framework (DeepSpeed ZeRO, torch FSDP2) provides to the steps written
once against it (shop_r1/learner/grpo_step.py, sft_step.py; the forward math in shop_r1/learner/forward.py).

A backend holds only its framework's concerns: building the trained module and the frozen reference, backward,
the optimizer step, all-reduce, the micro-batch boundary, save/load. A second backend is one new class with these
members (deepspeed_learner.py, fsdp2_learner.py); a loss variant never edits one. What every backend builds the same
way is shared: the process group and all-reduce (process_group.py), rank 0's weight-sync sender (weight_sender.py),
and the helpers below. `shop_r1.learner.protocol.Learner` is the actor-level seam the learner group calls (its step
methods delegate to grpo_step.py and sft_step.py).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from shop_r1.algo.lr_schedule import lr_multiplier
from shop_r1.config import LearnerConfig


@dataclass(frozen=True)
class OptimizerStep:
    grad_norm: float
    """The global gradient norm before clipping (NaN when it could not be measured)."""
    nonfinite: str = ""
    """"" when the step was taken; else why it was skipped ("loss" / "grad_norm", shop_r1/algo/finite.py)."""


@runtime_checkable
class TrainingBackend(Protocol):
    cfg: LearnerConfig
    rank: int
    world_size: int
    reference: Any
    """The frozen reference policy (an HF causal LM, no gradient) for the KL term, or None."""
    scheduler: torch.optim.lr_scheduler.LRScheduler
    """The LR schedule (`lr_scheduler` below); `get_last_lr()[0]` is the rate the next optimizer step applies."""

    @property
    def policy(self) -> Any:
        """The trained HF causal LM (`.model` and `.lm_head` run the forward); partitioned under ZeRO-3 and FSDP2,
        so every rank must make the same forwards."""

    @property
    def device(self) -> torch.device: ...

    def begin_micro_batch(self) -> None:
        """Called before each forward whose backward follows (the framework's per-micro-batch bookkeeping); where
        every forward runs first (grpo_step.py: grpo_update_with_self_certainty), once before the one backward."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate d loss / d params so that, at the optimizer step, the gradient is the *sum* over ranks of
        every backward's loss (a framework that averages over data-parallel ranks scales to undo it)."""

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        """Step on the accumulated gradients, or, when a loss of this step (on any rank) or the gradient norm is
        NaN/inf, skip it on every rank: the gradients dropped, weights, optimizer and schedule unchanged."""

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        """Sum (or max) a small CPU float64 vector over the ranks (a no-op on one rank); every rank must call."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in HF names (gathered where partitioned, so every rank must iterate)."""

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None: ...

    def load_checkpoint(self, ckpt_dir: str) -> dict: ...


# ----------------------------------------------------------------------------- shared by every backend's __init__


def computes_in_bf16(cfg: LearnerConfig, on_gpu: bool) -> bool:
    """learner.dtype: bfloat16, or `auto` on a GPU; else float32."""
    return cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and on_gpu)


def lr_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
                 lr_schedule: str) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps`, then constant (the paper states no decay) or cosine (sft.lr_schedule)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, warmup_steps, lr_schedule))


def reference_policy(reference_path: str | None, bf16: bool, device: torch.device) -> Any:
    """The frozen reference policy for the KL term: a plain module, replicated on every rank (None without a path)."""
    if reference_path is None:
        return None
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.bfloat16 if bf16 else torch.float32)
    reference = reference.to(device)
    reference.eval().requires_grad_(False)
    return reference


# ------------------------------------------------------------------------------ shared by every backend's save_hf


def save_hf_folder(state: dict[str, torch.Tensor], model_path: str, step: int, out_dir: str) -> None:
    """A normal HF folder (weights, config, tokenizer, chat template) of the base model at `model_path` with the
    trained weights `state` (HF names): written aside, then renamed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    load_trained_weights(model, state, source=f"the learner's weights at step {step}")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)
    (tmp / "shop_r1_model.json").write_text(json.dumps({"kind": "trained", "base": model_path, "step": step}))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def load_trained_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` (parameters in HF names) into `model`, the base model rebuilt for the HF export.

    Every key of `state` must be used and every key of the model filled, or ValueError lists the keys (nothing is
    loaded then). Two kinds of model key may be absent, because `named_parameters()` never yields them and the base
    model already holds their right values: a parameter tied to one that `state` has (`lm_head.weight` under
    `tie_word_embeddings` is the very tensor of `model.embed_tokens.weight`, so loading one fills both), and a
    buffer (rotary frequencies and the like are never trained).
    """
    expected = model.state_dict(keep_vars=True)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in state if k in params}
    buffers = {name for name, _ in model.named_buffers()}
    missing = sorted(k for k in expected.keys() - state.keys()
                     if k not in buffers and not (k in params and id(params[k]) in loaded))
    unexpected = sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"{source} do not match the {type(model).__name__} they are exported into: "
                         f"{len(missing)} missing ({_some_keys(missing)}); {len(unexpected)} unexpected "
                         f"({_some_keys(unexpected)})")
    model.load_state_dict(state, strict=False)  # strict=False only for the tied and buffer keys allowed above


def _some_keys(keys: list[str], limit: int = 10) -> str:
    return (", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")) or "none"
