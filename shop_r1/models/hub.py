"""`model.path` as a Hugging Face model id (`Qwen/Qwen2.5-0.5B-Instruct`) as well as a folder.

An id is downloaded once, by the driver, into the run folder (`RUN_DIR/hub/ORG--NAME`), which on a cluster is the
shared filesystem every node reads: the actors are given that folder, never the id, so no engine or learner rank
reaches the hub. A finished download is marked and reused without the network. Offline (`HF_HUB_OFFLINE=1`, or no
route to the hub), the error names the id and says to pass a local folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from shop_r1.errors import UserError

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DONE = ".shop_r1_download_complete"


def is_hub_id(path: str) -> bool:
    """Not an existing path, and shaped like `org/name` (no leading `/`, `.` or `~`, one slash)."""
    return bool(path) and not Path(path).expanduser().exists() and bool(_ID.match(path))


def hub_dir(model_id: str, run_dir: str | Path) -> Path:
    return Path(run_dir) / "hub" / model_id.replace("/", "--")


def _offline_error(model_id: str, exc: Exception) -> UserError:
    return UserError(f"model.path={model_id}: no such folder, and as a Hugging Face model id it could not be "
                     f"downloaded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); on a "
                     "machine without the hub, download it elsewhere and pass the local folder as model.path")


def resolve_model_path(path: str, run_dir: str | Path) -> str:
    """`path` itself when it is a folder (or empty); for a hub id, the local folder it was downloaded into."""
    if not is_hub_id(path):
        if path and not Path(path).expanduser().exists():
            raise UserError(f"model.path={path}: no such folder (nor a Hugging Face id: ORG/NAME)")
        return path
    out = hub_dir(path, run_dir).resolve()
    if (out / DONE).exists():
        return str(out)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    if constants.HF_HUB_OFFLINE:  # offline, snapshot_download hands back whatever a killed download left there
        raise _offline_error(path, OfflineModeIsEnabled("HF_HUB_OFFLINE=1"))
    try:
        snapshot_download(repo_id=path, local_dir=str(out))
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as exc:
        raise _offline_error(path, exc) from exc
    missing = missing_files(out)
    if missing:  # a connection lost mid-way can still return the folder: marked complete only when it is
        raise _offline_error(path, FileNotFoundError(f"{out} lacks {', '.join(missing[:3])}"))
    (out / DONE).write_text(path + "\n")
    return str(out)


def missing_files(folder: Path) -> list[str]:
    """What a model folder needs and lacks: config.json, and its weights (every shard its index names)."""
    import json

    missing = [] if (folder / "config.json").exists() else ["config.json"]
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).exists():
            shards = sorted(set(json.loads((folder / index).read_text()).get("weight_map", {}).values()))
            return missing + [s for s in shards if not (folder / s).exists()]
    if not any((folder / w).exists() for w in ("model.safetensors", "pytorch_model.bin")):
        missing.append("model.safetensors")
    return missing


SMALL_FILES = ["config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "vocab.*",
               "merges.txt", "*.model", "chat_template*"]
"""What `--dry-run` fetches of a hub id: its shape and its tokenizer (the prompt budget), no weights."""


def hub_config(model_id: str) -> Path:
    """The id's config and tokenizer files, in the hub's own cache (not the run folder: a dry run writes nothing
    there); their folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(repo_id=model_id, allow_patterns=SMALL_FILES))
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as exc:
        raise _offline_error(model_id, exc) from exc
