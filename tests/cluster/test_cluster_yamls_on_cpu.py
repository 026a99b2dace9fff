"""Cluster files: the Ray autoscaler YAMLs validate against Ray's own schema, the KubeRay manifests carry the fields
KubeRay requires, the shop-r1 cluster configs load and fit on the GPUs the clusters provide, and every cluster is
closed by default (token authentication, the dashboard on loopback, a firewall / NetworkPolicy that admits only the
cluster's own nodes, storage that is not world-writable, no token in the repository).

Offline and credential-free: `prepare_config` only merges the provider's defaults.yaml shipped in the `ray` package
(no boto3 / Google client import, no network), and the network is blocked while it runs to prove it.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import socket
import subprocess
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
TOKEN_FILE = "~/.ray/auth_token"
"""Where `ray get-auth-token --generate` writes the token locally, and where Ray looks for it by default on a node."""
POD_LABEL = "shop-r1/ray-cluster"
"""The pod-template label networkpolicy.yaml selects the Ray pods by."""


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
    assert set(raw["file_mounts"]) == {"~/shop-r1", TOKEN_FILE}

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


def rayjob_retry_problems(docs: list[dict]) -> list[str]:
    """What keeps a RayJob's retry from resuming; [] when it resumes. A retry runs the entrypoint again on a new
    RayCluster: it resumes only if the command continues a run (`shop-r1 pipeline` does by itself, `shop-r1 train`
    with --resume) and run_dir is on a volume claim that outlives the cluster, mounted where the driver runs (the
    head) and on every worker pod (learner ranks write checkpoint shards there)."""
    job = next(d for d in docs if d.get("kind") == "RayJob")
    spec, problems = job["spec"], []
    if not spec.get("backoffLimit", 0) >= 1:
        problems.append(f"spec.backoffLimit: {spec.get('backoffLimit', 0)}: a failed attempt is never retried")
    command = shlex.split(spec["entrypoint"])
    if command[:2] != ["shop-r1", "pipeline"] and not (command[:2] == ["shop-r1", "train"] and "--resume" in command):
        problems.append(f"spec.entrypoint: {' '.join(command[:2])} starts afresh on a retry (pipeline, or train "
                        "--resume, continue a run)")
    config = CONFIGS / Path(command[command.index("--config") + 1]).name
    run_dir = Path(load_config(config, [a for a in command[2:] if "=" in a and not a.startswith("-")]).run_dir)
    claims = {d["metadata"]["name"] for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    for role, template in _pod_templates(spec["rayClusterSpec"]):
        on_claims = {v["name"] for v in template["spec"].get("volumes", [])
                     if (v.get("persistentVolumeClaim") or {}).get("claimName") in claims}
        mounts = [m["mountPath"] for m in template["spec"]["containers"][0].get("volumeMounts", [])
                  if m["name"] in on_claims]
        if not any(run_dir.is_relative_to(m) for m in mounts):
            problems.append(f"{role}: run_dir {run_dir} is not on a mounted volume claim ({mounts}): a retry's new "
                            "cluster would not find the run")
    return problems


def test_a_rayjob_retry_resumes_the_run_from_the_shared_volume():
    docs = _docs(KUBERAY / "rayjob.yaml")
    assert rayjob_retry_problems(docs) == []
    assert "a retry resumes" in (KUBERAY / "rayjob.yaml").read_text().lower(), "the manifest says so"
    # The check finds each way a retry would start over.
    bad = copy.deepcopy(docs)
    job = next(d for d in bad if d.get("kind") == "RayJob")
    job["spec"]["backoffLimit"] = 0
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace("pipeline", "train") + " run_dir=/tmp/runs/x"
    problems = "\n".join(rayjob_retry_problems(bad))
    assert "backoffLimit: 0" in problems and "starts afresh" in problems
    assert "head: run_dir /tmp/runs/x is not on a mounted volume claim" in problems


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


# ---------------------------------------------------------------------------------------------- closed by default
# The dashboard is also the job-submission API: whoever reaches it runs code on every node. So every cluster file
# turns Ray's token authentication on, keeps the dashboard on loopback (reached through an SSH tunnel or
# `kubectl port-forward`), admits only the cluster's own nodes at the network level, and never makes storage
# world-writable; the token itself is made by the user or the operator and never written into the repository.

CLUSTER_FILES = sorted(p for p in CLUSTER.rglob("*") if p.is_file())
RAY_MANIFESTS = [KUBERAY / "raycluster.yaml", KUBERAY / "rayjob.yaml"]
DASHBOARD_OPEN_TO_PODS = {"rayjob.yaml"}
"""Manifests whose dashboard must listen on the pod IP: KubeRay's submitter pod submits the job and the operator polls
its status through the head Service. networkpolicy.yaml must then admit exactly those two (tested below)."""
DASHBOARD_HOST = re.compile(r"--dashboard-host[= ](\S+)")
NAMESPACE = "ml"
"""The namespace the tests place the Ray pods and the policies in (the manifests name none)."""


def _exported(shell: str) -> dict[str, str]:
    """The variables `export A=1 B=2` statements in `shell` set (unexpanded)."""
    env = {}
    for statement in re.findall(r"\bexport\s+([^;&|>]+)", shell):
        env.update(word.strip("'\"").split("=", 1) for word in statement.split() if "=" in word)
    return env


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
def test_autoscaler_yaml_starts_every_node_with_token_auth(path):
    raw = yaml.safe_load(path.read_text())
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in raw[key]
              if "ray start" in c]
    assert len(starts) == 2, starts
    for command in starts:
        env = _exported(command.split("ray start")[0])
        assert env.get("RAY_AUTH_MODE") == "token", command
        assert env.get("RAY_AUTH_TOKEN_PATH") == "$HOME/.ray/auth_token", command
    # The token travels from the user's machine (outside the checkout) to the path Ray reads on every node; setup
    # stops loudly without it and keeps it private; later shells (`ray exec`, `ray attach`) get token mode too.
    assert raw["file_mounts"][TOKEN_FILE] == TOKEN_FILE
    assert any("test -s ~/.ray/auth_token" in c and "chmod 600 ~/.ray/auth_token" in c and "exit 1" in c
               for c in raw["setup_commands"])
    assert any(_exported(c).get("RAY_AUTH_MODE") == "token" and ">> ~/.bashrc" in c for c in raw["setup_commands"])


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
def test_autoscaler_dashboard_listens_on_loopback_only(path):
    raw = yaml.safe_load(path.read_text())
    assert DASHBOARD_HOST.findall(" ".join(raw["head_start_ray_commands"])) == ["127.0.0.1"]
    commands = [c for key, value in raw.items() if key.endswith("_commands") for c in value]
    assert not any("0.0.0.0" in c for c in commands), "nothing may listen on every interface"
    assert "ray dashboard" in path.read_text().split("\n\n", 1)[0], "the header shows the SSH tunnel"


def test_aws_nodes_join_only_a_security_group_the_user_made():
    raw = yaml.safe_load((CLUSTER / "aws-a100.yaml").read_text())
    groups = {name: t["node_config"].get("SecurityGroupIds") for name, t in raw["available_node_types"].items()}
    # With SecurityGroupIds on every node type Ray makes no group of its own (Ray's own group would open SSH to
    # 0.0.0.0/0: ray/autoscaler/_private/aws/config.py, _create_default_ssh_inbound_rules). One group for all nodes:
    # its self-referencing rule is what lets the nodes reach each other.
    assert all(groups.values()) and len({tuple(g) for g in groups.values()}) == 1, groups
    assert "security_group" not in raw["provider"]
    readme = (CLUSTER / "README.md").read_text()
    assert "UserIdGroupPairs=[{GroupId=$SG}]" in readme and "--port 22" in readme, "README: how to make the group"


def test_gcp_nodes_sit_in_their_own_network_behind_tag_firewall_rules():
    raw = yaml.safe_load((CLUSTER / "gcp-a100.yaml").read_text())
    for name, node_type in raw["available_node_types"].items():
        node_config = node_type["node_config"]
        assert "shop-r1-ray" in node_config["tags"]["items"], name
        # Every node type names its interfaces, so Ray does not pick the project's `default` subnet for it.
        subnets = [i["subnetwork"] for i in node_config["networkInterfaces"]]
        assert subnets and all(s.endswith("/subnetworks/shop-r1-subnet") for s in subnets), name
    readme = (CLUSTER / "README.md").read_text()
    for flag in ("--source-tags=shop-r1-ray", "--target-tags=shop-r1-ray", "--rules=tcp:22", "--network=shop-r1-net"):
        assert flag in readme, f"README: the firewall rules ({flag})"


@pytest.mark.parametrize("path", AUTOSCALER_YAMLS, ids=lambda p: p.name)
def test_shared_storage_belongs_to_the_ray_user(path):
    init = "\n".join(yaml.safe_load(path.read_text())["initialization_commands"])
    assert re.search(r"chown 1000:100 /mnt/shared\b", init), "the container's ray user (uid 1000, gid 100)"
    assert re.search(r"chmod 2?7[75]0 /mnt/shared\b", init)


def test_no_cluster_file_makes_anything_world_accessible():
    for path in CLUSTER_FILES:
        text = path.read_text()
        assert "777" not in text and "a+rwx" not in text, path.name
        for mode in re.findall(r"\bchmod\s+(?:-R\s+)?(\S+)", text):
            if mode.isdigit():
                assert mode[-1] == "0", f"{path.name}: chmod {mode} gives other users access"
            else:  # symbolic: nothing granted to "o", "a" or no one named (which means all, less the umask)
                for clause in mode.split(","):
                    who, op = re.match(r"^([ugoa]*)([-+=]?)", clause).groups()
                    assert op == "-" or (who and not set(who) & {"o", "a"}), f"{path.name}: chmod {mode}"


def _ray_doc(path: Path) -> dict:
    return next(d for d in _docs(path) if d.get("apiVersion") == "ray.io/v1")


def _ray_spec(path: Path) -> dict:
    spec = _ray_doc(path)["spec"]
    return spec.get("rayClusterSpec", spec)


def _pod_templates(spec: dict) -> list[tuple[str, dict]]:
    """(ray.io/node-type, template) of the head and every worker group."""
    return [("head", spec["headGroupSpec"]["template"])] + [("worker", g["template"]) for g in spec["workerGroupSpecs"]]


@pytest.mark.parametrize("path", RAY_MANIFESTS, ids=lambda p: p.name)
def test_kuberay_cluster_has_token_auth_and_a_loopback_dashboard(path):
    spec = _ray_spec(path)
    # KubeRay >= 1.5.1 creates the token Secret and sets RAY_AUTH_MODE=token + RAY_AUTH_TOKEN on every Ray container.
    assert spec["authOptions"] == {"mode": "token"}
    assert tuple(int(n) for n in spec["rayVersion"].split(".")[:2]) >= (2, 52), "token auth needs Ray >= 2.52"
    host = spec["headGroupSpec"]["rayStartParams"]["dashboard-host"]
    # rayjob.yaml's exception is checked by test_only_the_rayjob_head_admits_its_submitter_and_the_operator.
    assert host == ("0.0.0.0" if path.name in DASHBOARD_OPEN_TO_PODS else "127.0.0.1"), host
    for role, template in _pod_templates(spec):
        for container in template["spec"]["containers"]:
            for env in container.get("env") or []:
                assert env["name"] != "RAY_AUTH_TOKEN" or "value" not in env, "the token comes from a Secret"
                assert env["name"] != "RAY_AUTH_MODE" or env.get("value") == "token"
        security = template["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000, role
        assert security["fsGroup"] == 100, f"{role}: the shared volume belongs to the ray user's group"


def _matches(selector: dict | None, labels: dict) -> bool:
    assert not (selector or {}).get("matchExpressions"), "this test reads matchLabels only"
    return all(labels.get(k) == v for k, v in ((selector or {}).get("matchLabels") or {}).items())


def _peer_matches(peer: dict, source: dict) -> bool:
    if "ipBlock" in peer:
        return True  # an address range: counted as open
    if "namespaceSelector" in peer:
        in_namespace = _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source["namespace"]})
    else:
        in_namespace = source["namespace"] == NAMESPACE  # a bare podSelector: the policy's own namespace
    return in_namespace and ("podSelector" not in peer or _matches(peer["podSelector"], source["labels"]))


def _admits(policies: list[dict], pod: dict, source: dict, port: int) -> bool:
    """Kubernetes' reading of NetworkPolicy: a pod that some Ingress policy selects takes only traffic that a rule of
    one of those policies admits (its peers and its ports; a missing list means all)."""
    selecting = [p["spec"] for p in policies if _matches(p["spec"]["podSelector"], pod["labels"])
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    return any((not rule.get("ports") or any(int(p["port"]) == port and p.get("protocol", "TCP") == "TCP"
                                             for p in rule["ports"]))
               and (not rule.get("from") or any(_peer_matches(peer, source) for peer in rule["from"]))
               for spec in selecting for rule in spec.get("ingress") or [])


def _pod(labels: dict, namespace: str = NAMESPACE) -> dict:
    return {"labels": labels, "namespace": namespace}


def _ray_pods(path: Path) -> dict[str, dict]:
    """The head and a worker pod as KubeRay labels them (template labels + ray.io/node-type + ray.io/cluster)."""
    return {role: _pod({**template["metadata"]["labels"], "ray.io/node-type": role, "ray.io/cluster": "generated"})
            for role, template in _pod_templates(_ray_spec(path))}


def test_networkpolicy_parses_and_selects_every_ray_pod():
    policies = _docs(KUBERAY / "networkpolicy.yaml")
    assert policies and all(p["apiVersion"] == "networking.k8s.io/v1" and p["kind"] == "NetworkPolicy"
                            and p["metadata"]["name"] and p["spec"]["policyTypes"] == ["Ingress"] for p in policies)
    for path in RAY_MANIFESTS:
        name = _ray_doc(path)["metadata"]["name"]
        for role, pod in _ray_pods(path).items():
            assert pod["labels"][POD_LABEL] == name, f"{path.name} {role}: label the pods {POD_LABEL}: {name}"
            assert any(_matches(p["spec"]["podSelector"], pod["labels"]) for p in policies), f"{path.name} {role}"


def test_networkpolicy_admits_only_the_clusters_own_pods():
    policies = _docs(KUBERAY / "networkpolicy.yaml")
    operator = _pod({"app.kubernetes.io/component": "kuberay-operator"}, namespace="default")
    for path in RAY_MANIFESTS:
        pods = _ray_pods(path)
        strangers = [_pod({"app": "notebook"}), _pod({POD_LABEL: "someone-else"}), _pod({}),
                     _pod(pods["worker"]["labels"], namespace="elsewhere")]  # the right labels, another namespace
        for role, pod in pods.items():
            for port in (6379, 8076, 8265, 10001, 29500, 52365):  # GCS, object manager, dashboard, client, NCCL, agent
                assert all(_admits(policies, pod, peer, port) for peer in pods.values()), (path.name, role, port)
                assert not any(_admits(policies, pod, peer, port) for peer in strangers), (path.name, role, port)
            assert not _admits(policies, pod, operator, 6379), (path.name, role)


def test_only_the_rayjob_head_admits_its_submitter_and_the_operator():
    policies = _docs(KUBERAY / "networkpolicy.yaml")
    job = _one(KUBERAY / "rayjob.yaml", "RayJob")
    assert job["spec"]["submissionMode"] == "K8sJobMode"  # the submitter is a Job named after the RayJob
    submitter = _pod({"batch.kubernetes.io/job-name": job["metadata"]["name"]})
    operator = _pod({"app.kubernetes.io/component": "kuberay-operator"}, namespace="default")
    lookalikes = [_pod({"batch.kubernetes.io/job-name": "another-job"}),
                  _pod({"app.kubernetes.io/component": "kuberay-operator"})]  # the operator's label, wrong namespace
    head = _ray_pods(KUBERAY / "rayjob.yaml")["head"]
    for peer in (submitter, operator):
        assert _admits(policies, head, peer, 8265) and not _admits(policies, head, peer, 6379)
    assert not any(_admits(policies, head, peer, 8265) for peer in lookalikes)
    others = [*_ray_pods(KUBERAY / "raycluster.yaml").values(), _ray_pods(KUBERAY / "rayjob.yaml")["worker"]]
    assert not any(_admits(policies, pod, peer, 8265) for pod in others for peer in (submitter, operator))


def test_no_token_is_written_into_the_repository():
    for path in [*CLUSTER_FILES, *sorted(CONFIGS.glob("*.yaml"))]:
        text = path.read_text()
        assert not re.search(r"\b[0-9a-fA-F]{32,}\b", text), f"{path.name}: a token-like hex string"
        for value in re.findall(r"\bRAY_AUTH_TOKEN\b\s*[=:]\s*(\S*)", text):
            assert value.startswith(("$", '"$')) or value == "", f"{path.name}: RAY_AUTH_TOKEN={value}"
    for path in AUTOSCALER_YAMLS + [CLUSTER / "runtime_env.yaml"]:  # their values, comments aside
        values = json.dumps(yaml.safe_load(path.read_text()))
        assert not re.search(r"\bRAY_AUTH_TOKEN\b", values), f"{path.name}: pass the token's path, not the token"
    try:
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked-files check needs git")
    names = [Path(line).name for line in tracked.stdout.splitlines()]
    assert not [n for n in names if n == "auth_token" or n.endswith(".token")]


def test_readme_shows_how_to_reach_a_closed_cluster():
    readme = (CLUSTER / "README.md").read_text()
    for needed in ("ray get-auth-token --generate", "export RAY_AUTH_MODE=token", "ray dashboard cluster/",
                   "kubectl port-forward", "kubectl apply -f cluster/kuberay/networkpolicy.yaml", "## Security"):
        assert needed in readme, needed


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
