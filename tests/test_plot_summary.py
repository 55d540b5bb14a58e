"""Loss-curve PNGs (mot.plot) and TensorBoard event files (mot.summary)."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from mot import plot
from mot import summary


def _write_metrics(workdir, evals=True, junk=False):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(10, 101, 10):
      f.write(json.dumps({"step": step, "loss": 3.0 / step, "ar_loss": 2.0 / step,
                          "dm_loss": 1.0 / step, "learning_rate": 1e-3,
                          "tokens_per_s": 1e4, "grad_norm": 1.0}) + "\n")
      if evals and step % 50 == 0:
        f.write(json.dumps({"step": step, "eval_ar_loss": 2.5 / step,
                            "eval_dm_loss": 1.5 / step}) + "\n")
    if junk:
      f.write('{"step": 110, "loss": 0.0')  # A line cut short by a crash.


def test_plot_writes_png_with_eval_panel(tmp_path):
  _write_metrics(tmp_path, junk=True)
  out = plot.plot_metrics(str(tmp_path))
  assert out == str(tmp_path / "curves.png")
  with Image.open(out) as im:
    assert im.format == "PNG" and im.width > im.height  # Two panels side by side.
  train, evals = plot.read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in train] == list(range(10, 101, 10))
  assert [r["step"] for r in evals] == [50, 100]


def test_plot_without_evals_and_custom_out(tmp_path):
  _write_metrics(tmp_path, evals=False)
  out = plot.plot_metrics(str(tmp_path), out=str(tmp_path / "sub" / "c.png"))
  with Image.open(out) as im:
    assert im.format == "PNG"


def test_plot_errors_are_one_line(tmp_path, capsys):
  with pytest.raises(FileNotFoundError, match=r"metrics.jsonl does not exist: train first"):
    plot.plot_metrics(str(tmp_path))
  (tmp_path / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match=r"metrics.jsonl has no training records"):
    plot.plot_metrics(str(tmp_path))
  with pytest.raises(SystemExit, match=r"^error: .*metrics.jsonl has no training records"):
    plot.main(["--workdir", str(tmp_path)])


def test_plot_command(tmp_path, capsys):
  _write_metrics(tmp_path)
  plot.main(["--workdir", str(tmp_path), "--out", str(tmp_path / "x.png")])
  assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'x.png'}"
  assert (tmp_path / "x.png").stat().st_size > 1000


def test_summary_writer_scalars_and_image(tmp_path):
  grid = np.linspace(0, 1, 12 * 20).reshape(12, 20)
  with summary.SummaryWriter(str(tmp_path), enabled=True) as writer:
    writer.scalars(1, {"step": 1, "loss": 0.5, "eval/ar_loss": 2.0})
    writer.scalars(2, {"loss": np.float32(0.25)})
    writer.image(2, "samples", grid)
    writer.image(3, "rgb", np.zeros((4, 5, 3)))
    writer.flush()
  logdir = tmp_path / "tensorboard"
  assert summary.read_scalars(str(logdir)) == {"loss": [(1, 0.5), (2, 0.25)],
                                                "eval/ar_loss": [(1, 2.0)]}
  images = {v.tag: (e.step, v.image) for e in summary.read_events(str(logdir))
            for v in e.summary.value if v.HasField("image")}
  assert set(images) == {"samples", "rgb"}
  step, image = images["samples"]
  assert step == 2 and (image.height, image.width) == (12, 20)
  import io
  png = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("L"))
  np.testing.assert_allclose(png, np.round(grid * 255), atol=1)


def test_summary_writer_disabled_writes_nothing(tmp_path):
  writer = summary.SummaryWriter(str(tmp_path), enabled=False)
  writer.scalars(1, {"loss": 1.0})
  writer.image(1, "x", np.zeros((2, 2)))
  writer.flush()
  writer.close()
  assert not writer.enabled and not os.listdir(tmp_path)


def test_summary_writer_rejects_bad_image_shape(tmp_path):
  with summary.SummaryWriter(str(tmp_path)) as writer:
    with pytest.raises(ValueError, match=r"image 'x': expected \[H, W\]"):
      writer.image(0, "x", np.zeros((2, 2, 2)))
