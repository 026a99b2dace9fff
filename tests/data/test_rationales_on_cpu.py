"""Rationale synthesis: a real `vllm serve` of the tiny model (plumbing), and a scripted stdlib endpoint on
127.0.0.1 for retries (500, 429, empty and malformed replies), refusals, resume and torn partial lines."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from procs import stop_session

from shop_r1.data.rationales import (
    RationaleError,
    build_messages,
    check_key_transport,
    clean_answer,
    synthesize_rationales,
)
from shop_r1.data.sessions import load_sessions, write_sessions
from shop_r1.types import Action, Session, Step

MARK = re.compile(r"<!--(\S+?)/(\d+)-->")


def _sessions(n: int, prefix: str = "s") -> list[Session]:
    """Small shop sessions (search, open a product, buy or leave), every rationale given; pages ~2.5k chars."""
    out = []
    for k in range(n):
        item = ["mug", "lamp", "chair", "kettle"][k % 4]
        results = "".join(f'<div class="result"><a name="search_results.{item} {j}.view_product">Blue {item} {j}'
                          f'</a><span class="price">${10 + j}.99</span></div>' for j in range(20))
        pages = ['<html><body><input name="search_input"/><button name="search_button">Search</button></body></html>',
                 f"<html><body><main>{results}</main></body></html>",
                 f'<html><body><h1>Blue {item} 3</h1><button name="buy_now">Buy now</button></body></html>']
        actions = [Action("type_and_submit", "search_input", f"blue {item}"),
                   Action("click", f"search_results.{item} 3.view_product"),
                   Action("click", "buy_now") if k % 2 else Action("terminate")]
        if k % 3 == 2:  # some shoppers leave on the results page
            pages, actions = pages[:2], [actions[0], Action("terminate")]
        steps = tuple(Step(page, action, f"My reason {t} for the {item}.")
                      for t, (page, action) in enumerate(zip(pages, actions)))
        out.append(Session(f"{prefix}{k:03d}", steps))
    return out


def _sessions_with_gaps(n: int, prefix: str = "s") -> list[Session]:
    """Every even step's rationale removed; each page starts with a `<!--sid/step-->` mark so a test endpoint
    knows which step a request is for (the head of the page survives the char budget)."""
    return [Session(s.session_id, tuple(
        replace(st, observation=f"<!--{s.session_id}/{t}-->{st.observation}", rationale=None if t % 2 == 0
                else st.rationale) for t, st in enumerate(s.steps))) for s in _sessions(n, prefix)]


def _missing(sessions: list[Session]) -> set[tuple[str, int]]:
    return {(s.session_id, t) for s in sessions for t, st in enumerate(s.steps) if st.rationale is None}


def _assert_filled(before: list[Session], after: tuple[Session, ...]) -> None:
    assert [s.session_id for s in after] == [s.session_id for s in before]  # every session once, input order
    for b, a in zip(before, after):
        assert len(a.steps) == len(b.steps)
        for sb, sa in zip(b.steps, a.steps):
            assert (sa.observation, sa.action) == (sb.observation, sb.action)
            assert sa.rationale and sa.rationale.strip() == sa.rationale and "\n" not in sa.rationale
            if sb.rationale is not None:
                assert sa.rationale == sb.rationale  # given rationales are kept as they were


# ---------------------------------------------------------------- a real `vllm serve` of the tiny model

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One `vllm serve` for the module, on loopback; killed with its process group in teardown."""
    port, log = _free_port(), tmp_path_factory.mktemp("vllm") / "server.log"
    # The OpenAI server always runs its engine core in a subprocess; with multiprocessing off (=0) that process
    # also runs the model (uni executor) instead of spawning a worker process: measured 24 s to ready vs 43 s.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_HOST_IP": "127.0.0.1"}
    started = time.monotonic()
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir),
             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--enforce-eager", "--max-model-len", "4096", "--max-num-seqs", "8", "--disable-uvicorn-access-log"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() - started > 300:
                raise RuntimeError(f"vllm serve did not come up; log tail:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        print(f"\nvllm serve of the tiny model ready in {time.monotonic() - started:.1f} s")
        yield url
    finally:
        stop_session(proc, grace_s=30)


def test_fills_only_missing_rationales_through_vllm_serve(vllm_server, tmp_path):
    sessions = _sessions_with_gaps(3)
    write_sessions(sessions, tmp_path / "in.jsonl")
    stats = synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", vllm_server, "tiny",
                                  concurrency=4, max_retries=6, timeout_s=60, max_tokens=24, page_char_budget=1500)
    _assert_filled(sessions, load_sessions(tmp_path / "out.jsonl").sessions)
    num_steps = sum(len(s.steps) for s in sessions)
    assert stats.num_sessions == 3 and stats.num_steps_filled == len(_missing(sessions))
    assert stats.num_steps_already_had == num_steps - len(_missing(sessions))
    assert stats.num_requests == stats.num_steps_filled + stats.num_retries
    assert (stats.num_failed, stats.resumed_sessions) == (0, 0)
    assert not (tmp_path / "out.jsonl.partial").exists()


