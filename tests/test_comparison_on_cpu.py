"""Results tables with their baselines: `shop_r1.comparison`, `evaluate.comparison_table/rows`, `shop-r1 report` and
`experiments/summarize.py`, on a tiny hand-made shop (4 held-out examples in 2 sessions)."""

import json
from pathlib import Path

import pytest

from shop_r1.comparison import Setting, compare, format_comparison, plot_exact_vs_terminate, plot_points
from shop_r1.data.examples import build_rl_examples, build_step_sft_examples, write_examples_jsonl
from shop_r1.evaluate import EvalReport, comparison_rows, comparison_table
from shop_r1.metrics import Predictions, compute_metrics, load_predictions, write_predictions
from shop_r1.report import make_report
from shop_r1.types import Action, Session, Step
from tests.test_baselines_on_cpu import ADD, CHECKOUT, SEARCH, VIEW, T  # the same actions as the baseline tests

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOME = '<a name="nav.category.bags">Bags</a><a name="todays_deals.X.view_product">X</a>'
RESULTS = '<input name="search_input"/><a name="search_results.Trail Pack.view_product">Trail Pack</a>'
PRODUCT = '<button name="add_to_cart">Add</button><button name="buy_now">Buy</button>'
CART = '<button name="proceed_to_checkout">Checkout</button>'


def _session(sid: str, *steps: tuple[str, Action]) -> Session:
    return Session(sid, tuple(Step(html, action, rationale="r") for html, action in steps))


def _buyer(sid):
    return _session(sid, (HOME, SEARCH), (RESULTS, VIEW), (PRODUCT, ADD), (CART, CHECKOUT))


def _leaver(sid):
    return _session(sid, (HOME, SEARCH), (RESULTS, T))


def _browser(sid):
    return _session(sid, (HOME, SEARCH), (RESULTS, VIEW), (PRODUCT, T))


def _r(a: Action) -> str:
    return json.dumps({"rationale": "r", "action": a.to_dict()})


TEST_IDS = ("t1:1", "t1:2", "t1:3", "t2:1")  # targets view, add, checkout, terminate
SFT_RESPONSES = [_r(VIEW), _r(T), _r(T), _r(T)]  # right on t1:1 and t2:1 -> 2/4
SHOP_R1_RESPONSES = [_r(T)] * 4  # right on t2:1 only -> 1/4


def _data(folder: Path) -> None:
    """Train: 3 buyers, 8 leavers, 4 browsers (click 13 of 25, the commonest click: view 7); test: t1 buyer, t2
    leaver."""
    count = lambda msgs: 0  # noqa: E731 - no budget
    train = [_buyer(f"a{i}") for i in range(3)] + [_leaver(f"b{i}") for i in range(8)] + \
        [_browser(f"c{i}") for i in range(4)]
    folder.mkdir(parents=True, exist_ok=True)
    rl_train = build_rl_examples(train, "whole_session", 1, count).examples
    write_examples_jsonl(rl_train, folder / "rl_train.jsonl")
    write_examples_jsonl(build_step_sft_examples(rl_train).examples, folder / "sft_train.jsonl")
    write_examples_jsonl(build_rl_examples([_buyer("t1"), _leaver("t2")], "whole_session", 1, count).examples,
                         folder / "rl_test.jsonl")


def _targets():
    return (VIEW, ADD, CHECKOUT, T)


