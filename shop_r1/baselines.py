"""Trivial baselines on the held-out examples: what a constant answer and a simple visible rule score (issue 21).

Every table of model scores shows these beside the models, computed on the same examples and through the same
metric code (each baseline writes a response string as the model would). A model that does not beat them has
learnt the class prior, not the shopper.

- `always_terminate`: `{"type": "terminate"}` for every example.
- `majority_type`: the commonest target type of the training split, as one fixed action: for terminate that is
  terminate; for click (type_and_submit) it is the commonest click name (name and text) among training targets of
  that type, so the constant can be exactly right.
- `visible_rule`: a small rule table fitted on the training split from what the prompt shows: the kind of the
  current page (from its element names), the step index (bucketed) and the shopper's last action (type and a
  coarse shape of its name) -> the commonest full target action in training with that key. A key seen fewer than
  `min_support` times backs off to a shorter key (dropping features from the end), then to the global commonest
  action. Which features (and in which back-off order) is chosen among FEATURE_SETS by cross-validation over the
  training *sessions* (k folds), never on the held-out examples; ties go to the simpler table.

Training examples are taken once per example id: a balanced `rl_train.jsonl` repeats examples to top up a class
and has already subsampled another, so its class prior is not the data's. `load_visible` reads the SFT file too
(`sft_train.jsonl`, session or step format), which holds every training step before balancing: prefer it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shop_r1.data.examples import load_rl_examples, load_sft_examples
from shop_r1.data.jsonl import read_jsonl_objects
from shop_r1.reward.action import exact_match
from shop_r1.types import ACTION_TYPES, Action, Message

PAGE_KINDS = ("home", "results", "product", "cart", "other")
FEATURES = ("page_kind", "step_bucket", "last_action")
FEATURE_SETS: tuple[tuple[str, ...], ...] = (
    (), ("page_kind",), ("page_kind", "last_action"), ("page_kind", "step_bucket"),
    ("page_kind", "last_action", "step_bucket"), ("page_kind", "step_bucket", "last_action"))
"""Candidate rule tables, simplest first; a table backs off by dropping features from the end."""
_NAME = re.compile(r"""\bname=["']([^"']*)["']""")
_PAGE = re.compile(r"Page (\d+) \(simplified HTML\)")


@dataclass(frozen=True)
class Visible:
    """What the prompt of one example shows that the rules may use, and the example's target."""

    example_id: str
    page_kind: str
    step_bucket: str
    last_action: str
    target: Action

    def key(self, features: Sequence[str]) -> tuple[str, ...]:
        return tuple(getattr(self, f) for f in features)


def page_kind(html: str) -> str:
    """home / results / product / cart / other, from the names of the page's interactive elements (the synthetic
    shop's, `shop_r1/data/synth/pages.py`; a page of another shop without them is `other`)."""
    names = _NAME.findall(html)
    if "proceed_to_checkout" in names:
        return "cart"
    if "buy_now" in names or "add_to_cart" in names:
        return "product"
    if any(n.startswith(("search_results.", "refinements.", "pagination.")) for n in names):
        return "results"
    if any(n.startswith(("todays_deals.", "nav.category.")) for n in names):
        return "home"
    return "other"


def step_bucket(step_index: int) -> str:
    """1, 2, 3, 4-5, 6+ (RL examples start at step 1: the step on the first page has no history)."""
    return str(step_index) if step_index <= 3 else "4-5" if step_index <= 5 else "6+"


