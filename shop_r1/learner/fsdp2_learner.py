"""One FSDP2 rank (`learner.backend=fsdp2`): the training backend (shop_r1/learner/backend.py) with torch's own
`fully_shard`, and the learner actor the group calls. The steps and their forwards are algorithm code shared with
the DeepSpeed backend (shop_r1/learner/grpo_step.py, sft_step.py, forward.py), as are the process group and
all-reduce (process_group.py) and the weight-sync sender (weight_sender.py); this module holds the FSDP2 concerns:
sharding, backward, optimizer step, gathers, save/load.

Sharding: each decoder layer is one FSDP unit; the embeddings, final norm and LM head are the root's (tied embeddings
need the LM head and the embeddings in one unit). The forward math calls `policy.model(...)`, then `policy.lm_head`
on the target positions only, never the whole model, so `policy` is a view (`_Policy`) whose `model` runs through the
root's FSDP hooks (`register_fsdp_forward_method`): the root's parameters are gathered there and, as FSDP2 does for
a root, stay gathered until the backward's end, where their gradient is reduced, so the LM head call in between uses
them. After a no-grad forward they stay gathered until `_reshard`, which every weight read and load calls first.

Gradient sum: FSDP2 averages over ranks by default. Here the divide factor is 1 with sum-only collectives
(`set_gradient_divide_factor(1.0)`, `set_force_sum_reduction_for_comms(True)`; gloo has neither AVG nor PREMUL_SUM),
so each backward's reduce-scatter sums over ranks as the protocol says; its result accumulates in the sharded grads.

Optimizer step: `clip_grad_norm_` over the sharded grads returns the global norm (a DTensor, made whole) before
clipping, as DeepSpeed's `gradient_clipping` does (coefficient max_norm / (norm + 1e-6), at most 1); a non-finite loss
on any rank or norm skips the step on every rank (DeepSpeedLearner.optimizer_step). Then AdamW and the same LR
schedule (shop_r1/algo/lr_schedule.py). bfloat16 (`learner.dtype`) computes in bf16 over fp32 sharded weights (the
optimizer's), reducing gradients in fp32.

Checkpoints: torch.distributed.checkpoint (DCP) writes the sharded weights and AdamW state (any world size can load
them); rank 0 adds the schedule, the step and the caller's state as JSON (STATE_FILE). DCP's own `.metadata` is a
pickle, as DeepSpeed's state files are: load only checkpoints you trust.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from shop_r1.algo.batch import GRPOBatch
from shop_r1.algo.step_rewards import StepRewards, UpdateWithSelfCertainty
from shop_r1.config import AdvantageConfig, LearnerConfig, LossConfig
from shop_r1.learner import process_group
from shop_r1.learner.backend import OptimizerStep, computes_in_bf16, lr_scheduler, reference_policy, save_hf_folder
from shop_r1.learner.grpo_step import (
    grpo_update,
    grpo_update_with_self_certainty,
    probe_logprobs,
    rationale_self_certainty,
)
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.learner.sft_step import eval_loss, sft_update
from shop_r1.learner.weight_sender import LearnerSender
from shop_r1.types import GRPOStepStats, SFTStepStats

STATE_FILE = "fsdp2_learner_state.json"
"""Beside DCP's files: the LR schedule, the learner step and the caller's client_state."""


@dataclass(frozen=True)
class _Policy:
    """What the forward math (shop_r1/learner/forward.py) uses of the trained model: the transformer called through
    the FSDP root (`model`), the LM head, and the dtype the forward computes in (the attention mask's)."""

    model: Callable[..., Any]
    lm_head: torch.nn.Module
    dtype: torch.dtype
    config: Any  # the model's config: its attention implementation (learner.attention=split switches it at load)


def _run_transformer(self: Any, **inputs: Any) -> Any:
    """Becomes the root module's `shop_r1_transformer` method, registered as an FSDP forward."""
    return self.model(**inputs)


class FSDP2Learner:
    def __init__(self, model_path: str, cfg: LearnerConfig, lr: float, total_steps: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, warmup_steps: int = 0, reference_path: str | None = None,
                 lr_schedule: str = "constant") -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
        from transformers import AutoModelForCausalLM

        self.on_gpu = torch.cuda.is_available()
        self._device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if self.on_gpu \
            else torch.device("cpu")
        if self.on_gpu:
            torch.cuda.set_device(self._device)
        self._rendezvous_store = process_group.init_process_group(rank, world_size, "nccl" if self.on_gpu else "gloo")
        torch.manual_seed(seed)
        self.rank, self.world_size, self.model_path, self.cfg = rank, world_size, str(model_path), cfg
        self.bf16 = computes_in_bf16(cfg, self.on_gpu)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if cfg.attention == "split" and (cfg.shared_prompt or cfg.pack_sequences):
            from shop_r1.learner import split_attention

            if split_attention.applies(model):  # switched before the wrapper hides the model; else the dense mask
                split_attention.ready(model)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        mesh = init_device_mesh(self._device.type, (world_size,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 \
            else MixedPrecisionPolicy()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self._units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in self._units:  # sum, not mean, over ranks (module docstring)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        model.shop_r1_transformer = types.MethodType(_run_transformer, model)
        register_fsdp_forward_method(model, "shop_r1_transformer")
        self.module = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
        self.scheduler = lr_scheduler(self.optimizer, total_steps, warmup_steps, lr_schedule)
        self.total_steps = total_steps
        self.step = 0
        self.reference = reference_policy(reference_path, self.bf16, self.device)
        self._weights_out = LearnerSender(rank)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def policy(self) -> Any:
        return _Policy(self.module.shop_r1_transformer, self.module.lm_head,
                       torch.bfloat16 if self.bf16 else torch.float32, self.module.config)

    def _reshard(self) -> None:
        """Every unit back to its shards (the root stays gathered after a forward until its backward ends)."""
        for unit in self._units:
            unit.reshard()

    # ---------------------------------------------------- the steps (shop_r1/learner/grpo_step.py, sft_step.py)

    def grpo_step(self, batch: GRPOBatch, loss_cfg: LossConfig) -> GRPOStepStats:
        """One GRPO update on this rank's share of the batch (any size, even empty); figures over the global batch."""
        stats = grpo_update(self, batch, loss_cfg, step=self.step + 1, pack=self.cfg.pack_sequences)
        self.step += 1
        return stats

    def grpo_step_with_self_certainty(self, batch: GRPOBatch, loss_cfg: LossConfig, rewards: StepRewards,
                                      adv_cfg: AdvantageConfig, first_row: int) -> UpdateWithSelfCertainty:
        """One GRPO update whose own forward gives s(r) and the advantages (shop_r1/learner/grpo_step.py); a step it
        did not train ran forwards without backward, so the units go back to their shards. Cost: with
        rl.self_certainty_breaks_ties=false a no-grad forward of the dropped groups' rows and forward + backward of
        the kept ones (below learner_logits); with it true a forward with gradient of every row and a backward through
        every micro-batch holding a kept row (can exceed learner_logits when many groups are dropped)."""
        out = grpo_update_with_self_certainty(self, batch, loss_cfg, rewards, adv_cfg, first_row, step=self.step + 1,
                                              pack=self.cfg.pack_sequences)
        if not out.updated:
            self._reshard()
        self.step += int(out.updated)
        return out

    def rationale_self_certainty(self, batch: GRPOBatch, direction: Literal["p_to_u", "u_to_p"],
                                 normalize_by_vocab: bool = False) -> list[float]:
        values = rationale_self_certainty(self, batch, direction, normalize_by_vocab, pack=self.cfg.pack_sequences)
        self._reshard()
        return values

    def probe_logprobs(self, batch: GRPOBatch) -> list[list[float]]:
        values = probe_logprobs(self, batch, pack=self.cfg.pack_sequences)
        self._reshard()
        return values

    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> SFTStepStats:
        """One optimizer step; the loss is the global batch's token mean (shop_r1/learner/sft_step.py)."""
        stats = sft_update(self, micro_batches, num_loss_tokens_global, step=self.step + 1)
        self.step += 1
        return stats

    @torch.no_grad()
    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float:
        loss = eval_loss(self, micro_batches)
        self._reshard()
        return loss

    # ---------------------------------------------------------------- the backend (shop_r1/learner/backend.py)

    def begin_micro_batch(self) -> None:
        """Nothing to do: every backward reduce-scatters and accumulates into the sharded gradients itself."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # summed over ranks by the reduce-scatter (divide factor 1, module docstring)

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        return process_group.all_reduce(values, op, self.world_size, self.device)

    def optimizer_step(self, losses: Sequence[float]) -> OptimizerStep:
        """Clip to learner.grad_clip and step, with this step's global gradient norm (before clipping) -- or, when a
        loss of this step (on any rank) or the norm is NaN/inf, no step at all: the gradients are dropped, the
        weights, optimizer and schedule stay as they were, and the cause ("loss" / "grad_norm") is returned."""
        from torch.distributed.tensor import DTensor

        from shop_r1.algo.finite import CAUSES, learner_cause

        params = [p for p in self.module.parameters() if p.grad is not None]
        norm_t = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip) if params else None
        if isinstance(norm_t, DTensor):
            norm_t = norm_t.full_tensor()
        norm = float(norm_t) if norm_t is not None else None
        local = learner_cause(losses, norm)
        # Every rank skips or steps together (the sharded weights must stay one model).
        flags = self.all_reduce(torch.tensor([float(local == c) for c in CAUSES], dtype=torch.float64), "max")
        cause = next((c for c, f in zip(CAUSES, flags.tolist()) if f), "")
        if not cause:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return OptimizerStep(norm if norm is not None else float("nan"), cause)

    # ------------------------------------------------------------------------------------------- weight sync

    def weight_manifest(self, bucket_bytes: int) -> Any:
        from shop_r1.weight_sync.broadcast import first_bucket_bytes, make_manifest

        dtype = torch.bfloat16 if self.bf16 else torch.float32
        return make_manifest(((n, tuple(p.shape), dtype) for n, p in self.module.named_parameters()), bucket_bytes,
                             fuse=True, first_bytes=first_bucket_bytes(bucket_bytes))

    def open_weight_sync_store(self, timeout_s: float = 600.0) -> tuple[str, int]:
        return self._weights_out.open_store(timeout_s)

    def init_weight_sender(self, spec: Any) -> None:
        self._weights_out.connect(spec, self.device)

    @torch.no_grad()
    def broadcast_weights(self, manifest: Any) -> int:
        """Every rank must call: the parameters of one bucket are gathered whole on every rank (one all-gather per
        sharded parameter), and rank 0 broadcasts them as the bucket's buffer. Returns bytes sent (0 on others)."""
        from torch.distributed.tensor import DTensor

        self._reshard()
        params = dict(self.module.named_parameters())
        sent = 0
        last = len(manifest.buckets) - 1
        for k, bucket in enumerate(manifest.buckets):
            group = [(m.name, params[m.name].full_tensor() if isinstance(params[m.name], DTensor)
                      else params[m.name]) for m in bucket]
            sent += self._weights_out.send_bucket(bucket, group, last=k == last,
                                                          zero_copy=manifest.zero_copy)
        return sent

    def nonfinite_weights(self) -> list[str]:
        """The names of the policy's parameters that hold NaN or inf (checked before a checkpoint is written); rank
        0 checks the whole model, the other ranks only join the gather."""
        from shop_r1.algo.finite import nonfinite_names

        return nonfinite_names(self.named_weights())

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full float32 CPU weights in HF names, parameters only (a tied one once, as DeepSpeedLearner's). Every rank
        must iterate (the gather is a collective); only rank 0 receives them, the others yield nothing."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self._reshard()
        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if state:
            for name, _ in self.module.named_parameters():
                # A copy: on one CPU rank the gathered tensor is the parameter itself. Popped, so at most one
                # tensor is held twice.
                yield name, state.pop(name).detach().to(torch.float32, copy=True)

    def save_hf(self, out_dir: str) -> None:
        """A normal HF folder of the trained weights (every rank gathers, rank 0 writes)."""
        state = dict(self.named_weights())
        if self.rank == 0:
            save_hf_folder(state, self.model_path, self.step, out_dir)

    # ------------------------------------------------------------------------------------------- checkpoints

    def _state_dicts(self) -> tuple[dict, dict, bool]:
        """(model, optimizer) sharded state dicts and whether AdamW has taken no step yet. DCP fills an empty AdamW
        state with a zero step; that is undone, so a checkpoint never changes the live optimizer."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self._reshard()
        fresh = not self.optimizer.state
        model_state, optim_state = get_state_dict(self.module, self.optimizer)
        if fresh:
            self.optimizer.state.clear()
        return model_state, optim_state, fresh

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        import torch.distributed.checkpoint as dcp

        model_state, optim_state, fresh = self._state_dicts()
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=ckpt_dir)
        if self.rank == 0:
            from shop_r1.atomic import write_atomic

            write_atomic(Path(ckpt_dir) / STATE_FILE, json.dumps({
                "client_state": {**client_state, "learner_step": self.step}, "optimizer_fresh": fresh,
                "scheduler": self.scheduler.state_dict()}))

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        folder = Path(ckpt_dir)
        if not (folder / ".metadata").is_file() or not (folder / STATE_FILE).is_file():
            raise FileNotFoundError(f"{ckpt_dir}: no FSDP2 checkpoint to resume from (learner.backend=fsdp2 reads "
                                    f"only its own: DCP's .metadata and {STATE_FILE})")
        model_state, optim_state, _ = self._state_dicts()
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=ckpt_dir)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        extra = json.loads((folder / STATE_FILE).read_text())
        if extra["optimizer_fresh"]:
            self.optimizer.state.clear()
        self.scheduler.load_state_dict(extra["scheduler"])
        client_state = extra["client_state"]
        self.step = int(client_state.get("learner_step", self.step))
        return client_state
