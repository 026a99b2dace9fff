"""The pending rollout of one-step-off async (rl.async_level=1) in a checkpoint: JSON, not pickle (a checkpoint on
shared storage is not trusted to run code). It round-trips exactly, and anything else is a loud error naming the
file."""

import json
import math
import pickle

import numpy as np
import pytest

from shop_r1 import checkpoint
from shop_r1.distributed.engine_group import ScoredBatch
from shop_r1.distributed.rollouts import PENDING_FILE, PendingRolloutError, StepRollout, encode_pending, load_pending
from shop_r1.types import Action, Completion, Generation, ParsedResponse, Prompt, RewardBreakdown, ScoredGeneration

RESPONSE = '{"rationale": "the cart", "action": {"type": "click", "name": "add_to_cart"}}'


def _rollout() -> StepRollout:
    """Two prompts x G=2, as the engines and the reward pool make them; awkward floats on purpose."""
    click, search = Action("click", "add_to_cart"), Action("type_and_submit", "search", "red shoes é")
    prompts = [Prompt("ex-1", (151644, 8948, 198), click, page_names=("add_to_cart", "buy_now")),
               Prompt("ex-2", (151644, 872), Action("terminate"))]
    completions = [
        Completion((90, 2, 7), RESPONSE, (-0.1, -2.5e-310, -0.0), ((-0.1, -2.3), (-2.5e-310, -float("inf")), (-0.0,)),
                   (0, 1, 14), "stop", 6),
        Completion((90,), "not json", (0.1 + 0.2,), ((0.1 + 0.2, -1e300),), (0,), "length", 6),
    ]
    rewards = (RewardBreakdown(1.0, 1.0, 0.1 + 0.2, 0.0, -1.2345678901234567, 2.2345678901234567, True,
                               parsed=ParsedResponse("the cart", click, (15, 23))),
               RewardBreakdown(error="TimeoutError: scorer took 30 s"))
    scored = [ScoredGeneration(p, Generation(i, p.token_ids, tuple(completions), 151936), rewards)
              for i, p in enumerate(prompts)]
    scored[1] = ScoredGeneration(prompts[1], scored[1].generation,
                                 (rewards[0], RewardBreakdown(format=1.0, total=1.0, format_valid=True,
                                                              parsed=ParsedResponse("", search))))
    before = checkpoint.TrainState(6, 1, 4, checkpoint.capture_rng())
    return StepRollout(8, prompts, ScoredBatch(scored, generate_s=12.5, reward_wait_s=0), 6, before)


def _parsed(rollout: StepRollout) -> list:
    return [r.parsed for s in rollout.batch.scored for r in s.rewards]  # compare=False: not in ==


def test_a_realistic_rollout_round_trips_exactly():
    rollout = _rollout()
    data = encode_pending(rollout)
    back = load_pending(data)
    # Records, prompts, completions, logprobs (to the last bit: -0.0, a subnormal, -inf, 0.1 + 0.2), rewards.
    assert (back.step, back.prompts, back.batch, back.version) == (rollout.step, rollout.prompts, rollout.batch,
                                                                  rollout.version)
    assert _parsed(back) == _parsed(rollout) and _parsed(back)[0].rationale_span == (15, 23)
    logprobs = back.batch.scored[0].generation.completions[0].logprobs
    assert math.copysign(1.0, logprobs[2]) == -1.0 and logprobs[1] == -2.5e-310
    assert type(back.batch.reward_wait_s) is int  # written from an int, read back as one
    # The RNG state in the very types capture_rng returns (restore_rng accepts it as is).
    b, r = back.before, rollout.before
    assert (b.step, b.cursor_epoch, b.cursor_position) == (r.step, r.cursor_epoch, r.cursor_position)
    assert b.rng["python"] == r.rng["python"] and b.rng["torch"] == r.rng["torch"]
    assert b.rng["numpy"][0] == r.rng["numpy"][0] and b.rng["numpy"][2:] == r.rng["numpy"][2:]
    assert b.rng["numpy"][1].dtype == np.uint32 and np.array_equal(b.rng["numpy"][1], r.rng["numpy"][1])
    assert encode_pending(back) == data
    nan = StepRollout(1, [], ScoredBatch([], float("nan"), 0.0), 0, checkpoint.TrainState(0, 0, 0, {}))
    assert math.isnan(load_pending(encode_pending(nan)).batch.generate_s)
    assert load_pending(None) is None


