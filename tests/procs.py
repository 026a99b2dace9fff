"""Stopping a server a test started in a session of its own (`start_new_session=True`): the whole process group."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_session(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to proc's process group, SIGKILL if it has not exited within `grace_s`."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
