"""The config fields of issue 21 section 3-4: defaults (the paper's), overrides, types and ranges."""

import pytest

from shop_r1.config import ConfigError, load_config


def test_defaults_are_the_papers_and_validation_is_off():
    cfg = load_config()
    assert cfg.rl.scale_rewards == "group"
    assert cfg.rl.self_certainty_breaks_ties is True
    assert cfg.reward.click_guard is False
    assert cfg.reward.terminate_value == 0.0
    assert (cfg.rl.val_every, cfg.rl.val_examples) == (0, 64)


def test_overrides_set_them():
    cfg = load_config(None, ["rl.scale_rewards=none", "rl.self_certainty_breaks_ties=false",
                             "reward.click_guard=true", "rl.val_every=5", "rl.val_examples=16"])
    assert (cfg.rl.scale_rewards, cfg.rl.self_certainty_breaks_ties, cfg.reward.click_guard) == ("none", False, True)
    assert (cfg.rl.val_every, cfg.rl.val_examples) == (5, 16)
    assert load_config(None, ["rl.scale_rewards=batch"]).rl.scale_rewards == "batch"


@pytest.mark.parametrize("override, named", [
    ("rl.scale_rewards=token", "rl.scale_rewards"),
    ("rl.self_certainty_breaks_ties=1", "rl.self_certainty_breaks_ties"),
    ("reward.click_guard=yes please", "reward.click_guard"),
    ("rl.val_every=2.5", "rl.val_every"),
])
def test_wrong_values_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize("override, message", [
    ("rl.val_every=-1", "rl.val_every=-1 is out of range: allowed >= 0"),
    ("rl.val_examples=0", "rl.val_examples=0 is out of range: allowed >= 1"),
    ("reward.terminate_value=1.5", "reward.terminate_value=1.5 is out of range"),
])
def test_ranges(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_within_type_is_refused_without_the_hierarchical_reward():
    assert load_config(None, ["rl.scale_rewards=within_type"]).rl.scale_rewards == "within_type"
    with pytest.raises(ConfigError, match=r"rl\.scale_rewards=within_type needs Table 1's hierarchical reward "
                                          r"\(got reward\.fn='pkg\.mod:fn'\)"):
        load_config(None, ["rl.scale_rewards=within_type", "reward.fn=pkg.mod:fn"])
    with pytest.raises(ConfigError, match=r"\(got reward\.action_reward=binary\)"):
        load_config(None, ["rl.scale_rewards=within_type", "reward.action_reward=binary"])
    load_config(None, ["rl.scale_rewards=batch", "reward.action_reward=binary"])  # other scales: as before


def test_self_certainty_from_the_update_parses_and_is_refused_where_it_cannot_apply():
    """reward.self_certainty.source=update_logits (issue 24 section 1): s(r) from the update's own forward."""
    cfg = load_config(None, ["reward.self_certainty.source=update_logits", "rl.async_level=1",
                             "rl.drop_zero_signal_groups=true"])
    assert cfg.reward.self_certainty.source == "update_logits" and load_config().reward.self_certainty.source == (
        "learner_logits")
    # Several mini-batches: a later one's forward follows an optimizer step.
    with pytest.raises(ConfigError, match=r"reward\.self_certainty\.source=update_logits needs "
                                          r"rl\.num_minibatches=1 \(got 2\)"):
        load_config(None, ["reward.self_certainty.source=update_logits", "rl.num_minibatches=2"])
    # A plug-in reward: its total is its own.
    with pytest.raises(ConfigError, match=r"reward\.self_certainty\.source=update_logits needs the Shop-R1 reward "
                                          r"\(reward\.fn empty, got 'pkg\.mod:fn'\)"):
        load_config(None, ["reward.self_certainty.source=update_logits", "reward.fn=pkg.mod:fn"])
    load_config(None, ["rl.num_minibatches=2", "reward.fn=pkg.mod:fn"])  # learner_logits: both as before
    with pytest.raises(ConfigError, match=r"reward\.self_certainty\.source"):
        load_config(None, ["reward.self_certainty.source=update"])
