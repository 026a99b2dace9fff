"""Trivial baselines: page kinds, the visible features of a prompt, the rule table and its back-off, the
cross-validated choice of features, and the baselines' responses through the metric code, worked out by hand."""

import json

import pytest

from shop_r1.baselines import (
    Visible,
    baselines,
    fit_rule_table,
    load_visible,
    majority_action,
    name_shape,
    page_kind,
    select_rule_table,
    session_folds,
    step_bucket,
    training_file,
    visible,
)
from shop_r1.data.examples import (
    balance_rl_examples,
    build_rl_examples,
    build_sft_examples,
    build_step_sft_examples,
    write_examples_jsonl,
)
from shop_r1.data.prompts import render_action, render_observation
from shop_r1.metrics import compute_metrics
from shop_r1.reward.format import parse_response
from shop_r1.types import Action, Message, Session, Step

HOME = '<html><a name="nav.home">Home</a><a name="nav.category.bags">Bags</a><a name="todays_deals.X.view_product">'
RESULTS = ('<html><input name="search_input"/><a name="refinements.price.under_25">Under $25</a>'
           '<a name="search_results.Trail Pack.view_product">Trail Pack</a></html>')
PRODUCT = ('<html><a name="back_to_results">Back</a><button name="add_to_cart">Add</button>'
           '<button name="buy_now">Buy</button><a name="related.Other.view_product">Other</a></html>')
CART = '<html><a name="nav.cart">Cart</a><button name="proceed_to_checkout">Checkout</button></html>'

SEARCH = Action("type_and_submit", "search_input", "trail pack")
VIEW = Action("click", "search_results.Trail Pack.view_product")
ADD = Action("click", "add_to_cart")
CHECKOUT = Action("click", "proceed_to_checkout")
T = Action("terminate")


def test_page_kind_step_bucket_and_name_shape():
    assert [page_kind(p) for p in (HOME, RESULTS, PRODUCT, CART, "<p>hello</p>")] == [
        "home", "results", "product", "cart", "other"]
    assert page_kind("<p>text mentioning buy_now without an element</p>") == "other"
    assert [step_bucket(i) for i in (1, 2, 3, 4, 5, 6, 9)] == ["1", "2", "3", "4-5", "4-5", "6+", "6+"]
    assert name_shape("search_results.Trail Pack 2.0.view_product") == "search_results.*.view_product"
    assert name_shape("refinements.brand.acme") == "refinements.brand.*"
    assert name_shape("add_to_cart") == "add_to_cart" and name_shape("pagination.next") == "pagination.next"


def test_visible_reads_the_current_page_and_the_last_action():
    prompt = [Message("system", "s"), Message("user", render_observation(HOME, 0)),
              Message("assistant", render_action(SEARCH, "I look for a pack")),
              Message("user", render_observation(RESULTS, 1)),
              Message("assistant", render_action(VIEW, None)),  # history without a rationale
              Message("user", render_observation(PRODUCT, 2))]
    v = visible("s1:2", prompt, ADD)
    assert v == Visible("s1:2", "product", "2", "click:search_results.*.view_product", ADD)
    first = visible("s1:1", prompt[:4], VIEW)
    assert (first.page_kind, first.step_bucket, first.last_action) == ("results", "1", "type_and_submit:search_input")
    with pytest.raises(ValueError, match="must end with the user turn"):
        visible("s1:3", prompt[:5], T)


def _sessions() -> list[Session]:
    def step(html, action):
        return Step(html, action, rationale="because")

    return [Session("a", (step(HOME, SEARCH), step(RESULTS, VIEW), step(PRODUCT, ADD), step(CART, CHECKOUT))),
            Session("b", (step(HOME, SEARCH), step(RESULTS, T))),
            Session("c", (step(HOME, SEARCH), step(RESULTS, VIEW), step(PRODUCT, T)))]


def test_load_visible_reads_rl_and_both_sft_formats_alike(tmp_path):
    count = lambda msgs: sum(len(m.content) for m in msgs)  # noqa: E731 - a budget nothing exceeds
    rl = build_rl_examples(_sessions(), "whole_session", 10**9, count).examples
    write_examples_jsonl(rl, tmp_path / "rl.jsonl")
    write_examples_jsonl(build_sft_examples(_sessions()).examples, tmp_path / "sft_session.jsonl")
    write_examples_jsonl(build_step_sft_examples(rl).examples, tmp_path / "sft_step.jsonl")
    from_rl = load_visible(tmp_path / "rl.jsonl")
    # One example per step after the first: a:1 a:2 a:3 b:1 c:1 c:2.
    assert [v.example_id for v in from_rl] == ["a:1", "a:2", "a:3", "b:1", "c:1", "c:2"]
    assert [v.page_kind for v in from_rl] == ["results", "product", "cart", "results", "results", "product"]
    assert from_rl[2].last_action == "click:add_to_cart" and from_rl[2].step_bucket == "3"
    assert load_visible(tmp_path / "sft_session.jsonl") == from_rl
    assert load_visible(tmp_path / "sft_step.jsonl") == from_rl
    # A balanced file repeats examples to top a class up: each example id counts once.
    write_examples_jsonl(balance_rl_examples(rl, ratio=3.0), tmp_path / "balanced.jsonl")
    once = load_visible(tmp_path / "balanced.jsonl")
    assert len(once) == len({v.example_id for v in once}) <= len(from_rl)
    assert training_file(tmp_path) is None
    (tmp_path / "rl_train.jsonl").write_text("")
    assert training_file(tmp_path).name == "rl_train.jsonl"
    (tmp_path / "sft_train.jsonl").write_text("")
    assert training_file(tmp_path).name == "sft_train.jsonl"  # every training step, before balancing
    assert load_visible(tmp_path / "sft_train.jsonl") == []


