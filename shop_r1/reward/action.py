"""The hierarchical action reward of Table 1, with difficulty-aware reward scaling (DARS), and exact match.

    action type  terminate | click | type_and_submit : +0.3 when the predicted type equals the target's
    attribute    click: +0.2 if name != ""            type_and_submit: +0.1 if name != "", +0.1 if text != ""
    value        click: + DARS * ROUGE-L(name)        type_and_submit: + 0.1 * ROUGE-L(name) + DARS * ROUGE-L(text)
                 terminate: + reward.terminate_value * DARS (0 in the paper; not in Table 1)
                 click, type_and_submit: + reward.type_value * DARS for the right type (0 in the paper)

A value term counts only when its ROUGE-L >= the threshold (0.75 in the paper). A wrong type earns nothing here.
"Non-empty" is judged after stripping whitespace, so a blank name earns no attribute reward.
With `reward.click_guard` (off by default, not in the paper) a click's value also needs the predicted name to be the
page's best match for the target's element (shop_r1/reward/click_guard.py); otherwise it is 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shop_r1.config import RewardConfig
from shop_r1.reward.click_guard import click_value_allowed
from shop_r1.reward.rouge import rouge_l
from shop_r1.types import Action

ACTION_TYPE_REWARD = 0.3
CLICK_NAME_ATTRIBUTE = 0.2
TYPE_NAME_ATTRIBUTE = 0.1
TYPE_TEXT_ATTRIBUTE = 0.1
TYPE_NAME_VALUE_WEIGHT = 0.1
BINARY_MATCH_REWARD = 1.0

_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ActionReward:
    action_type: float = 0.0
    attribute: float = 0.0
    value: float = 0.0


def _normalise_text(text: str) -> str:
    return _WHITESPACE.sub(" ", text.strip().lower())


def exact_match(pred: Action | None, target: Action) -> bool:
    """The evaluation rule (section 4.1): every relevant component equals the label.

    terminate: the type; click: the name (stripped); type_and_submit: the name (stripped) and the text after
    lowercasing and collapsing whitespace. A parse failure (None) or a wrong type is wrong.
    """
    if pred is None or pred.type != target.type:
        return False
    if target.type == "click":
        return pred.name.strip() == target.name.strip()
    if target.type == "type_and_submit":
        return (pred.name.strip() == target.name.strip()
                and _normalise_text(pred.text) == _normalise_text(target.text))
    return True


# ROUGE-L values that equal the threshold exactly can come out of the float arithmetic one ulp below it (3 of 3
# predicted tokens in a 5-token target: 2 * 1 * 0.6 / 1.6 = 0.7499999999999999); they must still count.
THRESHOLD_SLACK = 1e-9


def _thresholded(score: float, threshold: float) -> float:
    return score if score >= threshold - THRESHOLD_SLACK else 0.0


def action_reward(pred: Action, target: Action, cfg: RewardConfig,
                  page_names: Sequence[str] | None = None) -> ActionReward:
    """Table 1 (hierarchical), or the Table 4 `binary` ablation: 1.0 for an exact match in the action_type slot.

    `page_names`: the element names of the current page, read only by `reward.click_guard` (which raises without
    them: a guard that cannot see the page must not silently pass or fail every click)."""
    if cfg.action_reward == "binary":
        return ActionReward(action_type=BINARY_MATCH_REWARD if exact_match(pred, target) else 0.0)
    if pred.type != target.type:
        return ActionReward()
    dars = cfg.effective_dars
    if target.type == "click":
        attribute = CLICK_NAME_ATTRIBUTE if pred.name.strip() else 0.0
        value = dars * _thresholded(rouge_l(pred.name, target.name), cfg.rouge_threshold)
        if cfg.click_guard:
            if page_names is None:
                raise ValueError("reward.click_guard needs the page's element names (Prompt.page_names, "
                                 "shop_r1/data/pages.py: page_element_names)")
            if value and not click_value_allowed(pred.name, target.name, page_names):
                value = 0.0
        return ActionReward(ACTION_TYPE_REWARD, attribute, value + cfg.type_value * dars)
    if target.type == "type_and_submit":
        attribute = (TYPE_NAME_ATTRIBUTE if pred.name.strip() else 0.0) + \
            (TYPE_TEXT_ATTRIBUTE if pred.text.strip() else 0.0)
        value = TYPE_NAME_VALUE_WEIGHT * _thresholded(rouge_l(pred.name, target.name), cfg.rouge_threshold) + \
            dars * _thresholded(rouge_l(pred.text, target.text), cfg.rouge_threshold)
        return ActionReward(ACTION_TYPE_REWARD, attribute, value + cfg.type_value * dars)
    return ActionReward(action_type=ACTION_TYPE_REWARD, value=cfg.terminate_value * dars)
