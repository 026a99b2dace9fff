"""experiments/overfit.py's pure parts on hand-made files: the seeded choice of prompts, the sample-exact curve from a
rollout dump, its window means, greedy exact from predictions, and the one-line errors. No model, no Ray."""

import json

import pytest

from experiments.overfit import (
    DEFAULT_CONFIG,
    Check,
    CurvePoint,
    GreedyExact,
    SampleExact,
    StageFailed,
    check_overrides,
    choose_examples,
    curve_points,
    curve_summary,
    greedy_exact,
    main,
    prompt_visits,
    prompts_stage,
    render,
    request_changes,
    run_shop_r1,
    sample_exact_by_step,
    window_means,
)
from shop_r1.config import ConfigError
from shop_r1.data.examples import write_examples_jsonl
from shop_r1.errors import DataError, UserError
from shop_r1.types import Action, Message, RLExample

CLICK = Action("click", name="product.tent_a")
QUERY = Action("type_and_submit", name="search_input", text="waterproof tent")
STOP = Action("terminate")


def _example(eid: str, target: Action) -> RLExample:
    return RLExample(eid, eid.split(":")[0], int(eid.split(":")[1]),
                     (Message("system", "You shop."), Message("user", f"page of {eid}")), target, "I think so.")


def _say(kind: str, **action: str) -> str:
    return json.dumps({"rationale": "I think so.", "action": {"type": kind, **action}})


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# Eight distinct examples, two of them repeated (as `data build`'s balancing tops a type up with replacement).
EXAMPLES = [_example(f"s{i}:1", (CLICK, QUERY, STOP)[i % 3]) for i in range(8)]
WITH_REPEATS = [*EXAMPLES[:3], EXAMPLES[1], *EXAMPLES[3:], EXAMPLES[6]]


def test_choice_is_seeded_distinct_and_in_file_order():
    a = choose_examples(WITH_REPEATS, 5, seed=3, where="rl_train.jsonl")
    b = choose_examples(WITH_REPEATS, 5, seed=3, where="rl_train.jsonl")
    ids = [e.example_id for e in a]
    assert ids == [e.example_id for e in b]  # deterministic
    assert len(set(ids)) == 5  # distinct, though the file repeats s1:1 and s6:1
    order = [e.example_id for e in EXAMPLES]
    assert ids == sorted(ids, key=order.index)  # file order
    # All eight distinct examples when N is their number: each once, in file order.
    assert [e.example_id for e in choose_examples(WITH_REPEATS, 8, 0, "f")] == order
    # Other seeds choose other subsets (of the 56 five-of-eight subsets, not all three alike).
    assert len({tuple(e.example_id for e in choose_examples(WITH_REPEATS, 5, s, "f")) for s in (0, 1, 2)}) > 1


def test_too_few_distinct_examples_is_a_clear_error():
    with pytest.raises(DataError) as e:
        choose_examples(WITH_REPEATS, 9, 0, "RUN/data/rl_train.jsonl")
    assert str(e.value) == "RUN/data/rl_train.jsonl: 8 distinct examples (10 lines), fewer than --num-prompts 9"
    with pytest.raises(UserError, match="--num-prompts 0: must be at least 1"):
        choose_examples(EXAMPLES, 0, 0, "f")


def _check(tmp_path, seed=0, n=4) -> Check:
    write_examples_jsonl(WITH_REPEATS, tmp_path / "rl_train.jsonl")
    return Check(tmp_path / "model", tmp_path / "rl_train.jsonl", n, seed, tmp_path / "c.yaml", (), tmp_path / "out")


def test_prompts_are_lines_of_the_examples_file_and_a_rerun_keeps_them(tmp_path):
    c = _check(tmp_path)
    chosen = prompts_stage(c)
    written = _lines(c.prompts)
    assert len(written) == 4
    assert set(written) <= set(_lines(c.examples))  # the same line format: each line is one of the source's
    assert [json.loads(x)["example_id"] for x in written] == [e.example_id for e in chosen]
    before = c.prompts.read_bytes()
    assert prompts_stage(c) == chosen and c.prompts.read_bytes() == before  # done: kept as it is
    other = next(s for s in range(1, 20)
                 if choose_examples(WITH_REPEATS, 4, s, "f") != chosen)  # a seed that picks other examples
    with pytest.raises(DataError, match="holds other examples"):
        prompts_stage(_check(tmp_path, seed=other))


def _rollout(step: int, eid: str, *texts: str) -> str:
    return json.dumps({"step": step, "example_id": eid, "prompt_token_ids": [1, 2],
                       "samples": [{"text": t, "token_ids": [3], "logprobs": [-0.1]} for t in texts]})


TARGETS = {"s0:1": CLICK, "s1:1": QUERY, "s2:1": STOP}
RIGHT = {"s0:1": _say("click", name="product.tent_a"),
         "s1:1": _say("type_and_submit", name="search_input", text="Waterproof  TENT"),  # case and spaces: exact
         "s2:1": _say("terminate")}
