"""The learner seam. Backend: `DeepSpeedLearner` (ZeRO 0-3; gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

from shop_r1.learner.sft_data import MicroBatch


class Learner(Protocol):
    def sft_step(self, micro_batches: Sequence[MicroBatch], num_loss_tokens_global: int) -> Any: ...

    def eval_loss(self, micro_batches: Sequence[MicroBatch]) -> float: ...

    def save_hf(self, out_dir: str) -> None: ...

    def save_checkpoint(self, ckpt_dir: str, client_state: dict) -> None: ...

    def load_checkpoint(self, ckpt_dir: str) -> dict: ...

    def named_weights(self) -> Iterator[tuple[str, Any]]: ...
