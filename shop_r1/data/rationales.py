"""`shop-r1 data rationales`: fill missing rationales with an OpenAI-compatible chat endpoint (paper Appendix D).

One request per step whose `rationale` is None (a per-session request with a JSON-list answer was rejected: a
model that drops, merges or reorders list items would misalign rationales with steps, and one bad item would
cost the whole session). The request shows the shopper's earlier actions, the page (simplified HTML cut to a
character budget) and the action taken, and asks for one first-person sentence; for `terminate` it says the
shopper found nothing they wanted and closed the window. Steps that already have a rationale are never touched.

Resume design. Each finished session is appended to `OUT.partial` as one line `{"index": i, "session": {...}}`,
in whatever order sessions finish (so one slow session does not hold back the writes of the others). A re-run
with the same input reads the partial file, checks every line against the input session at its index (same id,
steps, actions and given rationales; else it stops and names the line), skips those sessions, and cuts off a
torn last line (one with no newline: a kill mid-write). When every session is done, the whole output is written
in input order to `OUT` atomically (aside + rename), then `OUT.partial` is removed; a kill between the two leaves
both, and the re-run just finalizes again. So every input session appears exactly once, in input order.
A step that still fails after all retries stops new requests (queued ones are dropped; running ones finish and
their sessions are flushed); then `RationaleError` names every failed session/step, and the next run resumes.

The API key. It is sent only over https, or over http to this machine (localhost, 127.0.0.0/8, ::1): a key in
plain http to another host can be read by anyone on the path, so that is refused before any file or socket is
touched, unless `allow_insecure_http` (`--allow-insecure-http`) says the network is trusted (an SSH tunnel, a
private VPC). Plain http without a key is allowed: no secret travels (the prompts do; use https for sensitive
sessions). Redirects are not followed, so the key only ever goes to the URL given.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

from shop_r1.data.sessions import load_sessions, session_from_dict, write_sessions
from shop_r1.errors import DataError
from shop_r1.types import Session

PAGE_CHAR_BUDGET = 6000
"""Characters of a page's HTML shown in a request; the head of the page (search box, results) is kept."""
MAX_TOKENS = 128
TEMPERATURE = 0.7
BACKOFF_BASE_S = 0.25
"""First retry waits 0.125-0.25 s, doubling per attempt up to BACKOFF_CAP_S (equal jitter)."""
BACKOFF_CAP_S = 10.0
RETRY_AFTER_CAP_S = 60.0

INSTRUCTIONS = """\
You will see one moment of a customer's shopping journey on a very large online store: the actions they took \
before, the page they are looking at (simplified HTML) and the action they took on that page. Your job is to \
write the customer's rationale for that action: one short sentence, in the first person, saying what they were \
thinking when they did it. If the action is "terminate", the customer did not find any product they wanted and \
left the store by closing the browser window; explain that in their words. Answer with the sentence only.

Example of an action and a good answer:
Action taken: {"type": "click", "name": "refinements.brand.trailpeak"}
I only trust TrailPeak for hiking boots, so I want to see just their models."""


class RationaleError(RuntimeError):
    """Some steps got no rationale after every retry; `stats` describes the run up to the failure."""

    def __init__(self, message: str, stats: RationaleRunStats | None = None) -> None:
        super().__init__(message)
        self.stats = stats


@dataclass(frozen=True)
class RationaleRunStats:
    num_sessions: int
    """Sessions in the input."""
    num_steps_filled: int
    """Rationales written by this run's requests."""
    num_steps_already_had: int
    """Input steps that came with a rationale (kept as they were)."""
    num_requests: int
    """HTTP requests sent, retries included."""
    num_retries: int
    num_failed: int
    """Steps given up on after all retries (0 when the call returns; see RationaleError.stats)."""
    resumed_sessions: int
    """Sessions taken from a previous run's partial output."""


