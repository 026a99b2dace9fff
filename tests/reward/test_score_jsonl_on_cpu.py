"""`shop-r1 reward score`: JSONL in, the same lines plus the reward out; bad lines are named."""

import json
import subprocess
import sys

import pytest

from shop_r1.config import RewardConfig
from shop_r1.reward.io import score_jsonl


def _write(path, lines):
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))


def test_scores_each_line_and_keeps_the_input(tmp_path):
    good = json.dumps({"rationale": "r", "action": {"type": "click", "name": "a.b"}})
    _write(tmp_path / "in.jsonl", [
        {"response": good, "target": {"type": "click", "name": "a.b"}, "id": 1},
        {"response": "nonsense", "target": {"type": "terminate"}, "id": 2},
    ])
    n = score_jsonl(tmp_path / "in.jsonl", tmp_path / "out.jsonl", RewardConfig())
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == 2 and [r["id"] for r in rows] == [1, 2]
    assert rows[0]["reward"] == {"format": 0.5, "action_type": 0.3, "attribute": 0.2, "value": 1000.0,
                                 "self_certainty": 0.0, "total": 1001.0}
    assert rows[1]["reward"]["total"] == 0.0


@pytest.mark.parametrize("bad, message", [
    ("{not json", r"in\.jsonl:2: not valid JSON"),
    (json.dumps({"response": 5, "target": {"type": "terminate"}}), r"in\.jsonl:2: response"),
    (json.dumps({"response": "x", "target": {"type": "scroll"}}), r"in\.jsonl:2: target\.type"),
    (json.dumps({"response": "x", "target": {"type": "click"}}), r"in\.jsonl:2: target\.name"),
    (json.dumps({"response": "x", "target": {"type": "terminate"}, "logprobs": {"token_offsets": [0]}}),
     r"in\.jsonl:2: logprobs"),
])
def test_bad_line_is_named_and_nothing_is_written(tmp_path, bad, message):
    _write(tmp_path / "in.jsonl", [{"response": "x", "target": {"type": "terminate"}}, bad])
    with pytest.raises(ValueError, match=message):
        score_jsonl(tmp_path / "in.jsonl", tmp_path / "out.jsonl", RewardConfig())
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_with_an_override_and_logprobs(tmp_path):
    resp = json.dumps({"rationale": "ok", "action": {"type": "click", "name": "a.b.c.e"}})
    start = resp.index('"ok"') + 1
    _write(tmp_path / "in.jsonl", [{"response": resp, "target": {"type": "click", "name": "a.b.c.d"},
                                    "logprobs": {"token_offsets": [0, start, start + 2],
                                                 "topk_logprobs": [[-1.0], [0.0], [-1.0]], "vocab_size": 8}}])
    subprocess.run([sys.executable, "-m", "shop_r1.cli", "reward", "score", "--input", str(tmp_path / "in.jsonl"),
                    "--output", str(tmp_path / "out.jsonl"), "reward.dars_factor=10",
                    "reward.self_certainty.source=topk_logprobs"], check=True,
                   capture_output=True)
    reward = json.loads((tmp_path / "out.jsonl").read_text())["reward"]
    # value = 10 * 0.75; s = ln 8 (p = 1 on the rationale token); total = 0.5 + 0.3 + 0.2 + 7.5 + 0.005 * ln 8
    assert reward["value"] == pytest.approx(7.5)
    assert reward["self_certainty"] == pytest.approx(2.0794415)
    assert reward["total"] == pytest.approx(8.5 + 0.005 * 2.0794415)
