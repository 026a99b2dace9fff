"""Shared fixtures. Tests never reach a model hub: models are built in code."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402

# Tests that start Ray, vLLM or DeepSpeed, or build a model: everything under these folders, and any test that uses
# one of these fixtures. `pytest -m "not heavy"` is the quick inner loop (the pure layers, about a minute).
HEAVY_DIRS = ("distributed", "learner", "rollout", "weight_sync", "gpu", "benchmarks", "models")
HEAVY_FIXTURES = {"tiny_model_dir", "tiny_tokenizer", "ray_local_cluster"}


def pytest_collection_modifyitems(config, items):
    # The suite's longest tests first (marked `first`), the rest in the files' order: under `--dist worksteal` the
    # first worker starts with them beside the other's light tests, instead of one of them starting last and running
    # alone while the other worker idles (the pipeline-resume test was the last 3 minutes of a 2026-12-05 CI run).
    items.sort(key=lambda item: item.get_closest_marker("first") is None)  # stable: the files' order otherwise
    for item in items:
        parts = item.path.parts
        in_heavy_dir = "tests" in parts and parts[parts.index("tests") + 1] in HEAVY_DIRS
        if in_heavy_dir or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Qwen2 + tokenizer, built once per test run."""
    from shop_r1.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
