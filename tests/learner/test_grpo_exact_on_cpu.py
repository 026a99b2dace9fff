"""GRPO made exact on the real components: the learner scores the tokens the engine sampled at the sampling
temperature: engine and learner logprobs agree (the K-rank update: tests/distributed/test_learner_ranks_on_cpu.py)."""

import pytest
import torch
from transformers import AutoTokenizer

from shop_r1.algo.batch import build_grpo_batch
from shop_r1.config import LearnerConfig, RLConfig, RolloutConfig
from shop_r1.data.encode import encode_prompts
from shop_r1.data.examples import build_rl_examples, chat_token_counter
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import RewardBreakdown, SamplingSpec, ScoredGeneration


@pytest.mark.timeout(900)
def test_engine_and_learner_logprobs_agree_at_the_sampling_temperature(tiny_model_dir):
    """vLLM samples at T and returns log softmax(logits / T) of the sampled tokens; the learner must compute the same
    (before the fix the engine returned T = 1 logprobs and the learner scored T = 1: the ratio was not the
    sampler's). At T = 0.6 the T = 1 scores differ clearly, so this test sees a temperature left out on either side."""
    from shop_r1.learner.rank import LearnerRank
    from shop_r1.rollout.vllm_engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = build_rl_examples(synthesize_sessions(3, seed=2), "latest_step", 1500,
                                 chat_token_counter(tok)).examples
    prompts = encode_prompts(tok, examples[:3], max_prompt_tokens=1500)
    assert len(prompts) == 3
    engine = VLLMEngine(str(tiny_model_dir), RolloutConfig(num_engines=1, kv_cache_gib=1.0), 2048, seed=0)
    learner = LearnerRank(str(tiny_model_dir), LearnerConfig(zero_stage=0), lr=1e-6, total_steps=1)
    try:
        for temperature in (0.6, 1.0):
            spec = SamplingSpec(n=4, temperature=temperature, max_new_tokens=24, top_k_logprobs=0, seed=5)
            gens = engine.generate([p.token_ids for p in prompts], spec)
            scored = [ScoredGeneration(p, g, tuple(RewardBreakdown() for _ in g.completions))
                      for p, g in zip(prompts, gens)]
            zeros = torch.zeros(len(scored), 4, dtype=torch.float64)
            batch = build_grpo_batch(scored, zeros, tok.pad_token_id, temperature)
            ours = learner.probe_logprobs(batch)
            theirs = [c.logprobs for g in gens for c in g.completions]
            assert [len(o) for o in ours] == [len(t) for t in theirs]
            diff = max(abs(a - b) for o, t in zip(ours, theirs) for a, b in zip(o, t))
            assert diff < 1e-4, (temperature, diff)
            if temperature != 1.0:  # the test has teeth: T = 1 scoring of the same tokens is far off
                at_one = learner.probe_logprobs(build_grpo_batch(scored, zeros, tok.pad_token_id, 1.0))
                assert max(abs(a - b) for o, t in zip(at_one, theirs) for a, b in zip(o, t)) > 1e-2
            # The step reports the same agreement as a metric (mean and max over the sampled tokens).
            stats = learner.grpo_step(batch, RLConfig(kl_beta=0.0).loss_config(spec.max_new_tokens))
            assert stats.sampler_logprob_abs_diff_max < 1e-4 and stats.num_tokens == sum(len(t) for t in theirs)
            engine.load_weights(learner.named_weights(), version=stats.step)
    finally:
        engine.shutdown()

