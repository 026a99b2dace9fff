"""experiments/type_flips.py on hand-made predictions: each count below is worked out by hand."""

import json

import pytest

from experiments.type_flips import render, type_flips
from shop_r1.metrics import Predictions
from shop_r1.types import Action

CLICK = Action("click", name="product.tent_a")
QUERY = Action("type_and_submit", name="search_input", text="waterproof tent")
STOP = Action("terminate")


def _say(kind, **action):
    return json.dumps({"rationale": "I think so.", "action": {"type": kind, **action}})


def _predictions(rows):
    ids, responses, targets = zip(*rows)
    return Predictions(tuple(ids), tuple(responses), tuple(targets))


SFT = _predictions([
    ("s1:0", _say("click", name="product.tent_b"), CLICK),     # right type, wrong name
    ("s1:1", _say("click", name="product.tent_a"), CLICK),     # exact
    ("s2:0", _say("type_and_submit", name="search_input", text="tent"), QUERY),  # right type, not exact
    ("s2:1", _say("terminate"), QUERY),                        # wrong type
    ("s3:0", _say("terminate"), STOP),                         # exact
    ("s3:1", "not json", CLICK),                               # unparsed
])
RL = _predictions([  # another order: aligned by example id
    ("s3:1", _say("type_and_submit", name="search_input", text="x"), CLICK),  # unparsed -> query: neither
    ("s3:0", _say("type_and_submit", name="search_input", text="tent"), STOP),  # lost
    ("s2:1", _say("type_and_submit", name="search_input", text="waterproof tent"), QUERY),  # gained
    ("s2:0", _say("type_and_submit", name="search_input", text="waterproof tent"), QUERY),  # same type, now exact
    ("s1:1", _say("click", name="product.tent_b"), CLICK),     # same type, now wrong
    ("s1:0", _say("click", name="product.tent_a"), CLICK),     # same type, now exact
])


def test_counts_by_hand():
    r = type_flips(SFT, RL)
    assert r["n"] == 6
    # flips: s3:1 (unparsed -> a query on a click target: neither), s3:0 (exact terminate lost), s2:1 (exact query
    # gained): one exact each side
    assert r["flips"] == {"gained": 1, "lost": 1, "neither": 1, "sft_exact": 1, "rl_exact": 1}
    assert r["same_right_type"] == {"click": {"n": 2, "sft_exact": 1, "rl_exact": 1},
                                    "type_and_submit": {"n": 1, "sft_exact": 0, "rl_exact": 1}}
    text = render("rl", r)
    assert "gained 1, lost 1, neither 1 (of 6), exact there 1 -> 1" in text and "click exact 1 -> 1 of 2" in text


def test_different_targets_or_missing_examples_are_errors():
    other = _predictions([(e, resp, STOP) for e, resp, _ in zip(RL.example_ids, RL.responses, RL.targets)])
    with pytest.raises(ValueError, match="different targets"):
        type_flips(SFT, other)
    with pytest.raises(ValueError, match="hold different examples"):
        type_flips(SFT.select(SFT.example_ids[:5]), RL)
    with pytest.raises(ValueError, match="no prediction"):
        type_flips(SFT, _predictions(list(zip(RL.example_ids[:5], RL.responses[:5], RL.targets[:5]))))
