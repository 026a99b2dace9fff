"""Cluster files: the Ray autoscaler YAMLs validate against Ray's own schema, the KubeRay manifests carry the fields
KubeRay requires, and the shop-r1 cluster configs load and fit on the GPUs the clusters provide.

Offline and credential-free: `prepare_config` only merges the provider's defaults.yaml shipped in the `ray` package
(no boto3 / Google client import, no network), and the network is blocked while it runs to prove it.
"""

from __future__ import annotations

import copy
import json
import re
import socket
from pathlib import Path

import pytest
import yaml

from shop_r1.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
KUBERAY = CLUSTER / "kuberay"
CONFIGS = ROOT / "configs" / "cluster"

GPUS_PER_NODE = 8
EXPECTED_AUTOSCALER_YAMLS = {"aws-a100.yaml", "gcp-a100.yaml"}
NODES_OF_CONFIG = {"a100-1node.yaml": 1, "a100-2node.yaml": 2}
GPU_EXTRA_INSTALL = re.compile(r"pip install\b.*-e\s+(['\"]?)\.\[gpu\]\1")


def _autoscaler_yamls() -> list[Path]:
    """Every cluster/*.yaml that is a Ray autoscaler config (it has a provider; runtime_env.yaml has not)."""
    return sorted(p for p in CLUSTER.glob("*.yaml") if "provider" in (yaml.safe_load(p.read_text()) or {}))


