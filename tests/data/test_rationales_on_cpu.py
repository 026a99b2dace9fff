"""Rationale synthesis against a real `vllm serve` of the tiny model (plumbing, retries, resume)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shop_r1.data.rationales import RationaleError, clean_answer, synthesize_rationales
from shop_r1.data.sessions import load_sessions, write_sessions
from shop_r1.data.synth import synthesize_sessions
from shop_r1.types import Session


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sessions_with_gaps(n: int) -> list[Session]:
    """Synthetic sessions with every other rationale removed."""
    from dataclasses import replace

    out = []
    for s in synthesize_sessions(n, seed=2):
        steps = tuple(replace(st, rationale=None) if i % 2 == 0 else st for i, st in enumerate(s.steps))
        out.append(Session(s.session_id, steps))
    return out


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir):
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--enforce-eager", "--max-model-len", "4096"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("vllm serve did not come up")
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_fills_only_missing_rationales_in_order(vllm_server, tmp_path):
    sessions = _sessions_with_gaps(3)
    write_sessions(sessions, tmp_path / "in.jsonl")
    stats = synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", vllm_server, "tiny",
                                  concurrency=4, max_retries=6, timeout_s=60)
    out = load_sessions(tmp_path / "out.jsonl").sessions
    assert [s.session_id for s in out] == [s.session_id for s in sessions]
    missing = sum(st.rationale is None for s in sessions for st in s.steps)
    assert stats.num_steps_filled == missing and stats.num_sessions == 3
    for before, after in zip(sessions, out):
        for a, b in zip(before.steps, after.steps):
            assert b.rationale  # every step has one now
            if a.rationale is not None:
                assert b.rationale == a.rationale  # existing ones untouched
            assert (a.observation, a.action) == (b.observation, b.action)
    assert not (tmp_path / "out.jsonl.partial").exists()


class _Flaky(BaseHTTPRequestHandler):
    """Answers 500 and 429 before succeeding; refuses (400) requests for a poisoned session."""

    calls = {"n": 0}
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.calls["n"] += 1
            n = self.calls["n"]
        if "POISON" in body["messages"][1]["content"]:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b"bad request")
            return
        if n % 3 == 1:
            self.send_response(500 if n % 2 else 429)
            self.end_headers()
            return
        payload = json.dumps({"choices": [{"message": {"content": '"I chose this on purpose."'}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def flaky_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_retries_then_resumes_after_a_failure_and_a_torn_line(flaky_server, tmp_path):
    from dataclasses import replace

    sessions = _sessions_with_gaps(4)
    poisoned = list(sessions)
    first = poisoned[2].steps[0]
    poisoned[2] = Session(poisoned[2].session_id,
                          (replace(first, observation=first.observation + "POISON"),) + poisoned[2].steps[1:])
    write_sessions(poisoned, tmp_path / "in.jsonl")
    with pytest.raises(RationaleError, match=rf"session {poisoned[2].session_id} step 0"):
        synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", flaky_server, "m", concurrency=2,
                              max_retries=3)
    partial = tmp_path / "out.jsonl.partial"
    assert len(partial.read_text().splitlines()) == 2  # the two sessions before the failure were flushed
    with open(partial, "a") as f:
        f.write('{"session_id": "torn')  # a kill mid-write
    write_sessions(sessions, tmp_path / "in.jsonl")  # the input is fixed; same ids, same order
    stats = synthesize_rationales(tmp_path / "in.jsonl", tmp_path / "out.jsonl", flaky_server, "m", concurrency=2,
                                  max_retries=3)
    assert stats.resumed_sessions == 2 and stats.num_retries > 0
    out = load_sessions(tmp_path / "out.jsonl").sessions
    assert [s.session_id for s in out] == [s.session_id for s in sessions]
    assert all(st.rationale for s in out for st in s.steps)
    assert out[3].steps[0].rationale == "I chose this on purpose."


def test_clean_answer():
    assert clean_answer('  "I want it."  ') == "I want it."
    assert clean_answer('{"rationale": "From JSON."}') == "From JSON."
    assert clean_answer("Rationale: I like it.\nMore text") == "I like it."
    assert clean_answer("   ") == ""
