"""The rollout engine and the SFT learner on CUDA: the same code paths as the CPU tests (bf16 policy, NCCL).
Run where CUDA exists (`pytest -m gpu`); skipped elsewhere."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shop_r1.config import LearnerConfig, RolloutConfig
from shop_r1.data.examples import build_sft_examples
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import SamplingSpec

pytestmark = pytest.mark.gpu


def test_vllm_engine_logprobs_and_weight_loading_on_cuda(tiny_model_dir, tmp_path):
    from shop_r1.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_model_dir), RolloutConfig(dtype="float32", gpu_memory_utilization=0.3),
                        max_model_len=2048)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("<|im_start|>user\nfind running shoes<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    spec = SamplingSpec(n=2, temperature=1.0, max_new_tokens=12, top_k_logprobs=5, seed=0)
    c = engine.generate([ids], spec)[0].completions[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    full = torch.tensor([ids + list(c.token_ids)], device="cuda")
    with torch.no_grad():
        ref = torch.log_softmax(model(full).logits[0, len(ids) - 1:-1].double(), -1)
    sampled = ref.gather(1, torch.tensor(c.token_ids, device="cuda")[:, None])[:, 0].cpu()
    torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), sampled, atol=1e-3, rtol=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights([(k, v) for k, v in model.state_dict().items()], version=1)
    greedy = engine.generate([ids], SamplingSpec(n=1, temperature=0.0, max_new_tokens=8, top_k_logprobs=0))[0]
    c = greedy.completions[0]
    full = torch.tensor([ids + list(c.token_ids)], device="cuda")
    with torch.no_grad():
        ref = torch.log_softmax(model(full).logits[0, len(ids) - 1:-1].double(), -1)
    assert ref.argmax(-1).cpu().tolist() == list(c.token_ids) and c.policy_version == 1
    engine.shutdown()


def test_sft_step_on_cuda_bf16(tiny_model_dir, tiny_tokenizer):
    from shop_r1.learner.rank import LearnerRank
    from shop_r1.learner.sft_data import pack_micro_batches, tokenize_sft_examples

    seqs = tokenize_sft_examples(build_sft_examples(synthesize_sessions(4, 0)).examples, tiny_tokenizer,
                                 4096).sequences
    mbs = pack_micro_batches(seqs, 8192)
    n = sum(mb.num_loss_tokens for mb in mbs)
    learner = LearnerRank(str(tiny_model_dir), LearnerConfig(zero_stage=2, dtype="bfloat16"), lr=3e-3,
                               total_steps=4)
    assert learner.device.type == "cuda"
    losses = [learner.sft_step(mbs, n).loss for _ in range(4)]
    assert losses[-1] < losses[0]