def name_shape(name: str) -> str:
    """A coarse name, so that a rule key has support: `search_results.<title>.view_product` ->
    `search_results.*.view_product`, `refinements.brand.acme` -> `refinements.brand.*`; short names unchanged."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] == "view_product":
        return f"{parts[0]}.*.view_product"
    return ".".join(parts[:2]) + ".*" if len(parts) >= 3 else name


def _action_of_turn(content: str, where: str) -> Action:
    try:
        obj = json.loads(content)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: an assistant turn is not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: an assistant turn is not a JSON object")
    return Action.from_dict(obj.get("action"), where=f"{where}: action")


def _step_of(context: Sequence[Message]) -> int:
    """The current page's step index: from its `Page N` header (`shop_r1.data.prompts.render_observation`), else the
    number of earlier user turns."""
    header = _PAGE.match(context[-1].content)
    return int(header.group(1)) - 1 if header else sum(m.role == "user" for m in context) - 1


def visible(example_id: str, context: Sequence[Message], target: Action, step_index: int | None = None,
            where: str = "example") -> Visible:
    """From a prompt that ends with the user turn of the current page (earlier pages are user turns, the
    shopper's earlier actions assistant turns between them). `step_index` None: read from the prompt."""
    if not context or context[-1].role != "user":
        raise ValueError(f"{where}: the prompt must end with the user turn of the current page")
    history = [m for m in context if m.role == "assistant"]
    last = "none"
    if history:
        a = _action_of_turn(history[-1].content, where)
        last = f"{a.type}:{name_shape(a.name)}" if a.type != "terminate" else "terminate"
    step = _step_of(context) if step_index is None else step_index
    return Visible(example_id, page_kind(context[-1].content), step_bucket(step), last, target)


def load_visible(path: str | Path) -> list[Visible]:
    """RL example JSONL (`prompt`, `target`) or SFT JSONL (`messages`: every assistant turn after the first page of a
    session is an example; in step format only the last turn), each example id once (first occurrence)."""
    first = next((obj for _, obj in read_jsonl_objects(path)), None)
    out: list[Visible] = []
    if first is None:
        return out
    if "prompt" in first:
        out = [visible(e.example_id, e.prompt, e.target, e.step_index, where=f"{path}: {e.example_id}")
               for e in load_rl_examples(path)]
    elif "messages" in first:
        for ex in load_sft_examples(path):
            where = f"{path}: {ex.session_id}"
            turns = [i for i, m in enumerate(ex.messages) if m.role == "assistant"]
            for i in turns[-1:] if ex.train_last_turn_only else turns[1:]:
                step = _step_of(ex.messages[:i])
                example_id = ex.session_id if ex.train_last_turn_only else f"{ex.session_id}:{step}"
                out.append(visible(example_id, ex.messages[:i], _action_of_turn(ex.messages[i].content, where),
                                   step, where))
    else:
        raise ValueError(f"{path}: expected RL examples (a 'prompt' field) or SFT examples (a 'messages' field)")
    once: dict[str, Visible] = {}
    for v in out:
        once.setdefault(v.example_id, v)
    return list(once.values())


def training_file(data_dir: str | Path) -> Path | None:
    """The file to fit baselines on in a data folder written by `shop_r1.data.build`: `sft_train.jsonl` (every
    training step, before balancing), else `rl_train.jsonl`, else None."""
    for name in ("sft_train.jsonl", "rl_train.jsonl"):
        if (Path(data_dir) / name).exists():
            return Path(data_dir) / name
    return None


def _commonest(actions: Sequence[Action]) -> Action:
    """The commonest action; ties by type order (click, type_and_submit, terminate), then name, then text."""
    counts = Counter(actions)
    return min(counts, key=lambda a: (-counts[a], ACTION_TYPES.index(a.type), a.name, a.text))


@dataclass(frozen=True)
class RuleTable:
    features: tuple[str, ...]
    """The finest key; back-off drops features from the end."""
    rules: dict[tuple[str, ...], Action]
    """Key (a prefix of `features`, at least one feature) -> action, for keys with at least min_support examples."""
    default: Action
    """The commonest training action: for keys never seen often enough."""
    cv_exact: float | None = None
    """Exact match of this table's feature set under cross-validation on the training sessions."""

    def predict(self, v: Visible) -> Action:
        for m in range(len(self.features), 0, -1):
            action = self.rules.get(v.key(self.features[:m]))
            if action is not None:
                return action
        return self.default

    def describe(self) -> str:
        return f"key ({', '.join(self.features) or 'none'}) -> commonest training action, {len(self.rules)} rules"


def fit_rule_table(train: Sequence[Visible], features: Sequence[str], min_support: int = 3) -> RuleTable:
    if not train:
        raise ValueError("fit_rule_table: no training examples")
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"fit_rule_table: unknown features {sorted(unknown)}; known: {FEATURES}")
    rules: dict[tuple[str, ...], Action] = {}
    for m in range(1, len(features) + 1):
        groups: dict[tuple[str, ...], list[Action]] = {}
        for v in train:
            groups.setdefault(v.key(features[:m]), []).append(v.target)
        rules.update({k: _commonest(acts) for k, acts in groups.items() if len(acts) >= min_support})
    return RuleTable(tuple(features), rules, _commonest([v.target for v in train]))


