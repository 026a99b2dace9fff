"""A tiny random Qwen2 with a byte-level BPE tokenizer trained on synthetic-shop text, saved as a normal HF folder.

Sized for tests on a 2-core CPU, yet shaped like the real thing where it matters: head_dim 32 (vLLM's CPU attention
needs >= 32), grouped-query attention, tied input/output embeddings (as small Qwen2.5 models have; it exercises the
tied-lm_head weight-reload trap), a ChatML chat template, long positions for page-heavy prompts.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from shop_r1.atomic import publish_atomically

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def default_corpus(num_sessions: int = 150, seed: int = 0, version: int = 1) -> Iterator[str]:
    """Text like what the model will read and write: pages, action JSON, rationales, the system prompt and the
    shoppers' profiles (synthetic shop `version`)."""
    from shop_r1.data.prompts import SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT, render_action, system_prompt
    from shop_r1.data.synth import synthesize_sessions

    yield SYSTEM_PROMPT
    if version >= 2:
        yield SHORT_SYSTEM_PROMPT
    for session in synthesize_sessions(num_sessions, seed, version):
        if session.persona:
            yield system_prompt(session.persona)
        for step in session.steps:
            yield step.observation
            yield render_action(step.action, step.rationale)


def train_tokenizer(corpus: Iterable[str], vocab_size: int, merges: str = "words"):
    """Byte-level BPE (any text round-trips) with ChatML specials, as a transformers fast tokenizer. `merges`:
    `words` splits the text as GPT-2 does (words, runs of punctuation) before BPE merges inside the pieces; `chunks`
    splits at whitespace only (model.scratch_tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if merges == "words":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif merges == "chunks":
        # A line break is a token of its own: the prompt ends in `assistant\n`, so an answer's first token must never
        # have been merged with it in training. A space stays on the chunk after it, as byte-level BPE keeps it.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(pattern=Regex(r"[\r\n\t\f\v]"), behavior="isolated"),
            pre_tokenizers.Split(pattern=Regex(" "), behavior="merged_with_next"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise ValueError(f"merges must be words or chunks, got {merges!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, corpus: Iterable[str] | None = None, seed: int = 0,
                     vocab_size: int = 2048, hidden_size: int = 64, num_layers: int = 2, merges: str = "words"
                     ) -> Path:
    """Train the tokenizer, initialise the model from `seed`, save both into `out_dir` (replaced atomically).

    Defaults: the tests' tiny model. Larger sizes (e.g. 128 x 4 layers, ~1M parameters) make the from-scratch shop
    model of the experiments (`model.from_scratch`); heads are 32 wide, key/value heads half as many."""
    if hidden_size % 32:
        raise ValueError(f"hidden_size={hidden_size}: must be a multiple of 32 (head_dim 32)")
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tokenizer = train_tokenizer(corpus if corpus is not None else default_corpus(seed=seed), vocab_size, merges)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size if hidden_size == 64
        else 3 * hidden_size, num_hidden_layers=num_layers, num_attention_heads=hidden_size // 32,
        num_key_value_heads=max(1, hidden_size // 64), max_position_embeddings=8192, tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "shop_r1_model.json").write_text(json.dumps({"kind": "tiny", "seed": seed, "vocab_size": len(tokenizer),
                                                        "hidden_size": hidden_size, "num_layers": num_layers,
                                                        "merges": merges, "num_parameters": model.num_parameters()}))
    out.parent.mkdir(parents=True, exist_ok=True)
    publish_atomically(tmp, out)  # fsynced, then renamed over any older folder
    return out
