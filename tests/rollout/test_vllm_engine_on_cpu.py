"""The vLLM engine in this process (the local-mode path) on a batch longer than one scheduler step."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from shop_r1.config import RolloutConfig
from shop_r1.data.encode import encode_prompts
from shop_r1.data.examples import build_rl_examples, chat_token_counter
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import SamplingSpec


@pytest.mark.timeout(600)
def test_seeded_sampling_of_a_batch_longer_than_one_scheduler_step(tiny_model_dir):
    """4 prompts x 2 samples x ~1.3k tokens exceed vLLM's 4096-token step budget. With chunked prefill vLLM rewinds
    the seeded generator of a request prefilled in chunks, which a CPU generator cannot do, and the engine died
    ("CPU Generator does not use offset"). Seeded sampling must run and repeat exactly."""
    from shop_r1.rollout.vllm_engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = build_rl_examples(synthesize_sessions(3, seed=1), "whole_session", 1500,
                                 chat_token_counter(tok)).examples
    prompts = [p.token_ids for p in encode_prompts(tok, examples[:4], max_prompt_tokens=1500)]
    assert 2 * sum(len(p) for p in prompts) > 4096
    engine = VLLMEngine(str(tiny_model_dir), RolloutConfig(num_engines=1, kv_cache_gib=1.0), 2048, seed=0)
    spec = SamplingSpec(n=2, temperature=1.0, max_new_tokens=8, top_k_logprobs=0, seed=123)
    a, b = engine.generate(prompts, spec), engine.generate(prompts, spec)
    assert [[c.token_ids for c in g.completions] for g in a] == [[c.token_ids for c in g.completions] for g in b]
    other = engine.generate(prompts, SamplingSpec(n=2, temperature=1.0, max_new_tokens=8, top_k_logprobs=0, seed=7))
    assert [[c.token_ids for c in g.completions] for g in other] != [[c.token_ids for c in g.completions] for g in a]