def build_messages(session: Session, index: int, page_char_budget: int = PAGE_CHAR_BUDGET) -> list[dict[str, str]]:
    """The chat request for step `index` of `session`: earlier actions, the page (cut to the budget), the action."""
    step = session.steps[index]
    history = "\n".join(f"{i + 1}. {json.dumps(s.action.to_dict(), ensure_ascii=False)}"
                        for i, s in enumerate(session.steps[:index]))
    page = step.observation
    if len(page) > page_char_budget:
        page = page[:page_char_budget] + f"\n<!-- {len(page) - page_char_budget} more characters cut -->"
    action = json.dumps(step.action.to_dict(), ensure_ascii=False)
    if step.action.type == "terminate":
        action += "\n(The customer found nothing they wanted and closed the browser window.)"
    user = (f"Earlier actions in this session, oldest first:\n{history or '(none: this is the first page)'}\n\n"
            f"Page the customer is looking at:\n{page}\n\nAction taken:\n{action}\n\n"
            "The customer's rationale for this action:")
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]


def clean_answer(text: str) -> str:
    """The rationale in a reply: unwraps a JSON object/string or code fence, drops a 'Rationale:' label and
    quotes, keeps the first non-empty line. An empty result means the reply had no usable rationale."""
    text = text.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    if text[:1] in '{"':
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("rationale"), str):
            text = obj["rationale"]
        elif isinstance(obj, str):
            text = obj
    text = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if text.lower().startswith("rationale:"):
        text = text[len("rationale:"):].strip()
    return text.strip("\"'“”").strip()


class _Transient(Exception):
    """Worth retrying: connection trouble, timeout, 429, 5xx or a malformed reply."""

    def __init__(self, reason: str, retry_after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


def is_loopback_host(host: str | None) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1): traffic to it never leaves this machine."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        return False


