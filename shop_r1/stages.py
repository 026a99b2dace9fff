"""The pipeline's stage ledger: which stages of a run folder are finished, for which config and inputs.

    RUN/stages.json   {stage: {"key": sha256, "status": "started" | "done", "outputs": {...}, "time": ...}}

A stage's key hashes its slice of the config (the keys that change what it produces), fingerprints of the files it
reads from outside the run, and the keys of the stages it consumes, so a change upstream re-runs everything below it.
`Ledger.run(name, key, fn)`:

    recorded "done" with the same key      -> skipped (said so); its recorded outputs are returned
    recorded "started" with the same key   -> fn(resume=True): the stage continues from its own checkpoints
    anything else                          -> fn(resume=False): done afresh

The file is replaced atomically (written aside, fsynced, renamed: shop_r1/atomic.py) after every change, so a kill
leaves either the old or the new ledger, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shop_r1.atomic import write_atomic

LEDGER_FILE = "stages.json"


def stage_key(name: str, config_slice: Mapping[str, Any], upstream: Iterable[str] = (),
              inputs: Mapping[str, str] | None = None) -> str:
    """sha256 over the stage's name, config slice (dotted key -> value), upstream keys and input fingerprints."""
    blob = json.dumps({"stage": name, "config": dict(sorted(config_slice.items())), "upstream": list(upstream),
                       "inputs": dict(sorted((inputs or {}).items()))}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative name and bytes, in name order)."""
    path, digest = Path(path), hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{path}: no file to fingerprint (a stage input must exist)")
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode() + b"\0")
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass
class Ledger:
    path: Path
    records: dict[str, dict[str, Any]]

    @classmethod
    def open(cls, run_dir: str | Path) -> Ledger:
        path = Path(run_dir) / LEDGER_FILE
        if not path.exists():
            return cls(path, {})
        try:
            records = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a stage ledger ({e}); move it away to run every stage afresh") from e
        if not isinstance(records, dict):
            raise ValueError(f"{path}: not a stage ledger (expected an object of stages)")
        return cls(path, records)

    def run(self, name: str, key: str, fn: Callable[[bool], Mapping[str, Any]]) -> dict[str, Any]:
        record = self.records.get(name, {})
        if record.get("key") == key and record.get("status") == "done":
            print(f"  {name}: finished before with this config and these inputs; skipped ({self.path})", flush=True)
            return dict(record["outputs"])
        resume = record.get("key") == key and record.get("status") == "started"
        if resume:
            print(f"  {name}: started before with this config and these inputs; continuing from its checkpoints",
                  flush=True)
        self._write(name, {"key": key, "status": "started", "time": time.time()})
        outputs = dict(fn(resume))
        self._write(name, {"key": key, "status": "done", "outputs": outputs, "time": time.time()})
        return outputs

    def _write(self, name: str, record: dict[str, Any]) -> None:
        self.records[name] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.records, indent=2, default=str))
