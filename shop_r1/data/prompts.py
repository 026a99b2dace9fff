"""Prompts: the system prompt (Appendix B's content, in our own words) and how pages and actions become turns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shop_r1.types import Action, Message

SYSTEM_PROMPT = """You are role-playing a real person shopping on a large online store. You will see what this \
shopper has looked at and done so far in the session, and the page in front of them now. Predict the single next \
thing they do, and why.

## What the shopper can do
Each action is a JSON object of one of three kinds:
1. type_and_submit: type text into an input field and submit it (like pressing Enter in the search box).
   {"type": "type_and_submit", "name": "<name of the input>", "text": "<what is typed>"}
2. click: click a button, link or other clickable element.
   {"type": "click", "name": "<name of the element>"}
3. terminate: the shopper is not satisfied with what they see, does not want to buy anything, and closes the \
browser window.
   {"type": "terminate"}

## The page
Each page is given as simplified HTML: scripts and styling are removed, the structure and visible text are kept. \
Elements you can interact with carry a unique `name` attribute; use that exact name in a click or type_and_submit \
action.

## The rationale
Write the shopper's reason as one short first-person sentence, saying what they are thinking as they act.

## Output
Answer with exactly one JSON object and nothing else: no prose, no code fence.
{"rationale": "<one first-person sentence>", "action": {"type": "...", ...}}"""


SHORT_SYSTEM_PROMPT = """Predict the shopper's next action on the last page, and why. Answer with one JSON object: \
{"rationale": "<one first-person sentence>", "action": {"type": "click", "name": "<element name>"} or \
{"type": "type_and_submit", "name": "<input name>", "text": "<text>"} or {"type": "terminate"}}"""
"""For a model trained from scratch: the same output contract in a quarter of the tokens (a constant prompt teaches
such a model nothing; its length is only cost)."""

INSTRUCTIONS = {"full": SYSTEM_PROMPT, "short": SHORT_SYSTEM_PROMPT}
PERSONA_HEADER = "## The shopper"


def system_prompt(persona: str | None = None, instructions: str = "full") -> str:
    """The system turn: the instructions (`full`: Appendix B's content; `short`), then what is known of this shopper
    when the session has a persona."""
    if instructions not in INSTRUCTIONS:
        raise ValueError(f"instructions must be one of {sorted(INSTRUCTIONS)}, got {instructions!r}")
    text = INSTRUCTIONS[instructions]
    return text if not persona else f"{text}\n\n{PERSONA_HEADER}\n{persona}"


def render_observation(html: str, step_index: int, persona: str | None = None) -> str:
    """The user turn for a page the shopper saw (step_index counts from 0), followed by what is known of the shopper
    when `persona` is given (`data.persona_position=page`)."""
    page = f"Page {step_index + 1} (simplified HTML):\n{html}"
    return page if persona is None else f"{page}{PERSONA_AFTER_PAGE}{persona}"


PERSONA_AFTER_PAGE = f"\n\n{PERSONA_HEADER}\n"
"""What separates a page's HTML from the persona that follows it in the same user turn."""


def split_persona(turn: str) -> tuple[str, str | None]:
    """A user turn -> (the page part, the persona that follows the page or None): the inverse of
    `render_observation`'s persona. A page's own HTML never holds the header (it is on a line of its own)."""
    page, sep, persona = turn.partition(PERSONA_AFTER_PAGE)
    return (page, persona) if sep else (turn, None)


def render_dropped_observation(step_index: int) -> str:
    """The user turn for an earlier page whose HTML was left out (latest-step context, or to fit the budget)."""
    return f"Page {step_index + 1}: HTML omitted; the shopper's action on it follows."


def render_action(action: Action, rationale: str | None) -> str:
    """The assistant turn: the output JSON. History turns in RL prompts carry no rationale (None)."""
    payload: dict[str, Any] = {} if rationale is None else {"rationale": rationale}
    payload["action"] = action.to_dict()
    return json.dumps(payload, ensure_ascii=False)


def apply_chat_template(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """Render turns with the model's own chat template (text, not ids)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                         "shop-r1 needs one to render prompts (save it in tokenizer_config.json / chat_template.jinja)")
    return tokenizer.apply_chat_template([m.to_dict() for m in messages], tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
