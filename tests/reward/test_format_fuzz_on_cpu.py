"""The format check and the scorer never raise, whatever the model writes; hostile inputs are format-invalid."""

import json
import random

import pytest

from shop_r1.config import RewardConfig, SelfCertaintyConfig
from shop_r1.reward.format import parse_response
from shop_r1.reward.scorer import score_response
from shop_r1.types import Action, TokenLogprobs

TARGET = Action("click", name="search_results.red shoe.view_product")


@pytest.mark.parametrize("text", [
    "",
    "I would click the first result.",
    '{"rationale": "r", "action": {"type": "click", "name": "x"}',            # truncated
    '{"rationale": "r", "action": {"type": "click", "name": "x"}} trailing',  # two things
    '{"rationale": "r", "action": {"type": "click", "name": "x"}}{"a": 1}',
    '```json\n{"rationale": "r", "action": {"type": "terminate"}}\n```',      # fenced: not the whole text
    '[{"rationale": "r", "action": {"type": "terminate"}}]',
    '{"rationale": 3, "action": {"type": "terminate"}}',
    '{"rationale": "r", "action": "terminate"}',
    '{"rationale": "r", "action": {"type": "scroll"}}',
    '{"rationale": "r", "action": {"type": "click", "name": 7}}',
    '{"rationale": "r", "action": {"type": "type_and_submit", "name": "q", "text": null}}',
    '{"rationale": "r", "rationale": "s", "action": {"type": "terminate"}}',  # duplicate key
    '{"rationale": "r", "action": {"type": "click", "name": "a", "name": "b"}}',
    '{"rationale": "r", "action": {"type": "terminate", "x": NaN}}',
    '{"rationale": "\\ud800", "action": {"type": "terminate"}}',             # lone surrogate
    "{" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,                                    # 100k-deep nesting
    '{"rationale": "r", "action": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "x" * 3_000_000,                                                              # megabytes of junk
    "{" + "\x00\xff\ufffd" * 1000 + "}",
])
def test_hostile_inputs_are_invalid_and_score_zero(text):
    assert parse_response(text) is None
    r = score_response(text, TARGET, RewardConfig())
    assert r.total == 0.0 and not r.format_valid


def test_non_string_input_is_invalid():
    for obj in (None, 3, b'{"rationale": "r"}', ["x"]):
        assert parse_response(obj) is None


def test_valid_with_surrounding_whitespace_and_extra_keys():
    text = '\n  {"action": {"type": "terminate", "extra": 1}, "rationale": "Nothing fits.", "confidence": 0.3}  \n'
    parsed = parse_response(text)
    assert parsed is not None and parsed.action == Action("terminate")
    start, end = parsed.rationale_span
    assert text[start:end] == "Nothing fits."


def test_rationale_span_points_at_the_raw_literal_with_escapes():
    text = '{"rationale": "I said \\"yes\\" to \\u00e9", "action": {"type": "terminate"}}'
    parsed = parse_response(text)
    assert parsed.rationale == 'I said "yes" to é'
    assert text[parsed.rationale_span[0]:parsed.rationale_span[1]] == 'I said \\"yes\\" to \\u00e9'


def test_random_fuzz_never_raises():
    rng = random.Random(7)
    pieces = ['{', '}', '[', ']', '"', ':', ',', 'rationale', 'action', 'type', 'click', 'name', 'text',
              'terminate', 'type_and_submit', '\\', 'null', 'true', '1e999', '-', ' ', '\n', '\\u', 'NaN', 'é']
    valid = json.dumps({"rationale": "r", "action": {"type": "click", "name": "search_results.red shoe.view_product"}})
    for i in range(3000):
        if i % 3 == 0:  # mutate a valid response
            chars = list(valid)
            for _ in range(rng.randint(1, 4)):
                chars[rng.randrange(len(chars))] = rng.choice(pieces)
            text = "".join(chars)
        elif i % 3 == 1:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        else:
            text = bytes(rng.randrange(256) for _ in range(rng.randint(0, 80))).decode("utf-8", errors="replace")
        r = score_response(text, TARGET, RewardConfig(), TokenLogprobs((0,), ((-0.5,),), 100))
        assert r.total >= 0.0


def test_logprobs_that_do_not_match_the_tokens_are_an_error_not_a_score():
    text = json.dumps({"rationale": "r", "action": {"type": "terminate"}})
    with pytest.raises(ValueError, match="logprob rows"):
        cfg = RewardConfig(self_certainty=SelfCertaintyConfig(source="topk_logprobs"))
        score_response(text, Action("terminate"), cfg, TokenLogprobs((0, 5), ((-0.1,),), 10))
