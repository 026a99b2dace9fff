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


def test_chunk_merges_round_trip_and_shorten_shop_text():
    """model.scratch_tokenizer=chunks: BPE merges across punctuation inside whitespace-free runs, so a page's HTML
    takes far fewer tokens than under GPT-2's word split; any text still round-trips, the specials stay whole."""
    import pytest

    from shop_r1.models.tiny import default_corpus, train_tokenizer

    corpus = list(default_corpus(num_sessions=20, seed=5, version=4))
    words, chunks = (train_tokenizer(corpus, 1024, m) for m in ("words", "chunks"))
    page = next(t for t in corpus if t.startswith("<html>"))
    assert len(chunks(page)["input_ids"]) < 0.6 * len(words(page)["input_ids"])
    text = 'Über café — 日本語 🛒 <button name="buy_now">$19.99</button>\n\t{"a": 1}  two  spaces\n\nend'
    for tok in (words, chunks):
        assert tok.decode(tok(text)["input_ids"]) == text
        assert tok.decode(tok(page)["input_ids"]) == page
    rendered = chunks.apply_chat_template([{"role": "user", "content": "U"}], tokenize=False,
                                          add_generation_prompt=True)
    assert chunks.convert_ids_to_tokens(chunks(rendered)["input_ids"])[0] == "<|im_start|>"
    assert chunks.convert_ids_to_tokens(chunks("<|im_end|>")["input_ids"]) == ["<|im_end|>"]
    # The generation prompt's tokens begin the tokens of prompt + answer, as they will at inference: the answer's
    # first token is never merged with the prompt's last line break.
    prompt = chunks.apply_chat_template([{"role": "user", "content": page}], tokenize=False, add_generation_prompt=True)
    for answer in ('{"rationale": "I want it.", "action": {"type": "terminate"}}', ' "x"', "\n{}"):
        ids = chunks(prompt)["input_ids"]
        assert chunks(prompt + answer)["input_ids"][:len(ids)] == ids, answer
    with pytest.raises(ValueError, match="merges must be words or chunks"):
        train_tokenizer(corpus, 1024, "bytes")


def test_a_chunks_model_folder_and_its_trained_copies_load_their_own_split(tmp_path):
    """AutoTokenizer would load a qwen2 folder with Qwen2's split (whatever tokenizer.json holds); load_tokenizer
    keeps the shop model's own, for the tiny build and for the HF folder the learner writes from it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shop_r1.learner.backend import save_hf_folder
    from shop_r1.models.tiny import default_corpus
    from shop_r1.models.tokenizer import load_tokenizer, merges_of

    corpus = list(default_corpus(num_sessions=20, seed=5, version=4))
    base = build_tiny_model(tmp_path / "base", corpus, vocab_size=1024, merges="chunks")
    page = next(t for t in corpus if t.startswith("<html>"))
    own = load_tokenizer(base)(page)["input_ids"]
    assert len(own) < 0.6 * len(AutoTokenizer.from_pretrained(base)(page)["input_ids"])  # the trap it avoids
    model = AutoModelForCausalLM.from_pretrained(base)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the embeddings
    save_hf_folder(state, str(base), step=3, out_dir=str(tmp_path / "hf"))
    assert merges_of(tmp_path / "hf") == "chunks" and load_tokenizer(tmp_path / "hf")(page)["input_ids"] == own
    words = build_tiny_model(tmp_path / "words", corpus, vocab_size=1024)
    assert merges_of(words) == "words" and merges_of(tmp_path) == "words"  # no marker: words
    assert load_tokenizer(words)(page)["input_ids"] == AutoTokenizer.from_pretrained(words)(page)["input_ids"]


def test_the_package_loads_model_tokenizers_only_through_load_tokenizer():
    """One loader, or a `chunks` model would be encoded with Qwen2's split in whichever place forgot it."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "shop_r1"
    allowed = {package / "models" / "tokenizer.py", package / "models" / "smollm2.py"}  # smollm2: the GGUF import
    offenders = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py"))
                 if p not in allowed and "AutoTokenizer" in p.read_text()]
    assert offenders == []


def test_chunk_merges_keep_every_answer_token_in_the_sft_loss(tmp_path):
    """The SFT loss covers the tokens that start inside the answer: a first answer token merged with the line break
    before it (`Ċ{"`, learned from the shop's text) would start outside it and never be trained, and the model would
    never learn to open its answer (the first `chunks` run: 0 of 50 answers whole, no parseable output)."""
    from shop_r1.data.prompts import render_action
    from shop_r1.learner.sft_data import tokenize_sft_example
    from shop_r1.models.tiny import default_corpus
    from shop_r1.models.tokenizer import load_tokenizer
    from shop_r1.types import Action, Message, SFTExample

    d = build_tiny_model(tmp_path / "m", default_corpus(num_sessions=300, seed=7919, version=4), vocab_size=4096,
                         merges="chunks")
    tok = load_tokenizer(d)
    answer = render_action(Action("type_and_submit", "search_input", "trail shoes"), "I'll search.")
    ex = SFTExample("s:0", (Message("system", "S"), Message("user", "<html></html>"), Message("assistant", answer)),
                    train_last_turn_only=True)
    seq = tokenize_sft_example(ex, tok, 2400)
    trained = tok.decode([i for i, m in zip(seq.input_ids, seq.loss_mask) if m])
    assert trained.startswith(answer), trained
