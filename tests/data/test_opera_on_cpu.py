"""OPeRA conversion from a hand-written Parquet file in the dataset's schema."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shop_r1.data.opera import convert_opera
from shop_r1.types import Action

COLUMNS = ["session_id", "action_id", "timestamp", "action_type", "semantic_id", "simplified_html", "rationale",
           "input_text"]


def _write(path, rows):
    pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}), path)


def test_converts_orders_and_counts_skipped_rows(tmp_path):
    _write(tmp_path / "opera.parquet", [
        # out of order on purpose: timestamps decide
        ("s1", "a3", 30.0, "terminate", None, "<html>3</html>", "Nothing fits.", None),
        ("s1", "a1", 10.0, "input", "search_input", "<html>1</html>", "I need a kettle.", "electric kettle"),
        ("s1", "a2", 20.0, "click", "search_results.kettle.view_product", "<html>2</html>", "", None),
        ("s1", "a2b", 25.0, "scroll", None, "<html>2b</html>", None, None),
        ("s2", "b1", 5.0, "click", "nav.home", "<html>h</html>", None, None),
        ("s2", "b2", 6.0, "scroll", None, "<html>h</html>", None, None),
    ])
    out = convert_opera(tmp_path / "opera.parquet")
    assert [s.session_id for s in out.sessions] == ["s1", "s2"]
    s1 = out.sessions[0]
    assert [st.action for st in s1.steps] == [
        Action("type_and_submit", "search_input", "electric kettle"),
        Action("click", "search_results.kettle.view_product"),
        Action("terminate"),
    ]
    assert [st.observation for st in s1.steps] == ["<html>1</html>", "<html>2</html>", "<html>3</html>"]
    assert [st.rationale for st in s1.steps] == ["I need a kettle.", None, "Nothing fits."]
    assert out.num_skipped_rows == 2 and out.skipped_by_type == {"scroll": 2}


def test_missing_value_is_named(tmp_path):
    _write(tmp_path / "opera.parquet", [("s9", "z1", 1.0, "click", None, "<html/>", None, None)])
    with pytest.raises(ValueError, match=r"session s9, action z1: column 'semantic_id'"):
        convert_opera(tmp_path / "opera.parquet")


def test_missing_column_is_named(tmp_path):
    pq.write_table(pa.table({"session_id": ["s"], "action_type": ["click"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="missing OPeRA columns"):
        convert_opera(tmp_path / "bad.parquet")
