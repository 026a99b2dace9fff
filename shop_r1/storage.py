"""Mirror a run folder to durable storage: a shared filesystem path or a bucket URI.

On a cluster, `run_dir` must be a path every node sees (NFS, EFS, Filestore, a PVC): learner ranks write their
DeepSpeed checkpoint shards there and the driver reads them back on `--resume`. `storage_uri` additionally copies
the whole run folder, from the driver, to any filesystem pyarrow speaks (`s3://bucket/prefix`, `gs://bucket/prefix`,
`hdfs://...`, `file:///path`) after every checkpoint and at the end of every stage, so that a lost cluster
loses nothing that was mirrored. Copies are whole-file and idempotent: a second mirror overwrites with the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class StorageError(RuntimeError):
    """A mirror to `storage_uri` failed; the local run folder is intact."""


@dataclass(frozen=True)
class MirrorResult:
    uri: str
    num_files: int
    num_bytes: int


def mirror_run(run_dir: str | Path, uri: str) -> MirrorResult:
    """Copy every file under `run_dir` to `uri` (same relative layout). Raises StorageError naming the URI."""
    import pyarrow
    import pyarrow.fs as pafs

    run = Path(run_dir)
    if not run.is_dir():
        raise StorageError(f"storage: run folder {run} does not exist; nothing to mirror to {uri}")
    files = [p for p in run.rglob("*") if p.is_file()]
    try:
        fs, root = pafs.FileSystem.from_uri(uri)
        fs.create_dir(root, recursive=True)
        pafs.copy_files(str(run.resolve()), root, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    except (OSError, ValueError, pyarrow.ArrowException) as e:
        raise StorageError(f"storage: mirroring {run} to {uri} failed: {e}") from e
    return MirrorResult(uri, len(files), sum(p.stat().st_size for p in files))


def mirror_or_warn(run_dir: str | Path, uri: str) -> MirrorResult | None:
    """Mid-run mirrors (after a checkpoint): a failure is printed and the run goes on; the next mirror retries."""
    if not uri:
        return None
    try:
        return mirror_run(run_dir, uri)
    except StorageError as e:
        print(f"WARNING: {e} (training continues; the run folder keeps everything)", flush=True)
        return None
