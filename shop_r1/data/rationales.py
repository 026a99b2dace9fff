"""`shop-r1 data rationales`: fill missing rationales with an OpenAI-compatible chat endpoint (paper Appendix D).

One request per step that lacks a rationale: the model sees the shopper's earlier actions, the page (HTML cut to a
character budget) and the action taken, and answers with one first-person sentence. Steps that already have a
rationale are never touched.

Resume: finished sessions are appended, one JSON line each, to `OUT.partial` as they complete (in input order, so
the file is always a prefix of the result). A re-run with the same input skips the sessions already there (checking
their ids against the input) and drops a torn last line left by a kill. When every session is done, `OUT.partial` is
renamed to `OUT`. A step whose request still fails after all retries stops the run with an error naming the session
and step, after everything before it was flushed, so the next run resumes there.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from shop_r1.data.prompts import render_action
from shop_r1.data.sessions import load_sessions, session_from_dict
from shop_r1.types import Session

PAGE_CHAR_BUDGET = 6000
INSTRUCTIONS = (
    "You will see part of a customer's shopping journey on a large online store: what they did before, the page "
    "they are looking at (simplified HTML) and the action they took on it. Write the customer's rationale for that "
    "action: one short first-person sentence saying what they were thinking. If the action is \"terminate\", they "
    "found nothing they wanted and closed the browser window. Answer with the sentence only."
)


class RationaleError(RuntimeError):
    """A step's rationale could not be obtained after every retry."""


@dataclass(frozen=True)
class RationaleRunStats:
    num_sessions: int
    num_steps_filled: int
    num_steps_already_had: int
    num_requests: int
    num_retries: int
    resumed_sessions: int


def build_messages(session: Session, index: int) -> list[dict[str, str]]:
    step = session.steps[index]
    history = "\n".join(f"{i + 1}. {render_action(s.action, None)}" for i, s in enumerate(session.steps[:index]))
    page = step.observation if len(step.observation) <= PAGE_CHAR_BUDGET else \
        step.observation[:PAGE_CHAR_BUDGET] + "\n<!-- page cut -->"
    user = (f"Earlier actions:\n{history or '(none: this is the first page)'}\n\n"
            f"Current page:\n{page}\n\nAction taken:\n{render_action(step.action, None)}\n\nRationale:")
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]


def clean_answer(text: str) -> str:
    """Strip quotes, a JSON wrapper or a 'Rationale:' label the model may add; keep the first line."""
    text = text.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
            if isinstance(obj, dict) and isinstance(obj.get("rationale"), str):
                text = obj["rationale"]
        except json.JSONDecodeError:
            pass
    text = text.split("\n", 1)[0].strip()
    if text.lower().startswith("rationale:"):
        text = text[len("rationale:"):].strip()
    return text.strip('"').strip("'").strip()


class _Client:
    def __init__(self, endpoint: str, model: str, api_key: str | None, max_retries: int, timeout_s: float) -> None:
        self.url = endpoint.rstrip("/") + "/v1/chat/completions"
        self.model, self.api_key, self.max_retries, self.timeout_s = model, api_key, max_retries, timeout_s
        self.requests = 0
        self.retries = 0

    def ask(self, messages: list[dict[str, str]], where: str) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": 64, "temperature": 0.7}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.retries += 1
                time.sleep(min(8.0, 0.2 * 2 ** attempt) * (0.5 + random.random()))
            self.requests += 1
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    answer = json.loads(resp.read())["choices"][0]["message"]["content"] or ""
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
                if e.code != 429 and e.code < 500:
                    raise RationaleError(f"{where}: the endpoint refused the request ({last}): {e.read()[:200]!r}")
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, KeyError, IndexError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            cleaned = clean_answer(answer)
            if cleaned:
                return cleaned
            last = "empty answer"
        raise RationaleError(f"{where}: no rationale after {self.max_retries + 1} attempts (last: {last})")


def _read_partial(path: Path, sessions: tuple[Session, ...]) -> int:
    """How many leading sessions `path` already holds; a torn last line is cut off the file."""
    if not path.exists():
        return 0
    good_bytes, done = 0, 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn line")
                got = session_from_dict(json.loads(raw), f"{path}:{done + 1}")
            except ValueError:
                break
            if done >= len(sessions) or got.session_id != sessions[done].session_id:
                raise RationaleError(f"{path}: session {done + 1} is {got.session_id!r}, but the input has "
                                     f"{sessions[done].session_id if done < len(sessions) else 'no more sessions'!r} "
                                     "there; remove the partial file or use --overwrite")
            good_bytes += len(raw)
            done += 1
    with open(path, "r+b") as f:
        f.truncate(good_bytes)
    return done


def synthesize_rationales(sessions_path: str | Path, out_path: str | Path, endpoint: str, model: str,
                          api_key_env: str = "OPENAI_API_KEY", concurrency: int = 8, max_retries: int = 4,
                          timeout_s: float = 60.0, overwrite: bool = False) -> RationaleRunStats:
    sessions = load_sessions(sessions_path).sessions
    out, partial = Path(out_path), Path(str(out_path) + ".partial")
    if overwrite:
        partial.unlink(missing_ok=True)
    done = _read_partial(partial, sessions)
    client = _Client(endpoint, model, os.environ.get(api_key_env), max_retries, timeout_s)
    filled = had = 0
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool, open(partial, "a", encoding="utf-8") as f:
        for session in sessions[done:]:
            missing = [i for i, s in enumerate(session.steps) if s.rationale is None]
            had += len(session.steps) - len(missing)
            futures = {i: pool.submit(client.ask, build_messages(session, i), f"session {session.session_id} step {i}")
                       for i in missing}
            steps = list(session.steps)
            for i, fut in futures.items():
                steps[i] = replace(steps[i], rationale=fut.result())  # raises RationaleError after flushing earlier
            filled += len(missing)
            f.write(json.dumps(Session(session.session_id, tuple(steps)).to_dict(), ensure_ascii=False) + "\n")
            f.flush()
    os.replace(partial, out)
    return RationaleRunStats(len(sessions), filled, had, client.requests, client.retries, done)
