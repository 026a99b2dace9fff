"""rollout.cpu_linear: what a CPU vLLM engine's linear layers compute from, and so what a weight update costs.

`onednn` (vLLM's own): when a layer's weight is loaded, vLLM's `dispatch_cpu_unquantized_gemm` repacks it into the
blocked layout of its CPU kernel (oneDNN, or sgl's for small matrices), drops the parameter, and the kernel reads the
packed copy. A weight update must repeat that repack for every linear layer and for the tied lm_head: on SmolLM2-135M
about 215 ms of one core per sync (134 ms for the linear layers, 82 ms for the lm_head; benchmarks/README.md
"Weight sync").

`torch`: the weight stays a plain parameter and `torch.nn.functional.linear` computes from it (torch's own GEMM), so
an in-place weight update is a copy into the parameter and the lm_head needs nothing after it. What it costs in
generation speed is measured beside what it saves in sync (benchmarks/README.md).

The switch takes effect while the engine builds its model (`plain_linear_layers`, around vLLM's `LLM(...)`): every
2-D linear layer dispatched inside the block is marked plain, and a layer once marked stays plain when vLLM's
layerwise reload processes it again later. Layers of engines built outside the block are vLLM's as before (the
engines of one process, e.g. the tests', may differ).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

PLAIN = "_shop_r1_plain_linear"
"""The attribute that marks a layer whose weight stays a plain parameter (F.linear computes from it)."""

_lock = threading.Lock()
_active = 0
"""How many `plain_linear_layers` blocks are open in this process (vLLM may build the model on another thread)."""


def is_plain(module: Any) -> bool:
    """True for a layer that computes with F.linear from its own weight parameter (`torch` mode)."""
    return bool(getattr(module, PLAIN, False))


def _install() -> None:
    """Wrap vLLM's CPU GEMM dispatch once per process (idempotent): plain inside `plain_linear_layers`, or for a layer
    already marked plain; vLLM's own otherwise."""
    try:
        from vllm.model_executor.layers import utils
    except ImportError as e:  # pragma: no cover - vLLM is a dependency of every engine
        raise RuntimeError(f"rollout.cpu_linear=torch needs vLLM's layers ({e})") from e
    with _lock:
        original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
        if original is None:
            raise RuntimeError("rollout.cpu_linear=torch: this vLLM has no model_executor.layers.utils."
                               "dispatch_cpu_unquantized_gemm to route the CPU linear layers through; use "
                               "rollout.cpu_linear=onednn")
        if getattr(original, PLAIN, False):
            return

        def dispatch(layer: Any, remove_weight: bool) -> None:
            weight = getattr(layer, "weight", None)
            plain = _active > 0 or is_plain(layer)
            if not plain or weight is None or weight.ndim != 2 or weight.is_meta:
                return original(layer, remove_weight)
            layer.cpu_linear = torch.nn.functional.linear  # (x, weight, bias), as vLLM's cpu_unquantized_gemm calls
            setattr(layer, PLAIN, True)

        setattr(dispatch, PLAIN, True)
        utils.dispatch_cpu_unquantized_gemm = dispatch


@contextlib.contextmanager
def plain_linear_layers(enabled: bool) -> Iterator[None]:
    """While the block is open, the CPU linear layers vLLM dispatches in this process keep their weight and use
    F.linear (build one engine at a time in it: another engine built meanwhile would be plain too)."""
    if not enabled:
        yield
        return
    global _active
    _install()
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
