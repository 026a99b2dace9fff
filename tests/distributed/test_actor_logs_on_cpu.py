"""Actors' own output (Python prints, C-level writes to fd 2) goes to RUN_DIR/logs/<Class>-<pid>.log, not the
console, unless --verbose; the actor still works, and its errors still reach the caller."""

import os
import sys

import pytest

from shop_r1.distributed.actors import get, set_actor_log_dir, spawn


class Noisy:
    def __init__(self):
        print("hello from init")

    def shout(self, word):
        print(f"stdout {word}", flush=True)
        os.write(2, f"fd2 {word}\n".encode())  # what C++ libraries (vLLM, gloo) write
        return os.getpid()

    def fail(self):
        raise ValueError("boom in the actor")


def test_actor_output_goes_to_its_log_file(ray_local_cluster, tmp_path):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    set_actor_log_dir(tmp_path / "logs")
    try:
        actor = spawn(Noisy, local=False)
        pid = get(actor.shout.remote("ping"))
        with pytest.raises(Exception, match="boom in the actor"):
            get(actor.fail.remote())
    finally:
        set_actor_log_dir(None)
    text = (tmp_path / "logs" / f"Noisy-{pid}.log").read_text()
    assert "hello from init" in text and "stdout ping" in text and "fd2 ping" in text
    # With no log folder (--verbose) nothing is redirected.
    plain = spawn(Noisy, local=False)
    get(plain.shout.remote("pong"))
    assert "pong" not in "".join(p.read_text() for p in (tmp_path / "logs").iterdir())


def test_verbose_flag_parses_before_and_after_the_command():
    from shop_r1.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["--verbose", "config", "show"]).verbose is True
    assert parser.parse_args(["config", "show", "--verbose"]).verbose is True
    assert parser.parse_args(["config", "show"]).verbose is False
