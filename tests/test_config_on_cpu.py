"""Config: the paper's defaults, YAML + dotted overrides, and errors that name the key."""

import pytest

from shop_r1.config import Config, ConfigError, load_config, save_config


def test_defaults_are_the_papers():
    cfg = load_config()
    assert cfg.reward.dars_factor == 1000.0
    assert cfg.reward.alpha == 0.005
    assert cfg.rl.kl_beta == 0.001
    assert cfg.reward.rouge_threshold == 0.75
    assert cfg.rollout.temperature == 0.6
    assert cfg.rl.global_batch_size == 64 and cfg.sft.global_batch_size == 64
    assert (cfg.sft.epochs, cfg.sft.lr) == (4, 2e-5)
    assert (cfg.rl.steps, cfg.rl.lr) == (500, 1e-7)
    assert cfg.data.max_prompt_tokens == 32768 and cfg.model.max_context_tokens == 32768


def test_yaml_then_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  dars_factor: 10\n  self_certainty:\n    direction: u_to_p\nrl:\n  steps: 3\n")
    cfg = load_config(path, ["reward.dars_factor=1", "data.context=latest_step", "reward.format_reward=false",
                             "rl.lr=1e-6"])
    assert cfg.reward.dars_factor == 1.0  # the override wins over the file
    assert isinstance(cfg.reward.dars_factor, float)  # an int literal is accepted for a float field
    assert cfg.reward.self_certainty.direction == "u_to_p"
    assert cfg.rl.steps == 3 and cfg.rl.lr == 1e-6
    assert cfg.data.context == "latest_step" and cfg.reward.format_reward is False


@pytest.mark.parametrize("override, named", [
    ("reward.dars=1", "reward.dars"),                     # unknown key
    ("rewards.dars_factor=1", "rewards"),                 # unknown section
    ("rl.steps=ten", "rl.steps"),                         # wrong type
    ("rl.steps=1.5", "rl.steps"),                         # a float for an int
    ("reward.format_reward=1", "reward.format_reward"),   # an int for a bool
    ("data.context=everything", "data.context"),          # not one of the Literal's values
    ("reward.self_certainty=3", "reward.self_certainty"),  # a value for a section
    ("reward.dars_factor", "reward.dars_factor"),         # no '='
])
def test_bad_overrides_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_unknown_key_in_yaml_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  temprature: 0.7\n")
    with pytest.raises(ConfigError, match=r"rollout\.temprature"):
        load_config(path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["seed=7", "reward.action_reward=binary"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert isinstance(cfg, Config)


def test_derived_dars_follows_the_scale_switch():
    assert load_config(None, ["reward.reward_scale=false"]).reward.effective_dars == 1.0
    assert load_config().reward.effective_dars == 1000.0


def test_every_shipped_config_loads():
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[1].joinpath("configs").rglob("*.yaml"))
    assert len(files) >= 9
    for f in files:
        load_config(f)  # an unknown key or a wrong type would raise, naming it
