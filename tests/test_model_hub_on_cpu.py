"""`model.path` as a Hugging Face id: downloaded once by the driver into RUN_DIR/hub, reused without the network, and
offline a one-line error that names the id (the test machine has no hub: HF_HUB_OFFLINE=1, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest

from shop_r1.errors import UserError
from shop_r1.models.hub import DONE, hub_dir, is_hub_id, resolve_model_path


def test_what_counts_as_a_hub_id(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not is_hub_id("") and not is_hub_id("/mnt/shared/models/x") and not is_hub_id("./models/x")
    assert not is_hub_id("a/b/c") and not is_hub_id("~/x") and not is_hub_id("model")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert not is_hub_id(str(tmp_path / "org" / "name")), "an existing folder is a folder"


def test_a_folder_is_itself_and_a_missing_one_is_named(tmp_path):
    assert resolve_model_path(str(tmp_path), tmp_path / "run") == str(tmp_path)
    assert resolve_model_path("", tmp_path / "run") == ""
    with pytest.raises(UserError, match=r"model.path=/no/such/model: no such folder"):
        resolve_model_path("/no/such/model", tmp_path / "run")


def test_offline_the_error_names_the_id_and_the_way_out(tmp_path):
    with pytest.raises(UserError) as err:
        resolve_model_path("no-such-org/no-such-model", tmp_path / "run")
    assert "model.path=no-such-org/no-such-model" in str(err.value)
    assert "pass the local folder as model.path" in str(err.value)
    assert not (hub_dir("no-such-org/no-such-model", tmp_path / "run") / DONE).exists()


def _fake_hub(monkeypatch, files):
    """snapshot_download online, writing `files` into local_dir; the calls it got."""
    calls = []

    def fake_snapshot_download(repo_id, local_dir, **kwargs):
        calls.append((repo_id, local_dir))
        for name in files:
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(local_dir) / name).write_text("{}")
        return local_dir

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    return calls


def test_a_download_that_returns_without_the_weights_is_not_marked_done(tmp_path, monkeypatch):
    _fake_hub(monkeypatch, ["config.json"])  # the connection dropped after the config
    with pytest.raises(UserError, match=r"lacks model.safetensors"):
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "run")
    assert not (hub_dir("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "run") / DONE).exists()


def test_an_id_is_downloaded_once_into_the_run_folder(tmp_path, monkeypatch):
    calls = _fake_hub(monkeypatch, ["config.json", "model.safetensors"])
    first = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "run")
    assert first == str(tmp_path / "run" / "hub" / "Qwen--Qwen2.5-0.5B-Instruct")
    assert calls == [("Qwen/Qwen2.5-0.5B-Instruct", first)]
    # The second time (a resumed run, another command on the same run folder): the folder, no hub call.
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "run") == first and len(calls) == 1
