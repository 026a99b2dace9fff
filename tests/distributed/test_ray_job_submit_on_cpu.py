"""`ray job submit` with the real Ray CLI against a real local head on loopback, and what the job uploads.

The head is started as a user would (`ray start --head --block`, token auth off as in the shared notes), in its own
session so it is stopped by its pid: `ray stop` would kill every Ray process on the machine, this test's included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from procs import stop_session

from shop_r1.cli import main as shop_r1_main

REPO = Path(__file__).resolve().parents[2]
RUNTIME_ENV = REPO / "cluster" / "runtime_env.yaml"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{BIN}:{env.get('PATH', '')}", "DS_ACCELERATOR": "cpu", "WANDB_MODE": "disabled",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    env.pop("RAY_ADDRESS", None)
    return env


def _ray(*args: str, timeout_s: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], check=False, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout_s)


def _job_server_up(address: str) -> bool:
    """Whether the head's job server answers (the dashboard's version endpoint, which `ray job` calls first)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _terminal_state(status_output: str) -> str | None:
    """The job's terminal state from `ray job status` output, or None while it runs.

    Ray prints either "Status for job 'X': SUCCEEDED" or "Job 'X' succeeded" depending on version and terminal.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", status_output).lower()
    match = re.search(r"\b(succeeded|failed|stopped)\b", text)
    return match.group(1) if match else None


@pytest.fixture
def ray_head(tmp_path_factory):
    """A Ray head on 127.0.0.1 with the job server; yields the dashboard address, stops the head by its pid."""
    ports = {name: _free_port() for name in ("port", "dashboard-port", "dashboard-agent-listen-port",
                                             "ray-client-server-port", "runtime-env-agent-port",
                                             "metrics-export-port", "node-manager-port", "object-manager-port")}
    temp_dir = Path("/tmp") / f"rjt{os.getpid()}"  # short: Ray's socket paths must stay under 107 bytes
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=6",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
           "--disable-usage-stats", *[f"--{k}={v}" for k, v in ports.items()]]
    log = (tmp_path_factory.mktemp("head") / "head.log").open("w")
    head = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 120
        while not _job_server_up(address):  # an HTTP probe, not a `ray job list` process (~1.5 CPU-s) a poll
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not come up; see {log.name}")
            time.sleep(1)
        yield address
    finally:
        stop_session(head, grace_s=5)  # SIGTERM stops it in ~35 s on 2 cores; SIGKILL takes its whole session
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def job_inputs(tiny_model_dir, tmp_path):
    """Sessions and RL examples on a path the job can see (this machine's filesystem plays the shared one)."""
    shared = tmp_path / "shared"
    shop_r1_main(["data", "synth", "--num-sessions", "6", "--out", str(shared / "sessions.jsonl")])
    shop_r1_main(["data", "build", "--sessions", str(shared / "sessions.jsonl"), "--out-dir", str(shared / "data"),
                  "--model", str(tiny_model_dir), "data.max_prompt_tokens=1200"])
    config = shared / "job.yaml"
    config.write_text(yaml.safe_dump({
        "run_dir": str(shared / "runs" / "job"), "storage_uri": f"file://{shared / 'bucket' / 'job'}",
        "ray": {"address": "auto"}, "logging": {"wandb": False},
        "rollout": {"group_size": 4, "max_new_tokens": 16, "kv_cache_gib": 1.0},
        "rl": {"steps": 2, "global_batch_size": 8, "checkpoint_every": 1, "check_weight_sync": True},
        "data": {"max_prompt_tokens": 1200}}))
    return shared, config


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ray_job_submit_trains_on_a_local_head(ray_head, job_inputs, tiny_model_dir):
    shared, config = job_inputs
    job_id = f"shop-r1-test-{os.getpid()}"
    # As a user submits: the CLI waits for the job and tails its logs (one process, instead of a `ray job status`
    # process every few seconds); then the job's state and logs as the CLI reports them.
    submitted = _ray("job", "submit", f"--address={ray_head}", f"--submission-id={job_id}",
                     f"--runtime-env={RUNTIME_ENV}", "--", "shop-r1", "train", "--config", str(config),
                     "--model", str(tiny_model_dir), "--examples", str(shared / "data" / "rl_train.jsonl"),
                     timeout_s=780)
    status = _ray("job", "status", f"--address={ray_head}", job_id, timeout_s=60).stdout
    state = _terminal_state(status)
    logs = _ray("job", "logs", f"--address={ray_head}", job_id, timeout_s=60).stdout
    assert state == "succeeded", f"job status:\n{status}\nlogs:\n{logs[-6000:]}"
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]

    # The job ran the uploaded code, not the checkout: the code path printed is inside Ray's unpacked working_dir.
    code_line = next(line for line in logs.splitlines() if line.startswith("shop-r1 code: "))
    assert str(REPO) not in code_line and "working_dir_files" in code_line, code_line
    run = shared / "runs" / "job"
    records = [json.loads(line) for line in (run / "metrics_grpo.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # The engines stamped every sample with the weights pushed after the previous step (the run stops otherwise).
    assert all(r["policy_version"] == r["step"] - 1 for r in records)
    assert all(r["train/sampler_logprob_abs_diff_max"] < 1e-3 for r in records)
    assert len((run / "rollouts.jsonl").read_text().splitlines()) >= 2  # the dump: one line per group per step
    assert all(r["weight_sync/check_max_abs_logprob_diff"] < 1e-3 for r in records)
    assert (run / "grpo" / "hf" / "model.safetensors").exists()
    assert (run / "grpo" / "checkpoints" / "latest").exists()
    # The run folder was mirrored to the storage URI (a file:// bucket here).
    mirrored = shared / "bucket" / "job"
    assert (mirrored / "metrics_grpo.jsonl").read_text() == (run / "metrics_grpo.jsonl").read_text()
    assert (mirrored / "grpo" / "hf" / "model.safetensors").stat().st_size == \
        (run / "grpo" / "hf" / "model.safetensors").stat().st_size


def _package(root: Path, out: Path) -> set[str]:
    """Zip `root` exactly as `ray job submit --runtime-env cluster/runtime_env.yaml` does; the names inside."""
    from ray._private.runtime_env.packaging import create_package

    excludes = yaml.safe_load(RUNTIME_ENV.read_text())["excludes"]
    create_package(str(root), out, include_gitignore=True, excludes=excludes)
    with zipfile.ZipFile(out) as z:
        return set(z.namelist())


def test_runtime_env_uploads_only_code(tmp_path):
    spec = yaml.safe_load(RUNTIME_ENV.read_text())
    assert spec["working_dir"] == "." and set(spec) <= {"working_dir", "excludes", "env_vars"}
    # A checkout with everything a user accumulates, and no .gitignore: the excludes alone must keep it out.
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "shop_r1", root / "shop_r1", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "configs", root / "configs")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    for junk in (".venv/lib/python3.11/site-packages/torch/lib.so", "runs/default/grpo/hf/model.safetensors",
                 "runs/default/metrics_grpo.jsonl", "wandb/run-1/files.bin", "models/tiny/model.safetensors",
                 "benchmarks/results/cpu/tmp/x.json",
                 "experiments/results/cpu/t/predictions.jsonl.gz", ".git/objects/ab/cdef", "shop_r1/__pycache__/x.pyc"):
        (root / junk).parent.mkdir(parents=True, exist_ok=True)
        (root / junk).write_bytes(b"\0" * 1024)
    names = _package(root, tmp_path / "pkg.zip")
    assert "shop_r1/train.py" in names and "configs/demo_cpu.yaml" in names and "pyproject.toml" in names
    leaked = [n for n in names if n.startswith((".venv/", "runs/", "wandb/", ".git/", "benchmarks/results/",
                                                           "experiments/results/"))
              or n.endswith((".safetensors", ".pyc"))]
    assert not leaked, leaked
    # The real checkout (with its .venv, a GB of packages) zips to a small upload.
    names = _package(REPO, tmp_path / "repo.zip")
    assert not [n for n in names if n.startswith((".venv/", "runs/"))]
    assert (tmp_path / "repo.zip").stat().st_size < 5 * 2**20


def test_terminal_state_reads_both_status_formats():
    assert _terminal_state("Job 'x' is currently running.") is None
    assert _terminal_state("\x1b[32mJob 'shop-r1-test-1' succeeded\x1b[39m") == "succeeded"
    assert _terminal_state("Status for job 'x': SUCCEEDED") == "succeeded"
    assert _terminal_state("Job 'x' failed\nStatus message: ...") == "failed"
