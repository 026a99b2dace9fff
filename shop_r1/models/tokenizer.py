"""Every model folder's tokenizer through one function, so the data build, SFT, the learner's HF export, the
engines' prompts and evaluation all encode text alike.

transformers 5's `AutoTokenizer` loads a folder whose config says `model_type: qwen2` as `Qwen2Tokenizer`, which
rebuilds the pre-tokenizer with Qwen2's own split whatever `tokenizer.json` holds. That is right for Qwen models and
for the from-scratch shop model's default tokenizer (`model.scratch_tokenizer=words`, the committed tables'), but a
shop model whose BPE merges across punctuation (`chunks`) needs the split it was trained with: its folders (the
tiny build and every folder trained from it, marked in `shop_r1_model.json`) load as the generic fast tokenizer of
their own `tokenizer.json`. The engines only decode (they are given token ids), and decoding does not depend on the
split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MARKER = "shop_r1_model.json"


def merges_of(model_dir: str | Path) -> str:
    """The shop model's BPE merges (`words` or `chunks`) as its folder records them; `words` for any other folder."""
    path = Path(model_dir) / MARKER
    if not path.is_file():
        return "words"
    try:
        return str(json.loads(path.read_text()).get("merges", "words"))
    except (OSError, ValueError):
        return "words"


def load_tokenizer(model_dir: str | Path, **kwargs: Any) -> Any:
    """The folder's tokenizer: its own `tokenizer.json` pipeline for a `chunks` shop model, `AutoTokenizer`
    otherwise."""
    if merges_of(model_dir) == "chunks":
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir), **kwargs)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), **kwargs)
