"""vLLM engines as Ray actors on CPU: logprobs match a HF forward pass, weight loading into a running engine
equals a fresh engine built from the same checkpoint, and scored generation lines rewards up with completions."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shop_r1.config import RewardConfig, RewardPoolConfig, RolloutConfig
from shop_r1.data.encode import encode_prompts
from shop_r1.data.examples import build_rl_examples, chat_token_counter
from shop_r1.data.synth import synthesize_sessions
from shop_r1.distributed.engine_group import EngineGroup, split_evenly
from shop_r1.distributed.reward_pool import RewardPool
from shop_r1.types import SamplingSpec

ROLLOUT = RolloutConfig(num_engines=1, kv_cache_gib=1.0, top_k_logprobs=5)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples = build_rl_examples(synthesize_sessions(3, seed=1), "whole_session", 1500,
                                 chat_token_counter(tok)).examples
    return encode_prompts(tok, examples[:4], max_prompt_tokens=1500)


@pytest.fixture(scope="module")
def group(ray_local_cluster, tiny_model_dir):
    g = EngineGroup(str(tiny_model_dir), ROLLOUT, max_model_len=2048, seed=0, local=False)
    yield g
    g.shutdown()


def hf_logprobs(model, prompt_ids, completion_ids) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].double()
    return torch.log_softmax(logits, dim=-1)


def test_split_evenly():
    assert [list(r) for r in split_evenly(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in split_evenly(1, 3)] == [[0]]


def test_engine_actor_logprobs_match_hf(group, prompts, tiny_model_dir):
    gens = group.generate([p.token_ids for p in prompts], SamplingSpec(n=2, temperature=1.0, max_new_tokens=12,
                                                                      top_k_logprobs=5, seed=7))
    assert [g.prompt_index for g in gens] == list(range(len(prompts)))
    assert group.policy_versions() == [0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for g, p in zip(gens, prompts):
        assert g.prompt_token_ids == p.token_ids and len(g.completions) == 2
        for c in g.completions:
            ref = hf_logprobs(model, p.token_ids, c.token_ids)
            sampled = ref.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), sampled, atol=1e-4, rtol=0)
            for j, row in enumerate(c.topk_logprobs):
                top5 = ref[j].topk(5).values
                got = torch.tensor(sorted(row, reverse=True)[:5], dtype=torch.float64)
                torch.testing.assert_close(got, top5, atol=1e-4, rtol=0)
            assert len(c.token_offsets) == len(c.token_ids) and c.policy_version == 0


def test_greedy_is_deterministic(group, prompts):
    spec = SamplingSpec(n=1, temperature=0.0, max_new_tokens=10, top_k_logprobs=0)
    a = group.generate([prompts[0].token_ids], spec)[0].completions[0]
    b = group.generate([prompts[0].token_ids], spec)[0].completions[0]
    assert a.token_ids == b.token_ids


def test_weight_loading_equals_a_fresh_engine_from_the_checkpoint(group, prompts, tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # the tied embedding too (lm_head shares it)
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "ckpt")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "ckpt")
    spec = SamplingSpec(n=1, temperature=0.0, max_new_tokens=10, top_k_logprobs=0)
    ids = [p.token_ids for p in prompts[:2]]
    before = group.generate(ids, spec)

    group.load_weights(list(model.state_dict().items()), version=1)
    loaded = group.generate(ids, spec)
    fresh_group = EngineGroup(str(tmp_path / "ckpt"), ROLLOUT, max_model_len=2048, seed=0, local=False)
    try:
        fresh = fresh_group.generate(ids, spec)
    finally:
        fresh_group.shutdown()
    assert group.policy_versions() == [1]
    for g_loaded, g_fresh, _before, p_ids in zip(loaded, fresh, before, ids):
        a, b = g_loaded.completions[0], g_fresh.completions[0]
        assert a.token_ids == b.token_ids and a.policy_version == 1
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
        ref = hf_logprobs(model, p_ids, a.token_ids).gather(1, torch.tensor(a.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(a.logprobs, dtype=torch.float64), ref, atol=1e-4, rtol=0)
    # The load really changed the engine (the test could fail).
    old = before[0].completions[0]
    new_on_old_tokens = hf_logprobs(model, ids[0], old.token_ids).gather(1, torch.tensor(old.token_ids)[:, None])
    assert not torch.allclose(new_on_old_tokens[:, 0].float(), torch.tensor(old.logprobs), atol=1e-3)


def test_generate_scored_aligns_rewards_with_completions(group, prompts):
    pool = RewardPool(RewardConfig(), RewardPoolConfig(num_workers=1), local=False)
    try:
        scored = group.generate_scored(prompts, SamplingSpec(n=2, temperature=1.0, max_new_tokens=8,
                                                             top_k_logprobs=5, seed=3), pool).scored
    finally:
        pool.shutdown()
    assert [s.prompt.example_id for s in scored] == [p.example_id for p in prompts]
    for s in scored:
        assert len(s.rewards) == len(s.generation.completions) == 2
        for r in s.rewards:  # a random model writes no valid JSON: format-invalid, scored 0, not failed
            assert r.error is None and r.total == 0.0