# ---------------------------------------------------------------- a scripted endpoint on loopback

class _Handler(BaseHTTPRequestHandler):
    endpoint: "_ScriptedEndpoint"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sid, step = MARK.search(body["messages"][1]["content"]).groups()
        status, content, headers = self.endpoint.answer(self.path, self.headers.get("Authorization"), (sid, int(step)))
        if content is None:
            payload = b"scripted failure"
        elif status == 200:
            payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        else:
            payload = content.encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class _ScriptedEndpoint:
    """`script(key, attempt)` -> (status, content, headers); records every request's key, path and auth."""

    def __init__(self, script):
        self.script, self.lock = script, threading.Lock()
        self.attempts: Counter = Counter()
        self.paths: set[str] = set()
        self.auth: set[str | None] = set()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Handler,), {"endpoint": self}))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path, auth, key):
        with self.lock:
            attempt = self.attempts[key]
            self.attempts[key] += 1
            self.paths.add(path)
            self.auth.add(auth)
        return self.script(key, attempt)


@pytest.fixture()
def scripted():
    """Start a scripted endpoint: `scripted(script)`; shut down after the test."""
    started = []

    def start(script):
        endpoint = _ScriptedEndpoint(script)
        threading.Thread(target=endpoint.server.serve_forever, args=(0.05,), daemon=True).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.server.shutdown()
        endpoint.server.server_close()


def _ok(key):
    return 200, f'Rationale: "I act on {key[0]} step {key[1]}."\nextra line', {}


def test_retries_500_429_empty_and_malformed_replies_and_keeps_answers_aligned(scripted, tmp_path, monkeypatch):
    failures = [(500, None, {}), (429, None, {"Retry-After": "0"}), (200, "  \n ", {}), (200, None, {}),
                (503, None, {})]  # (200, None): a 200 whose body is not JSON
    first_attempts = iter(range(10**6))  # the n-th first attempt fails the n-th way (mod 5): every way occurs
    sessions = _sessions_with_gaps(5)
    complete = _sessions(5)[3]  # a session with nothing to fill passes through as it is
    sessions[3] = Session(complete.session_id, tuple(replace(st, observation=f"<!--x-->{st.observation}")
                                                     for st in complete.steps))

    def script(key, attempt):
        if attempt == 0:
            return failures[next(first_attempts) % len(failures)]
        if key[0] == sessions[0].session_id:
            time.sleep(0.3)  # the first session finishes last: the output must still be in input order
        return _ok(key)

    endpoint = scripted(script)
    write_sessions(sessions, tmp_path / "in.jsonl")
    monkeypatch.setenv("SHOP_R1_TEST_KEY", "sekrit")
    stats = synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint.url + "/v1/", "m",
                                  api_key_env="SHOP_R1_TEST_KEY", concurrency=3, max_retries=2)
    out = load_sessions(tmp_path / "out.jsonl").sessions
    _assert_filled(sessions, out)
    missing = _missing(sessions)
    for s in out:  # each answer landed on the step it was asked for, despite concurrency and retries
        for t, st in enumerate(s.steps):
            if (s.session_id, t) in missing:
                assert st.rationale == f"I act on {s.session_id} step {t}."
    assert set(endpoint.attempts) == missing and set(endpoint.attempts.values()) == {2}
    assert (stats.num_requests, stats.num_retries, stats.num_steps_filled) == (2 * len(missing), len(missing),
                                                                              len(missing))
    assert endpoint.paths == {"/v1/chat/completions"} and endpoint.auth == {"Bearer sekrit"}


