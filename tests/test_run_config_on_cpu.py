"""A resume is the same run: config comparison, the allow-list, config_history.jsonl, write-once config.yaml."""

import json

import pytest
import yaml

from shop_r1.config import Config, ConfigError, config_to_dict, load_config, save_config
from shop_r1.run_config import (
    ABSENT,
    CONFIG_FILE,
    DEVICE_KEYS,
    HARMLESS,
    HISTORY_FILE,
    Change,
    ConfigDiff,
    changes_experiment,
    check_resume,
    compare_configs,
    current_run_config,
    flatten,
    save_run_config,
    start_run_config,
)


@pytest.fixture
def run(tmp_path):
    """A run folder started with the defaults (group_size 8, rl.steps 500, rl.lr 1e-7)."""
    run = tmp_path / "run"
    start_run_config(run, _cfg(run))
    return run


def _cfg(run, *overrides):
    return load_config(None, [f"run_dir={run}", *overrides])


def _history(run):
    return [json.loads(line) for line in (run / HISTORY_FILE).read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- comparison


def test_flatten():
    assert flatten({"rl": {"lr": 1e-7, "steps": 3}, "seed": 0, "reward": {"self_certainty": {"source": "x"}}}) == \
        {"rl.lr": 1e-7, "rl.steps": 3, "seed": 0, "reward.self_certainty.source": "x"}


def test_identical_configs_differ_in_nothing():
    diff = compare_configs(config_to_dict(Config()), config_to_dict(Config()))
    assert diff == ConfigDiff(refused=[], allowed=[]) and not diff


def test_compare_sorts_each_change_into_refused_or_allowed():
    new = Config()
    new.rollout.group_size, new.rl.steps, new.logging.wandb, new.reward.alpha = 4, 1000, False, 0.0
    diff = compare_configs(config_to_dict(Config()), config_to_dict(new))
    assert diff.refused == [("reward.alpha", 0.005, 0.0), ("rollout.group_size", 8, 4)]  # sorted by key
    assert diff.allowed == [("logging.wandb", True, False), ("rl.steps", 500, 1000)]
    assert isinstance(diff.refused[0], Change) and diff.refused[0].key == "reward.alpha"


def test_a_key_only_one_side_has_is_absent_on_the_other():
    diff = compare_configs({"rl": {"lr": 1e-7, "old_field": 1}}, {"rl": {"lr": 1e-7}, "logging": {"x": 1}})
    assert diff.refused == [("rl.old_field", 1, ABSENT)]
    assert diff.allowed == [("logging.x", ABSENT, 1)]


@pytest.mark.parametrize("key", ["model.path", "data.max_prompt_tokens", "reward.dars_factor", "seed",
                                 "rollout.group_size", "rollout.temperature", "rollout.max_new_tokens",
                                 "rollout.top_k_logprobs", "rollout.dtype", "rl.lr", "rl.global_batch_size",
                                 "rl.kl_beta", "rl.clip_eps", "rl.loss", "rl.scale_rewards",
                                 "rl.async_level", "sft.lr", "learner.num_ranks", "learner.zero_stage",
                                 "learner.grad_clip", "reward.self_certainty.source", "some.new_field"])
def test_keys_that_change_the_experiment(key):
    assert changes_experiment(key, 1, 2)


@pytest.mark.parametrize("key", ["rl.steps", "rl.checkpoint_every", "rl.keep_checkpoints", "rl.val_every",
                                 "logging.wandb", "ray.num_cpus", "run_dir", "storage_uri", "eval.max_examples",
                                 "reward_pool.num_workers", "reward_pool.timeout_s", "rollout.num_engines",
                                 "rollout.num_cpus_per_engine", "rollout.generate_timeout_s",
                                 "learner.num_cpus_per_rank", "learner.max_tokens_per_micro_batch",
                                 "weight_sync.transport", "rollout.weight_load"])
def test_keys_that_do_not(key):
    assert not changes_experiment(key, 1, 2)


def test_gpus_per_worker_may_change_but_not_between_cpu_and_gpu():
    for key in DEVICE_KEYS:
        assert not changes_experiment(key, 1.0, 2.0) and not changes_experiment(key, 0.5, 1.0)
        assert changes_experiment(key, 0.0, 1.0) and changes_experiment(key, 1.0, 0.0)  # device, and auto dtype


def test_allow_list_names_real_keys():
    keys = set(flatten(config_to_dict(Config())))
    for entry in (*HARMLESS, *DEVICE_KEYS):
        assert entry in keys or any(k.startswith(entry) for k in keys if entry.endswith(".")), entry


# ---------------------------------------------------------------------------------------------- check_resume


def test_changed_group_size_is_refused_naming_the_key_and_both_values(run):
    before = (run / CONFIG_FILE).read_bytes()
    with pytest.raises(ConfigError) as err:
        check_resume(run, _cfg(run, "rollout.group_size=4"), allow_change=False)
    msg = str(err.value)
    assert "in 1 key(s) that change the experiment:\n  rollout.group_size: 8 -> 4\n" in msg
    assert "--allow-config-change" in msg and str(run / CONFIG_FILE) in msg
    assert (run / CONFIG_FILE).read_bytes() == before
    assert [h["event"] for h in _history(run)] == ["written"]  # nothing recorded


def test_several_refused_keys_are_listed_at_once(run):
    with pytest.raises(ConfigError) as err:
        check_resume(run, _cfg(run, "rollout.group_size=4", "rl.lr=1e-6", "seed=3", "rl.steps=9"), False)
    assert "in 3 key(s) that change the experiment:\n" \
           "  rl.lr: 1e-07 -> 1e-06\n  rollout.group_size: 8 -> 4\n  seed: 0 -> 3\n" in str(err.value)
    assert "rl.steps" not in str(err.value)  # an allowed change is not listed among the refused ones


def test_rl_steps_change_is_allowed_and_recorded(run):
    before = (run / CONFIG_FILE).read_bytes()
    diff = check_resume(run, _cfg(run, "rl.steps=1000"), allow_change=False)
    assert diff.refused == [] and diff.allowed == [("rl.steps", 500, 1000)]
    written, resumed = _history(run)
    assert written["event"] == "written" and resumed["event"] == "resume"
    assert resumed["changes"] == [{"key": "rl.steps", "old": 500, "new": 1000, "refused": False}]
    assert resumed["allow_config_change"] is False and "time" in resumed
    # config.yaml stays the first config; the run's current config has the change
    assert (run / CONFIG_FILE).read_bytes() == before
    assert yaml.safe_load(before)["rl"]["steps"] == 500
    assert current_run_config(run)["rl.steps"] == 1000


def test_allow_change_overrides_and_records(run):
    diff = check_resume(run, _cfg(run, "rollout.group_size=4"), allow_change=True)
    assert diff.refused == [("rollout.group_size", 8, 4)]
    assert _history(run)[-1]["changes"] == [{"key": "rollout.group_size", "old": 8, "new": 4, "refused": True}]
    assert _history(run)[-1]["allow_config_change"] is True
    assert yaml.safe_load((run / CONFIG_FILE).read_text())["rollout"]["group_size"] == 8  # unchanged


def test_a_recorded_change_is_the_runs_config_from_then_on(run):
    check_resume(run, _cfg(run, "rollout.group_size=4"), allow_change=True)
    # The same config again: no change, nothing new recorded.
    assert not check_resume(run, _cfg(run, "rollout.group_size=4"), allow_change=False)
    assert len(_history(run)) == 2
    # Going back to config.yaml's value changes the experiment again (the checkpoint was trained with 4).
    with pytest.raises(ConfigError, match=r"rollout\.group_size: 4 -> 8"):
        check_resume(run, _cfg(run), allow_change=False)


def test_missing_saved_config_is_an_empty_diff(tmp_path):
    run = tmp_path / "fresh"
    diff = check_resume(run, _cfg(run, "rollout.group_size=4"), allow_change=False)
    assert diff == ConfigDiff(refused=[], allowed=[])
    assert not run.exists()  # nothing written by the check


def test_save_run_config_writes_once(tmp_path):
    run = tmp_path / "run"
    assert save_run_config(run, _cfg(run)) is True
    assert save_run_config(run, _cfg(run, "rollout.group_size=4")) is False
    assert load_config(run / CONFIG_FILE).rollout.group_size == 8  # the first one stays
    assert sorted(p.name for p in run.iterdir()) == [CONFIG_FILE, HISTORY_FILE]  # no temporary file left


def test_a_fresh_start_begins_a_new_history(run):
    check_resume(run, _cfg(run, "rl.steps=1000"), allow_change=False)
    start_run_config(run, _cfg(run))  # the run started again without --resume, same config.yaml content
    assert current_run_config(run)["rl.steps"] == 500
    assert [h["event"] for h in _history(run)] == ["written", "resume", "written"]


def test_a_config_yaml_replaced_without_a_history_line_drops_the_old_changes(run):
    check_resume(run, _cfg(run, "rl.steps=1000"), allow_change=False)
    save_config(_cfg(run, "rl.steps=7"), run / CONFIG_FILE)  # e.g. a writer that does not know the history
    assert current_run_config(run)["rl.steps"] == 7  # the recorded change was made on another config.yaml


def test_a_field_added_since_the_run_started_counts_as_its_default(run):
    saved = yaml.safe_load((run / CONFIG_FILE).read_text())
    del saved["rl"]["val_examples"], saved["rollout"]["group_size"]
    (run / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    assert not check_resume(run, _cfg(run), allow_change=False)


@pytest.mark.parametrize("old, same, other", [("token", "dapo", "grpo"), ("sequence", "grpo", "dapo")])
def test_a_run_from_before_rl_loss_resumes_under_the_renamed_key(run, old, same, other):
    """A config.yaml written with rl.loss_aggregation (replaced by rl.loss) is read through the rename: the same
    loss resumes without a change; another is refused naming rl.loss."""
    saved = yaml.safe_load((run / CONFIG_FILE).read_text())
    del saved["rl"]["loss"]
    saved["rl"]["loss_aggregation"] = old
    (run / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    assert current_run_config(run)["rl.loss"] == same and "rl.loss_aggregation" not in current_run_config(run)
    assert not check_resume(run, _cfg(run, f"rl.loss={same}"), allow_change=False)
    with pytest.raises(ConfigError, match=rf"rl\.loss: '{same}' -> '{other}'"):
        check_resume(run, _cfg(run, f"rl.loss={other}"), allow_change=False)


def test_a_damaged_history_line_is_named(run):
    with open(run / HISTORY_FILE, "a") as f:
        f.write('{"event": "resu\n')
    with pytest.raises(ConfigError, match=rf"{HISTORY_FILE}:2: not a JSON line"):
        check_resume(run, _cfg(run), allow_change=False)


# ---------------------------------------------------------------------------------------------- the CLI


def test_cli_train_resume_refuses_before_reading_the_model(run, tmp_path, monkeypatch, capsys):
    """`shop-r1 train --resume` checks the config first: the model and examples named here do not exist, and Ray is
    not started."""
    from shop_r1.cli import main

    monkeypatch.setenv("SHOP_R1_VERBOSE", "1")  # no actor log folder set up for this process
    before = (run / CONFIG_FILE).read_bytes()
    argv = ["train", "--resume", "--model", str(tmp_path / "no_model"), "--examples", str(tmp_path / "none.jsonl"),
            f"run_dir={run}", "rollout.group_size=4", "rl.global_batch_size=64"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "shop-r1: config error: resume: " in err and "  rollout.group_size: 8 -> 4\n" in err
    assert (run / CONFIG_FILE).read_bytes() == before
    assert [h["event"] for h in _history(run)] == ["written"]