def check_key_transport(endpoint: str, has_key: bool, allow_insecure_http: bool = False) -> None:
    """ValueError naming `endpoint` and the flag when an API key would go over plain http to another machine."""
    parts = urllib.parse.urlsplit(endpoint)
    if has_key and parts.scheme == "http" and not is_loopback_host(parts.hostname) and not allow_insecure_http:
        raise ValueError(
            f"refusing to send the API key over plain http to {endpoint!r}: anyone on the network path can read it. "
            "Use an https:// endpoint, a loopback one (localhost, 127.0.0.1, ::1, e.g. through an SSH tunnel), or "
            "pass allow_insecure_http=True (--allow-insecure-http) if you trust the network. An endpoint that needs "
            "no key works over http once the key variable is unset.")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (HTTP 3xx, not retried): the Authorization header never follows one elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class _ChatClient:
    """Thread-safe caller of `{endpoint}/v1/chat/completions` with retries; counts requests and retries."""

    def __init__(self, endpoint: str, model: str, api_key: str | None, max_retries: int, timeout_s: float,
                 max_tokens: int, allow_insecure_http: bool = False) -> None:
        base = endpoint.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http(s) base URL such as http://127.0.0.1:8000, got {endpoint!r}")
        check_key_transport(endpoint, bool(api_key), allow_insecure_http)
        # Accept both the server root and the OpenAI-style base URL that already ends in /v1.
        self.url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self.model, self.max_retries, self.timeout_s, self.max_tokens = model, max_retries, timeout_s, max_tokens
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        # A proxy from the environment (http_proxy) must not capture a server on this machine.
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if is_loopback_host(urllib.parse.urlsplit(base).hostname):
            handlers.append(urllib.request.ProxyHandler({}))
        self._open = urllib.request.build_opener(*handlers).open
        self._lock = threading.Lock()
        self.requests = 0
        self.retries = 0

    def rationale(self, messages: list[dict[str, str]], where: str) -> str:
        """A cleaned, non-empty rationale, or RationaleError naming `where` and the last problem."""
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": self.max_tokens,
                           "temperature": TEMPERATURE, "n": 1}).encode()
        reason, retry_after_s = "", 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))
                time.sleep(max(delay / 2 + random.uniform(0, delay / 2), min(retry_after_s, RETRY_AFTER_CAP_S)))
            with self._lock:
                self.requests += 1
                self.retries += attempt > 0
            try:
                text = clean_answer(self._post(body, where))
            except _Transient as e:
                reason, retry_after_s = str(e), e.retry_after_s
                continue
            if text:
                return text
            reason, retry_after_s = "the reply held no rationale (empty after cleaning)", 0.0
        raise RationaleError(f"{where}: no rationale after {self.max_retries + 1} attempts (last: {reason})")

    def _post(self, body: bytes, where: str) -> str:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with self._open(request, timeout=self.timeout_s) as reply:
                raw = reply.read()
        except urllib.error.HTTPError as e:  # before URLError: HTTPError is one
            detail = _error_detail(e)
            if e.code == 429 or e.code >= 500:
                raise _Transient(f"HTTP {e.code}: {detail}", _retry_after_s(e.headers.get("Retry-After"))) from None
            # Other 4xx (bad key, unknown model, prompt too long) will not get better by asking again.
            raise RationaleError(f"{where}: {self.url} refused the request (HTTP {e.code}): {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # refused, reset, timeout
            raise _Transient(f"{type(e).__name__}: {e}") from None
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _Transient(f"malformed reply ({type(e).__name__}): {raw[:200]!r}") from None
        return content if isinstance(content, str) else ""


def _error_detail(error: urllib.error.HTTPError) -> str:
    """The start of an error reply's body (servers explain 4xx there), or '' if it cannot be read."""
    try:
        return error.read(500).decode("utf-8", "replace") if error.fp is not None else ""
    except (OSError, http.client.HTTPException):
        return ""


def _retry_after_s(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:  # the HTTP-date form: fall back to our own backoff
        return 0.0


def _check_resumed(got: Session, want: Session, where: str) -> None:
    """A partial-output session must be the input session with its missing rationales filled."""
    problem = ""
    if got.session_id != want.session_id:
        problem = f"session_id {got.session_id!r}, but the input has {want.session_id!r} there"
    elif len(got.steps) != len(want.steps):
        problem = f"{len(got.steps)} steps, but the input session has {len(want.steps)}"
    else:
        for i, (g, w) in enumerate(zip(got.steps, want.steps)):
            if (g.observation, g.action) != (w.observation, w.action):
                problem = f"step {i} differs from the input's page or action"
            elif w.rationale is not None and g.rationale != w.rationale:
                problem = f"step {i} changed the input's rationale"
            elif not g.rationale:
                problem = f"step {i} has no rationale"
            if problem:
                break
    if problem:
        raise DataError(f"{where}: {problem}; this partial output is not from this input — remove it or pass "
                         "overwrite=True (--overwrite)")


def _read_partial(path: Path, sessions: tuple[Session, ...]) -> dict[int, Session]:
    """Finished sessions by input index; a torn last line (no newline) is cut off the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    *lines, torn = data.split(b"\n")
    done: dict[int, Session] = {}
    for lineno, raw in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(raw)
        except ValueError as e:  # only the last line can be torn by a kill; this one ended cleanly
            raise DataError(f"{where}: damaged line ({e}); remove the file or pass overwrite=True") from None
        index = obj.get("index") if isinstance(obj, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(sessions) or index in done:
            raise DataError(f"{where}: index {index!r} is not a new position in the input's {len(sessions)} "
                             "sessions; remove the file or pass overwrite=True")
        got = session_from_dict(obj.get("session"), where)
        _check_resumed(got, sessions[index], where)
        done[index] = got
    if torn:
        with open(path, "r+b") as f:
            f.truncate(len(data) - len(torn))
    return done


def synthesize_rationales(sessions_path: str | Path, out_path: str | Path, endpoint: str, model: str,
                          api_key_env: str = "OPENAI_API_KEY", concurrency: int = 8, max_retries: int = 4,
                          timeout_s: float = 60.0, overwrite: bool = False, max_tokens: int = MAX_TOKENS,
                          page_char_budget: int = PAGE_CHAR_BUDGET,
                          allow_insecure_http: bool = False) -> RationaleRunStats:
    """Write `out_path`: the sessions of `sessions_path`, in order, with every missing rationale filled.

    Resumes from `out_path + ".partial"` (see the module docstring); `overwrite` discards it and replaces an
    existing `out_path`, which is otherwise refused (unless it is the input itself: filling in place is fine).
    `timeout_s` bounds each socket operation of a request. Raises RationaleError naming the failed steps.
    `allow_insecure_http` lets the key (from `$api_key_env`) go over plain http to a host other than this machine;
    without it that is a ValueError, raised before any file is read or written.
    """
    if concurrency < 1 or max_retries < 0 or timeout_s <= 0 or max_tokens < 1 or page_char_budget < 1:
        raise ValueError("need concurrency >= 1, max_retries >= 0, timeout_s > 0, max_tokens >= 1, "
                         f"page_char_budget >= 1; got {concurrency}, {max_retries}, {timeout_s}, {max_tokens}, "
                         f"{page_char_budget}")
    client = _ChatClient(endpoint, model, os.environ.get(api_key_env), max_retries, timeout_s, max_tokens,
                         allow_insecure_http)
    sessions = load_sessions(sessions_path).sessions
    out, partial = Path(out_path), Path(f"{out_path}.partial")
    if overwrite:
        partial.unlink(missing_ok=True)
    elif out.exists() and not partial.exists() and not out.samefile(sessions_path):
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    done = _read_partial(partial, sessions)
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(partial, "a", encoding="utf-8") as sink:
        def finish(index: int, session: Session) -> None:
            sink.write(json.dumps({"index": index, "session": session.to_dict()}, ensure_ascii=False) + "\n")
            sink.flush()  # a kill after this keeps the session
            done[index] = session

        todo = [i for i in range(len(sessions)) if i not in done]
        run = _fill(sessions, todo, client, concurrency, page_char_budget, finish)
    had = sum(st.rationale is not None for s in sessions for st in s.steps)
    stats = RationaleRunStats(len(sessions), run.filled, had, client.requests, client.retries, len(run.failures),
                              len(sessions) - len(todo))
    if run.failures:
        listed = "; ".join(run.failures[:5]) + (f"; and {len(run.failures) - 5} more" if len(run.failures) > 5 else "")
        raise RationaleError(f"{len(run.failures)} step(s) got no rationale: {listed}. {len(done)} of "
                             f"{len(sessions)} sessions are saved in {partial}; run the same command again to "
                             "resume", stats)
    write_sessions((done[i] for i in range(len(sessions))), out)
    partial.unlink()
    return stats


@dataclass(frozen=True)
class _FillResult:
    filled: int
    failures: list[str]


def _fill(sessions: tuple[Session, ...], todo: list[int], client: _ChatClient, concurrency: int,
          page_char_budget: int, finish: Callable[[int, Session], None]) -> _FillResult:
    """Request every missing rationale of the sessions `todo`, calling `finish(index, session)` as each completes.

    At most 2 x concurrency requests are queued (messages are built lazily, so a large input does not hold every
    prompt in memory). After the first failure nothing new is sent and queued requests are dropped; requests
    already running finish and their sessions are kept."""
    steps = {i: list(sessions[i].steps) for i in todo}
    left = {i: sum(st.rationale is None for st in sessions[i].steps) for i in todo}
    for i in todo:
        if not left[i]:
            finish(i, sessions[i])
    jobs = ((i, t) for i in todo for t, st in enumerate(sessions[i].steps) if st.rationale is None)
    in_flight: dict[Future, tuple[int, int]] = {}
    filled, failures = 0, []
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rationale")
    try:
        while True:
            while not failures and len(in_flight) < 2 * concurrency and (job := next(jobs, None)) is not None:
                i, t = job
                where = f"session {sessions[i].session_id!r} (#{i + 1} of the input) step {t}"
                messages = build_messages(sessions[i], t, page_char_budget)
                in_flight[pool.submit(client.rationale, messages, where)] = job
            if not in_flight:
                break
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                i, t = in_flight.pop(future)
                if future.cancelled():
                    continue
                try:
                    text = future.result()
                except RationaleError as e:
                    failures.append(str(e))
                    for queued in in_flight:  # FIFO: only requests sent after this one are still queued
                        queued.cancel()
                    continue
                steps[i][t] = replace(steps[i][t], rationale=text)
                filled += 1
                left[i] -= 1
                if not left[i]:
                    finish(i, Session(sessions[i].session_id, tuple(steps.pop(i)), sessions[i].persona))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on Ctrl-C: drop queued requests, let running ones end
    return _FillResult(filled, failures)