def _v(eid, kind, last, target, bucket="1"):
    return Visible(eid, kind, bucket, last, target)


# cart x3 -> checkout; results x5 -> terminate 3, view 2; product x2 -> terminate 1, add 1.
TRAIN = ([_v(f"c{i}:3", "cart", "click:add_to_cart", CHECKOUT) for i in range(3)]
         + [_v(f"r{i}:1", "results", "type_and_submit:search_input", T) for i in range(3)]
         + [_v(f"r{i}:2", "results", "type_and_submit:search_input", VIEW) for i in range(3, 5)]
         + [_v("p0:2", "product", "click:search_results.*.view_product", T),
            _v("p1:2", "product", "click:search_results.*.view_product", ADD)])


def test_rule_table_and_back_off_by_hand():
    table = fit_rule_table(TRAIN, ("page_kind", "last_action"), min_support=3)
    # Global: terminate 4, checkout 3, view 2, add 1 -> terminate.
    assert table.default == T
    assert table.rules == {("cart",): CHECKOUT, ("cart", "click:add_to_cart"): CHECKOUT,
                           ("results",): T, ("results", "type_and_submit:search_input"): T}
    assert table.predict(_v("x:1", "cart", "click:something_else", T)) == CHECKOUT  # backs off to (cart,)
    assert table.predict(_v("x:1", "product", "click:add_to_cart", T)) == T  # product seen twice < 3: global
    assert table.predict(_v("x:1", "other", "none", T)) == T
    # With support 2 the product key counts: terminate 1 vs add_to_cart 1 -> tie, click first (type order).
    assert fit_rule_table(TRAIN, ("page_kind",), min_support=2).rules[("product",)] == ADD
    with pytest.raises(ValueError, match="unknown features"):
        fit_rule_table(TRAIN, ("colour",))


def test_majority_action_by_hand():
    # Types: click 3 + 2 + 1 = 6, terminate 4 -> click; the commonest click target: checkout (3).
    assert majority_action(TRAIN) == CHECKOUT
    assert majority_action([_v("a:1", "results", "none", T), _v("b:1", "results", "none", VIEW)]) == VIEW


def test_cross_validation_picks_the_simplest_best_table_by_hand():
    # Four sessions, each: cart -> checkout, results -> terminate twice. Sorted sessions s0..s3 in 2 folds:
    # s0 s2 | s1 s3. The global rule (terminate) gets 8 of 12 in held-out folds; page kind gets 12 of 12, and so
    # does every finer table (a tie: the simplest wins).
    train = [v for s in range(4) for v in (_v(f"s{s}:1", "results", "none", T), _v(f"s{s}:2", "results", "x", T),
                                           _v(f"s{s}:3", "cart", "y", CHECKOUT))]
    assert session_folds(train, 2) == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    table = select_rule_table(train, folds=2, min_support=1)
    assert table.features == ("page_kind",) and table.cv_exact == pytest.approx(1.0)
    only_global = select_rule_table(train, feature_sets=[()], folds=2, min_support=1)
    assert only_global.cv_exact == pytest.approx(8 / 12) and only_global.rules == {}


def test_baselines_write_parseable_responses_scored_by_the_metric_code():
    test = [_v("t0:3", "cart", "click:add_to_cart", CHECKOUT), _v("t1:1", "results", "none", T),
            _v("t2:2", "product", "click:search_results.*.view_product", ADD),
            _v("t3:1", "results", "type_and_submit:search_input", VIEW)]
    got = {b.name: b for b in baselines(TRAIN, test, folds=2, min_support=1)}
    assert list(got) == ["always_terminate", "majority_type", "visible_rule"]
    targets = [v.target for v in test]
    for b in got.values():
        assert b.example_ids == ("t0:3", "t1:1", "t2:2", "t3:1")
        assert all(parse_response(r) is not None for r in b.responses)
        assert json.loads(b.responses[0])["rationale"] == f"baseline {b.name}"
    # Always terminate: right on t1 only -> 1/4. Majority type (click checkout): right on t0 only -> 1/4.
    assert compute_metrics(got["always_terminate"].responses, targets).exact_match == pytest.approx(0.25)
    assert compute_metrics(got["majority_type"].responses, targets).exact_match == pytest.approx(0.25)
    # The visible rule's cross-validation: every TRAIN example is its own session; sorted c0 c1 c2 p0 p1 r0..r4 dealt
    # into 2 folds: {c0 c2 p1 r1 r3} | {c1 p0 r0 r2 r4}.
    #   global: fold 0 fits terminate (3 of 5) -> 1 hit (r1); fold 1 fits checkout (2 of 5) -> 1 hit (c1): 2/10.
    #   page kind: fold 0 fits cart->checkout, product->terminate, results->terminate -> c0 c2 r1: 3 hits;
    #     fold 1 fits cart->checkout, product->add, results->tie terminate/view -> view (click first) -> c1 r4: 2.
    #     5/10. Every finer table splits nothing here (one last action and one step bucket per page kind): a tie.
    # Refitted on all: cart->checkout, results->terminate (3 vs 2), product->tie -> add_to_cart.
    assert "key (page_kind)" in got["visible_rule"].description
    assert "cross-validated training exact 50.00%" in got["visible_rule"].description
    rule = compute_metrics(got["visible_rule"].responses, targets)
    assert rule.exact_match == pytest.approx(0.75)  # t0 t1 t2 right, t3 (view) wrong
    assert rule.predicted_mix["terminate"] == pytest.approx(0.5)