def session_folds(train: Sequence[Visible], folds: int) -> list[int]:
    """Fold of each example: the sorted distinct sessions dealt round-robin into `folds` folds."""
    sessions = sorted({v.example_id.rsplit(":", 1)[0] for v in train})
    fold_of = {s: i % folds for i, s in enumerate(sessions)}
    return [fold_of[v.example_id.rsplit(":", 1)[0]] for v in train]


def select_rule_table(train: Sequence[Visible], feature_sets: Sequence[Sequence[str]] = FEATURE_SETS,
                      folds: int = 5, min_support: int = 3) -> RuleTable:
    """The feature set with the best k-fold (by session) exact match on `train`, refitted on all of `train`."""
    if not feature_sets:
        raise ValueError("select_rule_table: no feature set to choose from")
    fold = session_folds(train, folds)
    best: tuple[float, tuple[str, ...]] = (-1.0, ())
    for features in feature_sets:
        hits = 0
        for k in range(folds):
            fit = [v for v, f in zip(train, fold) if f != k]
            if not fit:
                continue
            table = fit_rule_table(fit, features, min_support)
            hits += sum(exact_match(table.predict(v), v.target) for v, f in zip(train, fold) if f == k)
        score = hits / len(train)
        if score > best[0]:
            best = (score, tuple(features))
    table = fit_rule_table(train, best[1], min_support)
    return RuleTable(table.features, table.rules, table.default, best[0])


def render_response(action: Action, rationale: str) -> str:
    """The JSON a model writes: `{"rationale": ..., "action": {...}}`."""
    return json.dumps({"rationale": rationale, "action": action.to_dict()}, ensure_ascii=False)


@dataclass(frozen=True)
class Baseline:
    name: str
    """always_terminate | majority_type | visible_rule"""
    label: str
    description: str
    example_ids: tuple[str, ...]
    responses: tuple[str, ...]


def majority_action(train: Sequence[Visible]) -> Action:
    """The commonest training target type, as one action: the commonest training target of that type."""
    if not train:
        raise ValueError("majority_action: no training examples")
    types = Counter(v.target.type for v in train)
    kind = min(types, key=lambda t: (-types[t], ACTION_TYPES.index(t)))
    return _commonest([v.target for v in train if v.target.type == kind])


def baselines(train: Sequence[Visible], test: Sequence[Visible], folds: int = 5,
              min_support: int = 3) -> tuple[Baseline, ...]:
    """The three baselines' responses on `test` (fitted on `train`)."""
    ids = tuple(v.example_id for v in test)
    terminate = Action("terminate")
    majority = majority_action(train)
    table = select_rule_table(train, folds=folds, min_support=min_support)

    def make(name: str, label: str, description: str, actions: Sequence[Action]) -> Baseline:
        return Baseline(name, label, description, ids, tuple(render_response(a, f"baseline {name}") for a in actions))

    return (
        make("always_terminate", "Always terminate", "terminate on every example", [terminate] * len(test)),
        make("majority_type", "Majority type", f"the commonest training type as one action: "
             f"{json.dumps(majority.to_dict())}", [majority] * len(test)),
        make("visible_rule", "Visible rule", f"{table.describe()}; cross-validated training exact "
             f"{100 * (table.cv_exact or 0.0):.2f}%", [table.predict(v) for v in test]))
