"""weight_sync.transport: a typed switch checked when the config loads, shown by `shop-r1 config show`, and a key a
resume may change (how the weights travel, not which weights)."""

import json
import typing

import pytest
import yaml

from shop_r1.config import TRANSPORTS, ConfigError, WeightSyncTransport, load_config
from shop_r1.run_config import CONFIG_FILE, check_resume, current_run_config, start_run_config


def test_the_transport_defaults_to_auto_and_takes_each_name():
    assert load_config().weight_sync.transport == "auto"
    assert TRANSPORTS == typing.get_args(WeightSyncTransport) == ("auto", "nccl", "gloo", "direct")
    for name in TRANSPORTS:
        assert load_config(None, [f"weight_sync.transport={name}"]).weight_sync.transport == name


def test_config_show_prints_the_chosen_transport(capsys):
    from shop_r1.cli import main

    main(["config", "show", "weight_sync.transport=gloo"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["weight_sync"] == {"transport": "gloo", "zero_copy": False}
    assert list(shown)[-1] == "weight_sync"  # a new section after the others: the earlier output is unchanged


def test_an_unknown_transport_is_refused_naming_the_key(capsys):
    with pytest.raises(ConfigError, match=r"weight_sync\.transport: expected one of \('auto', 'nccl', 'gloo', "
                                          r"'direct'\), got 'nvlink'"):
        load_config(None, ["weight_sync.transport=nvlink"])
    from shop_r1.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["config", "show", "weight_sync.transport=nvlink"])
    assert exit_.value.code == 2
    assert "shop-r1: config error: weight_sync.transport: expected one of" in capsys.readouterr().err


def test_an_unknown_key_in_the_section_is_named():
    with pytest.raises(ConfigError, match=r"weight_sync\.backend: unknown config key"):
        load_config(None, ["weight_sync.backend=gloo"])


def test_changing_the_transport_on_resume_is_allowed_and_recorded(tmp_path):
    run = tmp_path / "run"
    start_run_config(run, load_config(None, [f"run_dir={run}"]))
    diff = check_resume(run, load_config(None, [f"run_dir={run}", "weight_sync.transport=gloo"]), allow_change=False)
    assert not diff.refused and diff.allowed == [("weight_sync.transport", "auto", "gloo")]
    assert current_run_config(run)["weight_sync.transport"] == "gloo"


def test_a_run_started_before_the_section_existed_resumes_unchanged(tmp_path):
    """Its config.yaml has no weight_sync section: read as the default, so resuming it unchanged is no change."""
    run = tmp_path / "run"
    start_run_config(run, load_config(None, [f"run_dir={run}"]))
    saved = yaml.safe_load((run / CONFIG_FILE).read_text())
    del saved["weight_sync"]
    (run / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    assert current_run_config(run)["weight_sync.transport"] == "auto"
    assert not check_resume(run, load_config(None, [f"run_dir={run}"]), allow_change=False)