WRONG = _say("click", name="product.tent_b")


def test_sample_exact_counts_each_steps_last_attempt(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    lines = [
        _rollout(1, "s0:1", RIGHT["s0:1"], WRONG),           # 1 of 2
        _rollout(1, "s1:1", RIGHT["s1:1"], "not json"),      # 1 of 2 -> step 1: 2 of 4
        _rollout(2, "s2:1", WRONG, WRONG),                   # killed attempt of step 2: dropped below
        _rollout(2, "s0:1", WRONG, WRONG),
        '{"step": 2, "example_id": "s1',                    # torn by the kill, glued to nothing: unreadable
        _rollout(2, "s2:1", RIGHT["s2:1"], RIGHT["s2:1"]),   # the resumed run's step 2: 2 of 2
        _rollout(2, "s1:1", RIGHT["s1:1"], WRONG),           # 1 of 2 -> step 2: 3 of 4
        _rollout(3, "s0:1", WRONG, _say("terminate")),       # 0 of 2
        _rollout(3, "s2:1", _say("click", name="x"), RIGHT["s2:1"]),  # 1 of 2 -> step 3: 1 of 4
    ]
    path.write_text("\n".join(lines) + "\n")
    counts = sample_exact_by_step(path, TARGETS, groups_per_step=2)
    assert counts == SampleExact({1: 2, 2: 3, 3: 1}, {1: 4, 2: 4, 3: 4}, unreadable_lines=1)
    metrics = [{"step": 1, "reward/action_type": 0.5}, {"step": 2, "reward/total": 1.0},
               {"step": 3, "reward/action_type": 0.25}]
    assert curve_points(counts, metrics) == [CurvePoint(1, 0.5, 4, 0.5), CurvePoint(2, 0.75, 4, None),
                                             CurvePoint(3, 0.25, 4, 0.25)]


def test_prompt_visits_and_headroom_by_hand(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    lines = [
        _rollout(1, "s0:1", RIGHT["s0:1"], WRONG),           # s0 first visit: 1 of 2
        _rollout(1, "s1:1", WRONG, WRONG),                   # s1 first visit: 0 of 2
        _rollout(2, "s2:1", WRONG, WRONG),                   # killed attempt of step 2: dropped
        _rollout(2, "s1:1", RIGHT["s1:1"], RIGHT["s1:1"]),   # the resumed step 2: s1 2 of 2
        _rollout(2, "s2:1", WRONG, WRONG),                   # s2: 0 of 2
        _rollout(3, "s0:1", RIGHT["s0:1"], RIGHT["s0:1"]),   # s0 last visit: 2 of 2
        _rollout(3, "s2:1", WRONG, WRONG),                   # s2 never exact
    ]
    path.write_text("\n".join(lines) + "\n")
    visits = prompt_visits(path, TARGETS, groups_per_step=2)
    assert visits.visits == {"s0:1": [(1, 1, 2), (3, 2, 2)], "s1:1": [(1, 0, 2), (2, 2, 2)],
                             "s2:1": [(2, 0, 2), (3, 0, 2)]}
    assert visits.headroom() == {"prompts": 3, "exact_in_first_group": 1, "exact_in_any_group": 2,
                                 "all_exact_in_last_group": 2}


def test_a_rollout_of_another_example_is_an_error(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(_rollout(1, "s0:1", WRONG) + "\n" + _rollout(1, "s9:1", WRONG) + "\n")
    with pytest.raises(DataError, match=r"rollouts.jsonl:2: .*example 's9:1'"):
        sample_exact_by_step(path, TARGETS, 2)


def test_window_means_by_hand():
    # 12 steps of 4 samples each, exact counts 0 0 1 1 1 2 2 2 3 3 4 4.
    values = [k / 4 for k in (0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4)]
    m = window_means(values)
    assert m.first == pytest.approx(3.75 / 10)  # 0+0+.25*3+.5*3+.75*2 = 3.75
    assert m.last == pytest.approx(5.75 / 10)   # .25*3+.5*3+.75*2+1*2 = 5.75
    assert (m.window, m.n) == (10, 12)
    short = window_means([0.0, 0.5, 1.0])  # fewer steps than the window: both means over all of them
    assert (short.first, short.last) == (0.5, 0.5)
    with pytest.raises(DataError, match="no GRPO steps"):
        window_means([])


def test_curve_summary_and_its_printout():
    points = [CurvePoint(s, k / 4, 4, k / 4) for s, k in enumerate((0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4), 1)]
    summary = curve_summary(points, GreedyExact(1, 4), GreedyExact(3, 4))
    assert summary["sample_exact"] == pytest.approx({"first": 0.375, "last": 0.575, "window": 10, "n": 12})
    assert summary["reward/action_type"] == summary["sample_exact"]
    assert summary["greedy_exact"] == {"before": {"exact": 1, "n": 4}, "after": {"exact": 3, "n": 4}}
    assert summary["steps"][2] == {"step": 3, "sample_exact": 0.25, "num_samples": 4, "reward_action_type": 0.25}
    text = render(json.loads(json.dumps(summary)))  # as read back from curve.json
    assert "sample exact: first 10 steps 0.375, last 10 steps 0.575 (12 steps)" in text
    assert text.splitlines()[-1] == "greedy exact: before 1 of 4, after 3 of 4"
    missing = curve_summary([CurvePoint(1, 0.5, 4, None)], GreedyExact(0, 1), GreedyExact(1, 1))
    assert missing["reward/action_type"] is None  # a step without the logged key: no logged means


def _predictions(path, rows):
    path.write_text("".join(json.dumps({"example_id": e, "response": r, "target": t.to_dict()}) + "\n"
                            for e, r, t in rows))
    return path


def test_greedy_exact_counts_by_the_evaluation_rule(tmp_path):
    path = _predictions(tmp_path / "predictions.jsonl", [
        ("s0:1", RIGHT["s0:1"], CLICK),                        # exact
        ("s1:1", _say("type_and_submit", name="search_input", text="tent"), QUERY),  # right type, not exact
        ("s2:1", RIGHT["s2:1"], STOP),                         # exact
        ("s3:1", "I would click the tent", CLICK),             # unparseable: wrong
    ])
    assert greedy_exact(path, ["s3:1", "s2:1", "s1:1", "s0:1"]) == GreedyExact(2, 4)  # any order of the ids
    assert GreedyExact(2, 4).render() == "2 of 4"
    with pytest.raises(DataError, match="not one for each of the 5 prompts"):
        greedy_exact(path, ["s0:1", "s1:1", "s2:1", "s3:1", "s4:1"])


def test_overrides_the_check_sets_and_another_command_are_refused():
    check_overrides(DEFAULT_CONFIG, ["rl.steps=100", "reward.action_reward=binary", "rl.lr=5e-4"])
    with pytest.raises(UserError, match="'run_dir=x': the overfit check sets run_dir"):
        check_overrides(DEFAULT_CONFIG, ["rl.steps=1", "run_dir=x"])
    with pytest.raises(ConfigError, match="rl.lrr"):  # the config's own rules, before any stage starts
        check_overrides(DEFAULT_CONFIG, ["rl.lrr=5e-4"])
    with pytest.raises(ConfigError):
        check_overrides(DEFAULT_CONFIG, ["rl.steps"])
    saved = {"seed": 0, "num_prompts": 16, "overrides": ["rl.steps=100"]}
    assert request_changes(saved, dict(saved)) == []
    assert request_changes(saved, {**saved, "seed": 1, "overrides": []}) == [
        "overrides: ['rl.steps=100'] -> []", "seed: 0 -> 1"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_inputs_end_with_one_line_and_exit_2(tmp_path, capsys):
    examples = tmp_path / "rl_train.jsonl"
    write_examples_jsonl(EXAMPLES[:3], examples)
    model = tmp_path / "sft_hf"
    args = ["--model", str(model), "--examples", str(examples), "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert _error_line(capsys) == f"overfit: error: --model {model}: no such folder"
    model.mkdir()
    assert main(args) == 2
    assert _error_line(capsys) == f"overfit: error: --model {model}: not a model folder (lacks config.json, " \
                                  "model.safetensors)"
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    assert main([*args, "--num-prompts", "4"]) == 2  # three lines, four prompts asked for
    assert _error_line(capsys) == f"overfit: error: {examples}: 3 distinct examples (3 lines), fewer than " \
                                  "--num-prompts 4"
    assert not (tmp_path / "out" / "overfit.json").exists()  # a failed first attempt does not bind the folder
    request = {"model": str(model), "examples": str(examples), "num_prompts": 3, "seed": 0,
               "config": str(DEFAULT_CONFIG), "overrides": ["rl.steps=100"]}
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "overfit.json").write_text(json.dumps(request))  # as a run that got past its prompts
    assert main([*args, "--num-prompts", "3", "--seed", "1"]) == 2
    assert _error_line(capsys) == f"overfit: error: {tmp_path / 'out'} was made by another command (overrides: " \
                                  "['rl.steps=100'] -> []; seed: 0 -> 1): give another --out, or remove the folder " \
                                  "to start again"


def test_a_failing_stage_is_named(capsys):
    # `shop-r1` refuses the flag in argparse, before any heavy import: a real subprocess, about a second.
    with pytest.raises(StageFailed, match=r"stage before: `shop-r1 eval run \.\.\.` exited with status 2"):
        run_shop_r1("before", ["eval", "run", "--no-such-flag"])


def test_plot_overfit_moving_mean_is_a_trailing_window():
    from experiments.plot_overfit import moving_mean

    # hand-computed: window 2 -> [1/1, (1+0)/2, (0+1)/2, (1+1)/2]
    assert moving_mean([1.0, 0.0, 1.0, 1.0], 2) == [1.0, 0.5, 0.5, 1.0]
    assert moving_mean([0.5], 10) == [0.5]
    with pytest.raises(ValueError, match="window"):
        moving_mean([1.0], 0)
