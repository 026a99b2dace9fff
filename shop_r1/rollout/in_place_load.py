"""Loading a weight update straight into a vLLM model's parameters, skipping vLLM's layerwise reload.

vLLM's `reload_weights` rebuilds every layer around the incoming tensors (materialise the layer's parameters, run the
model's `load_weights` to fuse q/k/v and gate/up, process them after loading; on CPU the linear weights are then
repacked for oneDNN): several passes over the bytes. Where the model's layout allows, this path does one: each
incoming tensor (or run of tensors vLLM fuses, sent adjacent by the learner: `make_manifest(..., fuse=True)`) goes
to its parameter as it arrives. A fused parameter's parts that lie end to end in the receive buffer are used as one
view, without a copy. What each kind of parameter needs:

- a linear layer's weight on CPU: vLLM's CPU kernels read a repacked copy, not the parameter, so the layer's own
  `process_weights_after_loading` runs on the new weight (one pass, the repack itself, which copies: the receive
  buffer is free again afterwards; a kernel that keeps the weight gets a copy of it); with rollout.cpu_linear=torch
  the layer computes from its parameter, which takes a copy like any other;
- everything else (a linear weight on GPU, biases, norms, the embedding): copied into the parameter in place; an
  embedding padded to a multiple of 64 rows takes the sent rows first.
The lm_head's repack (tied to the embedding or not) is the caller's (`WeightLoaderExtension`): as soon as its weight
has been copied (`copied`), so that it runs while the rest of the stream is still on the wire.

The layout allows it when `in_place_plan` finds no reason against it: one tensor-parallel rank, no quantisation, the
model fuses only what `PACKED_MODULES` says, and every sent name has a parameter of its shape. Otherwise the caller
uses vLLM's layerwise reload (rollout.weight_load=auto) or refuses (in_place).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shop_r1.rollout.cpu_linear import is_plain
from shop_r1.weight_sync.broadcast import PACKED_MODULES, fused_target


@dataclass(frozen=True)
class Target:
    """Where one incoming parameter (a sent tensor, or the run of parts vLLM fuses) goes."""

    module: str
    attr: str
    parts: tuple[str, ...]
    """The sent names, in fused order (one name when nothing is fused)."""
    linear_weight: bool


def _unquantized(module: Any) -> bool:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    return isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod)


def in_place_plan(model: Any, names: Sequence[str], tp_size: int = 1) -> tuple[list[Target] | None, str]:
    """The targets of `names` (in the order the stream brings them) in `model`, or None and the reason the
    layout does not allow loading in place."""
    from vllm.model_executor.layers.linear import LinearBase

    if tp_size != 1:
        return None, f"tensor parallelism ({tp_size} ranks): each rank holds a slice"
    mapping = {k: tuple(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}
    unknown = {k: v for k, v in mapping.items() if PACKED_MODULES.get(k) != v}
    if unknown:
        return None, f"the model fuses {unknown}, which the sender does not lay out"
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, LinearBase) and not _unquantized(module):
            return None, f"{name} is quantised ({type(module.quant_method).__name__})"
    targets: list[Target] = []
    i = 0
    while i < len(names):
        name = names[i]
        fused = fused_target(name)
        if fused is not None and fused[0].rpartition(".")[0] in modules:
            module_name, _, attr = fused[0].rpartition(".")
            parts = PACKED_MODULES[module_name.rpartition(".")[2]]
            want = [f"{module_name.rpartition('.')[0]}.{p}.{attr}".lstrip(".") for p in parts]
            got = list(names[i:i + len(want)])
            if got != want:
                return None, f"{module_name}.{attr}: its parts arrive as {got}, not {want} in a row"
        else:
            module_name, _, attr = name.rpartition(".")
            want = [name]
        module = modules.get(module_name)
        if module is None or not isinstance(getattr(module, attr, None), torch.nn.Parameter):
            return None, f"{name}: the engine's model has no parameter {module_name}.{attr}"
        targets.append(Target(module_name, attr, tuple(want), isinstance(module, LinearBase) and attr == "weight"))
        i += len(want)
    return targets, ""


def _fused(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The parts concatenated by rows: a view when they lie end to end in one buffer, else a copy."""
    if len(tensors) == 1:
        return tensors[0]
    first = tensors[0]
    end = first.data_ptr()
    adjacent = True
    for t in tensors:
        adjacent &= (t.is_contiguous() and t.dtype == first.dtype and t.shape[1:] == first.shape[1:]
                     and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() and t.data_ptr() == end)
        end = t.data_ptr() + t.numel() * t.element_size()
    if not adjacent:
        return torch.cat(tensors)
    rows = sum(t.shape[0] for t in tensors)
    shape = (rows, *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride())


def _check_shape(where: str, have: tuple[int, ...], sent: tuple[int, ...], padded_rows: bool) -> None:
    ok = have == sent or (padded_rows and len(have) == len(sent) and have[1:] == sent[1:] and have[0] >= sent[0])
    if not ok:
        raise RuntimeError(f"in-place weight load: {where} is {have} in the engine, {sent} sent")


def _load_linear_weight(module: Any, where: str, weight: torch.Tensor) -> None:
    shape = (module.output_size_per_partition, module.input_size_per_partition)
    _check_shape(where, shape, tuple(weight.shape), padded_rows=False)
    param = module.weight
    if hasattr(module, "cpu_linear") and not is_plain(module):  # vLLM's CPU kernels read a repacked copy: repack
        module.weight = torch.nn.Parameter(weight.to(param.dtype), requires_grad=False)
        module.quant_method.process_weights_after_loading(module)
        if module.weight.numel() and module.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr():
            module.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)  # the kernel keeps the weight
        return
    with torch.no_grad():
        param.data.copy_(weight)


def load_in_place(model: Any, targets: Sequence[Target], tensors: Iterable[tuple[str, torch.Tensor]],
                  copied: Callable[[torch.nn.Parameter], None] | None = None) -> None:
    """Load the stream (names in `targets`' order) into `model`'s parameters; consumes the whole stream. `copied`
    is called with each parameter copied in place (not a linear weight) as soon as it holds its new values, before
    the stream goes on: the caller repacks the tied lm_head there, while the next bucket is on the wire."""
    modules = dict(model.named_modules())
    stream = iter(tensors)
    for target in targets:
        parts = []
        for want in target.parts:
            name, tensor = next(stream)
            if name != want:
                raise RuntimeError(f"in-place weight load: expected {want}, got {name}")
            parts.append(tensor)
        where = f"{target.module}.{target.attr}"
        value = _fused(parts)
        module = modules[target.module]
        if target.linear_weight:
            _load_linear_weight(module, where, value)
            continue
        param = getattr(module, target.attr)
        _check_shape(where, tuple(param.shape), tuple(value.shape), padded_rows=True)
        with torch.no_grad():
            param.data[:value.shape[0]].copy_(value)
        if copied is not None:
            copied(param)
    leftover = next(stream, None)
    if leftover is not None:
        raise RuntimeError(f"in-place weight load: {leftover[0]} was sent but is not in the plan")
