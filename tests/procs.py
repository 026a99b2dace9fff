"""Stopping a server a test started in a session of its own (`start_new_session=True`): the whole process group."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_session(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to proc's process group, SIGKILL if it has not exited within `grace_s`. A group that is already gone
    (the server died during the test) is not an error here: the test's own failure is the one to report."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
