"""The training-backend seam, per rank: what one framework (DeepSpeed ZeRO, torch FSDP2) provides to the learner
rank (shop_r1/learner/rank.py), which owns everything the backends share: step counting, the process group and
its all-reduce, the non-finite guard of the optimizer step, the frozen reference, checkpoint client state, the HF
export and the weight source of the sync.

A backend holds only its framework's concerns: building the trained module, its optimizer and LR schedule; the
micro-batch boundary, backward and the optimizer step; gathering partitioned weights (whole, or one sync bucket at
a time); saving and loading its own engine state. A third backend is one new file with a class that implements
`TrainingBackend` (built as `cls(setup)`, `BackendSetup` below) and one `if` in `rank.training_backend`; a loss
variant never edits one. What every backend builds the same way is the helpers below.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from shop_r1.algo.lr_schedule import lr_multiplier
from shop_r1.config import LearnerConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class OptimizerStep:
    grad_norm: float
    """The global gradient norm before clipping (NaN when it could not be measured)."""
    nonfinite: str = ""
    """"" when the step was taken; else why it was skipped ("loss" / "grad_norm", shop_r1/algo/finite.py)."""


@dataclass(frozen=True)
class BackendSetup:
    """What a backend is built from (`TrainingBackend`'s constructor takes this one record)."""

    model_path: str
    cfg: LearnerConfig
    lr: float
    total_steps: int
    """Optimizer steps the LR schedule spans."""
    warmup_steps: int
    lr_schedule: str
    """`constant` or `cosine` after the warmup (`lr_scheduler` below)."""
    rank: int
    world_size: int
    seed: int
    on_gpu: bool
    bf16: bool
    """Compute in bfloat16 (`computes_in_bf16`): the forward's dtype and the weight-sync manifest's."""


class Policy(Protocol):
    """What the forward math (shop_r1/learner/forward.py) uses of a causal LM, trained or frozen: an HF model
    satisfies it, as does a backend's view of a wrapped one (fsdp2_learner._Policy)."""

    @property
    def model(self) -> Callable[..., Any]:
        """The transformer: hidden states of `input_ids` (run through the framework's hooks where wrapped)."""

    @property
    def lm_head(self) -> torch.nn.Module: ...

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the forward computes in (the attention mask's)."""

    @property
    def config(self) -> PretrainedConfig: ...


@runtime_checkable
class TrainingBackend(Protocol):
    """One framework on one rank. Every method that reads or moves weights is a collective where the weights are
    partitioned (ZeRO-3, FSDP2): every rank calls it, in the same order."""

    scheduler: torch.optim.lr_scheduler.LRScheduler
    """The LR schedule (`lr_scheduler` below); `get_last_lr()[0]` is the rate the next optimizer step applies."""

    @property
    def policy(self) -> Policy:
        """The trained model as the forward math runs it; partitioned under ZeRO-3 and FSDP2, so every rank must
        make the same forwards."""

    @property
    def device(self) -> torch.device: ...

    def begin_micro_batch(self) -> None:
        """Called before each forward whose backward follows (the framework's per-micro-batch bookkeeping); where
        every forward runs first (grpo_step.py: grpo_update_with_self_certainty), once before the one backward."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate d loss / d params so that, at the optimizer step, the gradient is the *sum* over ranks of
        every backward's loss (a framework that averages over data-parallel ranks scales to undo it)."""

    def grad_norm(self) -> float | None:
        """The global norm of the accumulated gradients before clipping, where it can be read before the step
        (a backend that clips here, before its step, clips to learner.grad_clip); None where the framework keeps
        the gradients to itself until its step (ZeRO's partitioned buffers) or none were accumulated."""

    def apply_step(self) -> float | None:
        """Clip (where `grad_norm` did not), step the optimizer and the LR schedule, and clear the gradients;
        returns the global gradient norm the framework measured during the step, or None."""

    def drop_gradients(self) -> None:
        """Clear the accumulated gradients without a step (weights, optimizer and schedule unchanged)."""

    def release_gathered(self) -> None:
        """Free what forwards without a backward left gathered (FSDP2's root unit); called after such forwards and
        before any weight is read or loaded. A no-op where nothing stays gathered."""

    def weight_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every parameter's HF name and whole shape (not its shard's), in `named_parameters` order."""

    def gathered_buckets(self, buckets: Sequence[Sequence[str]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Each bucket's parameters (by name) whole on this rank, one bucket at a time: what a bucket yields stays
        gathered until the next is asked for, so iterate it to the end. Every rank must iterate."""

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 CPU copies in HF names, parameters only (a tied one once). Every rank must iterate; a
        backend may yield them on rank 0 only (the others only join the gather)."""

    def save_checkpoint(self, ckpt_dir: str, tag: str, client_state: dict) -> None:
        """Write the engine state (weights, optimizer, schedule) and `client_state` (JSON-able) to `ckpt_dir`;
        `tag` names this save where the framework keeps several in one folder."""

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        """Restore what `save_checkpoint` wrote and return its `client_state`; FileNotFoundError, naming the
        folder and the backend, where it holds no checkpoint of this backend."""


# ----------------------------------------------------------------------------- shared by every backend's __init__


def computes_in_bf16(cfg: LearnerConfig, on_gpu: bool) -> bool:
    """learner.dtype: bfloat16, or `auto` on a GPU; else float32."""
    return cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and on_gpu)


def load_policy(setup: BackendSetup) -> PreTrainedModel:
    """The policy to train, in float32 (a backend computes in bf16 through its own mixed precision), after seeding
    torch with the run's seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(setup.seed)
    return AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=torch.float32)


def adamw(params: Iterator[torch.nn.Parameter], setup: BackendSetup
          ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` (learner.weight_decay) and its LR schedule (`lr_scheduler`)."""
    optimizer = torch.optim.AdamW(params, lr=setup.lr, weight_decay=setup.cfg.weight_decay)
    return optimizer, lr_scheduler(optimizer, setup.total_steps, setup.warmup_steps, setup.lr_schedule)


def lr_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int,
                 lr_schedule: str) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps`, then constant (the paper states no decay) or cosine (sft.lr_schedule)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, warmup_steps, lr_schedule))


def reference_policy(reference_path: str | None, bf16: bool, device: torch.device) -> PreTrainedModel | None:
    """The frozen reference policy for the KL term: a plain module, replicated on every rank (None without a path)."""
    if reference_path is None:
        return None
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch.bfloat16 if bf16 else torch.float32)
    reference = reference.to(device)
    reference.eval().requires_grad_(False)
    return reference


# ------------------------------------------------------------------------------------- the learner rank's HF export


def save_hf_folder(state: dict[str, torch.Tensor], model_path: str, step: int, out_dir: str) -> None:
    """A normal HF folder (weights, config, tokenizer, chat template) of the base model at `model_path` with the
    trained weights `state` (HF names): written aside, then renamed."""
    from transformers import AutoModelForCausalLM

    from shop_r1.models.tokenizer import load_tokenizer, merges_of

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    load_trained_weights(model, state, source=f"the learner's weights at step {step}")
    model.save_pretrained(tmp)
    load_tokenizer(model_path).save_pretrained(tmp)
    # The base's tokenizer kind goes with the weights (shop_r1/models/tokenizer.py reads it).
    (tmp / "shop_r1_model.json").write_text(json.dumps({"kind": "trained", "base": model_path, "step": step,
                                                        "merges": merges_of(model_path)}))
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