def test_the_batch_counts_its_failures_once_and_the_json_does_not_carry_them(monkeypatch):
    import shop_r1.distributed.engine_group as engine_group

    calls, real = [], engine_group.count_failures
    monkeypatch.setattr(engine_group, "count_failures", lambda rewards: calls.append(len(rewards)) or real(rewards))
    rollout = _rollout()
    data = encode_pending(rollout)
    # 4 rewards, one fallback: the scorer's own TimeoutError (cause "error", not the pool's "timeout").
    assert rollout.batch.failures.check(0.25, where="step 8") == 0.25  # the driver's check ...
    assert rollout.batch.failures.metrics()["reward/num_failed_error"] == 1.0  # ... and its metrics
    assert calls == [4]  # one walk over the rewards, whoever reads the record
    assert encode_pending(rollout) == data  # derived, not written into the checkpoint
    assert load_pending(data).batch.failures == rollout.batch.failures


def test_the_checkpoint_file_is_json_named_as_train_names_it(tmp_path):
    from shop_r1.train import PENDING_ROLLOUT

    assert PENDING_ROLLOUT == PENDING_FILE == "pending_rollout.json"
    rollout = _rollout()
    saved = checkpoint.save(tmp_path, rollout.before, {}, lambda d: None,
                            extra={PENDING_FILE: encode_pending(rollout)})
    raw = checkpoint.read_extra(saved, PENDING_FILE)
    assert json.loads(raw)["format"] == "shop-r1 pending rollout"
    assert load_pending(raw, where=saved / PENDING_FILE).batch == rollout.batch


class _RunsCode:
    """Unpickling it creates a file: what a planted pickle could do (with any other callable)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_or_garbage_file_is_refused_naming_the_file(tmp_path):
    where = tmp_path / "step_000006" / PENDING_FILE
    marker = tmp_path / "unpickled"
    with pytest.raises(PendingRolloutError, match=rf"^{where}: not a pending rollout \(UnicodeDecodeError"):
        load_pending(pickle.dumps(_RunsCode(marker)), where=where)  # an old pending_rollout.pkl, or a planted one
    assert not marker.exists()  # nothing was unpickled
    with pytest.raises(PendingRolloutError, match=rf"^{where}: not a pending rollout \(JSONDecodeError"):
        load_pending(encode_pending(_rollout())[:-40], where=where)  # cut short
    with pytest.raises(PendingRolloutError, match=r"^pending_rollout.json: not a pending rollout of format "):
        load_pending(b'{"step": 8}')  # the default names the checkpoint's file


def _tampered(edit) -> bytes:
    payload = json.loads(encode_pending(_rollout()))
    edit(payload["rollout"])
    return json.dumps(payload).encode()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r["batch"]["scored"][0]["generation"]["completions"][1]["logprobs"].__setitem__(0, "x"),
     r"rollout.batch.scored\[0\].generation.completions\[1\].logprobs\[0\]: expected float, got 'x'"),
    (lambda r: r["prompts"][0]["target"].__setitem__("type", "os.system"),
     r"rollout.prompts\[0\].target.type: expected one of \('click', 'type_and_submit', 'terminate'\)"),
    (lambda r: r["prompts"][1].__setitem__("__class__", "builtins.eval"),
     r"rollout.prompts\[1\]: expected a Prompt with fields \['example_id', 'token_ids', 'target', 'page_names'\]"),
    (lambda r: r.__setitem__("step", True), r"rollout.step: expected int, got True"),
    (lambda r: r["before"]["rng"].__setitem__("cuda", [1]), r"rollout.before.rng: unknown generator 'cuda'"),
    (lambda r: r["before"]["rng"]["numpy"].pop(), r"rollout.before.rng: not an RNG state"),
])
def test_a_tampered_field_is_named(edit, message, tmp_path):
    with pytest.raises(PendingRolloutError, match=rf"^{tmp_path}/x.json: {message}"):
        load_pending(_tampered(edit), where=tmp_path / "x.json")
