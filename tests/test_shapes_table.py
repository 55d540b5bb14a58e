"""bench.shapes_table: settings x seeds read from eval.json, spread and the marked rows."""
import json

import pytest

from bench import shapes_table


def _run(path, geneval, vqa, step=10):
  path.mkdir()
  record = {"step": step, "shapes": True, "geneval_overall": geneval,
            "geneval_heldout_overall": geneval / 2, "vqa_overall": vqa,
            "vqa_heldout_overall": vqa, "caption_match": None, "think_draw_both": 0.5,
            "frechet_ratio": 2.0}
  (path / "eval.json").write_text(json.dumps({"latest": record, "evaluations": [record]}))
  return str(path)


def test_table_marks_only_ranges_clear_of_the_baseline(tmp_path):
  runs = {"default": [_run(tmp_path / "a0", 0.80, 0.90), _run(tmp_path / "a1", 0.84, 0.92)],
          "worse": [_run(tmp_path / "b0", 0.50, 0.91), _run(tmp_path / "b1", 0.55, 0.95)]}
  table = shapes_table.settings_table(runs)
  assert table["default"]["geneval_overall"]["mean"] == pytest.approx(0.82)
  assert shapes_table.differs(table["worse"]["geneval_overall"],
                              table["default"]["geneval_overall"])
  assert not shapes_table.differs(table["worse"]["vqa_overall"],
                                  table["default"]["vqa_overall"])
  rows = shapes_table.markdown(table, runs).splitlines()
  assert rows[2].startswith("| default | 2 | 82.0 [80.0-84.0] |")
  assert "52.5 [50.0-55.0]*" in rows[3] and "93.0 [91.0-95.0] |" in rows[3]
  assert "n/a" in rows[3]   # no seed has a caption figure


def test_bad_specs_and_missing_records_are_errors(tmp_path):
  with pytest.raises(ValueError, match="NAME=DIR"):
    shapes_table.parse_runs(["default"])
  with pytest.raises(ValueError, match="no Shapes record of step 3"):
    shapes_table.read_record(_run(tmp_path / "r", 0.5, 0.5), step=3)