def _write_eval(folder: Path, label: str, responses: list[str], reverse: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    order = range(3, -1, -1) if reverse else range(4)
    preds = Predictions(tuple(TEST_IDS[i] for i in order), tuple(responses[i] for i in order),
                        tuple(_targets()[i] for i in order))
    write_predictions(preds, folder / "predictions.jsonl")
    m = compute_metrics(preds.responses, preds.targets)
    (folder / "metrics.json").write_text(json.dumps({"label": label, **m.to_dict(), "reward/total": 1.5}))
    return folder / "predictions.jsonl"


def _report(label: str, path: Path) -> EvalReport:
    p = load_predictions(path)
    return EvalReport(label, compute_metrics(p.responses, p.targets), {"reward/total": 1.5}, 0, str(path),
                      str(path.parent / "metrics.json"), 1.0)


def test_predictions_round_trip_plain_and_gzip(tmp_path):
    preds = Predictions(TEST_IDS, tuple(SFT_RESPONSES), _targets())
    for name in ("p.jsonl", "p.jsonl.gz"):
        assert load_predictions(write_predictions(preds, tmp_path / name)) == preds
    assert (tmp_path / "p.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert preds.sessions == ("t1", "t1", "t1", "t2")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"response": "x", "target": {"type": "terminate"}}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: example_id"):
        load_predictions(tmp_path / "bad.jsonl")


def test_comparison_rows_with_baselines(tmp_path):
    _data(tmp_path / "data")
    reports = [_report("SFT", _write_eval(tmp_path / "eval" / "sft", "SFT", SFT_RESPONSES, reverse=True)),
               _report("Shop-R1", _write_eval(tmp_path / "eval" / "shop_r1", "Shop-R1", SHOP_R1_RESPONSES))]
    c = comparison_rows(reports, train_examples_path=tmp_path / "data" / "sft_train.jsonl",
                        test_examples_path=tmp_path / "data" / "rl_test.jsonl")
    assert [r.label for r in c.rows] == ["SFT", "Shop-R1", "Always terminate", "Majority type", "Visible rule"]
    assert (c.n, c.num_sessions, c.reference) == (4, 2, "SFT")
    sft, shop, term, major = (c.row(x) for x in ("SFT", "Shop-R1", "Always terminate", "Majority type"))
    # SFT's file is in reverse order: aligned by example id, its numbers are unchanged.
    assert sft.metrics.exact_match == 0.5 and sft.vs_reference is None
    assert shop.metrics.exact_match == 0.25 and shop.vs_reference["exact_match"].value == pytest.approx(-0.25)
    assert shop.metrics.type_kappa == 0.0 and shop.metrics.predicted_mix["terminate"] == 1.0
    assert term.metrics.exact_match == 0.25
    assert major.metrics.exact_match == 0.25  # majority type: click, commonest click `view` -> right on t1:1
    assert '"name": "search_results.Trail Pack.view_product"' in major.note
    best = max((r for r in c.rows if r.kind == "baseline"), key=lambda r: r.metrics.exact_match)
    assert c.best_baseline == best.label and c.row(best.label).vs_best_baseline is None
    assert sft.vs_best_baseline["exact_match"].value == pytest.approx(0.5 - best.metrics.exact_match)
    # Every metric is differenced: kappa of SFT (by hand: p_o 1/2, p_e (1*3 + 3*1)/16 = 3/8 -> 1/5) minus Shop-R1's 0.
    assert shop.vs_reference["type_kappa"].value == pytest.approx(-0.2)
    assert sft.reward_total == 1.5 and term.reward_total is None
    json.dumps(c.to_dict())  # results.json can hold it
    text = format_comparison(c)
    assert all(len(line) <= 120 for line in text.splitlines())
    assert "Always terminate" in text and "vs SFT (pp)" in text and "Target mix c/t/x 75/0/25" in text
    # Without the example files: the model rows only, the call of before.
    plain = comparison_table(reports)
    assert "SFT" in plain and "Always terminate" not in plain
    with pytest.raises(ValueError, match="give both"):
        comparison_rows(reports, train_examples_path=tmp_path / "data" / "sft_train.jsonl")


def test_compare_refuses_other_targets_and_missing_examples():
    a = Setting("A", "model", Predictions(TEST_IDS, tuple(SFT_RESPONSES), _targets()))
    other = Setting("B", "model", Predictions(TEST_IDS, tuple(SFT_RESPONSES), (T, T, T, T)))
    with pytest.raises(ValueError, match="other targets"):
        compare([a, other])
    short = Setting("C", "model", Predictions(TEST_IDS[:2], tuple(SFT_RESPONSES[:2]), _targets()[:2]))
    with pytest.raises(ValueError, match="no prediction"):
        compare([a, short])
    with pytest.raises(ValueError, match="duplicate"):
        compare([a, a])


def test_plot_exact_vs_terminate(tmp_path):
    a = Setting("A", "model", Predictions(TEST_IDS, tuple(SFT_RESPONSES), _targets()))
    b = Setting("B", "baseline", Predictions(TEST_IDS, tuple(SHOP_R1_RESPONSES), _targets()))
    c = compare([a, b], num_resamples=50)
    points = plot_points("t", c)
    assert [(p.label, p.exact_match, p.predicted_terminate, p.target_terminate) for p in points] == [
        ("A", 0.5, 0.75, 0.25), ("B", 0.25, 1.0, 0.25)]
    assert plot_points("t", c.to_dict()) == points
    path = plot_exact_vs_terminate(points, tmp_path / "x.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert plot_exact_vs_terminate([], tmp_path / "none.png") is None


def test_report_shows_the_baselines(tmp_path):
    run = tmp_path / "run"
    _data(run / "data")
    _write_eval(run / "eval" / "sft", "SFT", SFT_RESPONSES)
    _write_eval(run / "eval" / "shop_r1", "Shop-R1", SHOP_R1_RESPONSES)
    report = make_report(run)
    md = report.markdown_path.read_text()
    assert "## Against the baselines" in md and "*Always terminate* (baseline)" in md
    assert "Baselines fitted on `data/sft_train.jsonl`" in md
    assert "| Shop-R1 | 25.00% | 25.00% |" in md  # the metrics.json table is still there
    assert any(p.name == "exact_vs_terminate.png" for p in report.plots)
    saved = json.loads((run / "report" / "comparison.json").read_text())
    assert [r["label"] for r in saved["rows"]][:2] == ["SFT", "Shop-R1"]


def test_summarize_writes_baselines_predictions_and_plots(tmp_path, monkeypatch):
    import experiments.summarize as summarize
    from experiments.suites import SFT_ROW, SHOP_R1, Suite

    ws = tmp_path / "ws"
    _data(ws / "data")
    _write_eval(ws / "eval" / "sft", "SFT", SFT_RESPONSES)
    _write_eval(ws / "eval" / "shop_r1", "SFT + Shop-R1", SHOP_R1_RESPONSES)
    monkeypatch.setattr(summarize, "_machine_name", lambda: "box")
    out = summarize.summarize("table2", Suite((SFT_ROW, SHOP_R1)), ws, tmp_path / "results")
    table = (out / "table.md").read_text()
    assert "| SFT + Shop-R1 | 25.00 [" in table and "*Visible rule* (baseline)" in table
    assert "27.72 / 36.40 / 31.28" in table  # the paper beside it
    names = sorted(p.name for p in (out / "predictions").iterdir())
    assert names == ["always_terminate.jsonl.gz", "majority_type.jsonl.gz", "sft.jsonl.gz", "shop_r1.jsonl.gz",
                     "visible_rule.jsonl.gz"]
    back = load_predictions(out / "predictions" / "shop_r1.jsonl.gz")
    assert back.example_ids == TEST_IDS and back.responses == tuple(SHOP_R1_RESPONSES)
    results = json.loads((out / "results.json").read_text())
    assert results["results"]["shop_r1"]["minus_sft"]["exact_match"]["value"] == pytest.approx(-0.25)
    assert len(results["comparison"]["rows"]) == 5
    assert (out / "exact_vs_terminate.png").read_bytes()[:8] == PNG_MAGIC
    everything = summarize.plot_all(tmp_path / "results" / "box")
    assert everything is not None and everything.read_bytes()[:8] == PNG_MAGIC
