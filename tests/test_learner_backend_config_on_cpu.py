"""learner.backend: a typed switch between the two learner backends, checked when the config loads, and a key that
changes the experiment on resume (a checkpoint is in its backend's format)."""

import pytest
import yaml

from shop_r1.config import ConfigError, load_config
from shop_r1.run_config import CONFIG_FILE, check_resume, current_run_config, start_run_config


def test_the_backend_defaults_to_deepspeed_and_takes_fsdp2():
    assert load_config(None, []).learner.backend == "deepspeed"
    assert load_config(None, ["learner.backend=fsdp2"]).learner.backend == "fsdp2"


def test_an_unknown_backend_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"learner\.backend: expected one of \('deepspeed', 'fsdp2'\), got 'fsdp'"):
        load_config(None, ["learner.backend=fsdp"])


def test_changing_the_backend_on_resume_is_refused(tmp_path):
    run = tmp_path / "run"
    start_run_config(run, load_config(None, [f"run_dir={run}"]))
    with pytest.raises(ConfigError, match=r"learner\.backend: 'deepspeed' -> 'fsdp2'"):
        check_resume(run, load_config(None, [f"run_dir={run}", "learner.backend=fsdp2"]), allow_change=False)


def test_a_run_started_before_the_field_existed_resumes_on_deepspeed(tmp_path):
    """Its config.yaml has no learner.backend: read as the default, so resuming it unchanged is no change."""
    run = tmp_path / "run"
    start_run_config(run, load_config(None, [f"run_dir={run}"]))
    saved = yaml.safe_load((run / CONFIG_FILE).read_text())
    del saved["learner"]["backend"]
    (run / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    assert current_run_config(run)["learner.backend"] == "deepspeed"
    assert not check_resume(run, load_config(None, [f"run_dir={run}"]), allow_change=False)
