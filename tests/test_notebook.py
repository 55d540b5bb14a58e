"""notebooks/colab_quickstart.ipynb runs, end to end, on the CPU with the tiny config.

Its code cells are executed in order in a fresh interpreter (no Jupyter needed), with the
"parameters" cell's values overridden after it runs, as papermill does: train, read the
checkpoint back, reason about held-out digits and draw one of each. Setup's Colab-only
steps (clone, pip) are skipped outside Colab by the notebook itself.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "colab_quickstart.ipynb")

RUNNER = """
import json, os, sys
import matplotlib
matplotlib.use("Agg")   # plt.show() draws nowhere
nb = json.load(open(sys.argv[1]))
overrides = json.loads(sys.argv[2])
namespace = {"__name__": "__main__"}
for cell in nb["cells"]:
  if cell["cell_type"] != "code":
    continue
  exec(compile("".join(cell["source"]), cell.get("id", "cell"), "exec"), namespace)
  if "parameters" in cell["metadata"].get("tags", []):
    namespace.update(overrides)
print("NOTEBOOK_OK", len(namespace["answers"]), namespace["drawn"].shape)
"""


def test_notebook_is_valid_json_without_outputs():
  nb = json.load(open(NOTEBOOK))
  assert nb["nbformat"] == 4
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)
  assert sum("parameters" in c["metadata"].get("tags", []) for c in code) == 1


def test_notebook_trains_reasons_and_generates_with_the_tiny_config(tmp_path):
  overrides = {"VARIANT": "tiny", "STEPS": 2, "WORKDIR": str(tmp_path / "run")}
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", RUNNER, NOTEBOOK, json.dumps(overrides)],
                        cwd=os.path.join(ROOT, "notebooks"), env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "NOTEBOOK_OK 8 (10, 8, 8)" in proc.stdout, proc.stdout[-2000:]
  assert "trained to step 2" in proc.stdout
  assert os.path.isdir(tmp_path / "run" / "checkpoints")