def test_refusal_fails_loudly_then_resume_skips_done_sessions_and_drops_a_torn_line(scripted, tmp_path):
    sessions = _sessions_with_gaps(6)
    poisoned = (sessions[2].session_id, 0)
    refuse = {"on": True}

    def script(key, attempt):
        if key == poisoned and refuse["on"]:
            return 400, "This model's maximum context length is 4096 tokens", {}
        return _ok(key)

    endpoint = scripted(script)
    write_sessions(sessions, tmp_path / "in.jsonl")
    args = (tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint.url, "m")
    expected = rf"session '{re.escape(poisoned[0])}' \(#3 of the input\) step 0: .*HTTP 400.*maximum context length"
    with pytest.raises(RationaleError, match=expected) as failed:
        synthesize_rationales(*args, concurrency=2, max_retries=3)
    assert failed.value.stats.num_failed == 1
    assert endpoint.attempts[poisoned] == 1  # a 4xx other than 429 is not retried
    assert not (tmp_path / "out.jsonl").exists()
    partial = tmp_path / "out.jsonl.partial"
    lines = partial.read_bytes().splitlines(keepends=True)
    saved = {json.loads(line)["index"] for line in lines}
    assert {0, 1} <= saved and 2 not in saved  # everything sent before the failure was flushed
    with open(partial, "ab") as f:
        f.write(lines[0][: len(lines[0]) // 2])  # a kill in the middle of a write

    with pytest.raises(RationaleError, match=expected) as failed_again:  # the torn line is cut, not resumed
        synthesize_rationales(*args, concurrency=2, max_retries=3)
    assert failed_again.value.stats.resumed_sessions == len(saved)
    lines = partial.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") and json.loads(line)["session"] for line in lines)  # no fragment merged in
    saved = {json.loads(line)["index"] for line in lines}

    refuse["on"] = False
    endpoint.attempts.clear()
    stats = synthesize_rationales(*args, concurrency=2, max_retries=3)
    _assert_filled(sessions, load_sessions(tmp_path / "out.jsonl").sessions)
    redo = {k for k in _missing(sessions) if k[0] not in {sessions[i].session_id for i in saved}}
    assert set(endpoint.attempts) == redo  # sessions already saved were not asked again
    assert (stats.resumed_sessions, stats.num_steps_filled) == (len(saved), len(redo))
    assert not partial.exists()


def test_partial_output_of_another_input_is_refused_and_overwrite_starts_over(scripted, tmp_path):
    endpoint = scripted(lambda key, attempt: _ok(key))
    sessions = _sessions_with_gaps(2)
    write_sessions(sessions, tmp_path / "in.jsonl")
    other = _sessions_with_gaps(1, prefix="other")[0]
    filled = Session(other.session_id, tuple(replace(st, rationale="x") for st in other.steps))
    partial = tmp_path / "out.jsonl.partial"
    partial.write_text(json.dumps({"index": 0, "session": filled.to_dict()}) + "\n")
    args = (tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint.url, "m")
    mismatch = rf"out.jsonl.partial:1: session_id '{re.escape(other.session_id)}'.*overwrite"
    with pytest.raises(ValueError, match=mismatch):
        synthesize_rationales(*args)
    partial.write_text('{"index": 0, "sess\n{"index": 1}\n')  # damage before the last line is not a torn write
    with pytest.raises(ValueError, match="out.jsonl.partial:1: damaged line"):
        synthesize_rationales(*args)
    stats = synthesize_rationales(*args, overwrite=True)
    assert stats.resumed_sessions == 0 and not partial.exists()
    _assert_filled(sessions, load_sessions(tmp_path / "out.jsonl").sessions)
    with pytest.raises(FileExistsError, match="overwrite"):  # a finished output is not silently replaced
        synthesize_rationales(*args)
    in_place = synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "in.jsonl", endpoint.url, "m")
    assert in_place.num_steps_filled == len(_missing(sessions))
    _assert_filled(sessions, load_sessions(tmp_path / "in.jsonl").sessions)


def test_unreachable_endpoint_is_retried_then_names_the_step(tmp_path):
    sessions = _sessions_with_gaps(1)
    write_sessions(sessions, tmp_path / "in.jsonl")
    expected = rf"session '{re.escape(sessions[0].session_id)}' \(#1 of the input\) step \d: no rationale after 2 "
    with pytest.raises(RationaleError, match=expected + r"attempts \(last: URLError") as failed:
        synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", f"http://127.0.0.1:{_free_port()}",
                              "m", concurrency=1, max_retries=1, timeout_s=5)
    stats = failed.value.stats
    assert stats.num_failed >= 1 and stats.num_requests == 2 * stats.num_failed
    assert (tmp_path / "out.jsonl.partial").read_text() == "" and not (tmp_path / "out.jsonl").exists()


