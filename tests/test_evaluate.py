"""mot.evaluate on a tiny trained checkpoint: figures, files, and bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mot import eval_digits, evaluate, train_lib
from mot.pipeline import Pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  from configs import digits
  config = digits.get_config("tiny")
  config.num_train_steps = 3
  path = tmp_path_factory.mktemp("evaluate")
  train_lib.train_and_evaluate(config, str(path))
  return path


def test_protocol_figures_and_files(workdir):
  pipe = Pipeline.from_workdir(str(workdir))
  result = evaluate.evaluate_pipeline(pipe, samples_per_digit=2, steps=2)
  images = result["_images"]
  assert images.shape == (20, 8, 8) and images.min() >= 0 and images.max() <= 1
  for key in ("reasoning_accuracy", "reasoning_accuracy_single_view", "generation_accuracy"):
    assert 0.0 <= result[key] <= 1.0
  assert result["sampling"]["reason_shifts"] == 1    # configs/digits.py reads 9 views
  assert result["classifier_heldout_accuracy"] > 0.94
  # The misread digits: as many as the accuracy says, each with its wrong answer; the
  # judge's own misses as many as its accuracy says.
  misread = result["reasoning_misread"]
  assert len(misread) == round((1 - result["reasoning_accuracy"]) * 297)
  assert all(m["answer"] != str(m["label"]) and 0 <= m["index"] < 297 for m in misread)
  assert len(result["classifier_misread"]) == round(
      (1 - result["classifier_heldout_accuracy"]) * 297)
  assert result["frechet"] > 0 and result["frechet_floor"] > 0
  np.testing.assert_allclose(result["frechet_ratio"], result["frechet"] / result["frechet_floor"])
  written = evaluate.write_results(str(workdir), result)
  with open(workdir / "eval.json") as f:
    saved = json.load(f)
  assert saved["latest"]["step"] == 3 and saved["latest"]["frechet"] == written["frechet"]
  assert os.path.exists(written["grid"])


def test_untrained_model_scores_near_chance(workdir):
  # A 3-step model cannot read digits: the metric must not flatter it.
  pipe = Pipeline.from_workdir(str(workdir))
  _, _, _, held_px, held_y = eval_digits.judge()
  accuracy, answers = eval_digits.reasoning_accuracy(pipe, held_px[:60], held_y[:60])
  assert len(answers) == 60 and accuracy < 0.5


def test_validation_split_run_is_scored_on_its_validation_digits(tmp_path):
  # data.validation_size: trained without the last 100 training digits, scored on them,
  # judge included, and the record says so; the 297 held-out digits are not used.
  from configs import digits as digits_config
  from mot.data import digits
  config = digits_config.get_config("tiny")
  config.num_train_steps = 2
  config.data.validation_size = 100
  train_lib.train_and_evaluate(config, str(tmp_path))
  pipe = Pipeline.from_workdir(str(tmp_path))
  result = evaluate.evaluate_pipeline(pipe, samples_per_digit=1, steps=2, reason_shifts=0)
  assert result["split"].startswith("validation (last 100 training digits")
  held_x, held_y = digits.load_digits_split(100)[2:]
  clf = eval_digits.judge(100)[0]
  expected_judge = np.mean(clf.predict(digits.to_pixels(held_x).reshape(100, -1)) == held_y)
  assert result["classifier_heldout_accuracy"] == expected_judge
  assert all(m["index"] < 100 for m in result["reasoning_misread"])
  assert len(result["reasoning_misread"]) == round((1 - result["reasoning_accuracy"]) * 100)
  assert "(validation split)" in evaluate.format_result(result)


def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "mot.evaluate", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def test_cli_writes_eval_json(workdir):
  # One view per digit (--reason_shifts 0): the nine-view protocol is the test above's.
  proc = run_cli("--workdir", str(workdir), "--samples_per_digit", "1", "--steps", "2",
                 "--reason_shifts", "0")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "reasoning accuracy" in proc.stdout
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  assert record["samples_per_digit"] == 1 and record["sampling"]["reason_shifts"] == 0
  assert record["reasoning_accuracy"] == record["reasoning_accuracy_single_view"]


def test_diffusion_classifier_bench_reads_with_the_dm_head(workdir):
  proc = subprocess.run([sys.executable, "-m", "bench.diffusion_classifier", "--workdir",
                         str(workdir), "--draws", "2", "--num_images", "12"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["images"] == 12 and result["draws"] == 2 and result["step"] == 3
  assert len(result["misread"]) == round(12 * (1 - result["accuracy"]))
  assert len(result["reasoning_misread"]) == round(12 * (1 - result["reasoning_accuracy"]))
  assert set(result["both_misread"]) == ({m["index"] for m in result["misread"]}
                                         & {m["index"] for m in result["reasoning_misread"]})
  bad = subprocess.run([sys.executable, "-m", "bench.diffusion_classifier", "--workdir",
                        str(workdir / "missing")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_read_evaluations_trusts_only_a_well_formed_eval_json(tmp_path):
  assert evaluate.read_evaluations(str(tmp_path)) == []  # missing
  path = tmp_path / evaluate.EVAL_FILE
  for damaged in ("{not json", '{"latest": {}}', '{"evaluations": 3}', "[1, 2]"):
    path.write_text(damaged)
    assert evaluate.read_evaluations(str(tmp_path)) == [], damaged
  path.write_text(json.dumps({"evaluations": [{"step": 4}, "junk", {"step": 8}]}))
  assert evaluate.read_evaluations(str(tmp_path)) == [{"step": 4}, {"step": 8}]
