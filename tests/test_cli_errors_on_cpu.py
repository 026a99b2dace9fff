"""Every user error of the `shop-r1` CLI is one line on stderr (no traceback) and exit status 2; `--verbose` shows
the traceback behind it. The checks that stop a run stop it before a model is loaded, Ray starts or the run folder
is made. `main` runs in this process (a real process only where the process matters: `python -m shop_r1.cli`)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import shop_r1
from shop_r1.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
A100 = str(REPO / "configs" / "cluster" / "a100-1node.yaml")
# Lines `main` writes to stderr before a command that spawns actors runs (which copy of the code runs; where the
# actors' output goes): status, not errors.
STATUS_PREFIXES = ("shop-r1 code: ", "shop-r1: the actors' own output")


@pytest.fixture(autouse=True)
def no_leaked_state(monkeypatch):
    """`main` sets process-wide state (SHOP_R1_VERBOSE with --verbose, the actors' log folder): put it back."""
    from shop_r1.distributed import actors

    monkeypatch.delenv("SHOP_R1_VERBOSE", raising=False)
    monkeypatch.setattr(actors, "_ACTOR_LOG_DIR", actors._ACTOR_LOG_DIR)


@pytest.fixture
def spawning_command(monkeypatch):
    """pipeline / sft / train (not --dry-run) turn HF's progress bars off process-wide; keep them as they are."""
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(hf_logging, "disable_progress_bar", lambda: None)


def user_error(capsys, argv: list[str]) -> str:
    """Run `shop-r1 ARGV` on a user error: exit 2, no traceback, one error line on stderr; that line."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if not line.startswith(STATUS_PREFIXES)]
    assert len(lines) == 1, err
    assert lines[0].startswith(("shop-r1: error: ", "shop-r1: config error: ")), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------- --config files


def test_a_missing_config_file_is_named(capsys, tmp_path):
    missing = tmp_path / "missing.yaml"
    line = user_error(capsys, ["config", "show", "--config", str(missing)])
    assert line == f"shop-r1: config error: --config {missing}: cannot read it (No such file or directory)"


def test_a_config_that_is_a_folder_is_named(capsys, tmp_path):
    line = user_error(capsys, ["config", "show", "--config", str(tmp_path)])
    assert line == f"shop-r1: config error: --config {tmp_path}: cannot read it (Is a directory)"


def test_invalid_yaml_is_named_by_file_and_line(capsys, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rl:\n  lr: 1e-6\n   steps: 3\n")  # line 3 indented one space too far
    line = user_error(capsys, ["config", "show", "--config", str(path)])
    assert line == f"shop-r1: config error: {path}:3: not valid YAML (mapping values are not allowed here)"


def test_a_config_whose_top_level_is_a_list_is_refused(capsys, tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- rl.lr: 1\n- rl.steps: 2\n")
    line = user_error(capsys, ["config", "show", "--config", str(path)])
    assert line == f"shop-r1: config error: {path}: the top level must be a mapping of config sections"


# ---------------------------------------------------------------------------------------------- dotted overrides


def test_an_unknown_key_suggests_the_close_one(capsys):
    line = user_error(capsys, ["config", "show", "rl.lrr=1"])
    assert line.startswith("shop-r1: config error: rl.lrr: unknown config key")
    assert "did you mean rl.lr?" in line


def test_an_unknown_section_suggests_the_close_one(capsys):
    line = user_error(capsys, ["config", "show", "rll.lr=1"])
    assert line.startswith("shop-r1: config error: rll: unknown config key")
    assert "did you mean rl?" in line


def test_config_show_doc_prints_the_keys_type_default_range_and_doc(capsys):
    main(["config", "show", "--doc", "rl.lr"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["rl.lr: float = 1e-07  (range > 0)", "    Learning rate (constant after rl.warmup_steps)."]


def test_config_show_doc_of_an_unknown_key_suggests_the_close_one(capsys):
    line = user_error(capsys, ["config", "show", "--doc", "rl.lrr"])
    assert line.startswith("shop-r1: config error: rl.lrr: unknown config key")
    assert "did you mean rl.lr?" in line


def test_config_show_doc_without_a_key_prints_every_key_by_section(capsys):
    from shop_r1.config import Config, config_to_dict
    from shop_r1.run_config import flatten

    main(["config", "show", "--doc"])
    out = capsys.readouterr().out
    keys = [line.split(":")[0] for line in out.splitlines() if line and not line.startswith((" ", "["))]
    assert keys == list(flatten(config_to_dict(Config())))  # every key once, in the dataclasses' order
    assert [line for line in out.splitlines() if line.startswith("[")][:3] == ["[top level]", "[model]", "[data]"]


def test_a_value_of_the_wrong_type_names_the_key(capsys):
    line = user_error(capsys, ["config", "show", "rl.lr=abc"])
    assert line == "shop-r1: config error: rl.lr: expected a float, got 'abc'"


# ---------------------------------------------------------------------------------------------- report


def test_report_of_a_missing_folder_names_it(capsys, tmp_path):
    missing = tmp_path / "no_run"
    line = user_error(capsys, ["report", str(missing)])
    assert line == f"shop-r1: error: report: no run folder at {missing}"


def test_report_of_an_empty_folder_names_it(capsys, tmp_path):
    line = user_error(capsys, ["report", str(tmp_path)])
    assert line == (f"shop-r1: error: report: {tmp_path} has no metrics_grpo.jsonl, metrics_sft.jsonl or "
                    "eval/*/metrics.json")


# ---------------------------------------------------------------------------------------------- argparse, --version


def test_a_mistyped_subcommand_suggests_the_close_one(capsys):
    # argparse's own usage error: the usage lines, then the error line with the hint.
    with pytest.raises(SystemExit) as exit_:
        main(["trian"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: shop-r1")
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1].endswith("did you mean 'train'?")


def test_version_prints_the_program_and_its_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"shop-r1 {shop_r1.__version__}\n"


# ---------------------------------------------------------------------------------------------- data synth


def test_data_synth_refuses_the_old_version_flag(capsys, tmp_path):
    out = tmp_path / "sessions.jsonl"
    line = user_error(capsys, ["data", "synth", "--num-sessions", "2", "--version", "2", "--out", str(out)])
    assert "--shop-version" in line and "data synth --version 2" in line
    assert not out.exists()


def test_data_synth_writes_the_sessions_asked_for(capsys, tmp_path):
    from shop_r1.data.sessions import load_sessions

    out = tmp_path / "sessions.jsonl"
    main(["data", "synth", "--num-sessions", "3", "--shop-version", "4", "--out", str(out)])
    assert f"wrote 3 sessions to {out}" in capsys.readouterr().out
    assert len(load_sessions(out).sessions) == 3
    assert len(out.read_text().splitlines()) == 3  # one session a line


# ---------------------------------------------------------------------------------------------- pipeline's sessions


def test_pipeline_dry_run_without_sessions_names_both_ways_out(capsys):
    # The committed cluster config leaves data.sessions_path empty on purpose; its model folder (on /mnt/shared) is
    # not here, so this also shows the sessions check comes before the model folder and Ray.
    line = user_error(capsys, ["pipeline", "--config", A100, "--dry-run"])
    assert line.startswith("shop-r1: config error: data.sessions_path is empty")
    assert "data.synthetic=true" in line


def test_pipeline_without_sessions_stops_before_making_the_run_folder(capsys, tmp_path, spawning_command):
    run_dir = tmp_path / "run"
    line = user_error(capsys, ["pipeline", "--config", A100, f"run_dir={run_dir}"])
    assert line.startswith("shop-r1: config error: data.sessions_path is empty")
    assert "data.synthetic=true" in line
    assert not run_dir.exists()


def test_pipeline_with_sessions_and_synthetic_is_refused(capsys, tmp_path):
    sessions = tmp_path / "sessions.jsonl"
    line = user_error(capsys, ["pipeline", "--config", A100, "--dry-run", f"data.sessions_path={sessions}",
                               "data.synthetic=true"])
    assert line.startswith(f"shop-r1: config error: data.sessions_path='{sessions}' and data.synthetic=true")


# ---------------------------------------------------------------------------------------------- examples files


def test_train_on_an_empty_examples_file_stops_before_the_model(capsys, tmp_path, spawning_command):
    # model.path is a folder with no model in it: a load would fail otherwise, so the examples check came first.
    examples, model, run_dir = tmp_path / "rl_train.jsonl", tmp_path / "not_a_model", tmp_path / "run"
    examples.write_text("")
    model.mkdir()
    line = user_error(capsys, ["train", "--examples", str(examples), f"model.path={model}", f"run_dir={run_dir}"])
    assert line.startswith(f"shop-r1: error: {examples}: no RL example in it")
    assert not run_dir.exists()


def test_train_names_the_malformed_line_of_its_examples(capsys, tmp_path, spawning_command):
    examples, model = tmp_path / "rl_train.jsonl", tmp_path / "not_a_model"
    examples.write_text('\n{"example_id": "e0", \n')  # line 1 blank (skipped, still counted), line 2 cut short
    model.mkdir()
    line = user_error(capsys, ["train", "--examples", str(examples), f"model.path={model}",
                               f"run_dir={tmp_path / 'run'}"])
    assert line.startswith(f"shop-r1: error: {examples}:2: not valid JSON")


def test_sft_on_an_empty_examples_file_stops_before_the_model(capsys, tmp_path, spawning_command):
    examples, model, run_dir = tmp_path / "sft_train.jsonl", tmp_path / "not_a_model", tmp_path / "run"
    examples.write_text("\n\n")  # blank lines only: no example
    model.mkdir()
    line = user_error(capsys, ["sft", "--examples", str(examples), f"model.path={model}", f"run_dir={run_dir}"])
    assert line.startswith(f"shop-r1: error: {examples}: no SFT example in it")
    assert not run_dir.exists()


# ---------------------------------------------------------------------------------------------- --verbose


def test_verbose_shows_the_traceback_and_still_exits_2(capsys, tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as exit_:
        main(["--verbose", "config", "show", "--config", str(missing)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "FileNotFoundError" in err  # the cause, chained under the ConfigError
    assert err.rstrip().splitlines()[-1] == \
        f"shop-r1: config error: --config {missing}: cannot read it (No such file or directory)"


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    # What a shell sees: stdout empty, stderr exactly the error line.
    missing = tmp_path / "missing.yaml"
    done = subprocess.run([sys.executable, "-m", "shop_r1.cli", "config", "show", "--config", str(missing)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"shop-r1: config error: --config {missing}: cannot read it (No such file or directory)\n"


# ---------------------------------------------------------------------------------------------- help text


def _walk(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) for `parser` and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")


def test_every_argument_and_subcommand_has_help_text():
    missing, seen = [], 0
    for path, parser in _walk(build_parser(), "shop-r1"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:  # the subcommands' one-line help
                    if not choice.help:
                        missing.append(f"{path} {choice.dest}")
                continue
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            seen += 1
            # argparse.SUPPRESS hides an argument on purpose (data synth --version, refused with a message).
            if not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"no help text: {missing}"
    assert seen > 50  # the walk reached the subcommands' own arguments


# ---------------------------------------------------------------------------------------------- data build budget


def test_data_build_with_no_page_under_the_budget_names_the_key(capsys, tmp_path, tiny_model_dir):
    from shop_r1.data.sessions import write_sessions
    from shop_r1.data.synth import synthesize_sessions

    # Measured with the tiny tokenizer: these sessions' RL prompts are 1707-6134 tokens (the instructions alone are
    # ~330 words), so a 50-token budget holds no current page and every example is left out.
    sessions, out = tmp_path / "sessions.jsonl", tmp_path / "data"
    write_sessions(synthesize_sessions(12, 0, 4, 0.1), sessions)
    line = user_error(capsys, ["data", "build", "--sessions", str(sessions), "--out-dir", str(out),
                               "--model", str(tiny_model_dir), "data.max_prompt_tokens=50"])
    assert line.startswith(f"shop-r1: error: data build: wrote 0 training RL examples to {out}")
    assert "raise data.max_prompt_tokens" in line
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rl_train"]["num_examples"] == 0 and stats["num_rl_over_budget"] > 0


def test_an_error_raised_in_an_actor_is_its_cause_on_one_line(capsys, monkeypatch):
    """Ray re-raises an actor's ConfigError as RayTaskError(ConfigError): a subclass of it whose text is the remote
    traceback. The line is the cause's message, and the kind is still a config error."""
    from shop_r1 import cli
    from shop_r1.config import ConfigError

    wrapper = type("RayTaskError(ConfigError)", (ConfigError,), {})
    remote = wrapper("Traceback (most recent call last):\n  File \"worker.py\", line 1\nConfigError: deep")
    remote.cause = ConfigError("reward.fn='x:y': cannot import x")

    def raises(args):
        raise remote

    monkeypatch.setattr(cli, "cmd_config_show", raises)
    line = user_error(capsys, ["config", "show"])
    assert line == "shop-r1: config error: reward.fn='x:y': cannot import x"


def test_a_resume_dry_run_refuses_as_a_resume_and_writes_nothing(tmp_path):
    from shop_r1.cli import _check_resume
    from shop_r1.config import ConfigError, load_config
    from shop_r1.run_config import start_run_config

    start_run_config(tmp_path, load_config(None, [f"run_dir={tmp_path}"]))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    changed = load_config(None, [f"run_dir={tmp_path}", "rollout.temperature=0.5"])
    with pytest.raises(ConfigError, match=r"rollout.temperature: 0.6 -> 0.5"):
        _check_resume(changed, False, dry_run=True)
    _check_resume(changed, True, dry_run=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before, "no history line, no new file"
    _check_resume(changed, True)  # the real resume records the change: the check above can tell
    assert (tmp_path / "config_history.jsonl").read_bytes() != before.get("config_history.jsonl")
