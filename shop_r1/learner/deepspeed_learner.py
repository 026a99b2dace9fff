"""One DeepSpeed rank: the policy model under ZeRO, trained with a token-mean loss over the global batch.

Distributed setup: MASTER_ADDR / MASTER_PORT name the rendezvous store the Ray learner group holds (its port picked
by the OS at bind time); run alone, a learner forms a one-rank group on 127.0.0.1 with its own store. The optimizer
is `torch.optim.AdamW` (with `zero_allow_untested_optimizer`), so nothing is JIT-compiled but DeepSpeed's own shm
communication op on CPU (built once into TORCH_EXTENSIONS_DIR).

Loss scaling: every micro-batch contributes sum(token losses) / num_loss_tokens_global, so the accumulated gradient
over micro-batches and ranks is the exact token mean of the global batch however it was split. DeepSpeed averages
gradients over data-parallel ranks, so each rank's loss is multiplied by world_size to undo that average.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from shop_r1.algo.lr_schedule import lr_multiplier
from shop_r1.config import LearnerConfig
from shop_r1.learner.sft_data import MicroBatch
from shop_r1.types import GRPOStepStats, SFTStepStats

RENDEZVOUS_TIMEOUT_S = 600.0


def _init_process_group(rank: int, world_size: int, backend: str) -> Any:
    """Join the learners' torch.distributed group through a TCPStore whose port the OS picked while binding.

    In a Ray learner group the store is held by a rendezvous actor (shop_r1/distributed/learner_group.py) whose
    address and port arrive as MASTER_ADDR / MASTER_PORT; every rank connects to it as a client. A standalone learner
    (tests, local mode) opens its own store on port 0. A port picked in advance (bind to 0, close, pass it on) can be
    taken by another process before anyone listens on it. DeepSpeed's init_distributed then finds the group made.
    """
    import torch.distributed as dist

    if dist.is_initialized():  # by this process before (another learner, or vLLM's own one-rank group)
        os.environ.setdefault("LOCAL_RANK", "0")
        return None
    addr = os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    timeout = timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    if world_size == 1 and "MASTER_PORT" not in os.environ:
        store = dist.TCPStore(addr, 0, 1, True, timeout=timeout, wait_for_workers=False)
    else:
        store = dist.TCPStore(addr, int(os.environ["MASTER_PORT"]), world_size, False, timeout=timeout)
    os.environ.update(MASTER_PORT=str(store.port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.setdefault("LOCAL_RANK", "0")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return store


def deepspeed_config(cfg: LearnerConfig, bf16: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer and cfg.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # We accumulate ourselves over a varying number of token-budget micro-batches and call step() once.
        # Unmanaged accumulation says so: backward() only accumulates, step() is the boundary that reduces over ranks
        # and updates (managed, every backward at gradient_accumulation_steps=1 would be a boundary). See also
        # DeepSpeedLearner._begin_micro_batch.
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedLearner:
    def __init__(self, model_path: str, cfg: LearnerConfig, lr: float, total_steps: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, warmup_steps: int = 0, reference_path: str | None = None,
                 lr_schedule: str = "constant") -> None:
        self.on_gpu = torch.cuda.is_available()
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if self.on_gpu else "cpu")
        self._rendezvous_store = _init_process_group(rank, world_size, "nccl" if self.on_gpu else "gloo")
        import deepspeed
        from transformers import AutoModelForCausalLM

        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        torch.manual_seed(seed)
        self.rank, self.world_size, self.model_path, self.cfg = rank, world_size, str(model_path), cfg
        bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and self.on_gpu)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
        # Linear warmup over `warmup_steps`, then constant (the paper states no decay) or cosine (sft.lr_schedule).
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_multiplier(step, total_steps, warmup_steps, lr_schedule))
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=schedule, config=deepspeed_config(cfg, bf16))
        self.total_steps = total_steps
        self.step = 0
        self.reference = None
        if reference_path is not None:
            # The frozen reference policy for the KL term: a plain module, replicated on every rank.
            ref_dtype = torch.bfloat16 if bf16 else torch.float32
            self.reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=ref_dtype).to(self.device)
            self.reference.eval().requires_grad_(False)
        self._sender = None

    @property
    def device(self) -> torch.device:
        return self.engine.device

    # ------------------------------------------------------------------------------------------------ GRPO

    def _logprobs(self, model: Any, batch: Any) -> torch.Tensor:
        """[b, T] logprob of each completion token under `model` at the batch's sampling temperature (0 elsewhere):
        log softmax(logits / T), the distribution the engine sampled from (as TRL and verl score it)."""
        return self._target_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                     batch.temperature, completion_mask=batch.completion_mask)

    def _micro_batches(self, batch: Any) -> list[Any]:
        """This rank's micro-batches, each trimmed to its own longest row, padded with empty ones to the largest count
        over all ranks.

        Consecutive rows fill a micro-batch up to `learner.max_tokens_per_micro_batch` padded tokens, counted as the
        forward will run them (packed per prompt under `learner.shared_prompt`). Under ZeRO every forward and backward
        is a collective, so every rank must make the same number of them whatever its share (an uneven split, or no
        responses at all): a rank short of micro-batches runs empty ones, whose rows train no token (completion mask
        0), so they add nothing to the loss or the gradient.
        """
        from shop_r1.algo.batch import micro_batch_rows
        from shop_r1.algo.shared_prompt import prefix_lengths

        lengths = [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]
        prompts = None
        if self.cfg.shared_prompt:
            prefixes, ids = prefix_lengths(batch.completion_mask, batch.attention_mask), batch.input_ids.tolist()
            prompts = [(p, tuple(ids[b][:p])) for b, p in enumerate(prefixes)]
        out = [batch.select(rows).trimmed()
               for rows in micro_batch_rows(lengths, self.cfg.max_tokens_per_micro_batch, prompts)]
        count = int(self._all_reduce(torch.tensor([len(out)], dtype=torch.float64), "max")[0])
        return out + [batch.empty_like(rows=1)] * (count - len(out))

    def _begin_micro_batch(self) -> None:
        """What DeepSpeedEngine.forward does first, before a forward whose backward follows.

        We run the module's parts directly (the vocabulary projection only at target positions), not the engine's
        forward, so we make its bookkeeping call ourselves: ZeRO counts micro-batches there, and without it every
        backward of a step overwrote the gradients of the ones before (only part of the batch trained; the test in
        tests/learner/test_deepspeed_learner_on_cpu.py splits one batch into 1 and into 5 micro-batches).
        """
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()

    def _all_reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or max) a small CPU float64 vector over the learner ranks (a no-op on one rank)."""
        if self.world_size == 1:
            return values
        import torch.distributed as dist

        buf = values.to(self.device)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return buf.cpu()

    @torch.no_grad()
    def rationale_self_certainty(self, batch: Any, direction: str, normalize_by_vocab: bool = False) -> list[float]:
        """Exact s(r) per response (one value each, 0 without rationale tokens) from the policy's full logits at
        temperature 1 over its rationale tokens: s(r) is defined on the model's own distribution, not the sampling
        one. Divided by the logits' width |V| when `normalize_by_vocab` (the paper's 1/|V|, as the top-k path)."""
        from shop_r1.reward.self_certainty import kl_to_uniform_logits

        out = []
        module = self.engine.module
        for mb in self._micro_batches(batch):
            hidden, source = self._hidden(module, mb.input_ids, mb.attention_mask, mb.completion_mask)
            for b in range(mb.num_responses):
                rows = source[b, 1:][mb.rationale_mask[b, 1:].bool().to(self.device)]
                if rows.numel() == 0:
                    out.append(0.0)
                    continue
                logits = module.lm_head(hidden.index_select(0, rows))  # [n_rationale, V] at T = 1
                value = float(kl_to_uniform_logits(logits, direction).float().mean())
                out.append(value / logits.shape[-1] if normalize_by_vocab else value)
        return out[:batch.num_responses]  # without the padding rows of _micro_batches

    def grpo_step(self, batch: Any, rl: Any) -> GRPOStepStats:
        """One rollout batch: reference and old logprobs, then `rl.num_minibatches` clipped-surrogate updates.

        `batch` is this rank's share (any size, even empty). The loss is the global mean over every rank's tokens
        ("token") or responses ("sequence"): each micro-batch's loss is weighted by its share of the global count
        (all-reduced), times world_size because DeepSpeed averages gradients over ranks.
        """
        from shop_r1.algo.grpo_loss import grpo_loss, truncated_is_weight

        micro = self._micro_batches(batch)
        with torch.no_grad():
            # With one update per rollout batch the policy is still the sampler: old == current, so the ratio is
            # exactly 1 and its detached logprobs serve as `old` without a second forward pass.
            old = [self._logprobs(self.engine.module, mb) if rl.num_minibatches > 1 else None for mb in micro]
            ref = [self._logprobs(self.reference, mb) if self.reference is not None else None for mb in micro]
        groups = [list(range(i, len(micro), rl.num_minibatches)) for i in range(min(rl.num_minibatches, len(micro)))]
        by_token = rl.loss_aggregation == "token"
        # Global denominators, one per mini-batch group: trained tokens (or responses) over all ranks.
        local = [sum(float(micro[i].completion_mask[:, 1:].sum()) if by_token else
                     float(micro[i].num_trained_responses) for i in group) for group in groups]
        denominators = self._all_reduce(torch.tensor(local, dtype=torch.float64)).tolist() if groups else []
        eps_high = rl.clip_eps_high or rl.clip_eps
        # Token-weighted sums over this rank (all-reduced below): loss share, kl, clipped, ratio, tokens, |diff|,
        # importance weight, truncated.
        sums = torch.zeros(8, dtype=torch.float64)
        diff_max = torch.zeros(1, dtype=torch.float64)
        grad_norms, causes = [], []
        for group, denominator in zip(groups, denominators):
            losses = []
            for i in group:
                mb = micro[i]
                mask = mb.completion_mask.to(self.device)
                self._begin_micro_batch()
                logp = self._logprobs(self.engine.module, mb)
                old_logp = old[i] if old[i] is not None else logp.detach()
                sampler = mb.sampler_logprobs.to(self.device, logp.dtype)
                # One-step-off samples came from the weights before the previous update: correct the surrogate.
                weight_is = truncated_is_weight(old_logp, sampler, rl.async_is_cap) if rl.async_level else None
                out = grpo_loss(logp, old_logp, ref[i], mb.advantages.to(self.device), mask, rl.clip_eps, eps_high,
                                rl.kl_beta, rl.loss_aggregation, behavior_weight=weight_is)
                n_tokens = float(mask[:, 1:].sum())
                count = n_tokens if by_token else float(mb.num_trained_responses)
                weight = count / denominator if denominator > 0 else 0.0
                self.engine.backward(out.loss * weight * self.world_size)
                losses.append(float(out.loss.detach()))
                # The sampling weights' logprobs (`old` when there are several updates, else this pass's, which runs
                # before any update of this batch), against the engine's: the two sides must agree.
                diff = (old_logp - sampler)[mask.bool()].abs()
                sums[5] += float(diff.double().sum())
                if weight_is is not None:
                    sums[6] += float(weight_is[mask.bool()].double().sum())
                    sums[7] += float((weight_is[mask.bool()] >= rl.async_is_cap).double().sum())
                diff_max[0] = max(float(diff_max[0]), float(diff.max()) if diff.numel() else 0.0)
                sums[0] += float(out.loss.detach()) * weight / len(groups)
                sums[1:4] += torch.tensor([out.kl, out.clip_fraction, out.ratio_mean], dtype=torch.float64) * n_tokens
                sums[4] += n_tokens
            norm, cause = self._optimizer_step(losses)
            grad_norms.append(norm)
            causes.append(cause)
        sums = self._all_reduce(sums)
        diff_max = self._all_reduce(diff_max, "max")
        tokens = float(sums[4])
        self.step += 1
        cause = next((c for c in causes if c), "")
        if cause:  # (one of) the update(s) skipped: nothing non-finite reaches the logs (the cause says what was)
            return GRPOStepStats(loss=0.0, kl=0.0, clip_fraction=0.0, ratio_mean=1.0, grad_norm=0.0,
                                 num_tokens=int(round(tokens)), step=self.step, nonfinite=cause)
        return GRPOStepStats(loss=float(sums[0]), kl=float(sums[1]) / max(tokens, 1.0),
                             clip_fraction=float(sums[2]) / max(tokens, 1.0),
                             ratio_mean=float(sums[3]) / tokens if tokens else 1.0,
                             grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
                             num_tokens=int(round(tokens)), step=self.step,
                             sampler_logprob_abs_diff_mean=float(sums[5]) / max(tokens, 1.0),
                             sampler_logprob_abs_diff_max=float(diff_max[0]),
                             is_weight_mean=float(sums[6]) / tokens if tokens and rl.async_level else 1.0,
                             is_truncated_fraction=float(sums[7]) / max(tokens, 1.0))

    @torch.no_grad()
    def probe_logprobs(self, batch: Any) -> list[list[float]]:
        """The policy's logprobs on each response's completion tokens (for the weight-sync check)."""
        out = []
        for mb in self._micro_batches(batch):
            lp = self._logprobs(self.engine.module, mb)
            for b in range(lp.shape[0]):
                out.append(lp[b][mb.completion_mask[b].bool().to(self.device)].float().cpu().tolist())
        return out[:batch.num_responses]  # without the padding rows of _micro_batches

    # ------------------------------------------------------------------------------------------- weight sync

    def weight_manifest(self, bucket_bytes: int) -> Any:
        from shop_r1.weight_sync.broadcast import make_manifest

        dtype = torch.bfloat16 if self.engine.bfloat16_enabled() else torch.float32
        return make_manifest(((n, tuple(p.ds_shape if hasattr(p, "ds_shape") else p.shape), dtype)
                              for n, p in self.engine.module.named_parameters()), bucket_bytes)

    def open_weight_sync_store(self, timeout_s: float = 600.0) -> tuple[str, int]:
        """Rank 0 opens the sync group's store on a port the OS picks; returns (this node's address, the port)."""
        from shop_r1.weight_sync.broadcast import open_master_store

        if self.rank != 0:
            raise RuntimeError("the weight-sync store lives on learner rank 0")
        import ray

        addr = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        self._sync_store = open_master_store(addr, timeout_s)
        return addr, self._sync_store.port

    def init_weight_sender(self, spec: Any) -> None:
        from shop_r1.weight_sync.broadcast import WeightSender

        if self.rank == 0:
            self._sender = WeightSender(spec, self.device, store=getattr(self, "_sync_store", None))

    def broadcast_weights(self, manifest: Any) -> int:
        """Every rank must call: under ZeRO-3 the parameters of one bucket are gathered together (one gather per
        bucket, not per parameter), and rank 0 copies them once into the bucket's buffer and broadcasts it before
        they are released. Returns bytes sent (0 on other ranks)."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        sent = 0
        for bucket in manifest.buckets:
            group = [(m.name, params[m.name]) for m in bucket]
            with deepspeed.zero.GatheredParameters([p for _, p in group], enabled=self.cfg.zero_stage == 3):
                if self.rank == 0:
                    sent += self._sender.send_bucket(bucket, group)
        return sent

    def _hidden(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                completion_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of `model`'s transformer over right-padded rows [b, T]: its final hidden states flattened to
        [N, H], and source [b, T], the index in them of the state that predicts row token t (the state at t - 1).

        With `learner.shared_prompt` and a completion mask, rows that share a prompt are packed so the prompt is
        encoded once (shop_r1/algo/shared_prompt.py: same outputs and gradients as the separate rows); otherwise the
        rows run as they are.
        """
        dev = self.device
        if completion_mask is not None and self.cfg.shared_prompt:
            from shop_r1.algo.shared_prompt import pack_shared_prompts, prefix_lengths

            packed = pack_shared_prompts(input_ids, attention_mask, prefix_lengths(completion_mask, attention_mask))
            hidden = model.model(input_ids=packed.input_ids.to(dev), position_ids=packed.position_ids.to(dev),
                                 attention_mask=packed.additive_mask(model.dtype, dev)).last_hidden_state
            return hidden.reshape(-1, hidden.shape[-1]), packed.source.to(dev)
        hidden = model.model(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev)).last_hidden_state
        rows, width = input_ids.shape
        source = torch.arange(rows * width, device=dev).view(rows, width) - 1
        source[:, 0] = -1
        return hidden.reshape(-1, hidden.shape[-1]), source

    def _target_logprobs(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         target_mask: torch.Tensor, temperature: float = 1.0,
                         completion_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[b, T] logprob of token t (predicted at t-1) under softmax(logits / temperature) where target_mask[:, t]
        is 1, else 0. `completion_mask` (GRPO rows) lets rows that share a prompt encode it once (`_hidden`).

        The vocabulary projection runs only on the positions that are targets (assistant or completion tokens, a
        small share of page-heavy sequences), so no [b, T, V] logits tensor is ever built.
        """
        ids = input_ids.to(self.device)
        hidden, source = self._hidden(model, input_ids, attention_mask, completion_mask)
        where = target_mask[:, 1:].to(self.device).bool()  # [b, T-1]
        logits = model.lm_head(hidden.index_select(0, source[:, 1:][where])).float()  # [n, V]
        if temperature != 1.0:
            logits = logits / temperature
        picked = logits.gather(-1, ids[:, 1:][where].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        out = torch.zeros(ids.shape, dtype=picked.dtype, device=self.device)
        out[:, 1:][where] = picked
        return out

    def _token_loss_sum(self, mb: MicroBatch) -> torch.Tensor:
        return -self._target_logprobs(self.engine.module, mb.input_ids, mb.attention_mask, mb.loss_mask).sum()

    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> SFTStepStats:
        if num_loss_tokens_global <= 0:
            raise ValueError("sft_step: the global batch has no assistant tokens to learn from")
        losses = []
        batches = list(micro_batches) or [self._empty_batch()]  # an idle rank still joins the collectives
        for mb in batches:
            self._begin_micro_batch()
            loss = self._token_loss_sum(mb) / num_loss_tokens_global
            # DeepSpeed averages gradients over ranks; scale back so the sum over ranks is the global token mean.
            self.engine.backward(loss * self.world_size)
            losses.append(float(loss.detach()))
        lr = self.scheduler.get_last_lr()[0]
        grad_norm, cause = self._optimizer_step(losses)
        self.step += 1
        if cause:  # skipped: nothing non-finite reaches the logs (the cause says what was)
            return SFTStepStats(loss=0.0, num_tokens=sum(mb.num_loss_tokens for mb in micro_batches), grad_norm=0.0,
                                lr=lr, step=self.step, nonfinite=cause)
        return SFTStepStats(loss=sum(losses), num_tokens=sum(mb.num_loss_tokens for mb in micro_batches),
                            grad_norm=grad_norm, lr=lr, step=self.step)

    def _optimizer_step(self, losses: Sequence[float]) -> tuple[float, str]:
        """engine.step(), returning this step's global gradient norm (before clipping) and "" -- or, when a loss of
        this step (on any rank) or the gradient norm is NaN/inf, no step at all: the gradients are dropped, the
        weights, optimizer and schedule stay as they were, and the cause ("loss" / "grad_norm") is returned.

        Where the gradients sit on the parameters we measure them before the step; where ZeRO keeps them in its own
        partitioned buffers only the losses can be checked before it, and DeepSpeed's own norm is read after it (a
        non-finite one is then reported, and `nonfinite_weights` keeps such weights out of any checkpoint).
        """
        from shop_r1.algo.finite import CAUSES, learner_cause

        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) \
            if grads else None
        local = learner_cause(losses, norm)
        # Every rank skips or steps together (the step is a collective under ZeRO).
        flags = self._all_reduce(torch.tensor([float(local == c) for c in CAUSES], dtype=torch.float64), "max")
        cause = next((c for c, f in zip(CAUSES, flags.tolist()) if f), "")
        if cause:
            self.engine.zero_grad()
            self.engine.optimizer.zero_grad(set_to_none=True)
            return (norm if norm is not None else float("nan")), cause
        self.engine.step()
        if norm is None:
            ds_norm = self.engine.get_global_grad_norm()
            norm = float(ds_norm) if ds_norm is not None else float("nan")
            cause = learner_cause((), norm) if ds_norm is not None else ""
        return norm, cause

    def nonfinite_weights(self) -> list[str]:
        """The names of the policy's parameters that hold NaN or inf (checked before a checkpoint is written)."""
        from shop_r1.algo.finite import nonfinite_names

        return nonfinite_names(self.named_weights())

    def _empty_batch(self) -> MicroBatch:
        one = torch.zeros((1, 2), dtype=torch.long)
        return MicroBatch(one, torch.ones_like(one), torch.zeros_like(one), 0)

    @torch.no_grad()
    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float:
        total = sum(float(self._token_loss_sum(mb)) for mb in micro_batches)
        tokens = sum(mb.num_loss_tokens for mb in micro_batches)
        return total / max(tokens, 1)

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in HF names; under ZeRO-3 gathered, so every rank must iterate it."""
        import deepspeed

        module = self.engine.module
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], enabled=self.cfg.zero_stage == 3):
                yield name, param.detach().to(torch.float32).cpu().clone()

    def save_hf(self, out_dir: str) -> None:
        """A normal HF folder (weights, config, tokenizer, chat template): written aside, then renamed."""
        state = dict(self.named_weights())
        if self.rank != 0:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        out = Path(out_dir)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        load_trained_weights(model, state, source=f"the learner's weights at step {self.step}")
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(tmp)
        (tmp / "shop_r1_model.json").write_text(json.dumps({"kind": "trained", "base": self.model_path,
                                                            "step": self.step}))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None:
        self.engine.save_checkpoint(ckpt_dir, tag=f"step{self.step}", client_state={**client_state,
                                                                                   "learner_step": self.step})

    def load_checkpoint(self, ckpt_dir: str) -> dict:
        path, client_state = self.engine.load_checkpoint(ckpt_dir)
        if path is None:
            raise FileNotFoundError(f"{ckpt_dir}: no DeepSpeed checkpoint to resume from")
        self.step = int(client_state.get("learner_step", self.step))
        return client_state


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
