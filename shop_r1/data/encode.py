"""RL examples -> engine-ready `Prompt`s: chat template once, token ids shared by engines and learner."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shop_r1.types import Prompt, RLExample


def encode_prompts(tokenizer: Any, examples: Sequence[RLExample], max_prompt_tokens: int) -> list[Prompt]:
    """Render each prompt with the tokenizer's chat template (with the generation prompt) and tokenize it.

    A prompt longer than `max_prompt_tokens` (what the engine can take with room for the answer) is an error naming
    the example: `data build` should have truncated it with the same tokenizer and budget. Each prompt carries the
    element names of its current page (for `reward.click_guard`).
    """
    from shop_r1.data.pages import page_element_names
    from shop_r1.data.prompts import apply_chat_template

    prompts = []
    for ex in examples:
        text = apply_chat_template(tokenizer, ex.prompt, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_tokens:
            raise ValueError(f"example {ex.example_id}: prompt has {len(ids)} tokens, over the {max_prompt_tokens} "
                             "the engine can take; rebuild the examples with a smaller data.max_prompt_tokens")
        prompts.append(Prompt(example_id=ex.example_id, token_ids=tuple(ids), target=ex.target,
                              page_names=page_element_names(ex.prompt)))
    return prompts
