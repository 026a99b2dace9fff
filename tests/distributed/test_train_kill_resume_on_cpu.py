"""`shop-r1 train` SIGKILLed after step 2 (the driver, its private Ray cluster and every actor at once), a torn last
line appended to metrics_grpo.jsonl as a kill mid-write leaves it, then `shop-r1 train --resume`:

- with a changed group size it is refused before anything starts, naming the key with its old and new value;
- with the run's own config it continues from the newest complete checkpoint to the last step, cutting the torn line
  (with a warning): every step is read once, no line in the file is unparseable, and `shop-r1 report` reads the run.

Each run gets a Ray temp dir of its own (RAY_TMPDIR): every process it starts inherits that variable, which is how
the test finds any process of the killed run still alive before the resume starts its own cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from shop_r1.data.examples import build_rl_examples, chat_token_counter, write_examples_jsonl
from shop_r1.data.synth import synthesize_sessions
from shop_r1.tracking import read_metrics

REPO = Path(__file__).resolve().parents[2]
SHOP_R1 = str(Path(sys.executable).parent / "shop-r1")
TORN = '{"step": 3, "reward/to'
OVERRIDES = ["rl.steps=4", "rollout.group_size=4", "rl.global_batch_size=8", "rollout.max_new_tokens=16",
             "rl.checkpoint_every=1", "rl.check_weight_sync=false", "logging.wandb=false", "logging.console_every=1",
             "rollout.kv_cache_gib=1", "reward_pool.num_workers=1", "ray.num_cpus=4", "rollout.num_cpus_per_engine=1",
             "learner.num_cpus_per_rank=1", "data.max_prompt_tokens=1200"]


def _env(ray_tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RAY_TMPDIR": str(ray_tmp), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "DS_ACCELERATOR": "cpu", "WANDB_MODE": "disabled", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    env.pop("RAY_ADDRESS", None)
    return env


def _train(model: Path, examples: Path, run: Path, *changes: str, resume: bool = False) -> list[str]:
    """The command: flags first, then the overrides (argparse takes no override after a flag); `changes` last win."""
    return [SHOP_R1, "train", "--model", str(model), "--examples", str(examples), *(["--resume"] if resume else []),
            f"run_dir={run}", *OVERRIDES, *changes]


def _processes_of(ray_tmp: Path) -> dict[int, str]:
    """pid -> command line of every live process started with RAY_TMPDIR=ray_tmp (zombies have no environ)."""
    marker = f"RAY_TMPDIR={ray_tmp}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's process group (the driver, Ray's GCS and raylet), then every other process of its session:
    the raylet starts each worker (every actor: engine, learner, reward worker) in a process group of its own, so a
    group kill alone leaves them to exit by themselves once they notice their raylet is gone (about 2 s here)."""
    os.killpg(proc.pid, signal.SIGKILL)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            session = int(stat.read_text().rsplit(")", 1)[1].split()[3])  # after "pid (comm)": state ppid pgrp session
            if session == proc.pid:
                os.kill(int(stat.parent.name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    proc.wait()


def _survivors(ray_tmp: Path, grace_s: float) -> dict[int, str]:
    """The processes of a run still alive after `grace_s` (a SIGKILLed process may take a moment to exit)."""
    deadline = time.monotonic() + grace_s
    while (alive := _processes_of(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def _logged_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines(keepends=True) if line.endswith("}\n")]


@pytest.fixture
def ray_tmps():
    """Short Ray temp dirs (Ray's socket paths must stay under 107 bytes), one per run."""
    root = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))
    yield root / "a", root / "b"
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.first
@pytest.mark.timeout(900)
def test_train_killed_then_resumed_refuses_a_changed_group_size_and_finishes(tiny_model_dir, tmp_path, ray_tmps):
    first_tmp, resume_tmp = ray_tmps
    examples = tmp_path / "rl_train.jsonl"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    write_examples_jsonl(build_rl_examples(synthesize_sessions(6, seed=0), "whole_session", 1200,
                                           chat_token_counter(tok)).examples, examples)
    run, metrics = tmp_path / "run", tmp_path / "run" / "metrics_grpo.jsonl"

    log = tmp_path / "first.log"
    with log.open("w") as f:
        proc = subprocess.Popen(_train(tiny_model_dir, examples, run), cwd=REPO, env=_env(first_tmp), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while 2 not in _logged_steps(metrics):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "GRPO never logged step 2"
            time.sleep(0.05)
    finally:
        _kill_session(proc)
    logged_before = _logged_steps(metrics)
    assert max(logged_before) < 4, "killed too late: the run had finished"
    # Every process of that run is gone: none left the session (a process that did would escape a lost pod's kill).
    stray = _survivors(first_tmp, grace_s=10)
    assert not stray, f"processes of the killed run still alive: {stray}"

    latest = (run / "grpo" / "checkpoints" / "latest").read_text().strip()  # the checkpoint the resume must take
    with metrics.open("a") as f:
        f.write(TORN)  # a kill mid-write: half a record, no newline

    # A resume that changes the experiment is refused before the model, the data or Ray is touched.
    refused = subprocess.run(_train(tiny_model_dir, examples, run, "rollout.group_size=8", "rl.global_batch_size=16",
                                    resume=True),
                             cwd=REPO, env=_env(resume_tmp), capture_output=True, text=True, timeout=300,
                             start_new_session=True)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "config error: resume: the config differs" in said, said[-4000:]
    assert "rollout.group_size: 4 -> 8" in said and "rl.global_batch_size: 8 -> 16" in said, said[-4000:]
    assert metrics.read_text().endswith(TORN), "the refused resume touched the metrics file"
    assert not (resume_tmp / "ray").exists(), "the refused resume started Ray"

    resumed = subprocess.run(_train(tiny_model_dir, examples, run, resume=True), cwd=REPO, env=_env(resume_tmp),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                             start_new_session=True)
    out = resumed.stdout
    (tmp_path / "resumed.log").write_text(out)
    assert resumed.returncode == 0, out[-4000:]
    step = int(latest.removeprefix("step_"))
    assert re.search(rf"resumed from \S+/{latest} \(step {step}\)", out), out[-4000:]
    assert re.search(r"MetricsFileWarning: \S+metrics_grpo\.jsonl:\d+: torn last line cut", out), out[-4000:]
    assert "GRPO: 4 steps" in out
    assert not _survivors(resume_tmp, grace_s=30), "the finished run left processes behind"

    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3, 4]
    lines = metrics.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") and json.loads(line)["step"] in (1, 2, 3, 4) for line in lines)
    # The steps logged after the checkpoint ran twice (the resumed run logs them again; readers keep the last).
    assert [json.loads(line)["step"] for line in lines] == [*logged_before, *range(step + 1, 5)]

    report = subprocess.run([SHOP_R1, "report", str(run)], cwd=REPO, env=_env(resume_tmp), capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "4 GRPO steps logged (steps 1–4)." in (run / "report" / "report.md").read_text()
