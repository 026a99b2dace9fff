"""`shop-r1 pipeline --dry-run` plans the one-node GPU config against Ray clusters with logical GPUs, and local
commands start their own cluster beside a `ray start --head` one (which a bare ray.init() would attach to).

One head for the module, started as a user would (`ray start --head --block`, 8 logical GPUs, 80 CPUs: the
one-node config asks 4 x 8 + 4 x 8 + 8 x 1 = 72), stopped by its pid (`ray stop` would kill every Ray process on the
machine). Nothing here starts an engine or a learner: each command is a dry run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import stop_session

from shop_r1.data.sessions import write_sessions
from shop_r1.data.synth import synthesize_sessions

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ONE_NODE = REPO / "configs" / "cluster" / "a100-1node.yaml"
# The tiny model's 8,192 positions hold neither the paper's 32k budgets nor its SFT length: fitted to it.
FIT_TINY = ["data.max_prompt_tokens=7000", "sft.max_seq_len=8192", "model.max_context_tokens=8192"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{BIN}:{env.get('PATH', '')}", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **extra})
    if "RAY_ADDRESS" not in extra:
        env.pop("RAY_ADDRESS", None)
    return env


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def gpu_head(tmp_path_factory):
    """A `ray start --head` cluster with 8 logical GPUs; yields its GCS address."""
    port = _free_port()
    ports = {"port": port, "node-manager-port": _free_port(), "object-manager-port": _free_port(),
             "ray-client-server-port": _free_port(), "runtime-env-agent-port": _free_port(),
             "metrics-export-port": _free_port(), "dashboard-agent-listen-port": _free_port()}
    # Ray's default temp dir, as a user's `ray start --head`: the head's address lands in
    # /tmp/ray/ray_current_cluster, where a bare ray.init() finds it (the bug the private cluster must not have).
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=80",
           "--num-gpus=8", "--include-dashboard=false", "--disable-usage-stats",
           *[f"--{k}={v}" for k, v in ports.items()]]
    log = (tmp_path_factory.mktemp("head") / "head.log").open("w")
    head = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _port_open(port):  # a socket probe first: a `ray status` process costs ~1.5 CPU-s a poll
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not come up; see {log.name}")
            time.sleep(0.5)
        while subprocess.run([str(BIN / "ray"), "status", f"--address={address}"], env=_env(), capture_output=True,
                             timeout=60, check=False).returncode != 0:
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not come up; see {log.name}")
            time.sleep(2)
        yield address
    finally:
        stop_session(head, grace_s=5)  # the head's own processes are its session: SIGKILL takes them all
        log.close()


@pytest.fixture(scope="module")
def inputs(tiny_model_dir, tmp_path_factory):
    sessions = tmp_path_factory.mktemp("data") / "sessions.jsonl"
    write_sessions(synthesize_sessions(12, 0, 4, 0.1), sessions)
    return [f"model.path={tiny_model_dir}", f"data.sessions_path={sessions}", *FIT_TINY]


def _dry_run(run_dir: Path, overrides: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "shop-r1"), "pipeline", "--dry-run", "--config", str(ONE_NODE),
                             f"run_dir={run_dir}", *overrides], env=_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def test_the_one_node_config_plans_on_a_cluster_with_8_gpus(gpu_head, inputs, tmp_path):
    code, out, err = _finish(_dry_run(tmp_path / "run", inputs, RAY_ADDRESS=gpu_head))
    assert code == 0, err
    assert "rollout: 4 x {CPU=8, GPU=1}" in out and "learner: 4 x {CPU=8, GPU=1}" in out, out
    assert "reward_pool: 8 x {CPU=1}" in out and "in all: CPU=72, GPU=8" in out, out
    assert f"placement: tried on the cluster at {gpu_head}" in out, out
    assert "12 sessions parsed" in out and "dry run: OK" in out, out
    assert not (tmp_path / "run").exists(), "a dry run writes nothing into the run folder"


def test_local_commands_beside_a_head_run_on_their_own_clusters_at_once(gpu_head, inputs, tmp_path):
    """Two dry runs at once beside the head, each on a private cluster (ray.address empty, no RAY_ADDRESS): 8
    logical GPUs plan, 4 fail naming the learner's 4 missing GPUs (the engines took the 4 there are)."""
    local = [*inputs, "ray.address=", "ray.num_cpus=80"]
    fits = _dry_run(tmp_path / "a", [*local, "ray.num_gpus=8"])
    short = _dry_run(tmp_path / "b", [*local, "ray.num_gpus=4"])
    (code_fits, out_fits, err_fits), (code_short, _, err_short) = _finish(fits), _finish(short)
    assert code_fits == 0, err_fits
    assert "placement: tried on a private local cluster (CPU=80, GPU=8)" in out_fits, out_fits
    assert code_short == 2, err_short
    assert "Traceback" not in err_short
    (line,) = [x for x in err_short.splitlines() if x.startswith("shop-r1: error:")]
    assert "learner: 4 x {CPU=8, GPU=1} do not fit" in line and "4 GPU short" in line, line
    assert "GPU=4 in all, 0 left after rollout" in line, line
