"""Periodic validation during GRPO (rl.val_every): the val/* figures by hand, and what the driver checks."""

import json

import pytest

from shop_r1.config import Config, ConfigError
from shop_r1.config import validate as validate_config
from shop_r1.rollout.metrics import validation_metrics
from shop_r1.rollout.records import PolicyVersionMismatch
from shop_r1.train import validate
from shop_r1.types import Action, Completion, Generation, Prompt, SamplingSpec


def answer(action: dict) -> str:
    return json.dumps({"rationale": "because", "action": action})


TARGETS = [Action("click", name="a.b"), Action("click", name="c.d"), Action("terminate"),
           Action("type_and_submit", name="search", text="x")]
RESPONSES = [answer({"type": "click", "name": "a.b"}),  # exact
             answer({"type": "terminate"}),             # wrong type
             answer({"type": "terminate"}),             # exact
             "not json"]                                # invalid


def test_validation_metrics_by_hand():
    # exact 2/4; types: predicted (click, terminate, terminate, invalid) vs target (click, click, terminate, tas):
    # p_o = 2/4; p_e = click 1*2 + terminate 2*1 + tas 0*1 = 4 over 16 = 0.25; kappa = (0.5 - 0.25) / 0.75 = 1/3.
    # Exact on non-terminate targets: 1 of 3. Predicted mix: click 1/4, terminate 2/4, tas 0, invalid 1/4.
    m = validation_metrics(RESPONSES, TARGETS)
    assert m["val/exact"] == 0.5
    assert m["val/kappa"] == pytest.approx(1 / 3)
    assert m["val/type_accuracy"] == 0.5
    assert m["val/exact_non_terminate"] == pytest.approx(1 / 3)
    assert (m["val/pred_click"], m["val/pred_terminate"], m["val/pred_type_and_submit"], m["val/pred_invalid"]) == \
        (0.25, 0.5, 0.0, 0.25)
    assert m["val/n"] == 4


def test_a_constant_answer_has_kappa_zero():
    m = validation_metrics([answer({"type": "terminate"})] * 4, TARGETS)
    assert m["val/kappa"] == 0.0 and m["val/pred_terminate"] == 1.0 and m["val/exact"] == 0.25


class FakeEngines:
    """Answers each prompt with the response stored under its first token id, stamped `version`."""

    def __init__(self, version: int) -> None:
        self.version, self.specs = version, []

    def generate(self, prompt_token_ids, spec: SamplingSpec):
        self.specs.append(spec)
        return [Generation(i, tuple(ids), (Completion((1,), RESPONSES[ids[0]], (0.0,), (), (0,), "stop",
                                                      self.version),), 100) for i, ids in enumerate(prompt_token_ids)]


PROMPTS = [Prompt(f"ex{i}", (i, 7), t) for i, t in enumerate(TARGETS)]


def test_validate_answers_greedily_with_the_current_weights():
    engines, cfg = FakeEngines(version=5), Config()
    m = validate(engines, PROMPTS, cfg, version=5)
    assert m["val/exact"] == 0.5 and m["val/kappa"] == pytest.approx(1 / 3) and m["val/seconds"] >= 0
    [spec] = engines.specs
    assert (spec.n, spec.temperature, spec.max_new_tokens) == (1, 0.0, cfg.rollout.max_new_tokens)


def test_validate_rejects_answers_of_another_policy():
    with pytest.raises(PolicyVersionMismatch, match="validation after step 6"):
        validate(FakeEngines(version=5), PROMPTS, Config(), version=6)


def test_val_every_needs_validation_prompts():
    cfg = Config()
    validate_config(cfg, "train", prompts=PROMPTS, val_prompts=None)  # off by default: nothing needed
    cfg.rl.val_every = 10
    with pytest.raises(ConfigError, match=r"rl\.val_every=10 needs validation prompts"):
        validate_config(cfg, "train", prompts=PROMPTS, val_prompts=None)
    validate_config(cfg, "train", prompts=PROMPTS, val_prompts=PROMPTS)


def test_click_guard_needs_page_names_on_the_prompts():
    cfg = Config()
    cfg.reward.click_guard = True
    with pytest.raises(ConfigError, match=r"reward\.click_guard=true needs each prompt's page_names"):
        validate_config(cfg, "train", prompts=PROMPTS, val_prompts=None)
    validate_config(cfg, "train", prompts=[Prompt("ex", (1,), Action("terminate"), page_names=("a.b",))])
