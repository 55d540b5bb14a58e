"""Sharded sampling: `Pipeline.from_workdir(workdir, mesh_shape=...)` and
`sample.py --mesh_shape` on a (2,2,2) mesh of 8 fake CPU devices draw the images and give
the answers of one device (the run happens in tests/_sample_mesh_worker.py: the device
count is set before JAX is imported)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mot.errors import ConfigError
from mot.pipeline import Pipeline
from tests import _procs


def test_sampling_on_a_mesh_equals_one_device(tmp_path):
  workdir, out, log = tmp_path / "run", tmp_path / "out", str(tmp_path / "worker.log")
  _procs.run_all([([_procs.python(), "tests/_sample_mesh_worker.py", str(workdir), str(out)],
                   _procs.cpu_env(8), log)], timeout=300, what="sharded sampling worker")
  with open(log) as f:
    line = next((l for l in f if l.startswith("RESULT ")), None)
  assert line, f"the worker printed no RESULT line:\n{_procs.tail(log)}"
  r = json.loads(line[len("RESULT "):])
  # Parameters read into their shards by the rules; no large one whole on a device.
  assert r["mesh_devices"] == 8
  assert not r["sharding_errors"], "\n".join(r["sharding_errors"][:10])
  assert r["named_leaves"] == 21 and not r["whole_large_leaves"], r["whole_large_leaves"]
  # Same seed, same images (within float rounding), same answers.
  assert r["generated_shape"] == [4, 8, 8]
  assert r["generated_max_abs_diff"] < 1e-4, r["generated_max_abs_diff"]
  assert r["answers"][0] == r["answers"][1] and len(r["answers"][0]) == 6
  # sample.py's logic writes the same PNGs (8-bit: at most one level apart).
  assert r["cli_images"] == 2 and r["cli_max_abs_diff"] <= 1.0, r["cli_max_abs_diff"]

  # This process has one device: a mesh it cannot form is one line, before any sampling.
  with pytest.raises(ConfigError, match="needs 8 devices but 1"):
    Pipeline.from_workdir(str(workdir), mesh_shape="(2,2,2)")
  target = tmp_path / "never"
  proc = subprocess.run(
      [sys.executable, "sample.py", "--workdir", str(workdir), "--mode", "generate",
       "--prompt", "a handwritten digit 3", "--out", str(target), "--mesh_shape", "(2,2,2)"],
      cwd=_procs.ROOT, env=dict(os.environ, PYTHONPATH=_procs.ROOT), capture_output=True,
      text=True, timeout=300)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("error: config.mesh_shape='(2,2,2)'")
  assert not target.exists()
  np.testing.assert_equal(proc.stdout, "")
