"""`reward.fn`: a reward of one's own, loaded by import path, with config errors that name the key."""

import pytest

from shop_r1.config import ConfigError, load_config
from shop_r1.reward.scorer import score_response
from shop_r1.reward.worker import RewardWorker, load_score_fn
from shop_r1.types import Action, RewardBreakdown, ScoreRequest


def length_reward(response, target, cfg, logprobs):
    """A toy reward: the response's length."""
    return RewardBreakdown(value=float(len(response)), total=float(len(response)), format_valid=True)


def test_default_is_the_shop_r1_reward_and_a_path_loads_a_function():
    assert load_score_fn("") is score_response
    cfg = load_config(None, [f"reward.fn={__name__}:length_reward"])
    fn = load_score_fn(cfg.reward.fn)
    assert fn is length_reward
    # The reward actors' worker scores with it.
    scored = RewardWorker(cfg.reward, fn).score([ScoreRequest("abcd", Action("terminate"))])
    assert scored[0].total == 4.0 and scored[0].error is None


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected 'package.module:function'"),
    ("shop_r1.not_a_module:f", "cannot load it (ModuleNotFoundError"),
    ("shop_r1.reward.scorer:missing", "cannot load it (AttributeError"),
    ("shop_r1.reward.scorer:__name__", "str is not callable"),
])
def test_bad_paths_name_the_key(spec, message):
    with pytest.raises(ConfigError, match=r"reward\.fn=") as err:
        load_score_fn(spec)
    assert message in str(err.value)
