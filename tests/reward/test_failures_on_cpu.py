"""Reward failures: classified by cause, counted for the metrics, and too many of them stop the run."""

import subprocess
import sys

import pytest

from shop_r1.reward.failures import (
    RewardFailureError,
    RewardFailures,
    check_failed_fraction,
    count_failures,
    crash_error,
    failure_cause,
    failure_counts,
)
from shop_r1.reward.worker import fallback_reward
from shop_r1.types import RewardBreakdown

OK = RewardBreakdown(format=0.5, total=0.5, format_valid=True)
TIMEOUT = fallback_reward("timeout")
CRASH = fallback_reward("worker crashed: ActorDiedError")
ERROR = fallback_reward("RuntimeError: poisoned response")


def test_failure_cause_of_each_fallback_text():
    assert failure_cause(None) is None
    assert failure_cause("timeout") == "timeout"
    assert failure_cause("worker crashed: ActorDiedError") == "crash"
    assert failure_cause(crash_error(MemoryError())) == "crash"
    assert crash_error(MemoryError()) == "worker crashed: MemoryError"
    assert failure_cause("RuntimeError: poisoned response") == "error"
    # A scorer's own TimeoutError is a scorer error, not the pool's timeout.
    assert failure_cause("TimeoutError: took too long") == "error"


def test_failure_counts_by_cause():
    rewards = [OK] * 5 + [TIMEOUT, TIMEOUT, CRASH, ERROR, ERROR, ERROR]
    assert failure_counts(rewards) == {"reward/num_failed": 6.0, "reward/num_failed_timeout": 2.0,
                                       "reward/num_failed_crash": 1.0, "reward/num_failed_error": 3.0}
    assert failure_counts([]) == {"reward/num_failed": 0.0, "reward/num_failed_timeout": 0.0,
                                  "reward/num_failed_crash": 0.0, "reward/num_failed_error": 0.0}


def test_one_walk_gives_the_record_that_the_check_and_the_metrics_read():
    rewards = [OK] * 6 + [TIMEOUT, CRASH, ERROR, fallback_reward("KeyError: second")]
    failures = count_failures(rewards)
    assert failures == RewardFailures(10, {"timeout": 1, "crash": 1, "error": 2},
                                      {"timeout": "timeout", "crash": "worker crashed: ActorDiedError",
                                       "error": "RuntimeError: poisoned response"})
    assert (failures.num_failed, failures.share) == (4, 0.4)
    assert failures.metrics() == failure_counts(rewards) == {
        "reward/num_failed": 4.0, "reward/num_failed_timeout": 1.0, "reward/num_failed_crash": 1.0,
        "reward/num_failed_error": 2.0}
    assert failures.check(0.4, where="step 2") == 0.4 == check_failed_fraction(rewards, 0.4, where="step 2")
    with pytest.raises(RewardFailureError, match=r"^step 2: 4 of 10 rewards are fallbacks \(share 0.4\)"):
        failures.check(0.3, where="step 2")
    assert count_failures([]).share == 0.0 and count_failures([]).check(0.0, where="step 1") == 0.0


def test_invalid_format_is_a_score_not_a_failure():
    assert failure_counts([RewardBreakdown()])["reward/num_failed"] == 0.0  # all zeros, but no error


def test_share_at_the_limit_passes():
    # 1 of 20 = 0.05, not above 0.05.
    assert check_failed_fraction([OK] * 19 + [TIMEOUT], 0.05, where="step 3") == 0.05
    assert check_failed_fraction([OK] * 20, 0.0, where="step 3") == 0.0
    assert check_failed_fraction([], 0.0, where="step 3") == 0.0


def test_share_above_the_limit_raises_naming_share_limit_key_and_causes():
    rewards = [OK] * 18 + [TIMEOUT, ERROR]  # 2 of 20 = 0.1 > 0.05
    with pytest.raises(RewardFailureError) as info:
        check_failed_fraction(rewards, 0.05, where="step 7")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert message.startswith("step 7: 2 of 20 rewards are fallbacks (share 0.1)")
    assert "reward_pool.max_failed_fraction=0.05" in message
    assert "timeout: 1 (first error: 'timeout'" in message
    assert "error: 1 (first error: 'RuntimeError: poisoned response'" in message
    assert "crash:" not in message  # only causes that occurred


def test_first_error_text_of_each_cause_is_named():
    first = fallback_reward("ValueError: first")
    rewards = [first, fallback_reward("KeyError: second"), CRASH, CRASH]
    with pytest.raises(RewardFailureError, match=r"crash: 2 \(first error: 'worker crashed: ActorDiedError'.*"
                                                 r"error: 2 \(first error: 'ValueError: first'"):
        check_failed_fraction(rewards, 0.5, where="step 1")


def test_limit_one_turns_the_check_off():
    assert check_failed_fraction([CRASH] * 4, 1.0, where="step 1") == 1.0


def test_limit_outside_0_1_is_rejected():
    with pytest.raises(ValueError, match="reward_pool.max_failed_fraction"):
        check_failed_fraction([OK], 1.5, where="step 1")


def test_failures_module_is_pure():
    # Its own imports: the standard library and shop_r1.types only (the package shop_r1.reward brings torch).
    import ast
    from pathlib import Path

    from shop_r1.reward import failures

    tree = ast.parse(Path(failures.__file__).read_text(encoding="utf-8"))
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [None])}
    assert imported <= {"__future__", "typing", "collections.abc", "dataclasses", "shop_r1.types"}
    assert "shop_r1.types" in imported
    code = ("import sys, shop_r1.reward.failures\n"
            "print(','.join(m for m in ('ray', 'vllm', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
