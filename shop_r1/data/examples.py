"""Sessions -> training examples (section 4.1).

- SFT: the whole session as one conversation: system, then per step user(page) -> assistant({rationale, action}).
  A session with any step lacking a rationale cannot supervise the rationale: it is left out and counted
  (fill rationales first with `shop-r1 data rationales`).
- RL: one example per step after the first. Prompt: system, then per earlier step user(page) -> assistant(the
  recorded {rationale, action}, or the action alone with `history_rationales=False`), then user(current page);
  target: that step's action (rewards never read rationales from the data).
  `latest_step` context (Table 5) omits every earlier page's HTML, keeping the action history.
  Budget: while the prompt exceeds `max_prompt_tokens`, the oldest remaining page HTML is dropped (binary search on
  how many, so a long session costs O(log n) token counts). If even the current page alone does not fit, the example
  is left out and counted.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1.data.jsonl import read_jsonl_objects
from shop_r1.data.prompts import (
    apply_chat_template,
    render_action,
    render_dropped_observation,
    render_observation,
    system_prompt,
)
from shop_r1.data.sessions import write_jsonl_atomic
from shop_r1.errors import DataError
from shop_r1.types import ACTION_TYPES, Action, Message, RLExample, Session, SFTExample

TokenCounter = Callable[[Sequence[Message]], int]


@dataclass(frozen=True)
class SFTBuild:
    examples: tuple[SFTExample, ...]
    skipped_session_ids: tuple[str, ...]
    """Sessions left out because a step has no rationale."""


@dataclass(frozen=True)
class RLBuild:
    examples: tuple[RLExample, ...]
    over_budget_ids: tuple[str, ...]
    """Examples left out because the current page alone exceeds max_prompt_tokens."""


PERSONA_POSITIONS = ("system", "page")


def _persona_parts(session: Session, persona: bool, position: str) -> tuple[str | None, str | None]:
    """(persona for the system turn, persona for after the page): at most one is set."""
    if position not in PERSONA_POSITIONS:
        raise ValueError(f"persona_position must be one of {PERSONA_POSITIONS}, got {position!r}")
    text = session.persona if persona else None
    return (text, None) if position == "system" else (None, text)


def drop_rationales(sessions: Sequence[Session], keep_fraction: float, seed: int) -> tuple[Session, ...]:
    """`sessions` with the rationales of all but a seeded round(keep_fraction x n) of them removed (by session: a
    session keeps all its rationales or none), in their order. `data.rationale_fraction`."""
    if keep_fraction >= 1:
        return tuple(sessions)
    keep = set(random.Random(seed).sample(range(len(sessions)), round(keep_fraction * len(sessions))))
    return tuple(s if i in keep else dataclasses.replace(
        s, steps=tuple(dataclasses.replace(step, rationale=None) for step in s.steps)) for i, s in enumerate(sessions))


def build_sft_examples(sessions: Sequence[Session], persona: bool = True, instructions: str = "full",
                       persona_position: str = "system", missing_rationale: str = "skip") -> SFTBuild:
    examples, skipped = [], []
    for s in sessions:
        if missing_rationale == "skip" and any(step.rationale is None for step in s.steps):
            skipped.append(s.session_id)
            continue
        in_system, after_page = _persona_parts(s, persona, persona_position)
        messages = [Message("system", system_prompt(in_system, instructions))]
        for i, step in enumerate(s.steps):
            messages.append(Message("user", render_observation(step.observation, i, after_page)))
            messages.append(Message("assistant", render_action(step.action, step.rationale)))
        examples.append(SFTExample(s.session_id, tuple(messages)))
    return SFTBuild(tuple(examples), tuple(skipped))


def build_step_sft_examples(examples: Sequence[RLExample], missing_rationale: str = "skip") -> SFTBuild:
    """One SFT conversation per prediction step: the RL example's prompt (same context mode, same history) and the
    recorded answer, loss on that answer only. SFT then sees exactly the prompts RL and evaluation see. A step with no
    rationale is skipped (`missing_rationale="skip"`) or trained on its action alone (`"action_only"`)."""
    out, skipped = [], []
    for e in examples:
        if e.target_rationale is None and missing_rationale == "skip":
            skipped.append(e.example_id)
            continue
        answer = Message("assistant", render_action(e.target, e.target_rationale))
        out.append(SFTExample(e.example_id, (*e.prompt, answer), train_last_turn_only=True))
    return SFTBuild(tuple(out), tuple(skipped))


def _rl_prompt(session: Session, t: int, num_dropped: int, history_rationales: bool = True,
               persona: bool = True, instructions: str = "full", persona_position: str = "system"
               ) -> tuple[Message, ...]:
    """Prompt for predicting step t with the HTML of the `num_dropped` oldest pages omitted (the session's persona,
    when it has one and `persona`, in the system turn or after the current page: `persona_position`)."""
    in_system, after_page = _persona_parts(session, persona, persona_position)
    messages = [Message("system", system_prompt(in_system, instructions))]
    for i in range(t):
        step = session.steps[i]
        page = render_dropped_observation(i) if i < num_dropped else render_observation(step.observation, i)
        messages.append(Message("user", page))
        messages.append(Message("assistant", render_action(step.action,
                                                            step.rationale if history_rationales else None)))
    messages.append(Message("user", render_observation(session.steps[t].observation, t, after_page)))
    return tuple(messages)


def build_rl_examples(sessions: Sequence[Session], context: str, max_prompt_tokens: int,
                      count_tokens: TokenCounter, history_rationales: bool = True, persona: bool = True,
                      instructions: str = "full", persona_position: str = "system") -> RLBuild:
    if context not in ("whole_session", "latest_step"):
        raise ValueError(f"context must be whole_session or latest_step, got {context!r}")
    examples, over = [], []
    for s in sessions:
        for t in range(1, len(s.steps)):
            example_id = f"{s.session_id}:{t}"
            lo = t if context == "latest_step" else 0
            prompt = lambda k, s=s, t=t: _rl_prompt(  # noqa: E731 - k earlier pages omitted
                s, t, k, history_rationales, persona, instructions, persona_position)
            if count_tokens(prompt(t)) > max_prompt_tokens:
                over.append(example_id)
                continue
            hi = t  # dropping all t earlier pages fits; find the fewest drops >= lo that fit
            if count_tokens(prompt(lo)) <= max_prompt_tokens:
                hi = lo
            else:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if count_tokens(prompt(mid)) <= max_prompt_tokens:
                        hi = mid
                    else:
                        lo = mid
            step = s.steps[t]
            examples.append(RLExample(example_id, s.session_id, t, prompt(hi), step.action,
                                      step.rationale, num_dropped_pages=hi))
    return RLBuild(tuple(examples), tuple(over))


def chat_token_counter(tokenizer: Any) -> TokenCounter:
    """Tokens of the chat-templated prompt including the generation prompt: what the engine will see."""

    def count(messages: Sequence[Message]) -> int:
        text = apply_chat_template(tokenizer, messages, add_generation_prompt=True)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def type_counts(examples: Sequence[RLExample]) -> dict[str, int]:
    counts = Counter(e.target.type for e in examples)
    return {t: counts.get(t, 0) for t in ACTION_TYPES}


def balance_rl_examples(examples: Sequence[RLExample], ratio: float = 1.1, seed: int = 0) -> list[RLExample]:
    """Resample so click and type_and_submit each number round(ratio * #terminate) (section 4.1: ~10% more).

    All terminate examples are kept; a type with more examples than its target is subsampled without replacement,
    one with fewer keeps all and is topped up by sampling with replacement. With no terminate example there is
    nothing to balance against and the input is returned unchanged. The result is shuffled (seeded).
    """
    by_type: dict[str, list[RLExample]] = {t: [] for t in ACTION_TYPES}
    for e in examples:
        by_type[e.target.type].append(e)
    n_term = len(by_type["terminate"])
    if n_term == 0:
        return list(examples)
    rng = random.Random(seed)
    target = round(ratio * n_term)
    out = list(by_type["terminate"])
    for kind in ("click", "type_and_submit"):
        pool = by_type[kind]
        if not pool:
            continue
        if len(pool) >= target:
            out.extend(rng.sample(pool, target))
        else:
            out.extend(pool)
            out.extend(rng.choices(pool, k=target - len(pool)))
    rng.shuffle(out)
    return out


def write_examples_jsonl(examples: Sequence[RLExample] | Sequence[SFTExample], path: str | Path) -> None:
    write_jsonl_atomic((e.to_dict() for e in examples), path)


def _messages(obj: Any, where: str) -> tuple[Message, ...]:
    if not isinstance(obj, list) or not obj:
        raise DataError(f"{where}: expected a non-empty list of messages")
    out = []
    for i, m in enumerate(obj):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise DataError(f"{where}[{i}]: expected {{role: system|user|assistant, content: str}}")
        out.append(Message(m["role"], m["content"]))
    return tuple(out)


def _read_jsonl(path: str | Path, parse: Callable[[Any, str], Any]) -> list[Any]:
    return [_parsed(parse, obj, where) for where, obj in read_jsonl_objects(path)]


def _parsed(parse: Callable[[Any, str], Any], obj: Any, where: str) -> Any:
    """A line's record; a bad field (an action's type, a count) is a DataError naming FILE:LINE and the field."""
    try:
        return parse(obj, where)
    except DataError:
        raise
    except (ValueError, TypeError) as exc:
        raise DataError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None


def _rl_from_dict(obj: dict[str, Any], where: str) -> RLExample:
    for key in ("example_id", "session_id"):
        if not isinstance(obj.get(key), str):
            raise DataError(f"{where}: {key}: expected a string")
    if not isinstance(obj.get("step_index"), int):
        raise DataError(f"{where}: step_index: expected an int")
    return RLExample(obj["example_id"], obj["session_id"], obj["step_index"], _messages(obj.get("prompt"),
                     f"{where}: prompt"), Action.from_dict(obj.get("target"), f"{where}: target"),
                     obj.get("target_rationale"), int(obj.get("num_dropped_pages", 0)))


def _sft_from_dict(obj: dict[str, Any], where: str) -> SFTExample:
    if not isinstance(obj.get("session_id"), str):
        raise DataError(f"{where}: session_id: expected a string")
    last_only = obj.get("train_last_turn_only", False)
    if not isinstance(last_only, bool):
        raise DataError(f"{where}: train_last_turn_only: expected a bool")
    return SFTExample(obj["session_id"], _messages(obj.get("messages"), f"{where}: messages"), last_only)


def load_rl_examples(path: str | Path) -> list[RLExample]:
    return _read_jsonl(path, _rl_from_dict)


def load_sft_examples(path: str | Path) -> list[SFTExample]:
    return _read_jsonl(path, _sft_from_dict)