AUTOSCALER_YAMLS = _autoscaler_yamls()


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access is not allowed in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _prepared(raw: dict) -> dict:
    """What `ray up` does before talking to the cloud: merge defaults, docker checks, per-type min/max workers."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(raw))


def _validate(raw: dict) -> dict:
    from ray.autoscaler._private.util import validate_config

    prepared = _prepared(raw)
    validate_config(prepared)  # jsonschema against ray/autoscaler/ray-schema.json + Ray's cross-field checks
    return prepared


def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


# ---------------------------------------------------------------------------------------------- autoscaler YAMLs


def test_the_autoscaler_yamls_are_all_found():
    assert {p.name for p in AUTOSCALER_YAMLS} >= EXPECTED_AUTOSCALER_YAMLS


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
def test_autoscaler_yaml_validates_against_rays_schema(path, no_network):
    import jsonschema

    raw = yaml.safe_load(path.read_text())
    jsonschema.validate(raw, _ray_schema())  # the file as written, before Ray's defaults are merged in
    prepared = _validate(raw)
    assert prepared["provider"]["type"] == raw["provider"]["type"]


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
def test_autoscaler_yaml_project_facts(path):
    raw = yaml.safe_load(path.read_text())
    types = raw["available_node_types"]
    head = types[raw["head_node_type"]]
    assert head["resources"].get("GPU") == 0, "the head is CPU-only: no GPU actor may land there"
    assert head["resources"].get("CPU", 0) > 0

    workers = {name: t for name, t in types.items() if name != raw["head_node_type"]}
    gpu_types = {name: t for name, t in workers.items() if t["resources"].get("GPU") == GPUS_PER_NODE}
    assert gpu_types, f"no worker type with {GPUS_PER_NODE} GPUs"
    for name, t in workers.items():
        assert t.get("min_workers", 0) in (0, 1), name
        assert t["max_workers"] >= max(2, t.get("min_workers", 0)), name
    assert raw["max_workers"] >= max(t["max_workers"] for t in gpu_types.values()) >= 2
    assert raw["max_workers"] >= sum(t.get("min_workers", 0) for t in workers.values())

    # The project with its GPU extra, from the checkout that file_mounts uploads.
    commands = raw["setup_commands"] + raw.get("worker_setup_commands", [])
    assert any(GPU_EXTRA_INSTALL.search(c) for c in commands), commands
    assert "." in raw["file_mounts"].values()
    assert any(c.startswith("cd ~/shop-r1") for c in raw["setup_commands"])
    assert set(raw["file_mounts"]) == {"~/shop-r1"}

    docker = raw["docker"]
    assert docker["image"].startswith("rayproject/ray:") and docker["image"].endswith("-gpu")
    assert docker["container_name"] and docker["run_options"]
    assert any("/mnt/shared" in opt for opt in docker["run_options"]), "the shared filesystem for run_dir"

    provider = raw["provider"]
    assert raw["cluster_name"]
    if provider["type"] == "aws":
        assert provider["region"] and provider["availability_zone"] and "cache_stopped_nodes" in provider
        assert {t["node_config"]["InstanceType"] for t in gpu_types.values()} == {"p4d.24xlarge"}
        assert any("boto3" in c for c in raw["head_setup_commands"])
    elif provider["type"] == "gcp":
        assert provider["region"] and provider["availability_zone"]
        assert "REPLACE" in provider["project_id"], "project_id stays an obvious placeholder"
        assert {t["node_config"]["machineType"] for t in gpu_types.values()} == {"a2-highgpu-8g"}
        assert any("google-api-python-client" in c for c in raw["head_setup_commands"])
    else:
        pytest.fail(f"unexpected provider {provider['type']}")

    header = path.read_text().split("\n\n", 1)[0]
    for command in ("ray up", "ray job submit", "ray down"):
        assert command in header, f"the header comment should show `{command}`"


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
@pytest.mark.parametrize("where,bad_key", [
    ("top", "max_worker"),          # for max_workers
    ("node_type", "min_worker"),    # for min_workers
    ("docker", "run_option"),       # for run_options
])
def test_a_misspelled_key_fails_validation(path, where, bad_key, no_network):
    import jsonschema

    raw = yaml.safe_load(path.read_text())
    bad = copy.deepcopy(raw)
    if where == "top":
        bad[bad_key] = bad.pop("max_workers")
    elif where == "node_type":
        gpu_type = next(t for t in bad["available_node_types"].values() if t["resources"].get("GPU"))
        gpu_type[bad_key] = gpu_type.pop("min_workers")
    else:
        bad["docker"][bad_key] = bad["docker"].pop("run_options")
    with pytest.raises(jsonschema.ValidationError, match=bad_key):
        _validate(bad)


# ---------------------------------------------------------------------------------------------- KubeRay manifests


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str) -> dict:
    found = [d for d in _docs(path) if d.get("kind") == kind]
    assert len(found) == 1, f"{path.name}: expected one {kind}, found {len(found)}"
    return found[0]


def _gpu_count(resources: dict) -> int:
    return int((resources or {}).get("limits", {}).get("nvidia.com/gpu", 0))


def raycluster_spec_problems(spec: dict, where: str = "spec") -> list[str]:
    """The fields KubeRay needs in a RayCluster spec (also a RayJob's rayClusterSpec); [] when all are there."""
    problems: list[str] = []

    def containers_problems(template: dict | None, at: str, need_gpu: bool) -> None:
        containers = ((template or {}).get("spec") or {}).get("containers") or []
        if not containers:
            problems.append(f"{at}.template.spec.containers: missing")
            return
        for i, c in enumerate(containers):
            if not c.get("name"):
                problems.append(f"{at}.template.spec.containers[{i}].name: missing")
            if not c.get("image"):
                problems.append(f"{at}.template.spec.containers[{i}].image: missing")
        resources = containers[0].get("resources") or {}
        if not resources.get("limits"):
            problems.append(f"{at}.template.spec.containers[0].resources.limits: missing")
        elif need_gpu and _gpu_count(resources) <= 0:
            problems.append(f"{at}.template.spec.containers[0].resources.limits: no nvidia.com/gpu")

    if not isinstance(spec, dict):
        return [f"{where}: missing"]
    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        problems.append(f"{where}.headGroupSpec: missing")
    else:
        if not isinstance(head.get("rayStartParams"), dict):
            problems.append(f"{where}.headGroupSpec.rayStartParams: missing")
        containers_problems(head.get("template"), f"{where}.headGroupSpec", need_gpu=False)
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        at = f"{where}.workerGroupSpecs[{i}]"
        for key in ("groupName", "replicas", "minReplicas", "maxReplicas"):
            if key not in group:
                problems.append(f"{at}.{key}: missing")
        if not isinstance(group.get("rayStartParams"), dict):
            problems.append(f"{at}.rayStartParams: missing")
        counts = [group.get(k) for k in ("minReplicas", "replicas", "maxReplicas")]
        if all(isinstance(n, int) for n in counts) and not counts[0] <= counts[1] <= counts[2]:
            problems.append(f"{at}: needs minReplicas <= replicas <= maxReplicas")
        is_gpu_group = "gpu" in str(group.get("groupName", "")).lower()
        containers_problems(group.get("template"), at, need_gpu=is_gpu_group)
    return problems


def _gpu_group(spec: dict) -> dict:
    groups = [g for g in spec["workerGroupSpecs"]
              if _gpu_count(g["template"]["spec"]["containers"][0].get("resources")) == GPUS_PER_NODE]
    assert groups, f"no worker group with {GPUS_PER_NODE} GPUs per pod"
    return groups[0]


def test_raycluster_manifest():
    cluster = _one(KUBERAY / "raycluster.yaml", "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["metadata"]["name"]
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert raycluster_spec_problems(spec) == []
    assert str(spec["headGroupSpec"]["rayStartParams"].get("num-gpus")) == "0", "the head is CPU-only"
    assert _gpu_group(spec)["maxReplicas"] >= 2


def test_rayjob_manifest():
    job = _one(KUBERAY / "rayjob.yaml", "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    match = re.search(r"\bshop-r1 (train|pipeline)\b.*--config\s+(\S*configs/cluster/(\S+\.yaml))", spec["entrypoint"])
    assert match, spec["entrypoint"]
    assert (CONFIGS / match.group(3)).is_file(), f"the entrypoint's config {match.group(2)} is not in configs/cluster"
    assert spec["shutdownAfterJobFinishes"] is True
    assert "rayClusterSpec" in spec or "clusterSelector" in spec
    if "rayClusterSpec" in spec:
        assert raycluster_spec_problems(spec["rayClusterSpec"], "spec.rayClusterSpec") == []
        nodes = NODES_OF_CONFIG[match.group(3)]
        gpu_group = _gpu_group(spec["rayClusterSpec"])
        assert gpu_group["maxReplicas"] >= gpu_group["replicas"] >= nodes


@pytest.mark.parametrize("path", [KUBERAY / "raycluster.yaml", KUBERAY / "rayjob.yaml"], ids=lambda p: p.name)
def test_kuberay_shared_volume_claim_is_read_write_many(path):
    docs = _docs(path)
    claims = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    ray_doc = next(d for d in docs if d.get("apiVersion") == "ray.io/v1")
    spec = ray_doc["spec"].get("rayClusterSpec", ray_doc["spec"])
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for template in templates:
        used = [v["persistentVolumeClaim"]["claimName"] for v in template["spec"].get("volumes", [])
                if "persistentVolumeClaim" in v]
        assert used and all(name in claims for name in used)
        mounts = [m["mountPath"] for m in template["spec"]["containers"][0].get("volumeMounts", [])]
        assert "/mnt/shared" in mounts
    assert all("ReadWriteMany" in c["spec"]["accessModes"] for c in claims.values())


def test_the_required_field_check_finds_what_is_missing():
    spec = copy.deepcopy(_one(KUBERAY / "raycluster.yaml", "RayCluster")["spec"])
    group = spec["workerGroupSpecs"][0]
    del group["replicas"]
    group["minReplicas"], group["maxReplicas"] = 3, 1
    del group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    del spec["headGroupSpec"]["rayStartParams"]
    del spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    problems = "\n".join(raycluster_spec_problems(spec))
    assert "workerGroupSpecs[0].replicas: missing" in problems
    assert "no nvidia.com/gpu" in problems
    assert "headGroupSpec.rayStartParams: missing" in problems
    assert "headGroupSpec.template.spec.containers[0].image: missing" in problems
    group["replicas"] = 2
    assert "minReplicas <= replicas <= maxReplicas" in "\n".join(raycluster_spec_problems(spec))


# ---------------------------------------------------------------------------------------------- shop-r1 configs


def test_the_cluster_configs_are_all_known():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == set(NODES_OF_CONFIG)


def _first_fit(bundles: list[dict[str, float]], nodes: int, node_cpus: float) -> bool:
    """Can these {GPU, CPU} bundles be placed on `nodes` GPU nodes (first fit, largest first)?"""
    free = [{"GPU": float(GPUS_PER_NODE), "CPU": node_cpus} for _ in range(nodes)]
    for b in sorted(bundles, key=lambda b: (b["GPU"], b["CPU"]), reverse=True):
        node = next((n for n in free if n["GPU"] >= b["GPU"] and n["CPU"] >= b["CPU"]), None)
        if node is None:
            return False
        node["GPU"] -= b["GPU"]
        node["CPU"] -= b["CPU"]
    return True


@pytest.mark.parametrize("name,nodes", sorted(NODES_OF_CONFIG.items()))
def test_cluster_config_loads_and_fits_the_gpus(name, nodes):
    cfg = load_config(CONFIGS / name, [])
    assert cfg.ray.address == "auto"
    assert cfg.run_dir.startswith("/mnt/shared/") and cfg.model.path.startswith("/mnt/shared/models/")
    assert "Qwen2.5-3B-Instruct" in cfg.model.path
    assert cfg.rollout.dtype == "bfloat16" and cfg.learner.dtype == "bfloat16"
    assert cfg.learner.zero_stage in (2, 3)

    rollout, learner = cfg.rollout, cfg.learner
    assert rollout.num_gpus_per_engine == rollout.tensor_parallel_size, "an engine holds its tensor-parallel GPUs"
    engine_gpus = rollout.num_engines * rollout.tensor_parallel_size
    learner_gpus = learner.num_ranks * learner.num_gpus_per_rank
    assert engine_gpus > 0 and learner_gpus > 0
    assert engine_gpus + learner_gpus <= GPUS_PER_NODE * nodes
    assert engine_gpus + learner_gpus == GPUS_PER_NODE * nodes, "every GPU of the nodes is used"
    assert rollout.tensor_parallel_size <= GPUS_PER_NODE and learner.num_gpus_per_rank <= GPUS_PER_NODE

    # Actor by actor on the GPU nodes the cluster files provide (CPUs of the smallest GPU worker definition).
    node_cpus = []
    for path in AUTOSCALER_YAMLS:
        raw = yaml.safe_load(path.read_text())
        for t in raw["available_node_types"].values():
            if t["resources"].get("GPU") == GPUS_PER_NODE:
                assert t["max_workers"] >= nodes, f"{path.name} cannot scale to {nodes} GPU nodes"
                node_cpus.append(t["resources"]["CPU"])
    kuberay_limits = _gpu_group(_one(KUBERAY / "raycluster.yaml", "RayCluster")["spec"])["template"]["spec"][
        "containers"][0]["resources"]["limits"]
    node_cpus.append(float(kuberay_limits["cpu"]))
    bundles = ([{"GPU": rollout.num_gpus_per_engine, "CPU": rollout.num_cpus_per_engine}] * rollout.num_engines
               + [{"GPU": learner.num_gpus_per_rank, "CPU": learner.num_cpus_per_rank}] * learner.num_ranks)
    assert _first_fit(bundles, nodes, min(node_cpus))
    if nodes > 1:
        assert not _first_fit(bundles, nodes - 1, min(node_cpus)), "the config would fit on fewer nodes"
