"""The Tracker's wandb run: one group per run folder (logging.run_name, else the folder's name), one run per stage
named GROUP-STAGE with the stage as its job type, the team's entity when given. `wandb.init` is replaced by a fake
that records its arguments: nothing is written or sent."""

import pytest

from shop_r1.config import LoggingConfig
from shop_r1.tracking import Tracker


class FakeRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, metrics, step=None):
        self.logged.append((step, metrics))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    """The runs `wandb.init` would have started, in order."""
    wandb = pytest.importorskip("wandb")
    runs = []

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return runs


def test_a_named_run_is_its_group_and_each_stage_a_run_in_it(tmp_path, fake_wandb):
    cfg = LoggingConfig(wandb=True, wandb_entity="team", run_name="exp1", console_every=0)
    tracker = Tracker(tmp_path / "runs" / "folder", cfg, "grpo", config={"rl": {"lr": 1e-6}})
    (run,) = fake_wandb
    kwargs = run.init_kwargs
    assert {k: kwargs[k] for k in ("project", "entity", "group", "job_type", "name")} == {
        "project": "shop-r1", "entity": "team", "group": "exp1", "job_type": "grpo", "name": "exp1-grpo"}
    assert kwargs["config"] == {"rl": {"lr": 1e-6}}
    assert kwargs["mode"] == "offline"  # offline files in the run folder unless WANDB_MODE says otherwise
    assert kwargs["dir"] == str(tmp_path / "runs" / "folder")
    tracker.log(3, {"reward/total": 1.5})
    tracker.close()
    assert run.logged == [(3, {"reward/total": 1.5})]
    assert run.finished


def test_without_a_run_name_the_group_is_the_run_folders_name(tmp_path, fake_wandb):
    cfg = LoggingConfig(wandb=True, console_every=0)  # run_name "", wandb_entity ""
    Tracker(tmp_path / "shop_r1_a100_1node", cfg, "sft").close()
    Tracker(tmp_path / "shop_r1_a100_1node", cfg, "grpo").close()
    sft, grpo = (r.init_kwargs for r in fake_wandb)
    assert (sft["group"], sft["job_type"], sft["name"]) == ("shop_r1_a100_1node", "sft", "shop_r1_a100_1node-sft")
    assert (grpo["group"], grpo["job_type"], grpo["name"]) == ("shop_r1_a100_1node", "grpo",
                                                               "shop_r1_a100_1node-grpo")
    assert sft["entity"] is None and grpo["entity"] is None  # empty: wandb's default entity


def test_the_group_is_the_resolved_folders_name(tmp_path, fake_wandb, monkeypatch):
    # run_dir=. (or a trailing ..) still names the folder, not "" or "..".
    (tmp_path / "exp2").mkdir()
    monkeypatch.chdir(tmp_path / "exp2")
    Tracker(".", LoggingConfig(wandb=True, console_every=0), "sft").close()
    assert fake_wandb[0].init_kwargs["group"] == "exp2"


def test_wandb_off_never_starts_a_run(tmp_path, fake_wandb):
    Tracker(tmp_path, LoggingConfig(wandb=False, console_every=0), "grpo").close()
    assert fake_wandb == []
