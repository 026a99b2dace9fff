"""`with_restarts`, the GRPO and SFT drivers' bounded restart: an actor death or hang (ActorTimeout) starts the next
attempt with resume=True, at most max_restarts times; any other error, or any error in local mode, is raised."""

import pytest

from shop_r1.distributed.actors import ActorTimeout, with_restarts


def _attempts(outcomes):
    calls = []

    def attempt(resume):
        calls.append(resume)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return attempt, calls


def test_a_hang_then_success_resumes_and_returns(capsys):
    attempt, calls = _attempts([ActorTimeout("learner grpo_step: not done within 2 s"), "done"])
    assert with_restarts(attempt, max_restarts=2, local=False, tag="grpo") == "done"
    assert calls == [False, True]
    assert "[grpo] an actor died or hung (ActorTimeout: learner grpo_step: not done within 2 s); actors torn down, " \
           "resuming from the last checkpoint (restart 1 of at most 2)" in capsys.readouterr().out


def test_past_max_restarts_the_last_error_is_raised():
    attempt, calls = _attempts([ActorTimeout("a"), ActorTimeout("b"), "never"])
    with pytest.raises(ActorTimeout, match="b"):
        with_restarts(attempt, max_restarts=1, local=False, tag="sft")
    assert calls == [False, True]


@pytest.mark.parametrize("error, local", [(ValueError("a bug"), False), (ActorTimeout("hang"), True)])
def test_other_errors_and_local_mode_are_never_restarted(error, local):
    attempt, calls = _attempts([error, "never"])
    with pytest.raises(type(error)):
        with_restarts(attempt, max_restarts=3, local=local, tag="grpo")
    assert calls == [False]