# ---------------------------------------------------------------- where the API key may go

def _no_network(monkeypatch) -> list:
    """Every outgoing connection is recorded and refused; no proxy from the environment is in the way."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    tried = []

    def refuse(address, *args, **kwargs):
        tried.append(address)
        raise OSError("network access is not allowed in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    return tried


def test_a_key_over_plain_http_to_another_host_is_refused_before_anything_happens(tmp_path, monkeypatch):
    tried = _no_network(monkeypatch)
    monkeypatch.setenv("SHOP_R1_TEST_KEY", "sekrit")
    write_sessions(_sessions_with_gaps(1), tmp_path / "in.jsonl")
    (tmp_path / "out.jsonl.partial").write_text("")  # overwrite=True must not have removed it either
    for endpoint in ("http://rationales.example:8000", "http://10.0.0.7:8000/v1", "http://[2001:db8::1]:8000"):
        with pytest.raises(ValueError, match=rf"plain http to '{re.escape(endpoint)}'.*--allow-insecure-http"):
            synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint, "m",
                                  api_key_env="SHOP_R1_TEST_KEY", overwrite=True)
    assert tried == [] and (tmp_path / "out.jsonl.partial").exists() and not (tmp_path / "out.jsonl").exists()


def test_a_key_over_plain_http_to_this_machine_is_sent(scripted, tmp_path, monkeypatch):
    endpoint = scripted(lambda key, attempt: _ok(key))
    sessions = _sessions_with_gaps(1)
    write_sessions(sessions, tmp_path / "in.jsonl")
    monkeypatch.setenv("SHOP_R1_TEST_KEY", "sekrit")
    synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint.url, "m",
                          api_key_env="SHOP_R1_TEST_KEY")
    assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.auth == {"Bearer sekrit"}
    _assert_filled(sessions, load_sessions(tmp_path / "out.jsonl").sessions)


@pytest.mark.parametrize("endpoint,has_key,allow,refused", [
    ("http://rationales.example:8000", True, False, True),    # the key in clear text across the network
    ("http://rationales.example:8000", True, True, False),    # ... unless the user says the network is trusted
    ("http://rationales.example:8000", False, False, False),  # no key: nothing secret is sent
    ("https://rationales.example", True, False, False),       # TLS
    ("http://127.0.0.1:8000", True, False, False),            # loopback never leaves the machine
    ("http://127.8.9.1:8000", True, False, False),
    ("http://localhost:8000/v1", True, False, False),
    ("http://LOCALHOST:8000", True, False, False),
    ("http://[::1]:8000", True, False, False),
    ("http://localhost.rationales.example", True, False, True),  # a name that only starts like localhost
    ("http://127.0.0.1.rationales.example", True, False, True),
    ("http://0.0.0.0:8000", True, False, True),               # not loopback: "this host" on some systems, any on others
])
def test_which_endpoints_may_receive_a_key(endpoint, has_key, allow, refused):
    if refused:
        with pytest.raises(ValueError, match=re.escape(endpoint)):
            check_key_transport(endpoint, has_key, allow)
    else:
        check_key_transport(endpoint, has_key, allow)


def test_allow_insecure_http_lets_the_request_go_out(tmp_path, monkeypatch):
    tried = _no_network(monkeypatch)
    monkeypatch.setenv("SHOP_R1_TEST_KEY", "sekrit")
    write_sessions(_sessions_with_gaps(1), tmp_path / "in.jsonl")
    with pytest.raises(RationaleError, match="URLError"):  # it got as far as connecting (refused by the test)
        synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "http://rationales.example:8000", "m",
                              api_key_env="SHOP_R1_TEST_KEY", max_retries=0, concurrency=1,
                              allow_insecure_http=True)
    assert tried and all(address == ("rationales.example", 8000) for address in tried)


def test_a_redirect_is_not_followed_with_the_key(scripted, tmp_path, monkeypatch):
    elsewhere = scripted(lambda key, attempt: _ok(key))
    endpoint = scripted(lambda key, attempt: (307, "moved", {"Location": elsewhere.url + "/v1/chat/completions"}))
    write_sessions(_sessions_with_gaps(1), tmp_path / "in.jsonl")
    monkeypatch.setenv("SHOP_R1_TEST_KEY", "sekrit")
    with pytest.raises(RationaleError, match="HTTP 307"):
        synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", endpoint.url, "m",
                              api_key_env="SHOP_R1_TEST_KEY", concurrency=1)
    assert endpoint.auth == {"Bearer sekrit"} and not elsewhere.attempts  # the key went nowhere else


# ---------------------------------------------------------------- the request and the answer

def test_build_messages_shows_history_cut_page_and_action():
    steps = (Step("<html>home</html>", Action("type_and_submit", "search_input", "red mug")),
             Step("<html>" + "r" * 500 + "</html>", Action("click", "search_results.Red Mug.view_product")),
             Step("<html>product</html>", Action("terminate")))
    session = Session("s1", steps)
    first = build_messages(session, 0)[1]["content"]
    assert "(none: this is the first page)" in first and '"text": "red mug"' in first
    cut = build_messages(session, 1, page_char_budget=100)[1]["content"]
    assert "<html>" + "r" * 94 + "\n<!-- 413 more characters cut -->" in cut  # 513 chars, 100 kept
    assert '1. {"type": "type_and_submit", "name": "search_input", "text": "red mug"}' in cut
    system, last = build_messages(session, 2)
    assert system["role"] == "system" and "closing the browser window" in system["content"]
    assert '2. {"type": "click"' in last["content"] and "closed the browser window" in last["content"]


def test_clean_answer():
    assert clean_answer('  "I want it."  ') == "I want it."
    assert clean_answer('{"rationale": "From JSON."}') == "From JSON."
    assert clean_answer('```json\n{"rationale": "Fenced."}\n```') == "Fenced."
    assert clean_answer("Rationale: I like it.\nMore text") == "I like it."
    assert clean_answer("\n\n  first real line \nsecond") == "first real line"
    assert clean_answer("{not json at all") == "{not json at all"
    assert clean_answer("   ") == "" and clean_answer('""') == ""
