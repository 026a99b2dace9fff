"""The tiny test model: loads offline, has the shape vLLM's CPU backend needs, deterministic, round-trips text."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shop_r1.models.tiny import build_tiny_model


def test_loads_and_has_the_right_shape(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size // cfg.num_attention_heads >= 32
    assert cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = model(ids).logits
    assert logits.shape == (1, 4, cfg.vocab_size) and torch.isfinite(logits).all()


def test_tokenizer_round_trips_any_text_and_renders_chatml(tiny_tokenizer):
    text = 'Über café — 日本語 🛒 <button name="buy_now">$19.99</button>\n\t{"a": 1}'
    assert tiny_tokenizer.decode(tiny_tokenizer(text)["input_ids"]) == text
    rendered = tiny_tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tokenize=False,
        add_generation_prompt=True)
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    # Shop text compresses: the tokenizer was trained on it.
    page = '<a name="search_results.Osprey Waterproof Hiking Backpack.view_product">'
    assert len(tiny_tokenizer(page)["input_ids"]) < len(page) / 2


def test_same_seed_same_model(tmp_path, tiny_model_dir):
    other = build_tiny_model(tmp_path / "again", seed=0)
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tokenizer_json = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    assert json.loads((other / "tokenizer.json").read_text()) == tokenizer_json
    different = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "seed1", seed=1)).state_dict()
    assert not torch.equal(a["model.embed_tokens.weight"], different["model.embed_tokens.weight"])


def test_generation_config_stops_at_end_of_turn(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
